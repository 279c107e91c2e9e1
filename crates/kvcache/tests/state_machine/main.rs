//! Property test: random sequences of reserve, write (good, stale, revoked, wrong generation,
//! duplicate, malformed), commit (good and broken manifests), abort, drain, sweep to
//! quarantine, release, allocate/grow/drop and reads, run against `model::PoolModel`.
//!
//! Invariant: every successful read returns bytes derived from (the reader's request, the
//! page, the page's current generation), i.e. data written for the reader under the current
//! generation; and page counts per state always equal the model's.

#[path = "../support/mod.rs"]
mod support;

mod model;

use std::time::{Duration, Instant};

use model::{
    predict_commit, predict_write, tokens_in_page, ManifestKind, Model, PoolModel, Transition,
    WriteKind, LAYERS, PAGE_SIZE,
};
use pagewarden_kvcache::{
    f16, page_checksum, CommitError, CommitManifest, Generation, GrantKey, KvLayout, KvPool,
    PageId, PageWrite, PoolConfig, PoolStats, ReadError, ReadablePages, ReserveError,
    ReservedPages, WriteError,
};
use proptest::sample::Index;
use proptest::test_runner::Config;
use proptest_state_machine::{prop_state_machine, StateMachineTest};
use support::{fill, owner};

fn namespace(req: u8) -> pagewarden_kvcache::Namespace {
    let secret = pagewarden_kvcache::NamespaceSecret::from_bytes(&[1; 32]);
    let tenant = pagewarden_kvcache::TenantId::new(format!("tenant-{req}"));
    pagewarden_kvcache::Namespace::derive(&secret, pagewarden_kvcache::Placement::Private(&tenant))
}

const LAYOUT: KvLayout = KvLayout {
    layers: LAYERS,
    kv_heads: 1,
    head_dim: 2,
    page_size: PAGE_SIZE,
};

type Table = Vec<(PageId, Generation)>;

struct Sut {
    pool: KvPool,
    next_req: u8,
    reserved: Vec<(u8, ReservedPages)>,
    readable: Vec<(u8, ReadablePages)>,
    revoked: Vec<(GrantKey, Table)>,
    retired: Vec<(GrantKey, Table)>,
    /// The model before the transition being applied (`apply` gets the one after).
    before: Model,
}

impl Sut {
    fn req(&mut self) -> u8 {
        self.next_req = self.next_req.wrapping_add(1);
        self.next_req
    }

    /// Files a grant that ended without a commit where the model says its pages went:
    /// draining, or freed at once (retired) when nothing of it could land any more.
    fn end_without_commit(&mut self, before: &Model, res: Index, grant: (GrantKey, Table)) {
        let r = &before.reserved[res.index(before.reserved.len())];
        if r.stream_ended || before.revocation_drains {
            self.retired.push(grant);
        } else {
            self.revoked.push(grant);
        }
    }
}

fn reserve_kind(e: &ReserveError) -> &'static str {
    match e {
        ReserveError::TooLarge { .. } => "too_large",
        ReserveError::Exhausted { .. } => "exhausted",
        ReserveError::ZeroTokens => "zero",
    }
}

fn write_name(e: WriteError) -> &'static str {
    match e {
        WriteError::UnknownGrant => "UnknownGrant",
        WriteError::RevokedGrant => "RevokedGrant",
        WriteError::WrongPage => "WrongPage",
        WriteError::StaleGeneration => "StaleGeneration",
        WriteError::DuplicateWrite => "DuplicateWrite",
        WriteError::BadLength => "BadLength",
        WriteError::TooManyTokens => "TooManyTokens",
        WriteError::ChecksumMismatch => "ChecksumMismatch",
    }
}

/// Fills pages `from..` of a locally owned allocation with their pattern through `kv_row_mut`.
fn fill_local(pages: &mut ReadablePages, req: u8, from: usize) {
    let tw = LAYOUT.token_width();
    for i in from..pages.table().len() {
        let (page, generation) = pages.table()[i];
        let bytes = fill(LAYOUT, req, page, generation);
        let elem = |e: usize| f16::from_bits(u16::from_le_bytes([bytes[2 * e], bytes[2 * e + 1]]));
        for layer in 0..LAYOUT.layers {
            for slot in 0..PAGE_SIZE {
                let (k, v) = pages.kv_row_mut(layer, i * PAGE_SIZE + slot).unwrap();
                for d in 0..tw {
                    k[d] = elem(LAYOUT.block_offset(layer, 0) + slot * tw + d);
                    v[d] = elem(LAYOUT.block_offset(layer, 1) + slot * tw + d);
                }
            }
        }
    }
}

/// A write of page `i` of `g` as the writer means it (correct data and token count).
fn good_data(g: &pagewarden_kvcache::WriteGrant, req: u8, i: usize) -> Vec<u8> {
    fill(LAYOUT, req, g.pages[i].0, g.pages[i].1)
}

struct PoolTest;

impl StateMachineTest for PoolTest {
    type SystemUnderTest = Sut;
    type Reference = PoolModel;

    fn init_test(m: &Model) -> Sut {
        let mut cfg = PoolConfig::with_pages(LAYOUT, m.capacity);
        cfg.zero_on_release = m.zero_on_release;
        cfg.revocation_drains = m.revocation_drains;
        Sut {
            pool: KvPool::new(cfg),
            next_req: 0,
            reserved: vec![],
            readable: vec![],
            revoked: vec![],
            retired: vec![],
            before: m.clone(),
        }
    }

    fn apply(mut s: Sut, m: &Model, t: Transition) -> Sut {
        let before = std::mem::replace(&mut s.before, m.clone());
        match t {
            Transition::Reserve { tokens } => {
                let req = s.req();
                let got = s.pool.reserve(owner(req), tokens);
                assert_eq!(
                    got.as_ref()
                        .map(|r| r.grant().pages.len())
                        .map_err(reserve_kind),
                    before.alloc(tokens)
                );
                if let Ok(r) = got {
                    assert_eq!(r.grant().tokens, tokens);
                    s.reserved.push((req, r));
                }
            }
            Transition::Allocate { tokens } => {
                let req = s.req();
                let got = s.pool.allocate(owner(req), tokens);
                assert_eq!(
                    got.as_ref().map(|p| p.table().len()).map_err(reserve_kind),
                    before.alloc(tokens)
                );
                if let Ok(mut p) = got {
                    fill_local(&mut p, req, 0);
                    p.set_len(tokens);
                    s.readable.push((req, p));
                }
            }
            Transition::Write { res, page, kind } => {
                let (req, r) = &s.reserved[res.index(s.reserved.len())];
                let g = r.grant().clone();
                let i = page.index(g.pages.len());
                let (pid, generation) = g.pages[i];
                let mut data = good_data(&g, *req, i);
                let mut tokens = tokens_in_page(g.tokens, i) as u32;
                let mut target = pid;
                let mut presented = generation;
                let mut checksum_flip = 0;
                match kind {
                    WriteKind::Good => {}
                    WriteKind::Short => tokens -= 1,
                    WriteKind::Foreign => {
                        data = fill(LAYOUT, req.wrapping_add(100), pid, generation)
                    }
                    WriteKind::WrongGen => presented = Generation(generation.0 + 1),
                    WriteKind::BadChecksum => checksum_flip = 1,
                    WriteKind::BadLength => {
                        data.pop();
                    }
                    WriteKind::TooManyTokens => tokens = PAGE_SIZE as u32 + 1,
                    WriteKind::WrongPage => {
                        target = (0..=s.pool.capacity_pages() as u32)
                            .map(PageId)
                            .find(|p| !g.pages.iter().any(|(q, _)| q == p))
                            .unwrap();
                    }
                }
                let checksum = page_checksum(&data) ^ checksum_flip;
                let got = s.pool.write_page(PageWrite {
                    key: g.key,
                    page: target,
                    generation: presented,
                    tokens,
                    data: &data,
                    checksum,
                });
                let r = &before.reserved[res.index(before.reserved.len())];
                assert_eq!(
                    got.map_err(write_name),
                    predict_write(r, i, kind),
                    "{kind:?}"
                );
            }
            Transition::WriteRevoked { rev, page } => {
                let (key, table) = &s.revoked[rev.index(s.revoked.len())];
                stale_write(
                    &s.pool,
                    *key,
                    table,
                    page.index(table.len()),
                    WriteError::RevokedGrant,
                );
            }
            Transition::WriteRetired { old, page } => {
                let (key, table) = &s.retired[old.index(s.retired.len())];
                stale_write(
                    &s.pool,
                    *key,
                    table,
                    page.index(table.len()),
                    WriteError::UnknownGrant,
                );
            }
            Transition::WriteUnknown => {
                let data = vec![0u8; LAYOUT.page_bytes()];
                let w = PageWrite {
                    key: GrantKey::random(),
                    page: PageId(0),
                    generation: Generation(1),
                    tokens: 1,
                    checksum: page_checksum(&data),
                    data: &data,
                };
                assert_eq!(s.pool.write_page(w), Err(WriteError::UnknownGrant));
            }
            Transition::Commit { res, kind } => {
                let (req, r) = s.reserved.remove(res.index(s.reserved.len()));
                let predicted =
                    predict_commit(&before.reserved[res.index(before.reserved.len())], kind);
                let g = r.grant().clone();
                let mut sums: Vec<u64> = (0..g.pages.len())
                    .map(|i| page_checksum(&good_data(&g, req, i)))
                    .collect();
                let mut key = g.key;
                let mut tokens = g.tokens;
                match kind {
                    ManifestKind::Good | ManifestKind::BadDigest => {}
                    ManifestKind::ShortCount => tokens -= 1,
                    ManifestKind::BadChecksum => sums[0] ^= 1,
                    ManifestKind::WrongKey => key = GrantKey::random(),
                }
                let mut manifest = CommitManifest::new(key, tokens, sums);
                if kind == ManifestKind::BadDigest {
                    manifest.digest ^= 1;
                }
                match r.commit(&manifest) {
                    Ok(p) => {
                        assert_eq!(predicted, Ok(()));
                        assert_eq!(p.len(), g.tokens);
                        s.retired.push((g.key, g.pages.clone()));
                        s.readable.push((req, p));
                    }
                    Err(e) => {
                        let idx = |p: PageId| g.pages.iter().position(|(q, _)| *q == p).unwrap();
                        let name = match e {
                            CommitError::KeyMismatch => "KeyMismatch".to_string(),
                            CommitError::TokenCountMismatch { written, reserved } => {
                                assert_eq!(reserved, g.tokens);
                                format!("TokenCount {written}")
                            }
                            CommitError::DigestMismatch => "DigestMismatch".into(),
                            CommitError::PageNotWritten(p) => format!("PageNotWritten {}", idx(p)),
                            CommitError::ChecksumMismatch(p) => {
                                format!("ChecksumMismatch {}", idx(p))
                            }
                            CommitError::GuardWordCorrupt(_) | CommitError::Expired => {
                                panic!("unexpected {e}")
                            }
                        };
                        assert_eq!(predicted, Err(name), "{kind:?}");
                        assert!(!s.pool.grant_is_live(g.key));
                        s.end_without_commit(&before, res, (g.key, g.pages.clone()));
                    }
                }
            }
            Transition::Abort { res, by_drop } => {
                let (_, r) = s.reserved.remove(res.index(s.reserved.len()));
                let g = r.grant().clone();
                if by_drop {
                    drop(r);
                } else {
                    r.abort();
                }
                assert!(!s.pool.grant_is_live(g.key));
                s.end_without_commit(&before, res, (g.key, g.pages));
            }
            Transition::DrainLive { res } => {
                let key = s.reserved[res.index(s.reserved.len())].1.grant().key;
                let before = s.pool.stats();
                s.pool.mark_drained(key);
                s.pool.peer_gone(key);
                assert_eq!(s.pool.stats(), before);
                assert!(s.pool.grant_is_live(key));
            }
            Transition::Drain { rev } => {
                let (key, table) = s.revoked.remove(rev.index(s.revoked.len()));
                s.pool.mark_drained(key);
                s.retired.push((key, table));
            }
            Transition::ReleaseQuarantined { rev } => {
                let (key, table) = s.revoked.remove(rev.index(s.revoked.len()));
                s.pool.peer_gone(key);
                s.retired.push((key, table));
            }
            Transition::Sweep => {
                let draining = s.pool.stats().draining;
                let moved = s
                    .pool
                    .sweep_expired(Instant::now() + Duration::from_secs(3600));
                assert_eq!(moved, draining);
            }
            Transition::Read { rd, page, layer } => {
                let (req, p) = &s.readable[rd.index(s.readable.len())];
                let i = page.index(p.table().len());
                let (pid, generation) = p.table()[i];
                assert_eq!(s.pool.generation(pid), Some(generation));
                let want = fill(LAYOUT, *req, pid, generation);
                assert_eq!(
                    p.page_bytes(i).unwrap(),
                    &want[..],
                    "foreign bytes on {pid}"
                );
                let (k, v) = p.layer_block(layer, i).unwrap();
                let at = |e: usize| u16::from_le_bytes([want[2 * e], want[2 * e + 1]]);
                for (j, x) in k.iter().enumerate() {
                    assert_eq!(x.to_bits(), at(LAYOUT.block_offset(layer, 0) + j));
                }
                for (j, x) in v.iter().enumerate() {
                    assert_eq!(x.to_bits(), at(LAYOUT.block_offset(layer, 1) + j));
                }
                assert_eq!(p.layer_block(LAYERS, i).unwrap_err(), ReadError::OutOfRange);
                assert_eq!(
                    p.layer_block(0, p.table().len()).unwrap_err(),
                    ReadError::OutOfRange
                );
            }
            Transition::Grow { rd, extra } => {
                let i = rd.index(s.readable.len());
                let (req, p) = &mut s.readable[i];
                let had = p.table().len();
                let want = p.capacity() + extra;
                let got = p.grow(want);
                let predicted = if want > before.cap_tokens() {
                    Err("too_large")
                } else {
                    before.alloc(extra).map(|_| ())
                };
                assert_eq!(got.as_ref().map_err(reserve_kind).copied(), predicted);
                match got {
                    Ok(()) => fill_local(p, *req, had),
                    Err(e) => assert_eq!(p.table().len(), had, "{e}"),
                }
            }
            Transition::DropReadable { rd, publish } => {
                let (req, p) = s.readable.remove(rd.index(s.readable.len()));
                if publish {
                    // The prefix cache is off in this pool: publishing frees like a drop.
                    let tokens: Vec<u32> = (0..p.len() as u32).map(|t| t + req as u32).collect();
                    let pages = p.table().len();
                    let none = s.pool.pin_prefix(&namespace(req), &[]);
                    let producer = p.owner().request;
                    let out = p.publish_prefix(&none, &tokens, producer);
                    assert_eq!((out.cached, out.freed), (0, pages));
                }
            }
        }
        s
    }

    fn check_invariants(s: &Sut, m: &Model) {
        let reserved = m.reserved.iter().map(|r| r.written.len()).sum();
        let readable = m.readable.iter().map(|r| r.pages).sum();
        assert_eq!(
            s.pool.stats(),
            PoolStats {
                free: m.free,
                reserved,
                readable,
                shared: 0,
                draining: m.draining(),
                quarantined: m.quarantined(),
            }
        );
        assert_eq!(s.reserved.len(), m.reserved.len());
        assert_eq!(s.readable.len(), m.readable.len());
        assert_eq!(s.revoked.len(), m.revoked.len());
        assert_eq!(s.retired.len(), m.retired);
        for (i, (_, p)) in s.readable.iter().enumerate() {
            assert_eq!(p.table().len(), m.readable[i].pages);
        }
        let snap = s.pool.metrics().snapshot();
        assert_eq!(
            (snap.allocations - snap.releases) as usize,
            m.capacity - m.free,
            "allocations - releases == pages not free"
        );
    }
}

fn stale_write(pool: &KvPool, key: GrantKey, table: &Table, i: usize, want: WriteError) {
    let (page, generation) = table[i];
    let data = vec![0xA5u8; LAYOUT.page_bytes()];
    let w = PageWrite {
        key,
        page,
        generation,
        tokens: 1,
        checksum: page_checksum(&data),
        data: &data,
    };
    assert_eq!(pool.write_page(w), Err(want));
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: 10_000,
        failure_persistence: None,
        .. Config::default()
    })]
    #[test]
    fn pool_matches_model(sequential 1..40 => PoolTest);
}

#[test]
fn model_predicts_both_outcomes() {
    // If the model could only predict failure, the property test would check little.
    let full = model::Res {
        tokens: 5,
        written: vec![Some(model::Landed::Good); 2],
        stream_ended: false,
    };
    assert_eq!(predict_commit(&full, ManifestKind::Good), Ok(()));
    assert!(predict_commit(&full, ManifestKind::BadChecksum).is_err());
    let half = model::Res {
        tokens: 5,
        written: vec![Some(model::Landed::Good), None],
        stream_ended: false,
    };
    assert_eq!(
        predict_commit(&half, ManifestKind::Good),
        Err("PageNotWritten 1".into())
    );
}
