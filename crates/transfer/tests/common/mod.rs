//! Helpers shared by the integration tests: a small pool, owners, page contents, requests and
//! manifests for a grant.
#![allow(dead_code)]

use std::time::Duration;

use bytes::Bytes;
use pagewarden_kvcache::{
    CommitManifest, KvLayout, KvPool, Owner, PoolConfig, RequestId, TenantId, WriteGrant,
};
use pagewarden_transfer::{ManifestBuilder, PageWriteReq};

/// 2 layers, 1 KV head, 8 dims, 4 tokens a page: 256-byte pages.
pub const LAYOUT: KvLayout = KvLayout {
    layers: 2,
    kv_heads: 1,
    head_dim: 8,
    page_size: 4,
};

/// A pool of `pages` pages.
pub fn pool(pages: usize) -> KvPool {
    KvPool::new(PoolConfig::with_pages(LAYOUT, pages))
}

/// An owner for request `n`.
pub fn owner(n: u8) -> Owner {
    Owner {
        request: RequestId([n; 16]),
        tenant: TenantId::new(format!("tenant-{n}")),
    }
}

/// Distinct bytes for page `idx` of writer `tag`.
pub fn page_data(tag: u8, idx: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ tag ^ (idx as u8).wrapping_mul(7))
        .collect()
}

/// One write per granted page, filled with `page_data(tag, ..)`.
pub fn reqs_for(g: &WriteGrant, tag: u8, page_bytes: usize) -> Vec<PageWriteReq> {
    g.pages
        .iter()
        .enumerate()
        .map(|(i, (page, generation))| PageWriteReq {
            dst_page: *page,
            dst_generation: *generation,
            tokens: g.tokens_in_page(i) as u32,
            src: Bytes::from(page_data(tag, i, page_bytes)),
        })
        .collect()
}

/// The manifest a correct sender builds for `reqs`.
pub fn manifest_for(g: &WriteGrant, reqs: &[PageWriteReq]) -> CommitManifest {
    ManifestBuilder::new(g.key).add_batch(reqs).build()
}

/// How long a test waits for what another task does.
pub const WAIT: Duration = Duration::from_secs(5);
