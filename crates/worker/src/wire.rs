//! The workers' proto ↔ domain conversions of the internal plane, once: the write grant
//! (decode sends it, prefill parses it), the commit manifest (prefill sends it, decode parses
//! it), the logprobs, and a prefix-cache erasure (both parse the request, answer the reply). The request reference, the finish reason and the sampling parameters,
//! which the router needs too, are `pagewarden_proto::convert`'s.
//! Malformed input becomes `INVALID_ARGUMENT` here, so nothing past the gRPC layer sees an
//! unparsed message.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pagewarden_common::namespace::Namespace;
use pagewarden_common::TenantId;

use pagewarden_kvcache::{
    CommitManifest, Erasure, Generation, GrantKey, PageId, SharedPages, WriteGrant,
};
use pagewarden_model::{Logprob, TokenLogprobs, MAX_TOP_LOGPROBS};
use pagewarden_proto::v1 as pb;
use pagewarden_transfer::{GrantSeal, SealMode};
use tonic::Status;

/// The prompt's ids (see `ReserveRequest.prompt_token_ids`): exactly `prompt_tokens` of them.
/// Decode needs them to recompute a sequence preempted for pages (and a repetition penalty
/// counts them).
pub fn prompt_ids(ids: Vec<u32>, prompt_tokens: usize) -> Result<Vec<u32>, Status> {
    if ids.len() != prompt_tokens {
        return Err(Status::invalid_argument(format!(
            "prompt_token_ids: all {prompt_tokens} prompt ids are required, got {}",
            ids.len()
        )));
    }
    Ok(ids)
}

/// One `(page, generation)` for the wire.
pub fn grant_page((page, generation): (PageId, Generation)) -> pb::GrantPage {
    pb::GrantPage {
        page: page.0,
        generation: generation.0,
    }
}

/// The runs of a pinned prefix for the wire (what a receipt names): each run's tokens, the
/// namespace, the request that produced it and its pages. Empty when nothing is pinned.
pub fn reused_runs(prefix: &SharedPages) -> Vec<pb::ReusedRun> {
    let namespace = prefix.namespace().as_bytes();
    prefix
        .runs()
        .iter()
        .map(|run| pb::ReusedRun {
            tokens: run.tokens as u32,
            namespace: namespace.to_vec(),
            producer_request_id: run.producer.as_bytes().to_vec(),
            pages: run.pages.iter().map(|&entry| grant_page(entry)).collect(),
        })
        .collect()
}

/// Parses a grant key (16 bytes).
pub fn grant_key(b: &[u8]) -> Result<GrantKey, Status> {
    b.try_into()
        .map(GrantKey)
        .map_err(|_| Status::invalid_argument("grant key must be 16 bytes"))
}

/// A commit manifest for the wire.
pub fn manifest_to_wire(m: CommitManifest) -> pb::CommitManifest {
    pb::CommitManifest {
        grant_key: m.key.0.to_vec(),
        tokens_written: m.tokens_written as u32,
        page_checksums: m.page_checksums,
        digest: m.digest,
    }
}

/// Parses a commit manifest (required).
pub fn manifest(m: Option<&pb::CommitManifest>) -> Result<CommitManifest, Status> {
    let m = m.ok_or_else(|| Status::invalid_argument("manifest is required"))?;
    Ok(CommitManifest {
        key: grant_key(&m.grant_key)?,
        tokens_written: m.tokens_written as usize,
        page_checksums: m.page_checksums.clone(),
        digest: m.digest,
    })
}

/// A decode worker's write grant for the wire; `transfer_addr` is where prefill sends the
/// pages, `seal` how it must seal them when the listener seals.
/// `g` on the wire, after the `prefix_tokens` leading prompt tokens decode already holds.
pub fn grant(
    g: &WriteGrant,
    prefix_tokens: usize,
    transfer_addr: &str,
    seal: Option<&GrantSeal>,
) -> pb::WriteGrant {
    let (seal_mode, seal_secret) = match seal {
        None => (pb::TransferSeal::None, Vec::new()),
        Some(s) => {
            let mode = match s.mode {
                SealMode::Mac => pb::TransferSeal::Mac,
                SealMode::Aead => pb::TransferSeal::Aead,
            };
            (mode, s.secret().to_vec())
        }
    };
    pb::WriteGrant {
        seal: seal_mode as i32,
        seal_secret,
        key: g.key.0.to_vec(),
        tenant: g.owner.tenant.as_str().to_string(),
        pages: g.pages.iter().map(|&entry| grant_page(entry)).collect(),
        tokens: g.tokens as u32,
        page_size: g.page_size as u32,
        expires_unix_ms: unix_ms(Instant::now() + g.idle_ttl),
        transfer_addr: transfer_addr.to_string(),
        prefix_tokens: prefix_tokens as u32,
    }
}

/// A decode worker's write grant as prefill holds it.
#[derive(Debug, Clone)]
pub struct ReceivedGrant {
    /// The grant's key (it names the grant on the transfer connection and in the manifest).
    pub key: GrantKey,
    /// The tenant the pages were reserved for.
    pub tenant: String,
    /// The granted pages, each under the generation decode reserved it at.
    pub pages: Vec<(PageId, Generation)>,
    /// Tokens the grant covers: the prompt after `prefix_tokens`.
    pub tokens: usize,
    /// Leading prompt tokens decode already holds (whole pages of its prefix cache): none of
    /// them is sent, and grant page `i` is the sequence's page `prefix_tokens / page_size + i`.
    pub prefix_tokens: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Decode's transfer listener.
    pub transfer_addr: String,
    /// The seal its frames must carry, when that listener seals.
    pub seal: Option<GrantSeal>,
}

impl ReceivedGrant {
    /// Tokens page `index` must hold: full pages, the last one the remainder.
    pub fn tokens_in_page(&self, index: usize) -> usize {
        self.tokens
            .saturating_sub(index * self.page_size)
            .min(self.page_size)
    }
}

/// Parses a write grant (required). Whether it fits the request is the receiver's check.
pub fn received_grant(g: Option<pb::WriteGrant>) -> Result<ReceivedGrant, Status> {
    let g = g.ok_or_else(|| Status::invalid_argument("grant is required"))?;
    let key =
        grant_key(&g.key).map_err(|_| Status::invalid_argument("grant.key must be 16 bytes"))?;
    if g.transfer_addr.is_empty() {
        return Err(Status::invalid_argument("grant.transfer_addr is required"));
    }
    let mode = match pb::TransferSeal::try_from(g.seal) {
        Ok(pb::TransferSeal::None) => None,
        Ok(pb::TransferSeal::Mac) => Some(SealMode::Mac),
        Ok(pb::TransferSeal::Aead) => Some(SealMode::Aead),
        Err(_) => return Err(Status::invalid_argument("grant.seal is not a known seal")),
    };
    let seal = match mode {
        None => None,
        Some(mode) => {
            let secret = g.seal_secret.as_slice().try_into().map_err(|_| {
                Status::invalid_argument("grant.seal_secret must be 32 bytes when sealed")
            })?;
            Some(GrantSeal::new(mode, secret))
        }
    };
    Ok(ReceivedGrant {
        seal,
        key,
        tenant: g.tenant,
        pages: g
            .pages
            .iter()
            .map(|p| (PageId(p.page), Generation(p.generation)))
            .collect(),
        tokens: g.tokens as usize,
        prefix_tokens: g.prefix_tokens as usize,
        page_size: g.page_size as usize,
        transfer_addr: g.transfer_addr,
    })
}

/// A request's prefix-cache namespace as the router sent it: `None` when empty (no caching
/// for this request), an error unless 32 bytes.
pub fn namespace(bytes: &[u8]) -> Result<Option<Namespace>, Status> {
    if bytes.is_empty() {
        return Ok(None);
    }
    Namespace::from_wire(bytes).map(Some).ok_or_else(|| {
        Status::invalid_argument(format!(
            "namespace has {} bytes; a namespace has 32",
            bytes.len()
        ))
    })
}

/// Parses an `EraseCache` call: the tenant and its namespace, both required.
pub fn erase_request(m: pb::EraseCacheRequest) -> Result<(TenantId, Namespace), Status> {
    if m.tenant.is_empty() {
        return Err(Status::invalid_argument("tenant is required"));
    }
    let namespace = namespace(&m.namespace)?
        .ok_or_else(|| Status::invalid_argument("namespace is required"))?;
    Ok((TenantId::new(m.tenant), namespace))
}

/// What worker `node_id` (`role`) erased, for the wire.
pub fn erase_reply(node_id: &str, role: &str, e: &Erasure) -> pb::EraseCacheReply {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    pb::EraseCacheReply {
        node_id: node_id.to_string(),
        role: role.to_string(),
        entries: count(e.entries),
        pages_zeroed: count(e.pages_zeroed),
        pages_deferred: count(e.pages_deferred),
        digest: e.digest.to_vec(),
    }
}

/// `at` as Unix milliseconds (a grant's expiry on the wire).
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

/// A token's logprobs for the wire.
pub fn logprobs(l: &TokenLogprobs) -> pb::Logprobs {
    let one = |l: &Logprob| pb::TokenLogprob {
        token: l.token,
        logprob: l.logprob,
    };
    pb::Logprobs {
        chosen: Some(one(&l.chosen)),
        top: l.top.iter().map(one).collect(),
    }
}

/// Parses a token's logprobs (absent stays absent).
pub fn parse_logprobs(l: Option<&pb::Logprobs>) -> Result<Option<TokenLogprobs>, Status> {
    let Some(l) = l else { return Ok(None) };
    let one = |l: &pb::TokenLogprob| {
        if l.logprob.is_nan() || l.logprob > 0.0 {
            return Err(Status::invalid_argument(
                "logprobs: a logprob must be a number <= 0",
            ));
        }
        Ok(Logprob {
            token: l.token,
            logprob: l.logprob,
        })
    };
    let chosen = l
        .chosen
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("logprobs.chosen is required"))?;
    if l.top.len() > MAX_TOP_LOGPROBS {
        return Err(Status::invalid_argument(format!(
            "logprobs.top: at most {MAX_TOP_LOGPROBS}"
        )));
    }
    Ok(Some(TokenLogprobs {
        chosen: one(chosen)?,
        top: l.top.iter().map(one).collect::<Result<_, _>>()?,
    }))
}
