//! `GgufWriter`: builds GGUF files (v3 by default) for tests and the tiny model generator.

use std::path::Path;

use super::reader::tensor_bytes;
use super::{GgmlType, MetaArray, MetaValue, DEFAULT_ALIGNMENT};

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Accumulates metadata and tensors, then serialises them as a GGUF file.
///
/// The writer does not reject duplicates or odd values, so tests can build malformed files;
/// only `add_tensor` checks that the data length matches the shape.
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    kvs: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty v3 writer with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version field written in the header (2 and 3 share a layout).
    pub fn set_version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets the data alignment and writes `general.alignment` when it is not the default.
    pub fn set_alignment(&mut self, alignment: u64) -> &mut Self {
        self.alignment = alignment;
        if alignment != DEFAULT_ALIGNMENT {
            self.add_value("general.alignment", MetaValue::U32(alignment as u32));
        }
        self
    }

    /// Adds any metadata value.
    pub fn add_value(&mut self, key: &str, value: MetaValue) -> &mut Self {
        self.kvs.push((key.to_string(), value));
        self
    }

    /// Adds a u32 value.
    pub fn add_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.add_value(key, MetaValue::U32(v))
    }

    /// Adds an i32 value.
    pub fn add_i32(&mut self, key: &str, v: i32) -> &mut Self {
        self.add_value(key, MetaValue::I32(v))
    }

    /// Adds a u64 value.
    pub fn add_u64(&mut self, key: &str, v: u64) -> &mut Self {
        self.add_value(key, MetaValue::U64(v))
    }

    /// Adds an f32 value.
    pub fn add_f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.add_value(key, MetaValue::F32(v))
    }

    /// Adds a bool value.
    pub fn add_bool(&mut self, key: &str, v: bool) -> &mut Self {
        self.add_value(key, MetaValue::Bool(v))
    }

    /// Adds a string value.
    pub fn add_str(&mut self, key: &str, v: &str) -> &mut Self {
        self.add_value(key, MetaValue::String(v.to_string()))
    }

    /// Adds an array of strings.
    pub fn add_str_array<S: AsRef<str>>(&mut self, key: &str, v: &[S]) -> &mut Self {
        let v = v.iter().map(|s| s.as_ref().to_string()).collect();
        self.add_value(key, MetaValue::Array(MetaArray::String(v)))
    }

    /// Adds an array of i32.
    pub fn add_i32_array(&mut self, key: &str, v: &[i32]) -> &mut Self {
        self.add_value(key, MetaValue::Array(MetaArray::I32(v.to_vec())))
    }

    /// Adds an array of u32.
    pub fn add_u32_array(&mut self, key: &str, v: &[u32]) -> &mut Self {
        self.add_value(key, MetaValue::Array(MetaArray::U32(v.to_vec())))
    }

    /// Adds an array of f32.
    pub fn add_f32_array(&mut self, key: &str, v: &[f32]) -> &mut Self {
        self.add_value(key, MetaValue::Array(MetaArray::F32(v.to_vec())))
    }

    /// Adds a tensor; `dims` in ggml order (`dims[0]` = row length), `data` already encoded.
    ///
    /// # Panics
    /// When `data.len()` does not match the size `dims` and `ty` imply.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        let want = tensor_bytes(name, dims, ty);
        assert!(
            matches!(want, Ok(n) if n == data.len() as u64),
            "GgufWriter::add_tensor({name}): {} bytes given, shape {dims:?} of {ty} needs {want:?}",
            data.len()
        );
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }

    /// Serialises the file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            out.extend_from_slice(&value_type(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let align = self.alignment.max(1);
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + t.data.len() as u64).next_multiple_of(align);
        }
        pad(&mut out, align);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad(&mut out, align);
        }
        out
    }

    /// Serialises the file to `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_bytes())
    }

    /// Writes the metadata and `tensors` (name, ggml dims, type) to `out`, asking `data` for
    /// each tensor's bytes in order, one at a time: a file of many gigabytes is written without
    /// holding it in memory. Tensors added with `add_tensor` come first.
    ///
    /// # Errors
    /// An I/O error, or `InvalidData` when `data` gives a tensor the wrong number of bytes.
    pub fn write_streamed<W: std::io::Write>(
        &self,
        out: &mut W,
        tensors: &[(String, Vec<u64>, GgmlType)],
        mut data: impl FnMut(usize, &mut Vec<u8>),
    ) -> std::io::Result<()> {
        let align = self.alignment.max(1);
        let mut all: Vec<(&str, &[u64], GgmlType, u64)> = Vec::new();
        for t in &self.tensors {
            all.push((&t.name, &t.dims, t.ty, t.data.len() as u64));
        }
        for (name, dims, ty) in tensors {
            let n = tensor_bytes(name, dims, *ty)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
            all.push((name, dims, *ty, n));
        }
        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&self.version.to_le_bytes());
        head.extend_from_slice(&(all.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut head, k);
            head.extend_from_slice(&value_type(v).to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        for (name, dims, ty, n) in &all {
            put_str(&mut head, name);
            head.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in *dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&ty.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + n).next_multiple_of(align);
        }
        pad(&mut head, align);
        out.write_all(&head)?;
        let mut buf = Vec::new();
        for t in &self.tensors {
            buf.clear();
            buf.extend_from_slice(&t.data);
            pad(&mut buf, align);
            out.write_all(&buf)?;
        }
        for (i, (name, _, _, n)) in all[self.tensors.len()..].iter().enumerate() {
            buf.clear();
            data(i, &mut buf);
            if buf.len() as u64 != *n {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("tensor {name}: {} bytes given, {n} needed", buf.len()),
                ));
            }
            pad(&mut buf, align);
            out.write_all(&buf)?;
        }
        Ok(())
    }
}

fn pad(out: &mut Vec<u8>, align: u64) {
    let len = (out.len() as u64).next_multiple_of(align) as usize;
    out.resize(len, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn array_type(a: &MetaArray) -> u32 {
    match a {
        MetaArray::U8(_) => 0,
        MetaArray::I8(_) => 1,
        MetaArray::U16(_) => 2,
        MetaArray::I16(_) => 3,
        MetaArray::U32(_) => 4,
        MetaArray::I32(_) => 5,
        MetaArray::F32(_) => 6,
        MetaArray::Bool(_) => 7,
        MetaArray::String(_) => 8,
        MetaArray::Array(_) => 9,
        MetaArray::U64(_) => 10,
        MetaArray::I64(_) => 11,
        MetaArray::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(a) => put_array(out, a),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &MetaArray) {
    out.extend_from_slice(&array_type(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], f: impl Fn(T) -> [u8; N]) {
        for &x in v {
            out.extend_from_slice(&f(x));
        }
    }
    match a {
        MetaArray::U8(v) => out.extend_from_slice(v),
        MetaArray::I8(v) => each(out, v, |x| [x as u8]),
        MetaArray::U16(v) => each(out, v, u16::to_le_bytes),
        MetaArray::I16(v) => each(out, v, i16::to_le_bytes),
        MetaArray::U32(v) => each(out, v, u32::to_le_bytes),
        MetaArray::I32(v) => each(out, v, i32::to_le_bytes),
        MetaArray::F32(v) => each(out, v, f32::to_le_bytes),
        MetaArray::Bool(v) => each(out, v, |x| [u8::from(x)]),
        MetaArray::String(v) => v.iter().for_each(|s| put_str(out, s)),
        MetaArray::Array(v) => v.iter().for_each(|x| put_array(out, x)),
        MetaArray::U64(v) => each(out, v, u64::to_le_bytes),
        MetaArray::I64(v) => each(out, v, i64::to_le_bytes),
        MetaArray::F64(v) => each(out, v, f64::to_le_bytes),
    }
}
