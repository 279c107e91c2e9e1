//! Sync shim: the free list's mutex is loom's under `--cfg pagewarden_loom`, std's otherwise.

#[cfg(pagewarden_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(pagewarden_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
