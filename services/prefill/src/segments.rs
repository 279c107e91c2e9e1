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
    /// when two jobs race, the first segment in wins. A pooled segment whose connection has
    /// ended (that decode restarted, or closed it) is dropped and reconnected here, before a
    /// grant's first page could go out on it.
    pub async fn open(&self, addr: &str, sealed: bool) -> Result<SegmentId, WorkerError> {
        {
            let mut open = self.open.lock().await;
            if let Some(&seg) = open.get(addr) {
                if self.backend.segment_open(seg) {
                    return Ok(seg);
                }
                tracing::info!(%addr, "the KV transfer connection had ended: reconnecting");
                open.remove(addr);
                self.backend.close_segment(seg);
            }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pagewarden_kvcache::{KvLayout, KvPool, Owner, PoolConfig, RequestId, TenantId};
    use pagewarden_transfer::{BatchStatus, EngineConfig, PageSink, PageWriteReq};

    use super::*;

    const LAYOUT: KvLayout = KvLayout {
        layers: 1,
        kv_heads: 1,
        head_dim: 8,
        page_size: 4,
    };

    /// A decode's transfer listener on a free port into a fresh pool; its address.
    async fn decode() -> (TcpBackend, KvPool, String) {
        let backend = TcpBackend::new(EngineConfig::default(), "127.0.0.1:0".parse().unwrap());
        let pool = KvPool::new(PoolConfig::with_pages(LAYOUT, 4));
        let desc = backend
            .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
            .await
            .unwrap();
        (backend, pool, desc.addr)
    }

    /// One page written under a fresh reservation of `pool` through `seg`.
    async fn write_one(segments: &Segments, seg: SegmentId, pool: &KvPool) -> BatchStatus {
        let owner = Owner {
            request: RequestId([7; 16]),
            tenant: TenantId::new("tenant"),
        };
        let res = pool.reserve(owner, 4).unwrap();
        let g = res.grant().clone();
        let (page, generation) = g.pages[0];
        let req = PageWriteReq {
            dst_page: page,
            dst_generation: generation,
            tokens: 4,
            src: vec![1u8; LAYOUT.page_bytes()].into(),
        };
        let h = segments.backend().submit_batch(seg, g.key, vec![req]);
        match h {
            Ok(h) => h.wait().await,
            Err(e) => BatchStatus::Failed(pagewarden_transfer::BatchFailure::ConnectionLost(
                e.to_string(),
            )),
        }
    }

    /// A decode that restarts on the same transfer address (as a container does) closed the
    /// pooled connection: the next grant gets a new one, not the dead one (seen failing: the
    /// first request after decode's restart got "KV transfer failed: connection lost").
    #[tokio::test]
    async fn a_connection_the_restarted_decode_closed_is_replaced() {
        let segments = Segments::new(TcpBackend::new(
            EngineConfig::default(),
            "127.0.0.1:0".parse().unwrap(),
        ));
        let (first, pool, addr) = decode().await;
        let seg = segments.open(&addr, false).await.unwrap();
        assert_eq!(
            write_one(&segments, seg, &pool).await,
            BatchStatus::Completed { pages: 1 }
        );
        assert_eq!(segments.open(&addr, false).await.unwrap(), seg, "reused");

        drop(first);
        // The old listener lets go of the port as its task ends.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let (_second, pool) = loop {
            let backend = TcpBackend::new(EngineConfig::default(), addr.parse().unwrap());
            let pool = KvPool::new(PoolConfig::with_pages(LAYOUT, 4));
            let sink = Arc::new(pool.clone()) as Arc<dyn PageSink>;
            match backend.register_segment(sink).await {
                Ok(desc) => {
                    assert_eq!(desc.addr, addr);
                    break (backend, pool);
                }
                Err(e) => assert!(tokio::time::Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        while segments.backend().segment_open(seg) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the close was never seen"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let fresh = segments.open(&addr, false).await.unwrap();
        assert_ne!(fresh, seg);
        assert_eq!(
            write_one(&segments, fresh, &pool).await,
            BatchStatus::Completed { pages: 1 }
        );
    }
}
