//! The decode half of the prefix cache (I10): a finished sequence's full prompt pages stay in
//! this worker's pool under the request's namespace, and a later prompt of the same namespace
//! is granted only after the longest prefix held here (`WriteGrant.prefix_tokens`), so
//! prefill sends only the rest (SGLang's `decode_prefix_len`).
//!
//! The cached pages are the pool's (`pagewarden_kvcache::prefix`): read-only once cached, held
//! by pins, looked up only under the namespace the router derived, read generation-checked
//! like any page (I1). What stands in for the commit check (I2) on them: every one of them was
//! committed for an earlier request of the same namespace, whose prompt held exactly these
//! tokens before them (the hash chain over token ids), and is pinned at the generation it was
//! cached at before the grant is sent, so it cannot change or leave until this sequence ends.

use pagewarden_common::namespace::Namespace;
use pagewarden_kvcache::{Owner, SharedPages};

use super::SchedulerDeps;
use crate::state::Running;

/// Pins the longest cached prefix of `tokens` (whole pages) under `namespace`; `None` when the
/// request has no namespace.
pub(super) fn pin_prefix(
    deps: &SchedulerDeps,
    namespace: Option<&Namespace>,
    tokens: &[u32],
) -> Option<SharedPages> {
    Some(deps.pool.pin_prefix(namespace?, tokens))
}

/// Pins the prefix a new prompt is granted after: every whole cached page but the one holding
/// its last token, whose logits prefill computes. Logged per tenant (metrics, auditor).
pub(super) fn pin_prompt_prefix(
    deps: &SchedulerDeps,
    owner: &Owner,
    namespace: Option<&Namespace>,
    prompt: &[u32],
) -> Option<SharedPages> {
    let prefix = pin_prefix(deps, namespace, &prompt[..prompt.len().saturating_sub(1)])?;
    deps.prefix_log.lookup(
        &owner.tenant,
        prefix.namespace(),
        owner.request,
        prompt.len(),
        prefix.len(),
    );
    Some(prefix)
}

/// Ends a finished sequence: its full prompt pages join the cache (see [`Running::finish`]),
/// the rest are freed.
pub(super) fn finish_sequence(deps: &SchedulerDeps, r: Running) {
    let tenant = r.seq.owner.tenant.clone();
    let namespace = r.seq.namespace;
    if let (Some(published), Some(ns)) = (r.finish(), namespace) {
        deps.prefix_log.published(&tenant, &ns, &published);
    }
}
