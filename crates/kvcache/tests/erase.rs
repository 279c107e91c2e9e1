//! Erasing a namespace from the prefix cache: its pages leave the index and are zeroed with a
//! new generation (at once, or at the last reader's unpin), no other namespace's page is
//! touched, a request that looked up before the erasure caches nothing after it, and the
//! digest names exactly the erased copies.

mod support;

use pagewarden_kvcache::{
    erasure_digest, Erasure, Generation, KvPool, Namespace, NamespaceSecret, PageId, PageState,
    Placement, PoolConfig, SharedPages, TenantId,
};
use support::{fill, finished, owner, prompt, LAYOUT};

const PS: usize = LAYOUT.page_size;

fn ns(tenant: &str) -> Namespace {
    let secret = NamespaceSecret::from_bytes(&[7; 32]);
    Namespace::derive(&secret, Placement::Private(&TenantId::new(tenant)))
}

/// A pool whose `zero_on_release` is off (the default): only the erasure's own zeroing
/// clears a page's bytes.
fn cache_pool(pages: usize) -> KvPool {
    let mut cfg = PoolConfig::with_pages(LAYOUT, pages);
    cfg.prefix_pages_per_namespace = pages;
    assert!(!cfg.zero_on_release);
    KvPool::new(cfg)
}

/// Request `req` computes all of `tokens` and publishes them under `namespace`; returns the
/// table of the pages it cached (its full pages).
fn publish(
    pool: &KvPool,
    req: u8,
    namespace: &Namespace,
    tokens: &[u32],
) -> Vec<(PageId, Generation)> {
    let none = pool.pin_prefix(namespace, &[]);
    let pages = finished(pool, req, tokens.len());
    let table = pages.table()[..tokens.len() / PS].to_vec();
    let out = pages.publish_prefix(&none, tokens, owner(req).request);
    assert_eq!(out.cached, table.len());
    table
}

fn assert_reads(pins: &SharedPages, req: u8) {
    for (i, &(page, generation)) in pins.table().iter().enumerate() {
        let want = fill(LAYOUT, req, page, generation);
        assert_eq!(pins.page_bytes(i).unwrap(), &want[..], "{page}");
    }
}

/// Takes every free page (no cached page is reclaimed for it) and asserts each of `pages` is
/// among them and all zero.
fn assert_zeroed(pool: &KvPool, pages: &[(PageId, Generation)]) {
    let free = pool.stats().free;
    let held = pool.allocate(owner(99), free * PS).unwrap();
    for &(page, _) in pages {
        let i = held
            .table()
            .iter()
            .position(|(p, _)| *p == page)
            .unwrap_or_else(|| panic!("{page} is not free"));
        assert!(
            held.page_bytes(i).unwrap().iter().all(|&b| b == 0),
            "{page} still holds its cached bytes"
        );
    }
}

#[test]
fn erasing_zeroes_the_namespaces_pages_and_touches_no_other() {
    let pool = cache_pool(8);
    let (a, b) = (ns("a"), ns("b"));
    let (x, y) = (prompt(0, 2 * PS + 1), prompt(0, 2 * PS));
    let at = publish(&pool, 1, &a, &x);
    // B caches the very same tokens: a page of B's must survive A's erasure.
    let bt = publish(&pool, 2, &b, &y);
    assert_eq!((pool.cached_pages(&a), pool.cached_pages(&b)), (2, 2));

    let out = pool.erase_namespace(&a);
    assert_eq!(
        out,
        Erasure {
            entries: 2,
            pages_zeroed: 2,
            pages_deferred: 0,
            digest: erasure_digest(&a, &at),
        }
    );
    assert_eq!(pool.cached_pages(&a), 0);
    assert_eq!(pool.cached_prefix_tokens(&a, &x), 0);
    assert!(pool.pin_prefix(&a, &x).is_empty());
    for &(page, generation) in &at {
        assert_eq!(pool.page_state(page), Some(PageState::Free));
        assert_eq!(pool.generation(page), Some(Generation(generation.0 + 1)));
    }
    // B's pages: still cached, at their generation, with B's bytes.
    assert_eq!(pool.cached_prefix_tokens(&b, &y), 2 * PS);
    for &(page, generation) in &bt {
        assert_eq!(
            pool.page_state(page),
            Some(PageState::Shared { readers: 0 })
        );
        assert_eq!(pool.generation(page), Some(generation));
    }
    let pins = pool.pin_prefix(&b, &y);
    assert_eq!(pins.table(), &bt[..]);
    assert_reads(&pins, 2);
    drop(pins);
    let m = pool.metrics().snapshot();
    assert_eq!((m.prefix_pages_erased, m.prefix_evictions), (2, 2));

    assert_zeroed(&pool, &at);
    // B's pages were not reclaimed for that allocation either.
    assert_eq!(pool.cached_pages(&b), 2);
}

#[test]
fn a_second_erasure_finds_nothing() {
    let pool = cache_pool(4);
    let a = ns("a");
    publish(&pool, 1, &a, &prompt(0, PS));
    assert_eq!(pool.erase_namespace(&a).entries, 1);
    let again = pool.erase_namespace(&a);
    assert_eq!(
        again,
        Erasure {
            entries: 0,
            pages_zeroed: 0,
            pages_deferred: 0,
            digest: erasure_digest(&a, &[]),
        }
    );
    assert_eq!(pool.erase_namespace(&ns("nobody")).entries, 0);
    assert_eq!(pool.stats().free, 4);
}

#[test]
fn a_page_still_read_is_unpublished_and_zeroed_at_its_last_unpin() {
    let pool = cache_pool(6);
    let (a, b) = (ns("a"), ns("b"));
    let x = prompt(0, 2 * PS);
    let at = publish(&pool, 1, &a, &x);
    let bt = publish(&pool, 2, &b, &prompt(500, PS));
    let both = pool.pin_prefix(&a, &x);
    let first = pool.pin_prefix(&a, &x[..PS]);
    let b_pin = pool.pin_prefix(&b, &prompt(500, PS));

    let out = pool.erase_namespace(&a);
    assert_eq!(
        (out.entries, out.pages_zeroed, out.pages_deferred),
        (2, 0, 2)
    );
    assert_eq!(out.digest, erasure_digest(&a, &at));
    assert_eq!(
        pool.page_state(at[0].0),
        Some(PageState::Erased { readers: 2 })
    );
    assert_eq!(
        pool.page_state(at[1].0),
        Some(PageState::Erased { readers: 1 })
    );
    // The running readers keep reading what they pinned; nobody else can find it.
    assert_reads(&both, 1);
    assert_eq!(pool.cached_prefix_tokens(&a, &x), 0);
    assert!(pool.pin_prefix(&a, &x).is_empty());
    // Erased pages are not evictable: an allocation cannot take them from their readers.
    assert_eq!(pool.available_pages(), 6 - 2 - 1);

    drop(both);
    assert_eq!(pool.page_state(at[1].0), Some(PageState::Free));
    assert_eq!(pool.generation(at[1].0), Some(Generation(at[1].1 .0 + 1)));
    assert_eq!(
        pool.page_state(at[0].0),
        Some(PageState::Erased { readers: 1 })
    );
    drop(first);
    assert_eq!(pool.page_state(at[0].0), Some(PageState::Free));
    assert_eq!(pool.generation(at[0].0), Some(Generation(at[0].1 .0 + 1)));
    assert_eq!(pool.stats().shared, 1);
    assert_eq!(pool.metrics().snapshot().prefix_evictions, 2);

    // B's pinned page was never touched.
    assert_eq!(b_pin.table(), &bt[..]);
    assert_reads(&b_pin, 2);
    assert_eq!(
        pool.page_state(bt[0].0),
        Some(PageState::Shared { readers: 1 })
    );
    assert_zeroed(&pool, &at);
}

#[test]
fn a_request_that_looked_up_before_the_erasure_caches_nothing_after_it() {
    let pool = cache_pool(8);
    let a = ns("a");
    let x = prompt(0, 3 * PS);
    publish(&pool, 1, &a, &x[..PS]);
    // Two requests running across the erasure: one missed, one hit the first page.
    let missed = pool.pin_prefix(&a, &prompt(900, PS));
    assert!(missed.is_empty());
    let hit = pool.pin_prefix(&a, &x[..2 * PS]);
    assert_eq!(hit.len(), PS);
    let m_pages = finished(&pool, 2, 2 * PS);
    let h_pages = finished(&pool, 3, 2 * PS);

    pool.erase_namespace(&a);
    let out = m_pages.publish_prefix(&missed, &prompt(900, 2 * PS), owner(2).request);
    assert_eq!((out.cached, out.freed), (0, 2));
    let out = h_pages.publish_prefix(&hit, &x, owner(3).request);
    assert_eq!((out.cached, out.freed), (0, 2));
    drop((missed, hit));
    assert_eq!(pool.cached_pages(&a), 0);
    assert_eq!(pool.stats().free, 8);

    // A request that looks up after the erasure caches again.
    publish(&pool, 4, &a, &x);
    assert_eq!(pool.cached_prefix_tokens(&a, &x), 3 * PS);
}

#[test]
fn the_digest_names_the_namespace_and_the_copies_whatever_their_order() {
    let (a, b) = (ns("a"), ns("b"));
    let pages = [(PageId(3), Generation(7)), (PageId(1), Generation(2))];
    let swapped = [pages[1], pages[0]];
    assert_eq!(erasure_digest(&a, &pages), erasure_digest(&a, &swapped));
    assert_ne!(erasure_digest(&a, &pages), erasure_digest(&b, &pages));
    let later = [(PageId(3), Generation(8)), (PageId(1), Generation(2))];
    assert_ne!(erasure_digest(&a, &pages), erasure_digest(&a, &later));
    assert_ne!(erasure_digest(&a, &pages), erasure_digest(&a, &pages[..1]));
}
