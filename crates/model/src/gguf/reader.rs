//! Parses a GGUF v2/v3 header (metadata, tensor infos) and checks every tensor against the file.

use std::collections::HashSet;

use super::cursor::Cursor;
use super::{GgmlType, GgufError, MetaArray, MetaValue, Metadata, TensorInfo};

/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's maximum number of tensor dimensions.
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays of arrays the reader accepts.
const MAX_ARRAY_DEPTH: u32 = 3;

/// The parsed header: everything but the tensor bytes.
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_start: u64,
}

/// How much of a file the parse needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extent {
    /// Every tensor's data must lie inside the buffer.
    Whole,
    /// The header alone: tensor data may lie past the end (a truncated file, a header cut out
    /// of a split model); offsets and sizes are still checked for overflow and alignment.
    HeaderOnly,
}

pub(crate) fn parse(buf: &[u8], extent: Extent) -> Result<Header, GgufError> {
    let mut c = Cursor::new(buf);
    let magic = c.take(4, &|| "magic".into())?;
    if magic != b"GGUF" {
        let mut m = [0u8; 4];
        m.copy_from_slice(magic);
        return Err(GgufError::BadMagic(m));
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;
    // A key/value pair needs at least a key length, a type and a 1-byte value.
    c.check_count(n_kv, 8 + 4 + 1, &|| "metadata count".into())?;
    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let type_id = c.u32(&|| format!("type of metadata key {key:?}"))?;
        let value = read_value(&mut c, &key, type_id)?;
        metadata.insert(key, value)?;
    }
    // A tensor info needs at least a name length, n_dims, a type and an offset.
    c.check_count(n_tensors, 8 + 4 + 4 + 8, &|| "tensor count".into())?;
    let mut tensors = Vec::new();
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let t = read_tensor_info(&mut c, i)?;
        if !names.insert(t.name.clone()) {
            return Err(GgufError::DuplicateTensor(t.name));
        }
        tensors.push(t);
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(_) => metadata.get_u64("general.alignment")?,
    };
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(GgufError::BadAlignment(alignment));
    }
    let header_end = c.pos() as u64;
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::Overflow("data section start".into()))?;
    let len = buf.len() as u64;
    for t in &tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::Misaligned {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let start = data_start
            .checked_add(t.offset)
            .ok_or_else(|| GgufError::Overflow(format!("start of tensor {:?}", t.name)))?;
        let end = start
            .checked_add(t.n_bytes)
            .ok_or_else(|| GgufError::Overflow(format!("end of tensor {:?}", t.name)))?;
        if end > len && extent == Extent::Whole {
            return Err(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                start,
                size: t.n_bytes,
                len,
            });
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

fn read_tensor_info(c: &mut Cursor<'_>, i: u64) -> Result<TensorInfo, GgufError> {
    let name = c.string(&|| format!("name of tensor #{i}"))?;
    let n_dims = c.u32(&|| format!("n_dims of tensor {name:?}"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::BadShape {
            tensor: name,
            reason: format!("{n_dims} dimensions (1..={MAX_DIMS} allowed)"),
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(c.u64(&|| format!("dim {d} of tensor {name:?}"))?);
    }
    let type_id = c.u32(&|| format!("type of tensor {name:?}"))?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
        tensor: name.clone(),
        type_id,
    })?;
    let offset = c.u64(&|| format!("offset of tensor {name:?}"))?;
    let n_bytes = tensor_bytes(&name, &dims, ggml_type)?;
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_bytes,
    })
}

/// Bytes a tensor of `dims` and `ty` occupies, with every step checked.
pub(crate) fn tensor_bytes(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, GgufError> {
    let overflow = || GgufError::Overflow(format!("size of tensor {name:?}"));
    let mut elems: u64 = 1;
    for &d in dims {
        // ggml stores dims as int64: anything above i64::MAX is negative there.
        if d > i64::MAX as u64 {
            return Err(overflow());
        }
        elems = elems.checked_mul(d).ok_or_else(overflow)?;
    }
    if elems > i64::MAX as u64 {
        return Err(overflow());
    }
    let row = dims.first().copied().unwrap_or(1);
    let bs = ty.block_size() as u64;
    if !row.is_multiple_of(bs) {
        return Err(GgufError::BadShape {
            tensor: name.to_string(),
            reason: format!("row length {row} is not a multiple of {ty}'s block size {bs}"),
        });
    }
    (elems / bs)
        .checked_mul(ty.type_size() as u64)
        .ok_or_else(overflow)
}

fn read_value(c: &mut Cursor<'_>, key: &str, type_id: u32) -> Result<MetaValue, GgufError> {
    let what = || format!("value of metadata key {key:?}");
    Ok(match type_id {
        0 => MetaValue::U8(c.u8(&what)?),
        1 => MetaValue::I8(c.u8(&what)? as i8),
        2 => MetaValue::U16(c.u16(&what)?),
        3 => MetaValue::I16(c.u16(&what)? as i16),
        4 => MetaValue::U32(c.u32(&what)?),
        5 => MetaValue::I32(c.u32(&what)? as i32),
        6 => MetaValue::F32(f32::from_bits(c.u32(&what)?)),
        7 => MetaValue::Bool(c.u8(&what)? != 0),
        8 => MetaValue::String(c.string(&what)?),
        9 => MetaValue::Array(read_array(c, key, 0)?),
        10 => MetaValue::U64(c.u64(&what)?),
        11 => MetaValue::I64(c.u64(&what)? as i64),
        12 => MetaValue::F64(f64::from_bits(c.u64(&what)?)),
        _ => {
            return Err(GgufError::UnknownValueType {
                key: key.to_string(),
                type_id,
            })
        }
    })
}

/// Smallest encoded size of one element of GGUF type `t` (used to cap counts).
fn min_elem_size(t: u32) -> u64 {
    match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10 | 11 | 12 => 8,
        // An array element holds a type and a count.
        _ => 12,
    }
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: u32) -> Result<MetaArray, GgufError> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep(key.to_string()));
    }
    let what = || format!("array of metadata key {key:?}");
    let t = c.u32(&what)?;
    let n = c.u64(&what)?;
    if t > 12 {
        return Err(GgufError::UnknownValueType {
            key: key.to_string(),
            type_id: t,
        });
    }
    c.check_count(n, min_elem_size(t), &|| {
        format!("element count of metadata key {key:?}")
    })?;
    // n fits in the remaining bytes, so it fits in usize.
    let n = n as usize;
    fn rep<T>(n: usize, mut f: impl FnMut() -> Result<T, GgufError>) -> Result<Vec<T>, GgufError> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(f()?);
        }
        Ok(v)
    }
    Ok(match t {
        0 => MetaArray::U8(rep(n, || c.u8(&what))?),
        1 => MetaArray::I8(rep(n, || Ok(c.u8(&what)? as i8))?),
        2 => MetaArray::U16(rep(n, || c.u16(&what))?),
        3 => MetaArray::I16(rep(n, || Ok(c.u16(&what)? as i16))?),
        4 => MetaArray::U32(rep(n, || c.u32(&what))?),
        5 => MetaArray::I32(rep(n, || Ok(c.u32(&what)? as i32))?),
        6 => MetaArray::F32(rep(n, || Ok(f32::from_bits(c.u32(&what)?)))?),
        7 => MetaArray::Bool(rep(n, || Ok(c.u8(&what)? != 0))?),
        8 => MetaArray::String(rep(n, || c.string(&what))?),
        9 => MetaArray::Array(rep(n, || read_array(c, key, depth + 1))?),
        10 => MetaArray::U64(rep(n, || c.u64(&what))?),
        11 => MetaArray::I64(rep(n, || Ok(c.u64(&what)? as i64))?),
        _ => MetaArray::F64(rep(n, || Ok(f64::from_bits(c.u64(&what)?)))?),
    })
}
