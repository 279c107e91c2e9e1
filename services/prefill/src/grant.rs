//! Parsing the wire request: the request reference, the decode worker's write grant and the
//! sampling parameters. Nothing past this module sees an unparsed message.

use pagewarden_common::namespace::Namespace;
use pagewarden_common::{AttemptId, RequestId, TenantId};
use pagewarden_model::SamplingParams;
pub use pagewarden_proto::convert::parse_request_ref as request_ref;
pub use pagewarden_proto::convert::sampling;
use pagewarden_proto::v1 as pb;
pub use pagewarden_worker::wire::{received_grant, ReceivedGrant};
use tonic::Status;

/// A parsed `PrefillRequest`.
#[derive(Debug, Clone)]
pub struct ValidPrefill {
    pub req: RequestId,
    pub attempt: AttemptId,
    pub tenant: TenantId,
    /// The tenant's weight in this worker's queues (at least 1).
    pub weight: u32,
    pub prompt: Vec<u32>,
    pub grant: ReceivedGrant,
    pub sampling: SamplingParams,
    /// The prefix-cache namespace the router derived; `None`: no caching for this request
    /// (always, when `sampling.prompt_logprobs` scores the prompt: the whole prompt is
    /// computed, with no held prefix).
    pub namespace: Option<Namespace>,
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
    let grant = received_grant(m.grant)?;
    if grant.tenant != m.tenant {
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
    // Decode may hold whole pages of the prompt already (never its last token, whose logits
    // give the first token); the grant covers exactly the rest.
    if grant.prefix_tokens % page_size != 0 || grant.prefix_tokens >= m.prompt_tokens.len() {
        return Err(Status::invalid_argument(format!(
            "grant.prefix_tokens {} is not a whole number of pages of the {}-token prompt, \
             short of its last token",
            grant.prefix_tokens,
            m.prompt_tokens.len()
        )));
    }
    if grant.prefix_tokens + grant.tokens != m.prompt_tokens.len()
        || grant.pages.len() != grant.tokens.div_ceil(page_size)
    {
        return Err(Status::invalid_argument(format!(
            "grant covers {} tokens in {} pages after {} held; the prompt has {} tokens",
            grant.tokens,
            grant.pages.len(),
            grant.prefix_tokens,
            m.prompt_tokens.len()
        )));
    }
    let namespace = pagewarden_worker::wire::namespace(&m.namespace)?;
    if sampling.prompt_logprobs.is_some() && (namespace.is_some() || grant.prefix_tokens > 0) {
        return Err(Status::invalid_argument(
            "sampling.prompt_logprobs needs the whole prompt computed: send no namespace \
             and a grant with no held prefix",
        ));
    }
    Ok(ValidPrefill {
        req,
        attempt,
        tenant: TenantId::new(m.tenant),
        weight: m.tenant_weight.max(1),
        prompt: m.prompt_tokens,
        grant,
        sampling,
        namespace,
    })
}
