//! A flipped bit or a swapped page in transit makes commit fail, never admit: through the
//! in-memory backend's tamper hook, and through a bit-flipping TCP proxy.

mod common;

use std::sync::Arc;

use common::{manifest_for, owner, pool, reqs_for, LAYOUT};
use pagewarden_kvcache::{CommitError, KvPool, WriteError};
use pagewarden_transfer::frame::{HEADER_LEN, WRITE_FIXED_LEN};
use pagewarden_transfer::memory::Tamper;
use pagewarden_transfer::types::page_checksum;
use pagewarden_transfer::{
    BatchFailure, BatchStatus, EngineConfig, MemoryBackend, PageSink, TcpBackend, TransferBackend,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Offsets inside an encoded WRITE frame.
const PAGE_AT: usize = HEADER_LEN + 16 + 8;
const CHECKSUM_AT: usize = HEADER_LEN + 16 + 8 + 4 + 8 + 4;
const DATA_AT: usize = HEADER_LEN + WRITE_FIXED_LEN;

/// Writes 3 pages through a tampering in-memory backend, then commits the honest manifest.
async fn transfer_with(tamper: Tamper) -> (BatchStatus, Result<(), CommitError>, KvPool) {
    let pool = pool(8);
    let be = MemoryBackend::new(EngineConfig::default()).with_tamper(tamper);
    let desc = be
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    let seg = be.open_segment(&desc).await.unwrap();
    let res = pool.reserve(owner(1), 12).unwrap();
    let g = res.grant().clone();
    let reqs = reqs_for(&g, 1, LAYOUT.page_bytes());
    let st = be
        .submit_batch(seg, g.key, reqs.clone())
        .unwrap()
        .wait()
        .await;
    let commit = res.commit(&manifest_for(&g, &reqs)).map(drop);
    (st, commit, pool)
}

#[tokio::test]
async fn untampered_transfer_commits() {
    let (st, commit, _) = transfer_with(Arc::new(|_: &mut Vec<Vec<u8>>| {})).await;
    assert_eq!(st, BatchStatus::Completed { pages: 3 });
    commit.expect("an honest transfer must commit");
}

#[tokio::test]
async fn a_flipped_bit_is_dropped_at_the_receiver_and_commit_fails() {
    let (st, commit, pool) = transfer_with(Arc::new(|f: &mut Vec<Vec<u8>>| {
        f[1][DATA_AT + 17] ^= 0x04;
    }))
    .await;
    assert!(matches!(
        st,
        BatchStatus::Failed(BatchFailure::Rejected {
            first: Some(WriteError::ChecksumMismatch),
            ..
        })
    ));
    assert!(
        matches!(commit, Err(CommitError::PageNotWritten(_))),
        "{commit:?}"
    );
    assert_eq!(pool.stats().readable, 0);
}

#[tokio::test]
async fn a_flipped_bit_with_a_forged_frame_checksum_lands_but_commit_fails() {
    let (st, commit, _) = transfer_with(Arc::new(|f: &mut Vec<Vec<u8>>| {
        let fr = &mut f[2];
        fr[DATA_AT + 3] ^= 0x80;
        let sum = page_checksum(&fr[DATA_AT..]);
        fr[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
    }))
    .await;
    assert_eq!(
        st,
        BatchStatus::Completed { pages: 3 },
        "the forged frame is self-consistent"
    );
    assert!(
        matches!(commit, Err(CommitError::ChecksumMismatch(_))),
        "{commit:?}"
    );
}

#[tokio::test]
async fn swapped_pages_land_but_commit_fails() {
    let (st, commit, _) = transfer_with(Arc::new(|f: &mut Vec<Vec<u8>>| {
        // Exchange the destination page (and generation) of the first two writes.
        let (a, b) = f.split_at_mut(1);
        let span = PAGE_AT..PAGE_AT + 12;
        let tmp = a[0][span.clone()].to_vec();
        a[0][span.clone()].copy_from_slice(&b[0][span.clone()]);
        b[0][span].copy_from_slice(&tmp);
    }))
    .await;
    assert_eq!(st, BatchStatus::Completed { pages: 3 });
    assert!(
        matches!(commit, Err(CommitError::ChecksumMismatch(_))),
        "{commit:?}"
    );
}

#[tokio::test]
async fn a_bit_flipped_on_the_tcp_wire_never_commits() {
    let pool = pool(8);
    let decode = TcpBackend::new(EngineConfig::default(), "127.0.0.1:0".parse().unwrap());
    let desc = decode
        .register_segment(Arc::new(pool.clone()) as Arc<dyn PageSink>)
        .await
        .unwrap();
    // A proxy that flips one bit of the first frame's page data on its way through.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = proxy.local_addr().unwrap();
    let upstream = desc.addr.clone();
    tokio::spawn(async move {
        let (client, _) = proxy.accept().await.unwrap();
        let server = tokio::net::TcpStream::connect(upstream).await.unwrap();
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut sr, &mut cw).await });
        let mut seen = 0usize;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = cr.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            let flip = DATA_AT + 100;
            if (seen..seen + n).contains(&flip) {
                buf[flip - seen] ^= 1;
            }
            seen += n;
            sw.write_all(&buf[..n]).await.unwrap();
        }
    });
    let prefill = TcpBackend::new(EngineConfig::default(), "127.0.0.1:0".parse().unwrap());
    let seg = prefill
        .open_segment(&pagewarden_transfer::SegmentDesc {
            addr: proxy_addr.to_string(),
        })
        .await
        .unwrap();
    let res = pool.reserve(owner(1), 12).unwrap();
    let g = res.grant().clone();
    let reqs = reqs_for(&g, 1, LAYOUT.page_bytes());
    let st = prefill
        .submit_batch(seg, g.key, reqs.clone())
        .unwrap()
        .wait()
        .await;
    assert!(matches!(
        st,
        BatchStatus::Failed(BatchFailure::Rejected {
            written: 2,
            rejected: 1,
            first: Some(WriteError::ChecksumMismatch)
        })
    ));
    let commit = res.commit(&manifest_for(&g, &reqs));
    assert!(
        matches!(commit, Err(CommitError::PageNotWritten(_))),
        "{:?}",
        commit.map(drop)
    );
    assert_eq!(
        decode
            .receiver_counters()
            .snapshot()
            .dropped_for(WriteError::ChecksumMismatch),
        1
    );
}
