//! Typed errors for reading GGUF files; every malformed input maps to one of these.

use std::path::PathBuf;

/// Why a GGUF file could not be opened or a metadata key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or memory-mapped.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    /// The version is not 2 or 3 (1 is obsolete; a byte-swapped number means a big-endian file).
    #[error("unsupported GGUF version {0} (supported: 2, 3; big-endian files are not supported)")]
    UnsupportedVersion(u32),
    /// The file ends before a field that the header says is there.
    #[error("truncated GGUF file: {what} needs {needed} bytes at offset {offset}, file has {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Byte offset of the read.
        offset: u64,
        /// Bytes the read needed.
        needed: u64,
        /// Total file length.
        len: u64,
    },
    /// A count or length is larger than the file could possibly hold.
    #[error("absurd {what}: {count} (at most {limit} fit in this file)")]
    AbsurdCount {
        /// What was counted.
        what: String,
        /// The declared count.
        count: u64,
        /// The largest count that could fit.
        limit: u64,
    },
    /// A size computation overflowed.
    #[error("integer overflow computing {0}")]
    Overflow(String),
    /// A string is not valid UTF-8.
    #[error("invalid UTF-8 in {0}")]
    InvalidUtf8(String),
    /// A metadata value has a type id outside the GGUF spec.
    #[error("metadata key {key:?} has unknown value type {type_id}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The raw type id.
        type_id: u32,
    },
    /// Arrays of arrays nested deeper than the reader accepts.
    #[error("metadata key {0:?} nests arrays too deeply")]
    NestingTooDeep(String),
    /// A tensor has a ggml type id this reader does not know.
    #[error("tensor {tensor:?} has unknown ggml type {type_id}")]
    UnknownTensorType {
        /// The tensor name.
        tensor: String,
        /// The raw type id.
        type_id: u32,
    },
    /// A tensor's type is known but this crate cannot compute with it.
    #[error("tensor {tensor:?} has unsupported ggml type {ty}")]
    UnsupportedTensorType {
        /// The tensor name.
        tensor: String,
        /// The type name.
        ty: &'static str,
    },
    /// The same metadata key appears twice.
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    /// The same tensor name appears twice.
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    /// A tensor's shape is invalid (too many dims, row not a multiple of the block size).
    #[error("tensor {tensor:?} has a bad shape: {reason}")]
    BadShape {
        /// The tensor name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("bad general.alignment {0}: must be a non-zero power of two")]
    BadAlignment(u64),
    /// A tensor's offset is not a multiple of the alignment.
    #[error("tensor {tensor:?} offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        /// The tensor name.
        tensor: String,
        /// The offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's data does not lie inside the file.
    #[error(
        "tensor {tensor:?} data [{start}, {start}+{size}) lies outside the file ({len} bytes): \
         the file is truncated or corrupt (a partial download, or one part of a split file?); \
         its metadata can be read, but it cannot be loaded as a model"
    )]
    TensorOutOfBounds {
        /// The tensor name.
        tensor: String,
        /// Absolute start offset.
        start: u64,
        /// Size in bytes.
        size: u64,
        /// File length.
        len: u64,
    },
    /// A file opened for its metadata only was used where tensor data is needed.
    #[error("the file was opened for its metadata only (it may be truncated): it cannot be loaded as a model")]
    MetadataOnly,
    /// A required metadata key is absent.
    #[error("missing metadata key {0:?}")]
    MissingKey(String),
    /// A metadata key holds a value of another type.
    #[error("metadata key {key:?} is {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// The type that was wanted.
        expected: &'static str,
        /// The type that is stored.
        found: &'static str,
    },
}
