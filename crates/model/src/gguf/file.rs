//! `GgufFile`: a parsed header over memory-mapped (or owned, aligned) bytes, with tensor views.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::reader::{self, Extent, Header};
use super::{GgmlType, GgufError, Metadata};

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the contiguous row length.
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Total number of elements.
    pub fn n_elements(&self) -> u64 {
        // The reader checked that the product does not overflow.
        self.dims.iter().product()
    }
}

/// A tensor's header entry and its bytes inside the file.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// The header entry.
    pub info: &'a TensorInfo,
    /// The raw (possibly quantized) data, `info.n_bytes` long.
    pub data: &'a [u8],
}

/// Bytes kept 64-byte aligned so tensor data can be reinterpreted as f32/f16 slices.
struct AlignedBytes {
    words: Vec<[u64; 8]>,
    len: usize,
}

impl AlignedBytes {
    fn new(bytes: &[u8]) -> Self {
        let mut words = vec![[0u64; 8]; bytes.len().div_ceil(64)];
        let dst = Self::view_mut(&mut words);
        dst[..bytes.len()].copy_from_slice(bytes);
        AlignedBytes {
            words,
            len: bytes.len(),
        }
    }

    fn view_mut(words: &mut [[u64; 8]]) -> &mut [u8] {
        // SAFETY: [u64; 8] has no padding and every byte pattern is a valid u8.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 64) }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `len <= words.len() * 64`; [u64; 8] has no padding.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

enum Backing {
    Mmap(Mmap),
    Owned(AlignedBytes),
}

/// What an opened file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contents {
    /// The header and every tensor's data ([`GgufFile::open`], [`GgufFile::from_bytes`]).
    Complete,
    /// The header only ([`GgufFile::open_metadata`]): tensor entries are listed, but no
    /// tensor's data can be read.
    MetadataOnly,
}

/// A parsed GGUF file. Tensor data stays in the mapping (or a heap buffer for `from_bytes`),
/// so the addresses of tensor bytes never change while the file lives, even when the
/// `GgufFile` value itself moves. `Send + Sync`.
pub struct GgufFile {
    backing: Backing,
    header: Header,
    contents: Contents,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("metadata_keys", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .field("contents", &self.contents)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`; every tensor's data must be in the file.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        Self::open_as(path, Extent::Whole)
    }

    /// Memory-maps and parses only the header of the file at `path` (metadata and tensor
    /// entries), which may be truncated after it: enough for a tokenizer or a chat template,
    /// never for weights ([`GgufFile::tensor`] returns `None`).
    pub fn open_metadata(path: &Path) -> Result<GgufFile, GgufError> {
        Self::open_as(path, Extent::HeaderOnly)
    }

    fn open_as(path: &Path, extent: Extent) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the mapping is read-only; a model file changing under a running server is
        // outside what this crate can defend against (llama.cpp makes the same assumption).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = reader::parse(&map, extent)?;
        Ok(GgufFile {
            backing: Backing::Mmap(map),
            header,
            contents: match extent {
                Extent::Whole => Contents::Complete,
                Extent::HeaderOnly => Contents::MetadataOnly,
            },
        })
    }

    /// Parses an in-memory file (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let owned = AlignedBytes::new(&bytes);
        let header = reader::parse(owned.as_slice(), Extent::Whole)?;
        Ok(GgufFile {
            backing: Backing::Owned(owned),
            header,
            contents: Contents::Complete,
        })
    }

    /// Drops this process's resident copy of the pages under `data` (tensor bytes of this
    /// file that a repacked copy now stands in for): a later read faults them back in from
    /// the file, unchanged. Best effort: a no-op for an in-memory file or bytes from
    /// elsewhere, and a refusal by the kernel is ignored.
    pub fn release(&self, data: &[u8]) {
        #[cfg(unix)]
        if let Backing::Mmap(m) = &self.backing {
            let (base, at) = (m.as_ptr() as usize, data.as_ptr() as usize);
            if at < base || at + data.len() > base + m.len() {
                return;
            }
            // SAFETY: `open` maps the file read-only and shared (`Mmap::map`): MADV_DONTNEED
            // only drops resident pages, and the next read of any byte in them (the range is
            // widened to whole pages) returns the same bytes from the file, so no borrow of
            // the mapping ever sees other contents.
            let _ = unsafe {
                m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at - base, data.len())
            };
        }
    }

    fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mmap(m) => m,
            Backing::Owned(o) => o.as_slice(),
        }
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The metadata key/value pairs.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// The data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// All tensor header entries, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// Whether the tensors' data was read with the header.
    pub fn contents(&self) -> Contents {
        self.contents
    }

    /// The tensor named `name` with its bytes; `None` when there is no such tensor or the file
    /// was opened for its metadata only.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        if self.contents == Contents::MetadataOnly {
            return None;
        }
        let info = self.header.tensors.iter().find(|t| t.name == name)?;
        // The reader checked start + n_bytes <= file length, so these casts and the slice hold.
        let start = (self.header.data_start + info.offset) as usize;
        let data = &self.bytes()[start..start + info.n_bytes as usize];
        Some(TensorView { info, data })
    }

    /// `general.architecture`, e.g. `llama`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.header.metadata.get_str("general.architecture")
    }
}
