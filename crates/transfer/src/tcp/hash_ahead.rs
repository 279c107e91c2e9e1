//! Checksums a connection's submitted pages on a helper thread, a bounded distance ahead of
//! the writer. The writer (kernel copy + TCP stack) is the sender's critical path, so it
//! should find each page's checksum ready; and since the helper stays at most
//! [`LOOKAHEAD_BYTES`] ahead, the page it just hashed is still in cache when the kernel copies
//! it into the socket (one read of the page from memory, not two). A page the helper has not
//! reached yet is hashed by whoever asks first (`OutPage::checksum` computes once).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, Thread};
use std::time::Duration;

use crate::engine::OutPage;

/// How far (in page bytes) the helper may run ahead of the writer: a few pages, well inside
/// the last-level cache.
pub(crate) const LOOKAHEAD_BYTES: u64 = 4 << 20;

/// Writer-side progress the helper paces itself against.
pub(crate) struct Progress {
    sent: AtomicU64,
    closed: AtomicBool,
    helper: Thread,
}

impl Progress {
    /// The writer is done with `bytes` more page bytes (sent, or skipped by a cancel).
    pub(crate) fn advance(&self, bytes: usize) {
        self.sent.fetch_add(bytes as u64, Ordering::Release);
        self.helper.unpark();
    }
}

/// The helper thread's queue; dropping it stops the thread.
pub(crate) struct HashAhead {
    tx: mpsc::Sender<Vec<OutPage>>,
    progress: Arc<Progress>,
}

impl HashAhead {
    /// Starts the helper thread.
    pub(crate) fn spawn() -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Vec<OutPage>>();
        let (ptx, prx) = mpsc::sync_channel::<Arc<Progress>>(1);
        let handle = thread::Builder::new()
            .name("pw-transfer-hash".into())
            .spawn(move || {
                let Ok(progress) = prx.recv() else { return };
                let mut hashed = 0u64;
                for batch in rx {
                    for p in &batch {
                        while hashed >= progress.sent.load(Ordering::Acquire) + LOOKAHEAD_BYTES {
                            if progress.closed.load(Ordering::Acquire) {
                                return;
                            }
                            thread::park_timeout(Duration::from_millis(10));
                        }
                        p.checksum();
                        hashed += p.src.len() as u64;
                    }
                }
            })?;
        let progress = Arc::new(Progress {
            sent: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            helper: handle.thread().clone(),
        });
        let _ = ptx.send(progress.clone());
        Ok(Self { tx, progress })
    }

    /// Queues a submitted batch (in submission order).
    pub(crate) fn queue(&self, pages: Vec<OutPage>) {
        let _ = self.tx.send(pages);
    }

    /// The handle the writer reports its progress on.
    pub(crate) fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }
}

impl Drop for HashAhead {
    fn drop(&mut self) {
        self.progress.closed.store(true, Ordering::Release);
        self.progress.helper.unpark();
    }
}
