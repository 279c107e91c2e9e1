//! Open transfer segments, one per decode worker's transfer address, reopened after a failure.
//! A decode whose listener seals frames is reached in plain TCP (its grants carry the seal),
//! any other under this worker's TLS when it has one.

use std::collections::HashMap;
use std::sync::Arc;

use pagewarden_transfer::{SegmentDesc, SegmentId, TcpBackend, TransferBackend};
use pagewarden_worker::WorkerError;

/// The TCP transfer backend and its open segments.
#[derive(Clone)]
pub struct Segments {
    backend: Arc<TcpBackend>,
    open: Arc<tokio::sync::Mutex<HashMap<String, SegmentId>>>,
}

impl Segments {
    pub fn new(backend: TcpBackend) -> Self {
        Self {
            backend: Arc::new(backend),
            open: Arc::default(),
        }
    }

    pub fn backend(&self) -> &TcpBackend {
        &self.backend
    }

    /// The open segment for `addr`, connecting if needed (`sealed`: the grant says its
    /// listener seals frames). The connect (bounded by the transfer's connect timeout) runs
    /// outside the lock, so one unreachable decode never stalls jobs bound for the others;
    /// when two jobs race, the first segment in wins.
    pub async fn open(&self, addr: &str, sealed: bool) -> Result<SegmentId, WorkerError> {
        if let Some(seg) = self.open.lock().await.get(addr) {
            return Ok(*seg);
        }
        let desc = SegmentDesc {
            addr: addr.to_string(),
        };
        let opened = match sealed {
            true => self.backend.open_sealed_segment(&desc).await,
            false => self.backend.open_segment(&desc).await,
        };
        let seg = opened.map_err(|e| {
            WorkerError::Unavailable(format!("cannot reach decode transfer listener {addr}: {e}"))
        })?;
        let mut open = self.open.lock().await;
        if let Some(&first) = open.get(addr) {
            self.backend.close_segment(seg);
            return Ok(first);
        }
        open.insert(addr.to_string(), seg);
        Ok(seg)
    }

    /// Drops a failed segment so the next job reconnects.
    pub fn forget(&self, addr: &str, seg: SegmentId) {
        self.backend.close_segment(seg);
        if let Ok(mut open) = self.open.try_lock() {
            if open.get(addr) == Some(&seg) {
                open.remove(addr);
            }
        } else {
            let open = self.open.clone();
            let addr = addr.to_string();
            tokio::spawn(async move {
                let mut open = open.lock().await;
                if open.get(&addr) == Some(&seg) {
                    open.remove(&addr);
                }
            });
        }
    }
}
