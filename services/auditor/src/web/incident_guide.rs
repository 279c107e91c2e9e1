//! What each incident kind means and what an operator does next, as the incident page says it.
//! One entry per kind, matched exhaustively: a new kind does not build until it says both.

use crate::domain::{IncidentKind, IntegrityKind};

/// The incident page's explanation of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guide {
    /// What was detected and what it means for isolation or correctness.
    pub meaning: &'static str,
    /// The operator's next step.
    pub next: &'static str,
}

/// The explanation of `kind`.
pub fn guide(kind: IncidentKind) -> Guide {
    let (meaning, next) = match kind {
        IncidentKind::CrossTenantMarker => (
            "A response to one tenant contained a canary marker the auditor issued to another \
             tenant: text of another tenant's prompt reached this tenant's answer. Isolation \
             failed for this request.",
            "Treat it as a data exposure: find the request and the workers that served it \
             (details, node), drain those workers, and compare their integrity incidents around \
             this time. Keep the incident open until the cause is known.",
        ),
        IncidentKind::ProbeBadStatus => (
            "A probe request got a server error, or a 4xx without OpenAI's error body: the \
             router answered something a client cannot act on.",
            "Open the probe run (link above) for the step and its HTTP status; check the \
             router's and workers' logs at that time and whether every worker was live.",
        ),
        IncidentKind::ProbeTokenCount => (
            "The router reported a prompt length (usage.prompt_tokens) other than the \
             tokenizer's count: the served model or its tokenizer is not the one the auditor \
             checks against, or prompts are being cut or padded.",
            "Check that the auditor's --model is the GGUF the workers serve; if it is, the \
             router's tokenization is wrong: stop rolling out the build that introduced it.",
        ),
        IncidentKind::ProbeLatency => (
            "A probe's first token came later than the suite's own measured pace allows for \
             its length (4x the time at that pace, never under the floor): a stalled or \
             overloaded worker.",
            "Look at the workers' queue depth and preemptions at that time (their /metrics) \
             and whether one was frozen or restarting; repeated ones on one node mean that \
             node is unhealthy.",
        ),
        IncidentKind::ProbeOverlengthAccepted => (
            "A prompt longer than the advertised context was answered with HTTP 200. This is \
             the admission failure behind the SGLang incident: an over-long prompt served over \
             pages another request may have written.",
            "Critical: stop serving from this deployment's build. Check the router's and the \
             workers' context limits (preflight on the Nodes page) and the admission path.",
        ),
        IncidentKind::ProbeUnreachable => (
            "The prober could not reach the router (no connection, or /v1/models did not say \
             how long a context may be).",
            "Check that the router is up and that the auditor's --router-url and probe keys \
             are right; nothing was probed meanwhile.",
        ),
        IncidentKind::SideChannel => (
            "The side-channel audit found another tenant able to tell that a prompt was cached \
             by someone else: by first-token times (timing) or by the order its requests came \
             back in (order). The details name the channel, the worker and the p-value.",
            "Check the worker's prefix-cache namespaces (Tenants page; the tenants file's \
             shared_namespace settings) and the router build: tenants must not share a \
             namespace unless configured to. Run the audit again from the Probes page.",
        ),
        IncidentKind::RecomputeMismatch => (
            "A served answer, scored again on a clean forward pass (fresh pages, no prefix \
             cache, another process), had a token whose logprob differs beyond the tolerance: \
             the answer was computed over something other than its own prompt, such as \
             another request's KV.",
            "Treat it as a possible exposure: the details give the first diverging position \
             and the decode pages with their generations; look for integrity incidents on \
             that node and those pages, and drain it.",
        ),
        IncidentKind::Integrity(k) => integrity(k),
    };
    Guide { meaning, next }
}

fn integrity(k: IntegrityKind) -> (&'static str, &'static str) {
    match k {
        IntegrityKind::GenerationMismatch => (
            "A KV read presented a page generation other than the page's current one: the page \
             was freed and reused since the reader was granted it (I1). The read was refused.",
            "The request was failed instead of answered over a stale page. Repeated ones on \
             one node point at a release path freeing pages early: see the node's other \
             incidents.",
        ),
        IntegrityKind::ChecksumMismatch => (
            "A transferred page's bytes did not match the checksum in prefill's commit \
             manifest (I2): the KV was corrupted or overwritten in flight. Decode refused it.",
            "Check the transfer link and both workers' logs; repeated ones between the same \
             pair mean a faulty link or device.",
        ),
        IntegrityKind::CountMismatch => (
            "Prefill wrote a different number of tokens than decode reserved pages for (I2): \
             decode would have attended over pages never written for this request. It \
             refused to generate.",
            "The request failed safely. Compare the two workers' builds and context limits \
             (Nodes page): this is the admission mismatch of the SGLang incident.",
        ),
        IntegrityKind::GuardWordCorrupt => (
            "A page's guard word was overwritten (I2): something wrote past a page's end, or \
             into a page it was not granted.",
            "Drain the node; look for write_rejected or quarantine incidents around it.",
        ),
        IntegrityKind::WriteRejected => (
            "A write carried a revoked or unknown grant key (I4): a late write from an \
             aborted or preempted request, fenced before it could land in another request's \
             pages.",
            "Working as designed when rare (aborts under load). Many on one node mean a \
             sender that keeps writing after cancellation: check that sender's logs.",
        ),
        IntegrityKind::Quarantine => (
            "Pages went to quarantine because their in-flight writes could not be confirmed \
             drained (I4): they are held out of the free list, not reused.",
            "Capacity is reduced until the quarantine ends; if it grows, restart the node in \
             a drain.",
        ),
        IntegrityKind::DeferredReleaseDrained => (
            "A release waited for in-flight writes and they drained (I4 working as designed).",
            "Nothing to do; it is recorded for completeness.",
        ),
        IntegrityKind::DeferredReleaseTimedOut => (
            "A release waited for in-flight writes and gave up: the pages were quarantined \
             rather than reused.",
            "Check the sending worker and the transfer link; see the node's quarantine \
             incidents.",
        ),
        IntegrityKind::PreflightFailed => (
            "A worker's KV pool cannot hold the context it advertises (I7): long prompts would \
             not fit. The worker refuses to serve.",
            "Give it a larger pool or a smaller context (Nodes page shows both), then restart.",
        ),
        IntegrityKind::PageNotWritten => (
            "Decode was granted a page that prefill never wrote for this request (I2): \
             generating would have attended over whatever the page held before.",
            "The request failed safely. Look at the prefill worker's incidents and logs for \
             the same request.",
        ),
        IntegrityKind::ManifestMismatch => (
            "The commit manifest's digest or grant key did not match what decode holds (I2): \
             the KV came from another attempt or was altered.",
            "Check both workers' builds and the transfer link; repeated ones mean a sender \
             out of step.",
        ),
        IntegrityKind::StaleMessage => (
            "A message of an old attempt or a revoked grant arrived and was dropped (I5).",
            "Working as designed when rare; many mean retries racing with cancellation.",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_says_what_it_means_and_what_to_do() {
        for &k in IncidentKind::ALL {
            let g = guide(k);
            assert!(g.meaning.len() > 40 && g.next.len() > 30, "{k}: {g:?}");
        }
    }
}
