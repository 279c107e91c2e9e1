//! Parsing of ingested reports: the gRPC handlers turn wire messages into these `Valid*` types,
//! and the engine accepts only these. Each error names the field and is sent back as
//! `INVALID_ARGUMENT`.

use pagewarden_common::{RequestId, TenantId};
use pagewarden_proto::v1 as pb;

use crate::domain::{CacheEventKind, IntegrityKind, NodeRole, SampleStatus};

/// A report that cannot be accepted, with a message for its sender.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidReport(pub String);

fn bad(msg: impl Into<String>) -> InvalidReport {
    InvalidReport(msg.into())
}

fn request_id(r: Option<&pb::RequestRef>) -> Result<Option<RequestId>, InvalidReport> {
    match r {
        None => Ok(None),
        Some(r) if r.request_id.is_empty() => Ok(None),
        Some(r) => RequestId::from_bytes(&r.request_id)
            .map(Some)
            .ok_or_else(|| bad("req.request_id must be 16 bytes")),
    }
}

/// Whether `s` is `len` lowercase hex digits.
fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn non_empty(s: String) -> Option<String> {
    if s.is_empty() {
        None
    } else {
        Some(s)
    }
}

/// What the response of a sampled request looks like to the auditor.
#[derive(Clone, Debug)]
pub enum SampleBody {
    /// The full text: it will be scanned.
    Text(String),
    /// Only a digest (hex): stored, not scannable.
    Digest(String),
}

/// A sampled response from the router.
#[derive(Clone, Debug)]
pub struct ValidSample {
    /// The requesting tenant.
    pub tenant: TenantId,
    /// The request.
    pub request: Option<RequestId>,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Completion tokens.
    pub completion_tokens: u32,
    /// The response.
    pub body: SampleBody,
    /// Time to first token.
    pub ttft_ms: Option<u32>,
    /// How it ended.
    pub status: SampleStatus,
    /// The decode node, when known.
    pub node: Option<String>,
}

impl TryFrom<pb::SampleReport> for ValidSample {
    type Error = InvalidReport;
    fn try_from(m: pb::SampleReport) -> Result<Self, InvalidReport> {
        if m.tenant.is_empty() {
            return Err(bad("tenant is required"));
        }
        let status = match pb::SampleStatus::try_from(m.status) {
            Ok(pb::SampleStatus::Ok) => SampleStatus::Ok,
            Ok(pb::SampleStatus::Rejected) => SampleStatus::Rejected,
            Ok(pb::SampleStatus::Error) => SampleStatus::Error,
            Ok(pb::SampleStatus::Cancelled) => SampleStatus::Cancelled,
            Ok(pb::SampleStatus::Unspecified) | Err(_) => {
                return Err(bad("status must be set to a known SampleStatus"))
            }
        };
        let body = if !m.response_text.is_empty() {
            SampleBody::Text(m.response_text)
        } else {
            SampleBody::Digest(pagewarden_common::hex::encode(&m.response_digest))
        };
        Ok(ValidSample {
            tenant: TenantId::new(m.tenant),
            request: request_id(m.req.as_ref())?,
            prompt_tokens: m.prompt_tokens,
            completion_tokens: m.completion_tokens,
            body,
            ttft_ms: m.ttft_ms,
            status,
            node: non_empty(m.node),
        })
    }
}

/// Most tokens (prompt and output together) a recompute report may carry: more than any
/// model's context the suite serves, small enough that one report cannot exhaust memory.
pub const MAX_RECOMPUTE_TOKENS: usize = 1 << 20;

/// A served request for the recompute audit (see `recompute`).
#[derive(Clone, Debug)]
pub struct ValidRecompute {
    /// The requesting tenant.
    pub tenant: TenantId,
    /// The request.
    pub request: Option<RequestId>,
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// The served output's token ids.
    pub output: Vec<u32>,
    /// The serving path's raw logprob of each output token (as many).
    pub served: Vec<f32>,
    /// The request's temperature (recorded; the audit scores raw logprobs).
    pub temperature: f32,
    /// The decode node that served it, when known.
    pub decode_node: Option<String>,
    /// The prefill node that computed the prompt, when known.
    pub prefill_node: Option<String>,
    /// Decode's page table at the end: (page, generation).
    pub pages: Vec<(u32, u64)>,
    /// Leading prompt tokens that came from a prefix cache.
    pub cached_tokens: u32,
    /// The serving prefill's and decode's arithmetic (empty where unknown).
    pub arithmetic: [String; 2],
}

impl ValidRecompute {
    /// Its token ids, prompt and output.
    pub fn tokens(&self) -> usize {
        self.prompt.len() + self.output.len()
    }
}

impl TryFrom<pb::RecomputeReport> for ValidRecompute {
    type Error = InvalidReport;
    fn try_from(m: pb::RecomputeReport) -> Result<Self, InvalidReport> {
        if m.tenant.is_empty() {
            return Err(bad("tenant is required"));
        }
        if m.prompt_tokens.is_empty() {
            return Err(bad("prompt_tokens must not be empty"));
        }
        if m.prompt_tokens.len() + m.output_tokens.len() > MAX_RECOMPUTE_TOKENS {
            return Err(bad(format!(
                "prompt_tokens and output_tokens hold more than {MAX_RECOMPUTE_TOKENS} tokens"
            )));
        }
        if m.served_logprobs.len() != m.output_tokens.len() {
            return Err(bad(format!(
                "served_logprobs has {} entries for {} output_tokens",
                m.served_logprobs.len(),
                m.output_tokens.len()
            )));
        }
        if m.served_logprobs
            .iter()
            .any(|l| !(l.is_finite() && *l <= 0.0))
        {
            return Err(bad("served_logprobs must be finite and at most 0"));
        }
        Ok(ValidRecompute {
            tenant: TenantId::new(m.tenant),
            request: request_id(m.req.as_ref())?,
            prompt: m.prompt_tokens,
            output: m.output_tokens,
            served: m.served_logprobs,
            temperature: m.temperature,
            decode_node: non_empty(m.decode_node),
            prefill_node: non_empty(m.prefill_node),
            pages: m.pages.iter().map(|p| (p.page, p.generation)).collect(),
            cached_tokens: m.cached_tokens,
            arithmetic: [m.prefill_arithmetic, m.decode_arithmetic],
        })
    }
}

/// An integrity event from a worker.
#[derive(Clone, Debug)]
pub struct ValidIntegrity {
    /// What was detected.
    pub kind: IntegrityKind,
    /// The reporting worker.
    pub node: String,
    /// The request involved.
    pub request: Option<RequestId>,
    /// The tenant involved.
    pub tenant: Option<TenantId>,
    /// The page involved.
    pub page: Option<u32>,
    /// The generation involved.
    pub generation: Option<u64>,
    /// Free-form details.
    pub details: String,
}

impl TryFrom<pb::IntegrityReport> for ValidIntegrity {
    type Error = InvalidReport;
    fn try_from(m: pb::IntegrityReport) -> Result<Self, InvalidReport> {
        let kind = pagewarden_proto::convert::integrity_kind(m.kind)
            .ok_or_else(|| bad("kind must be a known IntegrityKind"))?;
        if m.node.is_empty() {
            return Err(bad("node is required"));
        }
        Ok(ValidIntegrity {
            kind,
            node: m.node,
            request: request_id(m.req.as_ref())?,
            tenant: non_empty(m.tenant).map(TenantId::new),
            page: m.page,
            generation: m.generation,
            details: m.details,
        })
    }
}

/// A worker's preflight result.
#[derive(Clone, Debug)]
pub struct ValidPreflight {
    /// The worker.
    pub node: String,
    /// Its role.
    pub role: NodeRole,
    /// KV pool capacity in tokens.
    pub pool_tokens: u64,
    /// Advertised context.
    pub context_length: u32,
    /// The worker's own verdict.
    pub ok: bool,
    /// Its explanation.
    pub message: String,
}

impl TryFrom<pb::PreflightReport> for ValidPreflight {
    type Error = InvalidReport;
    fn try_from(m: pb::PreflightReport) -> Result<Self, InvalidReport> {
        if m.node.is_empty() {
            return Err(bad("node is required"));
        }
        let role = m
            .role
            .parse::<NodeRole>()
            .map_err(|_| bad("role must be \"prefill\" or \"decode\""))?;
        Ok(ValidPreflight {
            node: m.node,
            role,
            pool_tokens: m.pool_tokens,
            context_length: m.context_length,
            ok: m.ok,
            message: m.message,
        })
    }
}

/// A prefix-cache event from a worker.
#[derive(Clone, Debug)]
pub struct ValidCacheEvent {
    /// Hit, miss or eviction.
    pub kind: CacheEventKind,
    /// The reporting worker's node id.
    pub node: String,
    /// Prefill or decode.
    pub role: NodeRole,
    /// Hit, miss: whose prompt it was; eviction: whose request last used the namespace.
    pub tenant: Option<TenantId>,
    /// The namespace's tag: 8 lowercase hex digits.
    pub namespace: String,
    /// Hit, miss: the request.
    pub request: Option<RequestId>,
    /// Prompt tokens looked up.
    pub prompt_tokens: u32,
    /// Of those, found cached.
    pub cached_tokens: u32,
    /// Pages hit or evicted.
    pub pages: u32,
}

impl TryFrom<pb::CacheReport> for ValidCacheEvent {
    type Error = InvalidReport;
    fn try_from(m: pb::CacheReport) -> Result<Self, InvalidReport> {
        if m.node.is_empty() {
            return Err(bad("node is required"));
        }
        let role = m
            .role
            .parse::<NodeRole>()
            .map_err(|_| bad("role must be \"prefill\" or \"decode\""))?;
        if !is_hex(&m.namespace, 8) {
            return Err(bad(
                "namespace must be a namespace tag: 8 lowercase hex digits",
            ));
        }
        let kind = match pb::CacheEventKind::try_from(m.kind) {
            Ok(pb::CacheEventKind::Hit) => CacheEventKind::Hit,
            Ok(pb::CacheEventKind::Miss) => CacheEventKind::Miss,
            Ok(pb::CacheEventKind::Eviction) => CacheEventKind::Eviction,
            Ok(pb::CacheEventKind::Held) => CacheEventKind::Held,
            Ok(pb::CacheEventKind::Unspecified) | Err(_) => {
                return Err(bad("kind must be set to a known CacheEventKind"))
            }
        };
        let consistent = match kind {
            CacheEventKind::Hit => 0 < m.cached_tokens && m.cached_tokens < m.prompt_tokens,
            CacheEventKind::Miss => m.cached_tokens == 0 && m.prompt_tokens > 0,
            CacheEventKind::Eviction => m.pages > 0,
            CacheEventKind::Held => m.prompt_tokens == 0 && m.cached_tokens == 0,
        };
        if !consistent {
            return Err(bad(format!(
                "a {kind} with {} of {} prompt tokens cached and {} pages is inconsistent",
                m.cached_tokens, m.prompt_tokens, m.pages
            )));
        }
        Ok(ValidCacheEvent {
            kind,
            node: m.node,
            role,
            tenant: non_empty(m.tenant).map(TenantId::new),
            namespace: m.namespace,
            request: request_id(m.req.as_ref())?,
            prompt_tokens: m.prompt_tokens,
            cached_tokens: m.cached_tokens,
            pages: m.pages,
        })
    }
}

/// A tenant's prefix-cache erasure, as the router certified it (`DELETE /v1/cache`).
#[derive(Clone, Debug)]
pub struct ValidErasure {
    /// The tenant.
    pub tenant: TenantId,
    /// Its namespace's tag: 8 lowercase hex digits.
    pub namespace: String,
    /// The certificate's digest: 64 lowercase hex digits.
    pub digest: String,
    /// Each worker's part (at least one).
    pub workers: Vec<ValidErasedWorker>,
}

/// One worker's part of a [`ValidErasure`].
#[derive(Clone, Debug)]
pub struct ValidErasedWorker {
    /// Its node id.
    pub node: String,
    /// Prefill or decode.
    pub role: NodeRole,
    /// Cached pages taken out of its index.
    pub entries: u32,
    /// Of them, zeroed at once.
    pub pages_zeroed: u32,
    /// Of them, zeroed when their last reader lets go.
    pub pages_deferred: u32,
    /// Its digest: 64 lowercase hex digits.
    pub digest: String,
}

impl TryFrom<pb::ErasureReport> for ValidErasure {
    type Error = InvalidReport;
    fn try_from(m: pb::ErasureReport) -> Result<Self, InvalidReport> {
        if m.tenant.is_empty() {
            return Err(bad("tenant is required"));
        }
        if !is_hex(&m.namespace, 8) {
            return Err(bad(
                "namespace must be a namespace tag: 8 lowercase hex digits",
            ));
        }
        if !is_hex(&m.digest, 64) {
            return Err(bad("digest must be 64 lowercase hex digits"));
        }
        if m.workers.is_empty() {
            return Err(bad("workers: an erasure names at least one worker"));
        }
        let workers = m
            .workers
            .into_iter()
            .enumerate()
            .map(|(i, w)| {
                if w.node.is_empty() {
                    return Err(bad(format!("workers[{i}].node is required")));
                }
                let role = w.role.parse::<NodeRole>().map_err(|_| {
                    bad(format!(
                        "workers[{i}].role must be \"prefill\" or \"decode\""
                    ))
                })?;
                if !is_hex(&w.digest, 64) {
                    return Err(bad(format!(
                        "workers[{i}].digest must be 64 lowercase hex digits"
                    )));
                }
                if u64::from(w.entries) != u64::from(w.pages_zeroed) + u64::from(w.pages_deferred) {
                    return Err(bad(format!(
                        "workers[{i}]: {} entries but {} pages zeroed and {} deferred",
                        w.entries, w.pages_zeroed, w.pages_deferred
                    )));
                }
                Ok(ValidErasedWorker {
                    node: w.node,
                    role,
                    entries: w.entries,
                    pages_zeroed: w.pages_zeroed,
                    pages_deferred: w.pages_deferred,
                    digest: w.digest,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ValidErasure {
            tenant: TenantId::new(m.tenant),
            namespace: m.namespace,
            digest: m.digest,
            workers,
        })
    }
}
