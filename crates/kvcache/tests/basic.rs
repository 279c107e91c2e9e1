//! Unit-level behaviour of the pool: reserve errors, the write fence, commit verification,
//! deferred release, reads.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_kvcache::{
    page_checksum, CommitError, CommitManifest, Generation, KvLayout, KvPool, ManualClock,
    PageState, PageWrite, PoolConfig, PoolStats, ReadError, ReserveError, WriteError,
};
use support::{fill, owner, pool, write_all, LAYOUT};

fn states(pool: &KvPool) -> Vec<(Option<PageState>, Option<Generation>)> {
    (0..pool.capacity_pages() as u32)
        .map(|p| {
            let p = pagewarden_kvcache::PageId(p);
            (pool.page_state(p), pool.generation(p))
        })
        .collect()
}

#[test]
fn over_capacity_reserve_fails_before_any_page_changes() {
    let pool = pool(4);
    let _held = pool.allocate(owner(9), 5).unwrap(); // 2 pages used, 2 free
    let before = states(&pool);
    let stats = pool.stats();
    assert_eq!(
        pool.reserve(owner(1), 17).unwrap_err(),
        ReserveError::TooLarge {
            requested_tokens: 17,
            capacity_tokens: 16
        }
    );
    assert_eq!(
        pool.reserve(owner(1), 9).unwrap_err(),
        ReserveError::Exhausted {
            requested_pages: 3,
            free_pages: 2
        }
    );
    assert_eq!(
        pool.allocate(owner(1), 0).unwrap_err(),
        ReserveError::ZeroTokens
    );
    assert_eq!(states(&pool), before);
    assert_eq!(pool.stats(), stats);
    assert_eq!(pool.metrics().snapshot().allocations, 2);
}

#[test]
fn reserve_commit_read_roundtrip() {
    let pool = pool(4);
    let r = pool.reserve(owner(1), 6).unwrap();
    assert_eq!(pool.stats().reserved, 2);
    let m = write_all(&pool, &r, 1);
    let pages = r.commit(&m).unwrap();
    assert_eq!(pages.len(), 6);
    assert_eq!(pages.capacity(), 8);
    assert_eq!(pool.stats().readable, 2);
    for (i, &(page, generation)) in pages.table().iter().enumerate() {
        assert_eq!(
            pages.page_bytes(i).unwrap(),
            fill(LAYOUT, 1, page, generation)
        );
        let (k, v) = pages.layer_block(1, i).unwrap();
        assert_eq!(k.len(), LAYOUT.block_elems());
        let bytes = fill(LAYOUT, 1, page, generation);
        let off = LAYOUT.block_offset(1, 1) * 2;
        assert_eq!(
            v[0].to_bits(),
            u16::from_le_bytes([bytes[off], bytes[off + 1]])
        );
    }
    drop(pages);
    assert_eq!(pool.stats().free, 4);
    assert_eq!(pool.metrics().snapshot().releases, 2);
}

#[test]
fn local_allocation_rows_land_in_layer_blocks() {
    let pool = pool(4);
    let mut pages = pool.allocate(owner(1), 3).unwrap();
    pages.grow(7).unwrap();
    assert_eq!(pages.table().len(), 2);
    for pos in 0..7 {
        let (k, v) = pages.kv_row_mut(1, pos).unwrap();
        k.fill(half::f16::from_f32(pos as f32));
        v.fill(half::f16::from_f32(-(pos as f32)));
    }
    pages.set_len(7);
    let (k, v) = pages.layer_block(1, 1).unwrap();
    let tw = LAYOUT.token_width();
    assert_eq!(k[2 * tw].to_f32(), 6.0);
    assert_eq!(v[2 * tw + 3].to_f32(), -6.0);
    assert_eq!(pages.layer_block(2, 0).unwrap_err(), ReadError::OutOfRange);
    assert_eq!(pages.layer_block(0, 2).unwrap_err(), ReadError::OutOfRange);
    assert!(pages.kv_row_mut(0, 8).is_err());
    assert_eq!(
        pages.grow(17).unwrap_err(),
        ReserveError::TooLarge {
            requested_tokens: 17,
            capacity_tokens: 16
        }
    );
}

#[test]
fn read_with_stale_generation_is_refused_and_counted() {
    let pool = pool(2);
    let mut pages = pool.allocate(owner(1), 4).unwrap();
    let (page, generation) = pages.table()[0];
    pages.test_set_table_generation(0, Generation(generation.0 + 7));
    assert_eq!(
        pages.layer_block(0, 0).unwrap_err(),
        ReadError::GenerationMismatch {
            page,
            expected: Generation(generation.0 + 7),
            current: generation
        }
    );
    assert!(pages.page_bytes(0).is_err());
    assert!(pages.kv_row_mut(0, 0).is_err());
    assert_eq!(pool.metrics().snapshot().generation_mismatches, 3);
}

#[test]
fn generation_bumps_on_every_allocation() {
    let pool = pool(1);
    let g1 = pool.allocate(owner(1), 1).unwrap().table()[0].1;
    let g2 = pool.allocate(owner(2), 1).unwrap().table()[0].1;
    assert!(g2 > g1);
}

#[test]
fn every_write_error_is_dropped_and_counted() {
    let pool = pool(4);
    let r = pool.reserve(owner(1), 5).unwrap();
    let g = r.grant().clone();
    let (page, generation) = g.pages[0];
    let data = fill(LAYOUT, 1, page, generation);
    let sum = page_checksum(&data);
    let w = PageWrite {
        key: g.key,
        page,
        generation,
        tokens: 4,
        data: &data,
        checksum: sum,
    };
    let other = pool.allocate(owner(2), 1).unwrap().table()[0].0;
    let cases = [
        (
            PageWrite {
                key: pagewarden_kvcache::GrantKey::random(),
                ..w
            },
            WriteError::UnknownGrant,
        ),
        (PageWrite { page: other, ..w }, WriteError::WrongPage),
        (
            PageWrite {
                page: pagewarden_kvcache::PageId(99),
                ..w
            },
            WriteError::WrongPage,
        ),
        (
            PageWrite {
                generation: Generation(generation.0 + 1),
                ..w
            },
            WriteError::StaleGeneration,
        ),
        (
            PageWrite {
                data: &data[1..],
                ..w
            },
            WriteError::BadLength,
        ),
        (PageWrite { tokens: 5, ..w }, WriteError::TooManyTokens),
        (
            PageWrite {
                checksum: sum ^ 1,
                ..w
            },
            WriteError::ChecksumMismatch,
        ),
    ];
    for (bad, want) in cases {
        assert_eq!(pool.write_page(bad), Err(want), "{want:?}");
    }
    // Nothing above landed.
    let before = pool.metrics().snapshot();
    assert_eq!(before.write_rejections(), 7);
    pool.write_page(w).unwrap();
    assert_eq!(pool.write_page(w), Err(WriteError::DuplicateWrite));
    let s = pool.metrics().snapshot();
    assert_eq!(
        (
            s.write_unknown_grant,
            s.write_wrong_page,
            s.write_stale_generation,
            s.write_bad_length,
            s.write_too_many_tokens,
            s.write_checksum_mismatch,
            s.write_duplicate
        ),
        (1, 2, 1, 1, 1, 1, 1)
    );
}

#[test]
fn revoked_grant_write_is_dropped_counted_and_pages_drain() {
    let pool = pool(4);
    let r = pool.reserve(owner(1), 8).unwrap();
    let g = r.grant().clone();
    r.abort();
    assert_eq!(pool.stats().draining, 2);
    assert!(!pool.grant_is_live(g.key));
    let (page, generation) = g.pages[0];
    let data = fill(LAYOUT, 1, page, generation);
    let w = PageWrite {
        key: g.key,
        page,
        generation,
        tokens: 4,
        data: &data,
        checksum: page_checksum(&data),
    };
    assert_eq!(pool.write_page(w), Err(WriteError::RevokedGrant));
    assert_eq!(pool.metrics().snapshot().write_revoked_grant, 1);
    // Not free until drained.
    assert_eq!(pool.stats().free, 2);
    assert_eq!(
        pool.allocate(owner(2), 9).unwrap_err(),
        ReserveError::Exhausted {
            requested_pages: 3,
            free_pages: 2
        }
    );
    pool.mark_drained(g.key);
    assert_eq!(
        pool.stats(),
        PoolStats {
            free: 4,
            ..PoolStats::default()
        }
    );
    assert_eq!(pool.metrics().snapshot().deferred_drained, 2);
    // After the drain the key is unknown, and still refused.
    assert_eq!(pool.write_page(w), Err(WriteError::UnknownGrant));
}

#[test]
fn dropping_a_reservation_aborts_it() {
    let pool = pool(2);
    let key = {
        let r = pool.reserve(owner(1), 2).unwrap();
        r.grant().key
    };
    assert_eq!(pool.stats().draining, 1);
    pool.mark_drained(key);
    assert_eq!(pool.stats().free, 2);
}

/// Runs one broken commit and checks the pages drain instead of becoming free.
fn failed_commit(
    break_it: impl FnOnce(&KvPool, &pagewarden_kvcache::WriteGrant, &mut CommitManifest) -> bool,
    want: impl Fn(&pagewarden_kvcache::WriteGrant) -> CommitError,
) -> KvPool {
    let pool = pool(4);
    let r = pool.reserve(owner(1), 7).unwrap();
    let g = r.grant().clone();
    let mut m = write_all(&pool, &r, 1);
    let skip_redigest = break_it(&pool, &g, &mut m);
    if !skip_redigest {
        m.digest = pagewarden_kvcache::manifest_digest(&m.page_checksums, m.tokens_written);
    }
    let err = r.commit(&m).unwrap_err();
    assert_eq!(err, want(&g));
    assert_eq!(
        pool.stats().draining,
        2,
        "{err}: pages must drain, not free"
    );
    assert_eq!(pool.stats().free, 2);
    assert!(!pool.grant_is_live(g.key));
    // Unconfirmed drain goes to quarantine, and only the peer's end frees it.
    assert_eq!(
        pool.sweep_expired(Instant::now() + Duration::from_secs(3600)),
        2
    );
    assert_eq!(pool.stats().quarantined, 2);
    pool.peer_gone(g.key);
    assert_eq!(pool.stats().free, 4);
    assert_eq!(pool.metrics().snapshot().commit_failures(), 1);
    pool
}

#[test]
fn commit_with_a_missing_page_fails() {
    let pool = pool(4);
    let r = pool.reserve(owner(1), 7).unwrap();
    let g = r.grant().clone();
    let (page, generation) = g.pages[0];
    let data = fill(LAYOUT, 1, page, generation);
    let sum = page_checksum(&data);
    pool.write_page(PageWrite {
        key: g.key,
        page,
        generation,
        tokens: 4,
        data: &data,
        checksum: sum,
    })
    .unwrap();
    let m = CommitManifest::new(g.key, 7, vec![sum, 0]);
    assert_eq!(
        r.commit(&m).unwrap_err(),
        CommitError::PageNotWritten(g.pages[1].0)
    );
    assert_eq!(pool.stats().draining, 2);
    assert_eq!(pool.metrics().snapshot().commit_page_not_written, 1);
}

#[test]
fn commit_with_a_short_count_fails() {
    failed_commit(
        |_, _, m| {
            m.tokens_written = 6;
            false
        },
        |_| CommitError::TokenCountMismatch {
            written: 6,
            reserved: 7,
        },
    );
}

#[test]
fn commit_with_a_bad_manifest_checksum_fails() {
    failed_commit(
        |_, _, m| {
            m.page_checksums[1] ^= 1;
            false
        },
        |g| CommitError::ChecksumMismatch(g.pages[1].0),
    );
}

#[test]
fn commit_after_landed_bytes_changed_fails() {
    failed_commit(
        |pool, g, _| {
            pool.test_scribble(g.pages[0].0, 5);
            false
        },
        |g| CommitError::ChecksumMismatch(g.pages[0].0),
    );
}

/// Large grants are re-hashed on the rayon pool: the failure still names the first changed
/// page in grant order, and commit does not admit.
#[test]
fn commit_re_hash_of_a_large_grant_names_the_first_changed_page() {
    // SmolLM2-sized pages (368,640 bytes): 16 of them pass the parallel threshold.
    let layout = KvLayout {
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
        page_size: 16,
    };
    let pool = KvPool::new(PoolConfig::with_pages(layout, 16));
    let r = pool.reserve(owner(1), 16 * 16).unwrap();
    let g = r.grant().clone();
    let m = write_all(&pool, &r, 1);
    pool.test_scribble(g.pages[11].0, 300_000);
    pool.test_scribble(g.pages[5].0, 7);
    assert_eq!(
        r.commit(&m).unwrap_err(),
        CommitError::ChecksumMismatch(g.pages[5].0)
    );
    assert_eq!(pool.stats().readable, 0);
}

#[test]
fn commit_with_a_corrupt_guard_word_fails() {
    let pool = failed_commit(
        |pool, g, _| {
            pool.test_corrupt_guard(g.pages[1].0);
            false
        },
        |g| CommitError::GuardWordCorrupt(g.pages[1].0),
    );
    assert!(pool.metrics().snapshot().guard_word_failures >= 1);
}

#[test]
fn commit_with_a_bad_digest_or_key_fails() {
    failed_commit(
        |_, _, m| {
            m.digest ^= 1;
            true
        },
        |_| CommitError::DigestMismatch,
    );
    failed_commit(
        |_, _, m| {
            m.key = pagewarden_kvcache::GrantKey::random();
            false
        },
        |_| CommitError::KeyMismatch,
    );
}

#[test]
fn commit_with_a_short_page_fails() {
    let pool = pool(4);
    let r = pool.reserve(owner(1), 7).unwrap();
    let g = r.grant().clone();
    let mut sums = Vec::new();
    for &(page, generation) in &g.pages {
        let data = fill(LAYOUT, 1, page, generation);
        sums.push(page_checksum(&data));
        // Both pages claim 3 tokens: 6 landed of 7 reserved, though the manifest says 7.
        pool.write_page(PageWrite {
            key: g.key,
            page,
            generation,
            tokens: 3,
            data: &data,
            checksum: sums[sums.len() - 1],
        })
        .unwrap();
    }
    let err = r.commit(&CommitManifest::new(g.key, 7, sums)).unwrap_err();
    assert_eq!(
        err,
        CommitError::TokenCountMismatch {
            written: 6,
            reserved: 7
        }
    );
}

#[test]
fn expired_grant_cannot_commit() {
    let clock = ManualClock::new();
    let mut cfg = PoolConfig::with_pages(LAYOUT, 2);
    cfg.grant_ttl = Duration::from_secs(1);
    cfg.clock = Arc::new(clock.clone());
    let pool = KvPool::new(cfg);
    let r = pool.reserve(owner(1), 4).unwrap();
    let m = write_all(&pool, &r, 1);
    assert!(!r.expired(pool.now()), "a write just landed");
    clock.advance(Duration::from_secs(1));
    assert!(r.expired(pool.now()), "no write landed for its lifetime");
    assert_eq!(r.commit(&m).unwrap_err(), CommitError::Expired);
}

#[test]
fn a_grant_whose_writes_keep_landing_outlives_its_idle_ttl_and_an_idle_one_does_not() {
    // On the pool's clock, moved by hand: three gaps of 400 ms under a 1 s idle lifetime add
    // up to more than the lifetime, so a lifetime counted from the issue would expire.
    let clock = ManualClock::new();
    let ttl = Duration::from_secs(1);
    let mut cfg = PoolConfig::with_pages(LAYOUT, 4);
    cfg.grant_ttl = ttl;
    cfg.clock = Arc::new(clock.clone());
    let pool = KvPool::new(cfg);
    let busy = pool.reserve(owner(1), 12).unwrap();
    let idle = pool.reserve(owner(2), 4).unwrap();
    let g = busy.grant().clone();
    let issued = pool.now();
    let mut sums = Vec::new();
    for (i, &(page, generation)) in g.pages.iter().enumerate() {
        clock.advance(Duration::from_millis(400));
        let data = fill(pool.layout(), 1, page, generation);
        sums.push(page_checksum(&data));
        pool.write_page(PageWrite {
            key: g.key,
            page,
            generation,
            tokens: g.tokens_in_page(i) as u32,
            data: &data,
            checksum: page_checksum(&data),
        })
        .expect("valid write lands");
    }
    assert!(
        pool.now() - issued > ttl,
        "the writes took longer than the lifetime"
    );
    assert!(
        !busy.expired(pool.now()),
        "each landed write renews the grant"
    );
    assert!(
        idle.expired(pool.now()),
        "no write landed on this one for its lifetime"
    );
    let m = CommitManifest::new(g.key, g.tokens, sums);
    assert_eq!(busy.commit(&m).unwrap().len(), 12);
    // Writes renew the idle one too, until it goes a lifetime without one.
    let m = write_all(&pool, &idle, 2);
    assert!(!idle.expired(pool.now()), "a write just landed");
    clock.advance(ttl);
    assert!(idle.expired(pool.now()));
    assert_eq!(idle.commit(&m).unwrap_err(), CommitError::Expired);
}

#[test]
fn zero_on_release_clears_pages() {
    let mut cfg = PoolConfig::with_pages(LAYOUT, 1);
    cfg.zero_on_release = true;
    let pool = KvPool::new(cfg);
    let r = pool.reserve(owner(1), 4).unwrap();
    let m = write_all(&pool, &r, 1);
    drop(r.commit(&m).unwrap());
    let pages = pool.allocate(owner(2), 1).unwrap();
    assert!(pages.page_bytes(0).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn corrupt_guard_is_caught_before_reuse() {
    let pool = pool(1);
    let page = {
        let pages = pool.allocate(owner(1), 1).unwrap();
        pages.table()[0].0
    };
    pool.test_corrupt_guard(page);
    let _again = pool.allocate(owner(2), 1).unwrap();
    assert_eq!(pool.metrics().snapshot().guard_word_failures, 1);
}

#[test]
fn concurrent_reserve_and_release_conserve_pages() {
    let pool = pool(64);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let pool = pool.clone();
            s.spawn(move || {
                for i in 0..500usize {
                    let tokens = 1 + (i * 7 + t as usize) % 24;
                    if i % 2 == 0 {
                        if let Ok(r) = pool.reserve(support::owner(t), tokens) {
                            let m = write_all(&pool, &r, t);
                            let pages = r.commit(&m).unwrap();
                            for (j, &(p, g)) in pages.table().iter().enumerate() {
                                assert_eq!(pages.page_bytes(j).unwrap(), fill(LAYOUT, t, p, g));
                            }
                        }
                    } else if let Ok(r) = pool.reserve(support::owner(t), tokens) {
                        let key = r.grant().key;
                        r.abort();
                        pool.mark_drained(key);
                    }
                }
            });
        }
    });
    assert_eq!(
        pool.stats(),
        PoolStats {
            free: 64,
            ..PoolStats::default()
        }
    );
    let m = pool.metrics().snapshot();
    assert_eq!(m.allocations, m.releases);
}
