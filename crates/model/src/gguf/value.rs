//! GGUF metadata values and the key → value map with typed getters.

use std::collections::HashMap;

use super::GgufError;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8.
    String(String),
    /// GGUF type 9.
    Array(MetaArray),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 12.
    F64(f64),
}

/// A typed metadata array (GGUF arrays are homogeneous).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaArray {
    /// Array of u8.
    U8(Vec<u8>),
    /// Array of i8.
    I8(Vec<i8>),
    /// Array of u16.
    U16(Vec<u16>),
    /// Array of i16.
    I16(Vec<i16>),
    /// Array of u32.
    U32(Vec<u32>),
    /// Array of i32.
    I32(Vec<i32>),
    /// Array of f32.
    F32(Vec<f32>),
    /// Array of bool.
    Bool(Vec<bool>),
    /// Array of strings.
    String(Vec<String>),
    /// Array of arrays.
    Array(Vec<MetaArray>),
    /// Array of u64.
    U64(Vec<u64>),
    /// Array of i64.
    I64(Vec<i64>),
    /// Array of f64.
    F64(Vec<f64>),
}

impl MetaArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// Whether the array is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as i64 when this is an integer array (u64 values above i64::MAX fail).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            MetaArray::U8(v) => conv(v, |x| Some(x.into())),
            MetaArray::I8(v) => conv(v, |x| Some(x.into())),
            MetaArray::U16(v) => conv(v, |x| Some(x.into())),
            MetaArray::I16(v) => conv(v, |x| Some(x.into())),
            MetaArray::U32(v) => conv(v, |x| Some(x.into())),
            MetaArray::I32(v) => conv(v, |x| Some(x.into())),
            MetaArray::U64(v) => conv(v, |x| i64::try_from(x).ok()),
            MetaArray::I64(v) => Some(v.clone()),
            MetaArray::F32(_)
            | MetaArray::F64(_)
            | MetaArray::Bool(_)
            | MetaArray::String(_)
            | MetaArray::Array(_) => None,
        }
    }

    /// A short name of the element type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaArray::U8(_) => "array of u8",
            MetaArray::I8(_) => "array of i8",
            MetaArray::U16(_) => "array of u16",
            MetaArray::I16(_) => "array of i16",
            MetaArray::U32(_) => "array of u32",
            MetaArray::I32(_) => "array of i32",
            MetaArray::F32(_) => "array of f32",
            MetaArray::Bool(_) => "array of bool",
            MetaArray::String(_) => "array of string",
            MetaArray::Array(_) => "array of array",
            MetaArray::U64(_) => "array of u64",
            MetaArray::I64(_) => "array of i64",
            MetaArray::F64(_) => "array of f64",
        }
    }
}

impl MetaValue {
    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(a) => a.type_name(),
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }

    /// The value as i128 when it is an integer of any width.
    pub fn as_int(&self) -> Option<i128> {
        match self {
            MetaValue::U8(x) => Some((*x).into()),
            MetaValue::I8(x) => Some((*x).into()),
            MetaValue::U16(x) => Some((*x).into()),
            MetaValue::I16(x) => Some((*x).into()),
            MetaValue::U32(x) => Some((*x).into()),
            MetaValue::I32(x) => Some((*x).into()),
            MetaValue::U64(x) => Some((*x).into()),
            MetaValue::I64(x) => Some((*x).into()),
            MetaValue::F32(_)
            | MetaValue::F64(_)
            | MetaValue::Bool(_)
            | MetaValue::String(_)
            | MetaValue::Array(_) => None,
        }
    }
}

/// The metadata key/value pairs of a GGUF file, in file order, with lookup by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds a pair; fails on a duplicate key.
    pub(crate) fn insert(&mut self, key: String, value: MetaValue) -> Result<(), GgufError> {
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// The value for `key`.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// All pairs in file order.
    pub fn entries(&self) -> &[(String, MetaValue)] {
        &self.entries
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    fn wrong(key: &str, expected: &'static str, v: &MetaValue) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: v.type_name(),
        }
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let v = self.require(key)?;
        v.as_int()
            .and_then(|x| T::try_from(x).ok())
            .ok_or_else(|| Self::wrong(key, expected, v))
    }

    /// An integer key that fits in u32 (any integer width is accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.get_int(key, "integer fitting u32")
    }

    /// An integer key that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_int(key, "integer fitting u64")
    }

    /// An integer key that fits in i32.
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.get_int(key, "integer fitting i32")
    }

    /// A float key (f32, or f64 narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            MetaValue::F32(x) => Ok(*x),
            MetaValue::F64(x) => Ok(*x as f32),
            v => Err(Self::wrong(key, "f32", v)),
        }
    }

    /// A bool key.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            MetaValue::Bool(x) => Ok(*x),
            v => Err(Self::wrong(key, "bool", v)),
        }
    }

    /// A string key.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            MetaValue::String(s) => Ok(s),
            v => Err(Self::wrong(key, "string", v)),
        }
    }

    /// An array-of-strings key.
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.require(key)? {
            MetaValue::Array(MetaArray::String(v)) => Ok(v),
            v => Err(Self::wrong(key, "array of string", v)),
        }
    }

    /// An integer-array key whose elements all fit in i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        let v = self.require(key)?;
        let err = || Self::wrong(key, "array of integers fitting i32", v);
        match v {
            MetaValue::Array(a) => a
                .to_i64_vec()
                .ok_or_else(err)?
                .into_iter()
                .map(|x| i32::try_from(x).map_err(|_| err()))
                .collect(),
            _ => Err(err()),
        }
    }

    /// A float-array key (f32, or f64 narrowed).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        match self.require(key)? {
            MetaValue::Array(MetaArray::F32(v)) => Ok(v.clone()),
            MetaValue::Array(MetaArray::F64(v)) => Ok(v.iter().map(|&x| x as f32).collect()),
            v => Err(Self::wrong(key, "array of f32", v)),
        }
    }
}
