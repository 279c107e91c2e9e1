//! The page, generation and grant types this crate moves, taken from `pagewarden-kvcache` so a
//! frame's fields and a pool's checks can never disagree about what a key or a generation is.

pub use pagewarden_kvcache::{
    manifest_digest, page_checksum, CommitManifest, Generation, GrantKey, PageId, PageWrite,
    WriteError,
};
