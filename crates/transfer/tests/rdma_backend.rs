//! The RDMA backend (feature `rdma`). On a host without an RDMA device (CI, the development
//! box) it must refuse to start with a typed `Unsupported` error, not panic. On a host with a
//! device, the same test moves a grant's pages through it into a real pool and commits, and
//! checks that a revoked grant gets no window (its batch is rejected, nothing lands).
#![cfg(feature = "rdma")]

mod common;

use std::sync::Arc;

use common::{manifest_for, owner, page_data, pool, reqs_for, LAYOUT};
use pagewarden_transfer::rdma::RdmaBackend;
use pagewarden_transfer::{
    BatchFailure, BatchStatus, EngineConfig, PageSink, TransferBackend, TransferError,
};

fn backend() -> Result<RdmaBackend, TransferError> {
    RdmaBackend::new(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
}

#[tokio::test]
async fn rdma_backend_reports_a_missing_device_or_moves_pages_through_one() {
    let decode = match backend() {
        Err(TransferError::Unsupported(msg)) => {
            assert!(
                msg.contains("RDMA device"),
                "the error must say what is missing: {msg}"
            );
            let has_device = std::fs::read_dir("/sys/class/infiniband")
                .map(|mut d| d.next().is_some())
                .unwrap_or(false);
            assert!(
                !has_device,
                "a device is present but could not be opened: {msg}"
            );
            return;
        }
        Err(e) => panic!("expected Unsupported without a device, got {e}"),
        Ok(b) => b,
    };
    // A device is present: a real transfer over it.
    let pool = pool(8);
    let desc = decode
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    let prefill = backend().unwrap();
    let seg = prefill.open_segment(&desc).await.unwrap();
    let res = pool.reserve(owner(1), 10).unwrap();
    let g = res.grant().clone();
    let reqs = reqs_for(&g, 1, LAYOUT.page_bytes());
    let manifest = manifest_for(&g, &reqs);
    let h = prefill.submit_batch(seg, g.key, reqs).unwrap();
    assert_eq!(h.wait().await, BatchStatus::Completed { pages: 3 });
    prefill.drain(seg, g.key).await.unwrap();
    let readable = res.commit(&manifest).expect("commit");
    for i in 0..3 {
        assert_eq!(
            readable.page_bytes(i).unwrap(),
            page_data(1, i, LAYOUT.page_bytes()).as_slice()
        );
    }

    // A revoked grant: no window, the batch is rejected, nothing lands.
    let res = pool.reserve(owner(2), 4).unwrap();
    let g = res.grant().clone();
    res.abort();
    let h = prefill
        .submit_batch(seg, g.key, reqs_for(&g, 2, LAYOUT.page_bytes()))
        .unwrap();
    assert!(matches!(
        h.wait().await,
        BatchStatus::Failed(BatchFailure::Rejected { written: 0, .. })
    ));
}
