//! Helpers shared by the kvcache integration tests.
#![allow(dead_code)]

use pagewarden_kvcache::{
    page_checksum, CommitManifest, Generation, KvLayout, KvPool, Owner, PageId, PageWrite,
    PoolConfig, ReadablePages, RequestId, ReservedPages, TenantId,
};

/// A tiny page: 2 layers, 1 head of 4, 4 tokens per page = 128 bytes.
pub const LAYOUT: KvLayout = KvLayout {
    layers: 2,
    kv_heads: 1,
    head_dim: 4,
    page_size: 4,
};

pub fn pool(pages: usize) -> KvPool {
    KvPool::new(PoolConfig::with_pages(LAYOUT, pages))
}

pub fn owner(n: u8) -> Owner {
    Owner {
        request: RequestId([n; 16]),
        tenant: TenantId::new(format!("tenant-{n}")),
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Page bytes that can only have been written for (request, page, generation).
pub fn fill(layout: KvLayout, request: u8, page: PageId, generation: Generation) -> Vec<u8> {
    let seed = splitmix64(splitmix64(splitmix64(request as u64) ^ page.0 as u64) ^ generation.0);
    (0..layout.page_bytes().div_ceil(8) as u64)
        .flat_map(|chunk| splitmix64(seed ^ chunk).to_le_bytes())
        .take(layout.page_bytes())
        .collect()
}

/// Writes every page of a reservation correctly for `request`; returns the manifest.
pub fn write_all(pool: &KvPool, r: &ReservedPages, request: u8) -> CommitManifest {
    let g = r.grant().clone();
    let mut sums = Vec::new();
    for (i, &(page, generation)) in g.pages.iter().enumerate() {
        let data = fill(pool.layout(), request, page, generation);
        let checksum = page_checksum(&data);
        pool.write_page(PageWrite {
            key: g.key,
            page,
            generation,
            tokens: g.tokens_in_page(i) as u32,
            data: &data,
            checksum,
        })
        .expect("valid write lands");
        sums.push(checksum);
    }
    CommitManifest::new(g.key, g.tokens, sums)
}

/// A finished request of `tokens` tokens whose pages hold KV written for request `req`.
pub fn finished(pool: &KvPool, req: u8, tokens: usize) -> ReadablePages {
    let r = pool.reserve(owner(req), tokens).unwrap();
    let m = write_all(pool, &r, req);
    r.commit(&m).unwrap()
}

/// Prompt token ids `from..from + n`.
pub fn prompt(from: u32, n: usize) -> Vec<u32> {
    (from..from + n as u32).collect()
}
