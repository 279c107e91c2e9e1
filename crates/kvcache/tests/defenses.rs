//! The test-only `Defenses` switches each remove exactly one check; the reliability tests rely
//! on that.

mod support;

use pagewarden_kvcache::{
    page_checksum, CommitManifest, Defenses, Generation, KvPool, PageWrite, PoolConfig, WriteError,
};
use support::{fill, owner, write_all, LAYOUT};

fn pool_without(d: Defenses) -> KvPool {
    let mut cfg = PoolConfig::with_pages(LAYOUT, 4);
    cfg.defenses = d;
    KvPool::new(cfg)
}

#[test]
fn all_defenses_are_on_by_default() {
    let d = PoolConfig::with_pages(LAYOUT, 1).defenses;
    assert!(d.read_generation_check && d.commit_token_count && d.checksum_check && d.grant_fencing);
}

#[test]
fn without_read_generation_check_a_stale_table_reads() {
    let pool = pool_without(Defenses {
        read_generation_check: false,
        ..Defenses::default()
    });
    let mut pages = pool.allocate(owner(1), 4).unwrap();
    let g = pages.table()[0].1;
    pages.test_set_table_generation(0, Generation(g.0 + 1));
    assert!(pages.layer_block(0, 0).is_ok());
    assert_eq!(pool.metrics().snapshot().generation_mismatches, 0);
}

#[test]
fn without_commit_token_count_a_short_manifest_commits() {
    let pool = pool_without(Defenses {
        commit_token_count: false,
        ..Defenses::default()
    });
    let r = pool.reserve(owner(1), 6).unwrap();
    let mut m = write_all(&pool, &r, 1);
    m = CommitManifest::new(m.key, 5, m.page_checksums);
    assert!(r.commit(&m).is_ok());
}

#[test]
fn without_checksum_check_a_bad_checksum_lands() {
    let pool = pool_without(Defenses {
        checksum_check: false,
        ..Defenses::default()
    });
    let r = pool.reserve(owner(1), 4).unwrap();
    let g = r.grant().clone();
    let (page, generation) = g.pages[0];
    let data = fill(LAYOUT, 1, page, generation);
    let w = PageWrite {
        key: g.key,
        page,
        generation,
        tokens: 4,
        data: &data,
        checksum: 1,
    };
    assert_eq!(pool.write_page(w), Ok(()));
}

#[test]
fn without_grant_fencing_a_revoked_write_lands() {
    let pool = pool_without(Defenses {
        grant_fencing: false,
        ..Defenses::default()
    });
    let r = pool.reserve(owner(1), 4).unwrap();
    let g = r.grant().clone();
    r.abort();
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
    assert_eq!(pool.write_page(w), Ok(()));
    // With the fence on, the same write is refused.
    let fenced = pool_without(Defenses::default());
    let r = fenced.reserve(owner(1), 4).unwrap();
    let g = r.grant().clone();
    r.abort();
    let w = PageWrite {
        key: g.key,
        page: g.pages[0].0,
        generation: g.pages[0].1,
        ..w
    };
    assert_eq!(fenced.write_page(w), Err(WriteError::RevokedGrant));
}
