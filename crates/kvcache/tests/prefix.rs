//! The prefix cache (I10): shared pages are read-only and pinned by reference count, never
//! released or evicted while read, read only at their current generation (I1), never handed
//! across namespaces, and zeroed with a new generation when evicted. The last test drives
//! random sequences of publish, pin, unpin, read, allocate and drop against those rules.

mod support;

use pagewarden_kvcache::{
    Generation, KvPool, Namespace, NamespaceSecret, PageId, PageState, Placement, PoolConfig,
    Published, ReadError, ReadablePages, ReserveError, SharedPages, TenantId,
};
use proptest::prelude::*;
use support::{fill, finished, owner, prompt, write_all, LAYOUT};

const PS: usize = LAYOUT.page_size;

fn secret() -> NamespaceSecret {
    NamespaceSecret::from_bytes(&[7; 32])
}

fn ns(tenant: &str) -> Namespace {
    Namespace::derive(&secret(), Placement::Private(&TenantId::new(tenant)))
}

fn cache_pool(pages: usize, per_namespace: usize) -> KvPool {
    let mut cfg = PoolConfig::with_pages(LAYOUT, pages);
    cfg.prefix_pages_per_namespace = per_namespace;
    KvPool::new(cfg)
}

/// Publishes request `req`'s KV of all of `tokens` (no cached prefix) under `namespace`;
/// returns its table and the outcome.
fn publish(
    pool: &KvPool,
    req: u8,
    namespace: &Namespace,
    tokens: &[u32],
) -> (Vec<(PageId, Generation)>, Published) {
    let none = pool.pin_prefix(namespace, &[]);
    let pages = finished(pool, req, tokens.len());
    let table = pages.table().to_vec();
    (
        table,
        pages.publish_prefix(&none, tokens, owner(req).request),
    )
}

/// Each pinned page reads as written for its request in `reqs`.
fn assert_reads_each(pins: &SharedPages, reqs: &[u8]) {
    for (i, &(page, generation)) in pins.table().iter().enumerate() {
        let want = fill(LAYOUT, reqs[i], page, generation);
        assert_eq!(pins.page_bytes(i).unwrap(), &want[..], "{page}");
    }
}

fn assert_reads(pins: &SharedPages, req: u8) {
    for (i, &(page, generation)) in pins.table().iter().enumerate() {
        let want = fill(LAYOUT, req, page, generation);
        assert_eq!(pins.page_bytes(i).unwrap(), &want[..], "{page}");
        let (k, _) = pins.layer_block(1, i).unwrap();
        let at = LAYOUT.block_offset(1, 0) * 2;
        assert_eq!(k[0].to_bits().to_le_bytes(), [want[at], want[at + 1]]);
    }
}

#[test]
fn publish_then_pin_reads_the_publishers_full_pages() {
    let pool = cache_pool(8, 8);
    let a = ns("a");
    let p = prompt(0, 2 * PS + 2);
    let (table, out) = publish(&pool, 1, &a, &p);
    assert_eq!(
        out,
        Published {
            cached: 2,
            already_cached: 0,
            evicted: 0,
            freed: 1
        }
    );
    let s = pool.stats();
    assert_eq!((s.shared, s.readable, s.free), (2, 0, 6));
    assert_eq!(pool.cached_pages(&a), 2);
    assert_eq!(pool.cached_prefix_tokens(&a, &p), 2 * PS);
    assert_eq!(pool.cached_prefix_tokens(&a, &p[..2 * PS - 1]), PS);
    assert_eq!(pool.cached_prefix_tokens(&a, &prompt(1, 2 * PS)), 0);

    let pins = pool.pin_prefix(&a, &p);
    assert_eq!((pins.len(), pins.table()), (2 * PS, &table[..2]));
    assert_reads(&pins, 1);
    let again = pool.pin_prefix(&a, &p[..PS + 1]);
    assert_eq!(again.table(), &table[..1]);
    assert_eq!(
        pool.page_state(table[0].0),
        Some(PageState::Shared { readers: 2 })
    );
    assert_eq!(
        pool.page_state(table[1].0),
        Some(PageState::Shared { readers: 1 })
    );
    drop((pins, again));
    assert_eq!(
        pool.page_state(table[0].0),
        Some(PageState::Shared { readers: 0 })
    );

    // The same prompt again: already cached, its copy is freed.
    let (_, out) = publish(&pool, 2, &a, &p);
    assert_eq!((out.cached, out.already_cached, out.freed), (0, 2, 3));
    assert_eq!(pool.stats().shared, 2);
    let m = pool.metrics().snapshot();
    assert_eq!((m.prefix_pages_cached, m.prefix_pages_hit), (2, 3));
    assert_eq!(m.allocations - m.releases, 2);
}

#[test]
fn a_request_caches_the_pages_after_its_pinned_prefix() {
    let pool = cache_pool(8, 8);
    let a = ns("a");
    let long = prompt(0, 3 * PS + 1);
    let (first, _) = publish(&pool, 1, &a, &long[..PS]);
    // Request 2 pins the cached first page, computes the rest and publishes it after.
    let pins = pool.pin_prefix(&a, &long[..long.len() - 1]);
    assert_eq!(pins.table(), &first[..]);
    let suffix = finished(&pool, 2, long.len() - pins.len());
    let st = suffix.table().to_vec();
    let out = suffix.publish_prefix(&pins, &long, owner(2).request);
    assert_eq!((out.cached, out.already_cached, out.freed), (2, 0, 1));
    drop(pins);
    let all = pool.pin_prefix(&a, &long);
    assert_eq!(all.table(), &[first[0], st[0], st[1]]);
    assert_reads_each(&all, &[1, 2, 2]);
    drop(all);
    // Pages published after pins of other tokens are not chained on: nothing is cached.
    let other = pool.pin_prefix(&a, &long[..PS]);
    let wrong = finished(&pool, 3, 2 * PS);
    let out = wrong.publish_prefix(&other, &prompt(500, 3 * PS), owner(3).request);
    assert_eq!((out.cached, out.freed), (0, 2));
    assert_eq!(pool.stats().shared, 3);
}

/// A chain published in two parts by two requests is pinned as two runs, each naming the
/// request that computed it, with the pages and generations it cached.
#[test]
fn pins_report_each_run_with_the_request_that_published_it() {
    let pool = cache_pool(8, 8);
    let a = ns("a");
    let long = prompt(0, 4 * PS + 1);
    let (first, _) = publish(&pool, 1, &a, &long[..2 * PS]);
    // Request 2 pins request 1's two pages, computes two more and publishes them after.
    let pins = pool.pin_prefix(&a, &long[..4 * PS]);
    assert_eq!(pins.table(), &first[..2]);
    let suffix = finished(&pool, 2, 2 * PS);
    let second = suffix.table().to_vec();
    let out = suffix.publish_prefix(&pins, &long[..4 * PS], owner(2).request);
    assert_eq!(out.cached, 2);
    // A pin taken before the second publish saw only request 1's run.
    let runs = pins.runs();
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].producer, runs[0].tokens, runs[0].pages),
        (owner(1).request, 2 * PS, &first[..2])
    );
    drop(pins);

    let all = pool.pin_prefix(&a, &long);
    assert_eq!(all.len(), 4 * PS);
    let runs: Vec<_> = all
        .runs()
        .iter()
        .map(|r| (r.producer, r.tokens, r.pages.to_vec()))
        .collect();
    assert_eq!(
        runs,
        vec![
            (owner(1).request, 2 * PS, first[..2].to_vec()),
            (owner(2).request, 2 * PS, second),
        ]
    );
    assert_reads_each(&all, &[1, 1, 2, 2]);
    assert_eq!(all.namespace(), &a);
    // Nothing pinned, no run.
    assert!(pool.pin_prefix(&a, &prompt(900, 4 * PS)).runs().is_empty());
}

#[test]
fn the_cache_is_off_without_a_quota() {
    let pool = cache_pool(4, 0);
    let (_, out) = publish(&pool, 1, &ns("a"), &prompt(0, 2 * PS));
    assert_eq!((out.cached, out.freed), (0, 2));
    assert_eq!(pool.stats().free, 4);
    assert!(pool.pin_prefix(&ns("a"), &prompt(0, 2 * PS)).is_empty());
}

#[test]
fn a_page_with_readers_is_never_evicted_or_released() {
    let pool = cache_pool(4, 2);
    let a = ns("a");
    let x = prompt(0, 2 * PS);
    let (xt, _) = publish(&pool, 1, &a, &x);
    let pins = pool.pin_prefix(&a, &x);
    assert_eq!(pins.table(), &xt[..]);

    // Over quota, every cached page pinned: the new chain is not cached, nothing evicted.
    let (_, out) = publish(&pool, 2, &a, &prompt(100, 2 * PS));
    assert_eq!((out.cached, out.evicted, out.freed), (0, 0, 2));
    // Allocation pressure: pinned pages are not reclaimed.
    assert!(matches!(
        pool.allocate(owner(3), 3 * PS),
        Err(ReserveError::Exhausted { .. })
    ));
    for &(page, generation) in &xt {
        assert_eq!(
            pool.page_state(page),
            Some(PageState::Shared { readers: 1 })
        );
        assert_eq!(pool.generation(page), Some(generation));
    }
    assert_reads(&pins, 1);
    drop(pins);

    // Unpinned, the leaf goes first: the allocation takes one cached page, X's second.
    let held = pool.allocate(owner(3), 3 * PS).unwrap();
    assert!(held.table().iter().any(|(p, _)| *p == xt[1].0));
    assert_eq!(pool.cached_prefix_tokens(&a, &x), PS);
    assert_eq!(pool.metrics().snapshot().prefix_evictions, 1);
}

#[test]
fn a_stale_generation_is_never_read() {
    let pool = cache_pool(4, 4);
    let a = ns("a");
    let x = prompt(0, PS);
    let (xt, _) = publish(&pool, 1, &a, &x);
    let mut pins = pool.pin_prefix(&a, &x);
    let (page, generation) = xt[0];
    pins.test_set_table_generation(0, Generation(generation.0 + 1));
    let stale = ReadError::GenerationMismatch {
        page,
        expected: Generation(generation.0 + 1),
        current: generation,
    };
    assert_eq!(pins.page_bytes(0).unwrap_err(), stale);
    assert_eq!(pins.layer_block(0, 0).unwrap_err(), stale);
    assert_eq!(pool.metrics().snapshot().generation_mismatches, 2);
    drop(pins);

    // Eviction bumps the generation at once, before the page is reused: every
    // (page, generation) naming the cached copy is stale from then on.
    let _all = pool.allocate(owner(2), 4 * PS).unwrap();
    assert!(pool.generation(page).unwrap().0 > generation.0 + 1);
    assert!(pool.pin_prefix(&a, &x).is_empty());
}

#[test]
fn a_page_cached_under_one_namespace_is_never_returned_to_another() {
    let pool = cache_pool(16, 2);
    let (a, b) = (ns("a"), ns("b"));
    let p = prompt(0, 2 * PS);
    let (at, _) = publish(&pool, 1, &a, &p);
    assert_eq!(pool.cached_prefix_tokens(&b, &p), 0);
    assert!(pool.pin_prefix(&b, &p).is_empty());
    assert_eq!(pool.pin_prefix(&a, &p).table(), &at[..]);

    // B caches the same tokens in pages of its own, read back as B's bytes.
    let (bt, out) = publish(&pool, 2, &b, &p);
    assert_eq!((out.cached, out.already_cached), (2, 0));
    let pins = pool.pin_prefix(&b, &p);
    assert_eq!(pins.table(), &bt[..]);
    assert!(bt.iter().all(|x| !at.contains(x)));
    assert_reads(&pins, 2);
    drop(pins);

    // A's publishing beyond its quota evicts A's pages, never B's.
    let (_, out) = publish(&pool, 3, &a, &prompt(50, 2 * PS));
    assert_eq!((out.cached, out.evicted), (2, 2));
    assert_eq!(pool.cached_prefix_tokens(&b, &p), 2 * PS);
    assert_eq!(pool.cached_prefix_tokens(&a, &p), 0);

    // Tenants the tenants file places in one named namespace share it; nobody else does.
    // Tenants c and d, both placed in "org", derive the same namespace, whoever they are.
    let org = Namespace::derive(&secret(), Placement::Shared("org"));
    let q = prompt(200, PS);
    publish(&pool, 4, &org, &q);
    assert_eq!(pool.cached_prefix_tokens(&org, &q), PS);
    assert_eq!(pool.cached_prefix_tokens(&ns("c"), &q), 0);
    assert_eq!(pool.cached_prefix_tokens(&ns("org"), &q), 0);
}

#[test]
fn an_evicted_page_comes_back_zeroed() {
    // zero_on_release is off (the default): only eviction's own zeroing clears the bytes.
    let pool = cache_pool(3, 1);
    let a = ns("a");
    let (xt, _) = publish(&pool, 1, &a, &prompt(0, PS));
    // Quota eviction: Y's publish evicts X.
    let (_, out) = publish(&pool, 2, &a, &prompt(100, PS));
    assert_eq!((out.cached, out.evicted), (1, 1));
    let held = pool.allocate(owner(3), 2 * PS).unwrap();
    let i = held
        .table()
        .iter()
        .position(|(p, _)| *p == xt[0].0)
        .unwrap();
    assert!(held.page_bytes(i).unwrap().iter().all(|&b| b == 0));
    drop(held);
    // Reclaim eviction: an allocation of the whole pool evicts Y.
    let all = pool.allocate(owner(4), 3 * PS).unwrap();
    for i in 0..3 {
        assert!(
            all.page_bytes(i).unwrap().iter().all(|&b| b == 0),
            "page {i}"
        );
    }
    assert_eq!(pool.metrics().snapshot().prefix_evictions, 2);
}

#[test]
fn an_allocation_says_whose_cached_pages_it_took() {
    let pool = cache_pool(4, 2);
    let (a, b) = (ns("a"), ns("b"));
    publish(&pool, 1, &a, &prompt(0, 2 * PS));
    publish(&pool, 2, &b, &prompt(100, PS));
    assert!(
        pool.take_reclaimed().is_empty(),
        "nothing was reclaimed yet"
    );
    // 1 page is free; the next 3 come from the cache, oldest first (a's publish).
    let held = pool.allocate(owner(3), 4 * PS).unwrap();
    let mut took = pool.take_reclaimed();
    took.sort_by_key(|&(_, n)| n);
    assert_eq!(took, vec![(b, 1), (a, 2)]);
    assert!(
        pool.take_reclaimed().is_empty(),
        "each reclaim is told once"
    );
    drop(held);
}

#[test]
fn eviction_within_a_namespace_is_least_recently_used() {
    let pool = cache_pool(8, 3);
    let a = ns("a");
    let (x, y, z) = (prompt(0, 2 * PS), prompt(100, PS), prompt(200, PS));
    publish(&pool, 1, &a, &x);
    publish(&pool, 2, &a, &y);
    drop(pool.pin_prefix(&a, &x)); // X used after Y
    let (_, out) = publish(&pool, 3, &a, &z);
    assert_eq!((out.cached, out.evicted), (1, 1));
    assert_eq!(pool.cached_prefix_tokens(&a, &y), 0);
    assert_eq!(pool.cached_prefix_tokens(&a, &x), 2 * PS);
    assert_eq!(pool.cached_prefix_tokens(&a, &z), PS);
}

/// One step of the random test.
#[derive(Clone, Debug)]
enum Op {
    /// A request of namespace `ns` with prompt `prompt` finishes and publishes.
    Publish {
        ns: u8,
        prompt: u8,
        tokens: usize,
    },
    /// Pin the longest cached prefix of a prompt under a namespace.
    Pin {
        ns: u8,
        prompt: u8,
    },
    Unpin(prop::sample::Index),
    /// Local allocation (may reclaim cached pages).
    Allocate {
        tokens: usize,
    },
    DropAllocation(prop::sample::Index),
}

/// One of four prompts of `3 * PS` tokens; prompts 0 and 1 share their first page.
fn random_prompt(p: u8) -> Vec<u32> {
    let mut v = prompt(1000 * p as u32, 3 * PS);
    if p == 1 {
        v[..PS].copy_from_slice(&prompt(0, PS));
    }
    v
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2u8, 0..4u8, 1..=3 * PS).prop_map(|(ns, prompt, tokens)| Op::Publish { ns, prompt, tokens }),
        3 => (0..2u8, 0..4u8).prop_map(|(ns, prompt)| Op::Pin { ns, prompt }),
        2 => any::<prop::sample::Index>().prop_map(Op::Unpin),
        2 => (1..=3 * PS).prop_map(|tokens| Op::Allocate { tokens }),
        2 => any::<prop::sample::Index>().prop_map(Op::DropAllocation),
    ]
}

/// What a cached page was published as: its request, namespace and the prefix it ends.
#[derive(Clone, Debug)]
struct Cached {
    req: u8,
    ns: u8,
    prefix: Vec<u32>,
    generation: Generation,
}

fn run(ops: Vec<Op>) {
    let pool = cache_pool(6, 3);
    let spaces = [ns("a"), ns("b")];
    let mut cached: std::collections::HashMap<PageId, Cached> = Default::default();
    let mut pins: Vec<SharedPages> = vec![];
    let mut held: Vec<ReadablePages> = vec![];
    let mut next_req = 0u8;
    for op in ops {
        match op {
            Op::Publish { ns, prompt, tokens } => {
                // As prefill will: pin what is cached, compute the rest, publish after it.
                let p = random_prompt(prompt);
                let pinned = pool.pin_prefix(&spaces[ns as usize], &p[..tokens - 1]);
                let skip = pinned.len();
                let Ok(r) = pool.reserve(owner(next_req), tokens - skip) else {
                    continue;
                };
                let m = write_all(&pool, &r, next_req);
                let pages = r.commit(&m).unwrap();
                let table = pages.table().to_vec();
                for (page, _) in &table {
                    // Reused: whatever it was cached as before, it is not any more.
                    cached.remove(page);
                }
                pages.publish_prefix(&pinned, &p[..tokens], owner(next_req).request);
                for (i, &(page, generation)) in table.iter().enumerate() {
                    if let Some(PageState::Shared { .. }) = pool.page_state(page) {
                        let prefix = p[..skip + (i + 1) * PS].to_vec();
                        let c = Cached {
                            req: next_req,
                            ns,
                            prefix,
                            generation,
                        };
                        cached.insert(page, c);
                    }
                }
                next_req = next_req.wrapping_add(1);
            }
            Op::Pin { ns, prompt } => {
                let p = random_prompt(prompt);
                let got = pool.pin_prefix(&spaces[ns as usize], &p);
                for (i, (page, generation)) in got.table().iter().enumerate() {
                    let c = &cached[page];
                    assert_eq!(c.ns, ns, "{page} handed across namespaces");
                    assert_eq!(c.prefix, p[..(i + 1) * PS], "{page} is another prefix");
                    assert_eq!(c.generation, *generation);
                    let want = fill(LAYOUT, c.req, *page, *generation);
                    assert_eq!(got.page_bytes(i).unwrap(), &want[..]);
                }
                // The runs name each page's publisher and cover the pins exactly, in order.
                let from_runs: Vec<_> = got
                    .runs()
                    .iter()
                    .flat_map(|r| r.pages.iter().map(move |p| (*p, r.producer)))
                    .collect();
                let want: Vec<_> = got
                    .table()
                    .iter()
                    .map(|p| (*p, owner(cached[&p.0].req).request))
                    .collect();
                assert_eq!(from_runs, want);
                pins.push(got);
            }
            Op::Unpin(i) => {
                if !pins.is_empty() {
                    pins.remove(i.index(pins.len()));
                }
            }
            Op::Allocate { tokens } => {
                if let Ok(mut a) = pool.allocate(owner(200), tokens) {
                    for (i, (page, _)) in a.table().to_vec().into_iter().enumerate() {
                        // A page that was cached comes back zeroed (eviction), never with
                        // the cached bytes; it is no longer cached.
                        if cached.remove(&page).is_some() {
                            assert!(a.page_bytes(i).unwrap().iter().all(|&b| b == 0));
                        }
                    }
                    a.set_len(tokens);
                    held.push(a);
                }
            }
            Op::DropAllocation(i) => {
                if !held.is_empty() {
                    held.remove(i.index(held.len()));
                }
            }
        }
        // Every pin still reads what was published for it, at the same generation, and its
        // pages are Shared with exactly as many readers as pins hold them.
        let mut readers: std::collections::HashMap<PageId, u32> = Default::default();
        for got in &pins {
            for (i, (page, generation)) in got.table().iter().enumerate() {
                *readers.entry(*page).or_default() += 1;
                let c = &cached[page];
                let want = fill(LAYOUT, c.req, *page, *generation);
                assert_eq!(got.page_bytes(i).unwrap(), &want[..]);
            }
        }
        for (page, n) in &readers {
            assert_eq!(
                pool.page_state(*page),
                Some(PageState::Shared { readers: *n })
            );
        }
        let s = pool.stats();
        assert_eq!(
            s.shared,
            spaces.iter().map(|n| pool.cached_pages(n)).sum::<usize>()
        );
        assert_eq!(s.free + s.readable + s.shared, pool.capacity_pages());
        let m = pool.metrics().snapshot();
        assert_eq!((m.allocations - m.releases) as usize, s.readable + s.shared);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, failure_persistence: None, .. ProptestConfig::default() })]
    #[test]
    fn random_publish_pin_allocate_keep_the_rules(ops in prop::collection::vec(op(), 1..40)) {
        run(ops);
    }
}
