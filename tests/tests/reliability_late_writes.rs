//! Late writes: requests of 8 tenants aborted at random points of their transfer,
//! with the transport holding some writes and executing them late, at random later steps
//! (while other tenants' requests reserve, commit and read the same pages). Seeded. Every
//! readable request's KV is scanned for other tenants' markers: zero foreign reads over
//! ≥ 1,000 aborted requests. The same storm with grant fencing off (and a transport that
//! confirms drains early) must show foreign reads: the positive control.

#[allow(dead_code)]
#[path = "../src/harness/mod.rs"]
mod harness;

use std::collections::HashMap;

use bytes::Bytes;
use harness::cluster::{Cluster, LAYOUT};
use harness::layers::Layers;
use harness::markers::{contains_marker, contains_marker_fragment, Tenant};
use pagewarden_common::test_switches::Switch;
use pagewarden_kvcache::{
    page_checksum, CommitManifest, GrantKey, Owner, PageWrite, ReadablePages, RequestId, TenantId,
};
use pagewarden_transfer::{BatchStatus, PageWriteReq, TransferBackend};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TENANTS: [Tenant; 8] = [
    Tenant {
        name: "t0",
        marker: "<MARK-T0-a1b2c3>",
    },
    Tenant {
        name: "t1",
        marker: "<MARK-T1-d4e5f6>",
    },
    Tenant {
        name: "t2",
        marker: "<MARK-T2-0a9b8c>",
    },
    Tenant {
        name: "t3",
        marker: "<MARK-T3-7d6e5f>",
    },
    Tenant {
        name: "t4",
        marker: "<MARK-T4-4a3b2c>",
    },
    Tenant {
        name: "t5",
        marker: "<MARK-T5-1d0e9f>",
    },
    Tenant {
        name: "t6",
        marker: "<MARK-T6-8a7b6c>",
    },
    Tenant {
        name: "t7",
        marker: "<MARK-T7-5d4e3f>",
    },
];

struct Held {
    due: u64,
    key: GrantKey,
    page: pagewarden_kvcache::PageId,
    generation: pagewarden_kvcache::Generation,
    tokens: u32,
    data: Bytes,
}

#[derive(Default, Debug)]
struct Tally {
    aborted: usize,
    served: usize,
    reads: usize,
    foreign_reads: usize,
    late_executed: usize,
    late_rejected: usize,
}

fn foreign(bytes: &[u8], me: usize) -> bool {
    TENANTS.iter().enumerate().any(|(i, t)| {
        i != me && (contains_marker(bytes, t.marker) || contains_marker_fragment(bytes, t.marker))
    })
}

/// Reads every page of `r` (tenant `me`); counts a foreign read if any other marker shows.
fn check(r: &ReadablePages, me: usize, tally: &mut Tally) {
    for i in 0..r.table().len() {
        let b = r.page_bytes(i).expect("own page at its generation");
        tally.reads += 1;
        if foreign(b, me) {
            tally.foreign_reads += 1;
        }
    }
}

async fn storm(layers: Layers, seed: u64, aborts: usize, early_drain: f64) -> Tally {
    let c = Cluster::with_pages(layers, 48, 64).await;
    let (backend, seg) = c.transfer();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let mut held: Vec<Held> = Vec::new();
    let mut undrained: HashMap<GrantKey, usize> = HashMap::new();
    let mut live: Vec<(ReadablePages, usize)> = Vec::new();
    let mut step = 0u64;
    while tally.aborted < aborts {
        step += 1;
        // Execute the late writes that are due.
        let (due, rest): (Vec<Held>, Vec<Held>) = held.drain(..).partition(|h| h.due <= step);
        held = rest;
        for h in due {
            tally.late_executed += 1;
            let w = PageWrite {
                key: h.key,
                page: h.page,
                generation: h.generation,
                tokens: h.tokens,
                data: &h.data,
                checksum: page_checksum(&h.data),
            };
            if c.decode.write_page(w).is_err() {
                tally.late_rejected += 1;
            }
            if let Some(n) = undrained.get_mut(&h.key) {
                *n -= 1;
                if *n == 0 {
                    undrained.remove(&h.key);
                    c.decode.mark_drained(h.key);
                }
            }
        }
        // Read and retire some live requests.
        live.retain(|(r, me)| {
            check(r, *me, &mut tally);
            rng.random_bool(0.5)
        });
        // A new request.
        let me = rng.random_range(0..TENANTS.len());
        let t = &TENANTS[me];
        let prompt = rng.random_range(1..=96);
        let owner = Owner {
            request: RequestId::random(),
            tenant: TenantId::new(t.name),
        };
        let Ok(reserved) = c.decode.reserve(owner, prompt) else {
            // Pool full of draining pages: let every held write land (or be refused).
            for h in held.iter_mut() {
                h.due = step + 1;
            }
            live.clear();
            continue;
        };
        let grant = reserved.grant().clone();
        let seq = c.prefill_compute(t, prompt).expect("prefill pool has room");
        let pages: Vec<PageWriteReq> = grant
            .pages
            .iter()
            .enumerate()
            .map(|(i, &(page, generation))| PageWriteReq {
                dst_page: page,
                dst_generation: generation,
                tokens: grant.tokens_in_page(i) as u32,
                src: Bytes::copy_from_slice(seq.page_bytes(i).expect("own page")),
            })
            .collect();
        drop(seq);
        if rng.random_bool(0.2) {
            // Served: every page lands, commit, read now or later.
            let sums = pages.iter().map(|p| page_checksum(&p.src)).collect();
            let st = backend
                .submit_batch(seg, grant.key, pages)
                .expect("submit")
                .wait()
                .await;
            assert!(matches!(st, BatchStatus::Completed { .. }), "{st:?}");
            backend.drain(seg, grant.key).await.expect("drain");
            let r = reserved
                .commit(&CommitManifest::new(grant.key, prompt, sums))
                .expect("clean commit");
            tally.served += 1;
            check(&r, me, &mut tally);
            live.push((r, me));
            continue;
        }
        // Aborted at a random point: some pages sent, some held by the transport, the rest
        // never sent.
        let n = pages.len();
        let sent = rng.random_range(0..=n);
        let held_n = rng.random_range(0..=n - sent);
        let mut it = pages.into_iter();
        let now: Vec<PageWriteReq> = it.by_ref().take(sent).collect();
        if !now.is_empty() {
            let _ = backend
                .submit_batch(seg, grant.key, now)
                .expect("submit")
                .wait()
                .await;
        }
        for p in it.take(held_n) {
            held.push(Held {
                due: step + rng.random_range(1..=12),
                key: grant.key,
                page: p.dst_page,
                generation: p.dst_generation,
                tokens: p.tokens,
                data: p.src,
            });
        }
        reserved.abort();
        tally.aborted += 1;
        if held_n == 0 || rng.random_bool(early_drain) {
            // The transport confirms the drain now (early, if writes are still held).
            backend.cancel(seg, grant.key).await.expect("cancel");
        } else {
            undrained.insert(grant.key, held_n);
        }
    }
    live.clear();
    for h in held.drain(..) {
        let w = PageWrite {
            key: h.key,
            page: h.page,
            generation: h.generation,
            tokens: h.tokens,
            data: &h.data,
            checksum: page_checksum(&h.data),
        };
        tally.late_executed += 1;
        if c.decode.write_page(w).is_err() {
            tally.late_rejected += 1;
        }
    }
    for k in undrained.into_keys() {
        c.decode.mark_drained(k);
    }
    let s = c.decode.stats();
    assert_eq!(
        s.free, 48,
        "decode pool not all free after the storm: {s:?}"
    );
    let _ = LAYOUT;
    tally
}

#[tokio::test]
async fn zero_foreign_reads_over_1200_aborted_requests() {
    for seed in [1u64, 2, 3] {
        let t = storm(Layers::all_on(), seed, 400, 0.5).await;
        eprintln!("seed {seed}: {t:?}");
        assert!(t.aborted >= 400 && t.served > 50 && t.reads > 500, "{t:?}");
        assert!(
            t.late_executed > 200,
            "too few late writes exercised: {t:?}"
        );
        assert_eq!(
            t.late_rejected, t.late_executed,
            "a late write landed: {t:?}"
        );
        assert_eq!(t.foreign_reads, 0, "seed {seed}: foreign read: {t:?}");
    }
}

#[tokio::test]
async fn positive_control_without_fencing_late_writes_are_read_by_other_tenants() {
    let t = storm(Layers::without(Switch::GrantFencing), 7, 300, 1.0).await;
    eprintln!("fencing off: {t:?}");
    assert!(
        t.foreign_reads > 0,
        "no foreign read without the fence: the storm is too weak: {t:?}"
    );
}
