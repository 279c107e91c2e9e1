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
    /// Set by the helper before it parks; while set it waits to be woken.
    parked_at: AtomicU64,
    closed: AtomicBool,
    helper: Thread,
}

/// `parked_at` value meaning "the helper is running".
const RUNNING: u64 = u64::MAX;

impl Progress {
    /// The writer is done with `bytes` more page bytes (sent, or skipped by a cancel). Wakes
    /// the helper only once the writer has consumed half of its lead, so a wake-up (a futex
    /// call and a context switch) is paid every few pages, not on every page.
    pub(crate) fn advance(&self, bytes: usize) {
        let sent = self.sent.fetch_add(bytes as u64, Ordering::AcqRel) + bytes as u64;
        let at = self.parked_at.load(Ordering::Acquire);
        if at != RUNNING && sent + LOOKAHEAD_BYTES / 2 >= at {
            self.parked_at.store(RUNNING, Ordering::Release);
            self.helper.unpark();
        }
    }
}

/// Fewest cores for which a helper thread pays off. Measured on a busy 2-core host, the
/// helper cost ~7% more CPU per transfer (wake-ups, a third runnable thread) for no gain in
/// goodput; there the writer hashes each page itself, right before sending it.
pub(crate) const MIN_CORES: usize = 4;

/// Whether this host has enough cores for a helper.
pub(crate) fn worthwhile() -> bool {
    thread::available_parallelism().is_ok_and(|n| n.get() >= MIN_CORES)
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
                            progress.parked_at.store(hashed, Ordering::Release);
                            // Re-check after announcing: the writer may have moved meanwhile.
                            if hashed < progress.sent.load(Ordering::Acquire) + LOOKAHEAD_BYTES {
                                progress.parked_at.store(RUNNING, Ordering::Release);
                                break;
                            }
                            thread::park_timeout(Duration::from_millis(10));
                            progress.parked_at.store(RUNNING, Ordering::Release);
                        }
                        p.checksum();
                        hashed += p.src.len() as u64;
                    }
                }
            })?;
        let progress = Arc::new(Progress {
            sent: AtomicU64::new(0),
            parked_at: AtomicU64::new(RUNNING),
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::types::{Generation, PageId};

    fn hashed(pages: &[OutPage]) -> usize {
        pages
            .iter()
            .filter(|p| p.checksum_if_computed().is_some())
            .count()
    }

    /// Real time: the hashing helper is a real thread, polled until it caught up.
    fn settle(pages: &[OutPage], want: usize) -> usize {
        for _ in 0..500 {
            if hashed(pages) >= want {
                break;
            }
            thread::sleep(Duration::from_millis(2));
        }
        // Give a helper that would overrun its lead the time to do it.
        thread::sleep(Duration::from_millis(30));
        hashed(pages)
    }

    #[test]
    fn the_helper_stays_within_its_lead_and_catches_up_when_the_writer_moves() {
        const MIB: usize = 1 << 20;
        let pages: Vec<OutPage> = (0..12u8)
            .map(|i| {
                OutPage::new(
                    PageId(i.into()),
                    Generation(1),
                    1,
                    Bytes::from(vec![i; MIB]),
                )
            })
            .collect();
        let h = HashAhead::spawn().unwrap();
        h.queue(pages.clone());
        let lead = (LOOKAHEAD_BYTES as usize) / MIB;
        assert_eq!(settle(&pages, lead), lead, "no further ahead than its lead");
        let progress = h.progress();
        progress.advance(lead * MIB);
        assert_eq!(settle(&pages, 2 * lead), 2 * lead);
        progress.advance(12 * MIB);
        assert_eq!(settle(&pages, 12), 12);
        for p in &pages {
            assert_eq!(p.checksum(), crate::types::page_checksum(&p.src));
        }
        drop(h);
    }
}
