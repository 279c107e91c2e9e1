//! Sync shim: the free list's mutex is loom's under `--cfg loom`, std's otherwise.

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
