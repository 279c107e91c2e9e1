//! Parsing the wire request: the request reference, the decode worker's write grant and the
//! sampling parameters. Nothing past this module sees an unparsed message.

use pagewarden_common::{AttemptId, RequestId, TenantId};
use pagewarden_kvcache::{Generation, GrantKey, PageId};
use pagewarden_model::SamplingParams;
use pagewarden_proto::v1 as pb;
pub use pagewarden_worker::wire::{request_ref, sampling};
use tonic::Status;

/// A decode worker's grant as prefill uses it.
#[derive(Debug, Clone)]
pub struct Grant {
    pub key: GrantKey,
    pub pages: Vec<(PageId, Generation)>,
    pub tokens: usize,
    pub page_size: usize,
    pub transfer_addr: String,
}

impl Grant {
    /// Tokens page `index` must hold: full pages, the last one the remainder.
    pub fn tokens_in_page(&self, index: usize) -> usize {
        self.tokens
            .saturating_sub(index * self.page_size)
            .min(self.page_size)
    }
}

/// A parsed `PrefillRequest`.
#[derive(Debug, Clone)]
pub struct ValidPrefill {
    pub req: RequestId,
    pub attempt: AttemptId,
    pub tenant: TenantId,
    /// The tenant's weight in this worker's queues (at least 1).
    pub weight: u32,
    pub prompt: Vec<u32>,
    pub grant: Grant,
    pub sampling: SamplingParams,
}

/// Parses the whole request. `admit` runs (I3) as soon as the lengths are known, before the
/// grant is looked at; the grant must cover exactly the prompt in pages of `page_size`.
pub fn parse(
    m: pb::PrefillRequest,
    page_size: usize,
    admit: impl FnOnce(usize, usize) -> Result<(), Status>,
) -> Result<ValidPrefill, Status> {
    let (req, attempt) = request_ref(m.req.as_ref())?;
    if m.tenant.is_empty() {
        return Err(Status::invalid_argument("tenant is required"));
    }
    let sampling = sampling(m.sampling.as_ref())?;
    admit(m.prompt_tokens.len(), sampling.max_tokens)?;
    let g = m
        .grant
        .ok_or_else(|| Status::invalid_argument("grant is required"))?;
    let key = g
        .key
        .as_slice()
        .try_into()
        .map(GrantKey)
        .map_err(|_| Status::invalid_argument("grant.key must be 16 bytes"))?;
    let grant = Grant {
        key,
        pages: g
            .pages
            .iter()
            .map(|p| (PageId(p.page), Generation(p.generation)))
            .collect(),
        tokens: g.tokens as usize,
        page_size: g.page_size as usize,
        transfer_addr: g.transfer_addr,
    };
    if g.tenant != m.tenant {
        return Err(Status::invalid_argument(
            "grant.tenant differs from the request's tenant",
        ));
    }
    if grant.page_size != page_size {
        return Err(Status::invalid_argument(format!(
            "grant.page_size {} differs from this worker's page size {page_size}",
            grant.page_size
        )));
    }
    if grant.tokens != m.prompt_tokens.len()
        || grant.pages.len() != grant.tokens.div_ceil(page_size)
    {
        return Err(Status::invalid_argument(format!(
            "grant covers {} tokens in {} pages; the prompt has {} tokens",
            grant.tokens,
            grant.pages.len(),
            m.prompt_tokens.len()
        )));
    }
    if grant.transfer_addr.is_empty() {
        return Err(Status::invalid_argument("grant.transfer_addr is required"));
    }
    Ok(ValidPrefill {
        req,
        attempt,
        tenant: TenantId::new(m.tenant),
        weight: m.tenant_weight.max(1),
        prompt: m.prompt_tokens,
        grant,
        sampling,
    })
}
