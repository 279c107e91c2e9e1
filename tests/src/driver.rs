//! Drives a decode and a prefill worker over gRPC exactly as the router does:
//! `Reserve` (decode) → `Prefill` (prefill, with the grant) → `Generate` (decode, with the
//! manifest), collecting the token stream.

use pagewarden_common::RequestId;
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::decode_client::DecodeClient;
use pagewarden_proto::v1::prefill_client::PrefillClient;
use tonic::transport::Channel;
use tonic::Status;

/// A finished completion as seen by a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Completion tokens (marker-only events excluded).
    pub tokens: Vec<u32>,
    /// Concatenated text.
    pub text: String,
    /// The last event's finish reason.
    pub finish: pb::FinishReason,
}

/// gRPC clients of one decode and one prefill worker.
#[derive(Clone)]
pub struct Driver {
    /// Decode client.
    pub decode: DecodeClient<Channel>,
    /// Prefill client.
    pub prefill: PrefillClient<Channel>,
}

/// A request reference for attempt 1 of a fresh id.
pub fn fresh_ref() -> pb::RequestRef {
    pb::RequestRef {
        request_id: RequestId::random().as_bytes().to_vec(),
        attempt: 1,
    }
}

/// Greedy sampling with `max_tokens`.
pub fn greedy(max_tokens: u32) -> pb::SamplingParams {
    pb::SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: None,
        max_tokens,
        ..Default::default()
    }
}

impl Driver {
    /// Connects to both workers.
    pub async fn connect(decode_url: &str, prefill_url: &str) -> Driver {
        Driver {
            decode: DecodeClient::connect(decode_url.to_string())
                .await
                .expect("connect decode"),
            prefill: PrefillClient::connect(prefill_url.to_string())
                .await
                .expect("connect prefill"),
        }
    }

    /// Decode's `Info`.
    pub async fn decode_info(&mut self) -> pb::WorkerInfo {
        self.decode
            .info(pb::InfoRequest {})
            .await
            .expect("decode info")
            .into_inner()
    }

    /// Prefill's `Info`.
    pub async fn prefill_info(&mut self) -> pb::WorkerInfo {
        self.prefill
            .info(pb::InfoRequest {})
            .await
            .expect("prefill info")
            .into_inner()
    }

    /// `Reserve` on decode for `prompt` (the ids prefill is then given), greedy sampling with
    /// `max_tokens`.
    pub async fn reserve(
        &mut self,
        req: &pb::RequestRef,
        tenant: &str,
        prompt: &[u32],
        max_tokens: u32,
    ) -> Result<pb::WriteGrant, Status> {
        self.reserve_with(req, tenant, prompt, greedy(max_tokens))
            .await
    }

    /// `Reserve` on decode for `prompt` with the generation's sampling parameters (said once,
    /// here).
    pub async fn reserve_with(
        &mut self,
        req: &pb::RequestRef,
        tenant: &str,
        prompt: &[u32],
        sampling: pb::SamplingParams,
    ) -> Result<pb::WriteGrant, Status> {
        let r = self
            .decode
            .reserve(pb::ReserveRequest {
                req: Some(req.clone()),
                tenant: tenant.into(),
                prompt_tokens: prompt.len() as u32,
                sampling: Some(sampling),
                prompt_token_ids: prompt.to_vec(),
                tenant_weight: 1,
                namespace: Vec::new(),
            })
            .await?
            .into_inner();
        Ok(r.grant.expect("reserve reply carries a grant"))
    }

    /// `Prefill` on prefill.
    pub async fn prefill(
        &mut self,
        req: &pb::RequestRef,
        tenant: &str,
        prompt: &[u32],
        grant: pb::WriteGrant,
        sampling: pb::SamplingParams,
    ) -> Result<pb::PrefillReply, Status> {
        Ok(self
            .prefill
            .prefill(pb::PrefillRequest {
                req: Some(req.clone()),
                tenant: tenant.into(),
                prompt_tokens: prompt.to_vec(),
                grant: Some(grant),
                sampling: Some(sampling),
                tenant_weight: 1,
                namespace: Vec::new(),
            })
            .await?
            .into_inner())
    }

    /// `Generate` on decode (with the sampling given to `Reserve`), collected to the end of
    /// the stream.
    pub async fn generate(
        &mut self,
        req: &pb::RequestRef,
        reply: pb::PrefillReply,
    ) -> Result<Completion, Status> {
        let mut stream = self
            .decode
            .generate(pb::GenerateRequest {
                req: Some(req.clone()),
                manifest: reply.manifest,
                first_token: reply.first_token,
                first_logprobs: reply.first_logprobs,
            })
            .await?
            .into_inner();
        let mut out = Completion {
            tokens: vec![],
            text: String::new(),
            finish: pb::FinishReason::Unspecified,
        };
        while let Some(ev) = stream.message().await? {
            assert_eq!(
                ev.req.as_ref(),
                Some(req),
                "token event names another request"
            );
            if !ev.marker_only {
                out.tokens.push(ev.token);
            }
            out.text.push_str(&ev.text);
            let finish = pb::FinishReason::try_from(ev.finish).expect("known finish reason");
            if finish != pb::FinishReason::Unspecified {
                out.finish = finish;
                break;
            }
        }
        assert_ne!(
            out.finish,
            pb::FinishReason::Unspecified,
            "stream ended without a finish reason"
        );
        Ok(out)
    }

    /// The whole flow for one prompt.
    pub async fn complete(
        &mut self,
        tenant: &str,
        prompt: &[u32],
        sampling: pb::SamplingParams,
    ) -> Result<Completion, Status> {
        let req = fresh_ref();
        let grant = self
            .reserve_with(&req, tenant, prompt, sampling.clone())
            .await?;
        let reply = self.prefill(&req, tenant, prompt, grant, sampling).await?;
        self.generate(&req, reply).await
    }

    /// `Abort` on decode.
    pub async fn abort_decode(&mut self, req: &pb::RequestRef) -> bool {
        self.decode
            .abort(pb::AbortRequest {
                req: Some(req.clone()),
                reason: "test".into(),
            })
            .await
            .expect("decode abort")
            .into_inner()
            .found
    }
}
