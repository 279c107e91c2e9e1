//! Completion of one submitted batch: poll it, or await it.
//!
//! `Pending --> Completed | Failed | Cancelled`; the terminal state never changes again.

use tokio::sync::watch;

use crate::engine::OutPage;
use crate::frame::BatchId;
use crate::types::WriteError;

/// Why a batch did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchFailure {
    /// The receiver dropped some pages (see the first reason).
    Rejected {
        /// Pages that landed.
        written: u32,
        /// Pages dropped.
        rejected: u32,
        /// Reason of the first drop.
        first: Option<WriteError>,
    },
    /// The connection died before the batch was acknowledged.
    ConnectionLost(String),
}

/// State of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchStatus {
    /// Not yet acknowledged.
    Pending,
    /// Every page landed.
    Completed {
        /// Pages written.
        pages: u32,
    },
    /// Some pages did not land.
    Failed(BatchFailure),
    /// Cancelled before every page was sent.
    Cancelled {
        /// Pages that landed before the cancel took effect.
        written: u32,
    },
}

impl BatchStatus {
    /// Whether the state is terminal.
    pub fn is_done(&self) -> bool {
        match self {
            BatchStatus::Pending => false,
            BatchStatus::Completed { .. }
            | BatchStatus::Failed(_)
            | BatchStatus::Cancelled { .. } => true,
        }
    }
}

/// Sender's handle to a submitted batch.
#[derive(Debug)]
pub struct BatchHandle {
    id: BatchId,
    rx: watch::Receiver<BatchStatus>,
    pages: Vec<OutPage>,
}

/// Backend side of a batch's completion.
#[derive(Debug)]
pub struct BatchCompleter(watch::Sender<BatchStatus>);

impl BatchCompleter {
    /// Sets the terminal state (later calls are ignored).
    pub fn finish(&self, s: BatchStatus) {
        self.0.send_if_modified(|cur| {
            if cur.is_done() {
                false
            } else {
                *cur = s;
                true
            }
        });
    }
}

impl Drop for BatchCompleter {
    fn drop(&mut self) {
        // A backend that forgets a batch must not leave its waiter hanging.
        self.finish(BatchStatus::Failed(BatchFailure::ConnectionLost(
            "batch dropped by the backend".into(),
        )));
    }
}

/// A fresh pending batch of `pages`: the handle for the caller, the completer for the backend.
pub fn new_batch(id: BatchId, pages: &[OutPage]) -> (BatchHandle, BatchCompleter) {
    let (tx, rx) = watch::channel(BatchStatus::Pending);
    // Clones share each page's checksum cell: whoever hashes first, hashes for both.
    let pages = pages.to_vec();
    (BatchHandle { id, rx, pages }, BatchCompleter(tx))
}

impl BatchHandle {
    /// The batch's number on its connection.
    pub fn id(&self) -> BatchId {
        self.id
    }

    /// `(checksum, tokens)` of each page of the batch, in submission order: what the commit
    /// manifest must claim (see `ManifestBuilder::add_sent`). Each page is hashed only once:
    /// pages the backend already sent reuse its checksum, so call this after the batch
    /// completed ([`BatchHandle::wait_ref`]); called earlier it hashes unsent pages itself.
    pub fn sent_pages(&self) -> Vec<(u64, u32)> {
        self.pages
            .iter()
            .map(|p| (p.checksum(), p.tokens))
            .collect()
    }

    /// Current state, without waiting.
    pub fn poll(&self) -> BatchStatus {
        self.rx.borrow().clone()
    }

    /// Waits for the terminal state.
    pub async fn wait(mut self) -> BatchStatus {
        self.wait_ref().await
    }

    /// Waits for the terminal state, keeping the handle (for [`BatchHandle::sent_pages`]).
    pub async fn wait_ref(&mut self) -> BatchStatus {
        match self.rx.wait_for(BatchStatus::is_done).await {
            Ok(s) => s.clone(),
            Err(_) => BatchStatus::Failed(BatchFailure::ConnectionLost("backend gone".into())),
        }
    }
}
