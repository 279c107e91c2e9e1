//! Pool benchmarks, reported per page (throughput = pages):
//! - `cycle/reserve_write_commit_release`: reserve a 1,000-page request, write every page
//!   under the grant, commit (verifying checksums and guard words), drop (release).
//! - `cycle/reserve_abort_drain`: the grant bookkeeping without data (reserve, revoke, drain).
//! - `cycle/allocate_release`: the bookkeeping alone (local allocate + drop of 1,000 pages).
//! - `read/layer_block_checked`: the per-read generation check plus block lookup, per page,
//!   against `read/unchecked_baseline` (the same pointer math over a plain slice).
//!
//! Run: `cargo bench -p pagewarden-kvcache --bench pool -- --quick`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pagewarden_kvcache::{
    f16, page_checksum, CommitManifest, KvLayout, KvPool, Owner, PageWrite, PoolConfig, RequestId,
    TenantId,
};

const PAGES: usize = 1_000;
/// 2 layers x 2 heads x 16 dims, 16 tokens per page: 4 KiB pages.
const LAYOUT: KvLayout = KvLayout {
    layers: 2,
    kv_heads: 2,
    head_dim: 16,
    page_size: 16,
};

fn owner() -> Owner {
    Owner {
        request: RequestId([7; 16]),
        tenant: TenantId::new("bench"),
    }
}

fn cycle(c: &mut Criterion) {
    let pool = KvPool::new(PoolConfig::with_pages(LAYOUT, PAGES));
    let data = vec![0x5Au8; LAYOUT.page_bytes()];
    let checksum = page_checksum(&data);
    let tokens = PAGES * LAYOUT.page_size;
    let mut g = c.benchmark_group("cycle");
    g.throughput(Throughput::Elements(PAGES as u64));
    g.bench_function("reserve_write_commit_release", |b| {
        b.iter(|| {
            let r = pool.reserve(owner(), tokens).unwrap();
            let grant = r.grant().clone();
            for &(page, generation) in &grant.pages {
                pool.write_page(PageWrite {
                    key: grant.key,
                    page,
                    generation,
                    tokens: LAYOUT.page_size as u32,
                    data: &data,
                    checksum,
                })
                .unwrap();
            }
            let m = CommitManifest::new(grant.key, tokens, vec![checksum; PAGES]);
            drop(black_box(r.commit(&m).unwrap()));
        })
    });
    g.bench_function("reserve_abort_drain", |b| {
        b.iter(|| {
            let r = pool.reserve(owner(), tokens).unwrap();
            let key = r.grant().key;
            r.abort();
            pool.mark_drained(black_box(key));
        })
    });
    g.bench_function("allocate_release", |b| {
        b.iter(|| drop(black_box(pool.allocate(owner(), tokens).unwrap())))
    });
    g.finish();
}

fn read(c: &mut Criterion) {
    let pool = KvPool::new(PoolConfig::with_pages(LAYOUT, PAGES));
    let pages = pool.allocate(owner(), PAGES * LAYOUT.page_size).unwrap();
    let plain = vec![f16::ZERO; PAGES * LAYOUT.page_elems()];
    let mut g = c.benchmark_group("read");
    g.throughput(Throughput::Elements(PAGES as u64));
    g.bench_function("layer_block_checked", |b| {
        b.iter(|| {
            let mut acc = 0u16;
            for i in 0..PAGES {
                let (k, v) = pages.layer_block(black_box(1), i).unwrap();
                acc ^= k[0].to_bits() ^ v[0].to_bits();
            }
            acc
        })
    });
    g.bench_function("unchecked_baseline", |b| {
        b.iter(|| {
            let mut acc = 0u16;
            let n = LAYOUT.block_elems();
            for i in 0..PAGES {
                let base = i * LAYOUT.page_elems();
                let layer = black_box(1);
                let k = &plain[base + LAYOUT.block_offset(layer, 0)..][..n];
                let v = &plain[base + LAYOUT.block_offset(layer, 1)..][..n];
                acc ^= k[0].to_bits() ^ v[0].to_bits();
            }
            acc
        })
    });
    g.finish();
}

criterion_group!(benches, cycle, read);
criterion_main!(benches);
