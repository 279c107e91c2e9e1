//! Wire (proto) ↔ domain conversions at the gRPC boundary. Malformed input becomes
//! `INVALID_ARGUMENT` here, so nothing past this layer sees an unparsed message.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pagewarden_kvcache::{CommitManifest, GrantKey, WriteGrant};
use pagewarden_proto::v1 as pb;
pub use pagewarden_worker::wire::{parse_logprobs, prompt_ids, request_ref, sampling};
use tonic::Status;

/// Parses a grant key.
pub fn grant_key(b: &[u8]) -> Result<GrantKey, Status> {
    b.try_into()
        .map(GrantKey)
        .map_err(|_| Status::invalid_argument("grant key must be 16 bytes"))
}

/// Parses a commit manifest.
pub fn manifest(m: Option<&pb::CommitManifest>) -> Result<CommitManifest, Status> {
    let m = m.ok_or_else(|| Status::invalid_argument("manifest is required"))?;
    Ok(CommitManifest {
        key: grant_key(&m.grant_key)?,
        tokens_written: m.tokens_written as usize,
        page_checksums: m.page_checksums.clone(),
        digest: m.digest,
    })
}

fn unix_ms(at: Instant) -> u64 {
    let now_sys = SystemTime::now();
    let now = Instant::now();
    let sys = if at >= now {
        now_sys + (at - now)
    } else {
        now_sys - (now - at)
    };
    sys.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A grant for the wire.
pub fn grant(g: &WriteGrant, transfer_addr: &str) -> pb::WriteGrant {
    pb::WriteGrant {
        key: g.key.0.to_vec(),
        tenant: g.owner.tenant.as_str().to_string(),
        pages: g
            .pages
            .iter()
            .map(|(p, gen)| pb::GrantPage {
                page: p.0,
                generation: gen.0,
            })
            .collect(),
        tokens: g.tokens as u32,
        page_size: g.page_size as u32,
        expires_unix_ms: unix_ms(g.expires_at),
        transfer_addr: transfer_addr.to_string(),
    }
}
