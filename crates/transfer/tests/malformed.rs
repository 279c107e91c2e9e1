//! Malformed frames close that connection with a counted reason and touch no page; the pages
//! they aimed at can still be written once, correctly, afterwards.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{owner, page_data, pool, LAYOUT};
use pagewarden_kvcache::{Generation, GrantKey, PageId};
use pagewarden_transfer::frame::{encode, BatchId, Frame, WriteFrame, HEADER_LEN};
use pagewarden_transfer::receiver::ReceiverCounters;
use pagewarden_transfer::types::page_checksum;
use pagewarden_transfer::{PageSink, TcpReceiver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn write_frame(key: GrantKey, page: PageId, generation: Generation, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    encode(
        &mut b,
        &Frame::Write(WriteFrame {
            key,
            batch: BatchId(1),
            page,
            generation,
            tokens: 4,
            checksum: page_checksum(data),
            data,
        }),
    );
    b
}

/// Sends `bytes` (then half-closes if `eof`), and returns once the receiver has closed.
async fn send_raw(addr: std::net::SocketAddr, bytes: &[u8], eof: bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if eof {
        s.shutdown().await.unwrap();
    }
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink))
        .await
        .expect("receiver must close a malformed connection")
        .ok();
    assert!(sink.is_empty(), "no reply to a malformed frame");
}

#[tokio::test]
async fn each_malformed_frame_closes_its_connection_and_writes_nothing() {
    let pool = pool(4);
    let counters = Arc::new(ReceiverCounters::default());
    let rx = TcpReceiver::bind(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(pool.clone()) as Arc<dyn PageSink>,
        counters.clone(),
    )
    .await
    .unwrap();
    let addr = rx.local_addr();
    let res = pool.reserve(owner(1), 4).unwrap();
    let g = res.grant().clone();
    let (page, generation) = g.pages[0];
    let data = page_data(1, 0, LAYOUT.page_bytes());
    let good = write_frame(g.key, page, generation, &data);

    let mut cases: Vec<(&str, Vec<u8>, bool)> = Vec::new();
    let mut b = good.clone();
    b[0] = b'Q';
    cases.push(("bad magic", b, false));
    let mut b = good.clone();
    b[4] = 9;
    cases.push(("bad version", b, false));
    let mut b = good.clone();
    b[5] = 77;
    cases.push(("unknown frame type", b, false));
    let mut b = good.clone();
    b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    cases.push(("oversize length", b, false));
    let mut b = good.clone();
    let dl = HEADER_LEN + 16 + 8 + 4 + 8 + 4 + 8;
    b[dl..dl + 4].copy_from_slice(&7u32.to_le_bytes());
    cases.push(("data length disagrees with payload length", b, false));
    cases.push(("truncated", good[..good.len() / 2].to_vec(), true));
    cases.push((
        "page beyond the pool",
        write_frame(g.key, PageId(4096), generation, &data),
        false,
    ));
    let mut ack = Vec::new();
    encode(&mut ack, &Frame::DrainAck(g.key));
    cases.push(("ack sent the wrong way", ack, false));

    for (i, (what, bytes, eof)) in cases.iter().enumerate() {
        send_raw(addr, bytes, *eof).await;
        let c = counters.snapshot();
        assert_eq!(
            c.malformed_closes,
            i as u64 + 1,
            "{what}: not counted as malformed"
        );
        assert_eq!(c.frames_ok, 0, "{what}: a page landed");
    }

    // The page those frames aimed at is still unwritten: the good frame lands exactly once.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&good).await.unwrap();
    let mut end = Vec::new();
    encode(
        &mut end,
        &Frame::BatchEnd {
            key: g.key,
            batch: BatchId(1),
            pages: 1,
        },
    );
    s.write_all(&end).await.unwrap();
    let mut reply = [0u8; HEADER_LEN + 17];
    s.read_exact(&mut reply).await.unwrap();
    let (f, _) = pagewarden_transfer::frame::decode_from(&reply, 64)
        .unwrap()
        .unwrap();
    match f {
        Frame::BatchAck(a) => {
            assert_eq!((a.written, a.rejected), (1, 0), "{a:?}");
        }
        other => panic!("expected a batch ack, got {other:?}"),
    }
    assert_eq!(counters.snapshot().frames_ok, 1);
    drop(s);
    drop(res);
}

#[tokio::test]
async fn a_frame_under_an_unknown_grant_is_dropped_not_fatal() {
    let pool = pool(4);
    let counters = Arc::new(ReceiverCounters::default());
    let rx = TcpReceiver::bind(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(pool.clone()) as Arc<dyn PageSink>,
        counters.clone(),
    )
    .await
    .unwrap();
    let data = page_data(1, 0, LAYOUT.page_bytes());
    let mut s = TcpStream::connect(rx.local_addr()).await.unwrap();
    s.write_all(&write_frame(
        GrantKey([3; 16]),
        PageId(0),
        Generation(1),
        &data,
    ))
    .await
    .unwrap();
    let mut drain = Vec::new();
    encode(&mut drain, &Frame::Drain(GrantKey([3; 16])));
    s.write_all(&drain).await.unwrap();
    // The connection is still open: the DRAIN after the dropped frame is acknowledged.
    let mut reply = [0u8; HEADER_LEN + 16];
    s.read_exact(&mut reply).await.unwrap();
    assert!(matches!(
        pagewarden_transfer::frame::decode_from(&reply, 64)
            .unwrap()
            .unwrap()
            .0,
        Frame::DrainAck(_)
    ));
    let c = counters.snapshot();
    assert_eq!(c.dropped_total(), 1);
    assert_eq!(c.malformed_closes, 0);
}
