//! `AuditorSampleSink`: sends every finished response, every cache erasure's certificate and
//! every choice picked for the recompute audit to the auditor through [`AuditorClient`]
//! (bounded buffer, never blocks; drops and counts when full).

use pagewarden_common::auditor_client::AuditorClient;
use pagewarden_common::AttemptId;
use pagewarden_proto::convert::request_ref;
use pagewarden_proto::v1 as pb;

use crate::erasure::CacheErasure;
use crate::sample::{RecomputeSample, ResponseSample, SampleSink};

/// Reports each offered sample to the auditor.
#[derive(Clone)]
pub struct AuditorSampleSink {
    client: AuditorClient,
}

impl AuditorSampleSink {
    /// Reports through `client`.
    pub fn new(client: AuditorClient) -> Self {
        AuditorSampleSink { client }
    }

    /// The client, for its drop/send counters.
    pub fn client(&self) -> &AuditorClient {
        &self.client
    }
}

/// The wire status of a finish reason: `abort` means the response was cut short.
fn status(finish_reason: &str) -> pb::SampleStatus {
    match finish_reason {
        "abort" => pb::SampleStatus::Cancelled,
        _ => pb::SampleStatus::Ok,
    }
}

/// The wire form of one sample.
pub fn sample_report(s: ResponseSample) -> pb::SampleReport {
    pb::SampleReport {
        tenant: s.tenant.as_str().to_string(),
        req: Some(request_ref(s.request, AttemptId(1))),
        prompt_tokens: s.prompt_tokens,
        completion_tokens: s.completion_tokens,
        response_text: s.text,
        response_digest: Vec::new(),
        ttft_ms: s
            .ttft
            .map(|d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX)),
        status: status(s.finish_reason) as i32,
        node: String::new(),
    }
}

/// The wire form of an erasure's certificate.
pub fn erasure_report(c: &CacheErasure) -> pb::ErasureReport {
    pb::ErasureReport {
        tenant: c.tenant.clone(),
        namespace: c.namespace.clone(),
        workers: c
            .workers
            .iter()
            .map(|w| pb::ErasedWorker {
                node: w.worker.clone(),
                role: w.role.to_string(),
                entries: w.entries,
                pages_zeroed: w.pages_zeroed,
                pages_deferred: w.pages_deferred,
                digest: w.digest.clone(),
            })
            .collect(),
        digest: c.digest.clone(),
    }
}

/// The wire form of a choice for the recompute audit.
pub fn recompute_report(r: RecomputeSample) -> pb::RecomputeReport {
    pb::RecomputeReport {
        tenant: r.tenant.as_str().to_string(),
        req: Some(request_ref(r.request, AttemptId(1))),
        prompt_tokens: r.prompt,
        output_tokens: r.output,
        served_logprobs: r.served_logprobs,
        temperature: r.temperature,
        decode_node: r.decode_node,
        pages: r
            .pages
            .into_iter()
            .map(|(page, generation)| pb::GrantPage { page, generation })
            .collect(),
        prefill_node: r.prefill_node,
        cached_tokens: r.cached_tokens,
        prefill_arithmetic: r.arithmetic[0].clone(),
        decode_arithmetic: r.arithmetic[1].clone(),
    }
}

impl SampleSink for AuditorSampleSink {
    fn offer(&self, sample: ResponseSample) {
        self.client.report_sample(sample_report(sample));
    }

    fn erased(&self, certificate: &CacheErasure) {
        self.client.report_erasure(erasure_report(certificate));
    }

    fn takes_recomputes(&self) -> bool {
        true
    }

    fn recompute(&self, sample: RecomputeSample) {
        self.client.report_recompute(recompute_report(sample));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pagewarden_common::auditor_client::Report;
    use pagewarden_common::{RequestId, TenantId};

    use super::*;

    #[tokio::test]
    async fn offered_sample_reaches_the_client_buffer() {
        let (client, mut rx) = AuditorClient::with_sink(4);
        let sink = AuditorSampleSink::new(client);
        sink.offer(ResponseSample {
            request: RequestId([7; 16]),
            tenant: TenantId::new("alpha"),
            endpoint: "completions",
            prompt_tokens: 5,
            completion_tokens: 3,
            text: "hello".into(),
            finish_reason: "length",
            ttft: Some(Duration::from_millis(42)),
        });
        let Some(Report::Sample(r)) = rx.recv().await else {
            panic!("expected a sample report");
        };
        assert_eq!(r.tenant, "alpha");
        assert_eq!(r.req.unwrap().request_id, vec![7; 16]);
        assert_eq!((r.prompt_tokens, r.completion_tokens), (5, 3));
        assert_eq!(r.response_text, "hello");
        assert_eq!(r.ttft_ms, Some(42));
        assert_eq!(r.status, pb::SampleStatus::Ok as i32);
        assert_eq!(sink.client().stats().queued, 1);
    }
}
