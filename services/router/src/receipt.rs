//! Isolation receipts (`X-Pagewarden-Receipt: 1`): what each choice of a response was computed
//! over, signed with the deployment's key (`pagewarden_common::receipt`), so a tenant can prove
//! afterwards which cached pages (and whose), which transfer and which decode pages its answer
//! came from.
//!
//! A receipt names, for the response: its id, model, tenant, the tenant's namespace tag and
//! the SHA-256 of the router's own executable (the build); for each choice: its request id,
//! the SHA-256 of its prompt's and its output's token ids (u32 little-endian each), prefill's
//! worker with its reused prefix-cache runs (tokens, namespace tag, the request that produced
//! them, pages), the transfer (the grant's pages and the commit manifest decode verified
//! before its first token: a choice that produced a token passed that check, I2), and decode's
//! worker with its own reused runs, its page table at the end and its preemptions.
//!
//! Everything in it came from the workers' replies to this request; the router adds no claim
//! of its own beyond the ids, digests and the build.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use axum::http::HeaderMap;
use pagewarden_common::hex;
use pagewarden_common::namespace::Namespace;
use pagewarden_common::receipt::{
    ids_sha256, PublicKey, ReceiptKey, ReceiptKeyError, RECEIPT_VERSION,
};
use pagewarden_proto::v1::ReusedRun;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::error::{RouterError, ValidationError};
use crate::provenance::Provenance;
use crate::respond::Streaming;

/// The request header that asks for a receipt.
pub const RECEIPT_HEADER: &str = "x-pagewarden-receipt";

/// Where the router signs receipts: the key and the build's hash.
pub struct Receipts {
    key: ReceiptKey,
    /// SHA-256 of the running executable, computed once in the background at start.
    build: Arc<OnceLock<String>>,
}

impl Receipts {
    /// Signs with `key`; starts hashing the executable.
    pub fn new(key: ReceiptKey) -> Self {
        let build = Arc::new(OnceLock::new());
        let b = build.clone();
        std::thread::spawn(move || {
            b.get_or_init(executable_sha256);
        });
        Self { key, build }
    }

    /// Signs with the PEM key at `path`.
    pub fn load(path: &Path) -> Result<Self, ReceiptKeyError> {
        ReceiptKey::load(path).map(Self::new)
    }

    /// The key verifiers check against.
    pub fn public(&self) -> PublicKey {
        self.key.public()
    }

    /// The signed receipt of a response whose every choice has ended.
    pub fn issue(&self, s: &Streaming) -> Result<Value, RouterError> {
        let build = self.build.get_or_init(executable_sha256);
        let choices: Vec<Value> = s
            .outs
            .iter()
            .map(|out| {
                let summary = out.summary.as_ref();
                let prov = summary.map(|x| &x.provenance);
                let empty = Provenance::default();
                choice(
                    out.index,
                    summary.map(|x| x.id.to_string()).unwrap_or_default(),
                    &s.prompts[out.prompt],
                    summary.map_or(0, |x| x.cached_tokens),
                    out.finish.map_or("abort", |f| f.as_str()),
                    prov.unwrap_or(&empty),
                )
            })
            .collect();
        let receipt = json!({
            "version": RECEIPT_VERSION,
            "response_id": s.meta.id,
            "created": s.meta.created,
            "model": s.meta.model,
            "tenant": s.tenant.as_str(),
            "namespace": s.namespace.tag(),
            "build": { "router_sha256": build },
            "choices": choices,
        });
        self.key
            .sign(receipt)
            .map_err(|e| RouterError::Internal(format!("cannot sign a receipt: {e}")))
    }
}

/// Whether the request asks for a receipt: `1`/`true` yes, `0`/`false` or absent no.
pub fn requested(headers: &HeaderMap) -> Result<bool, RouterError> {
    let Some(v) = headers.get(RECEIPT_HEADER) else {
        return Ok(false);
    };
    match v.to_str().map(str::trim) {
        Ok("1" | "true") => Ok(true),
        Ok("0" | "false") => Ok(false),
        _ => Err(ValidationError::new(
            "X-Pagewarden-Receipt",
            "X-Pagewarden-Receipt must be 1 (sign a receipt) or 0",
        )
        .into()),
    }
}

fn choice(
    index: usize,
    request_id: String,
    prompt: &[u32],
    cached_tokens: u32,
    finish: &str,
    p: &Provenance,
) -> Value {
    let manifest = p.manifest.map(|m| {
        json!({
            "tokens_written": m.tokens_written,
            "pages": m.pages,
            "digest": format!("{:016x}", m.digest),
        })
    });
    let account = p.account.as_ref();
    json!({
        "index": index,
        "request_id": request_id,
        "prompt": { "tokens": prompt.len(), "sha256": ids_sha256(prompt) },
        "output": {
            "tokens": p.output_ids.len(),
            "sha256": ids_sha256(&p.output_ids),
            "finish_reason": finish,
        },
        "prefill": {
            "worker": p.prefill_worker,
            "cached_tokens": cached_tokens,
            "reused": runs(&p.prefill_reused),
        },
        "transfer": {
            // Decode streams no token before the manifest checks out (I2).
            "verdict": if manifest.is_some() && !p.output_ids.is_empty() { "verified" } else { "none" },
            "granted_pages": pairs(p.granted_pages.iter().copied()),
            "manifest": manifest,
        },
        "decode": {
            "worker": p.decode_worker,
            "prefix_tokens": p.decode_prefix_tokens,
            "page_size": p.page_size,
            "reused": runs(account.map_or(&[][..], |a| &a.reused)),
            "pages": pairs(account.into_iter().flat_map(|a| a.pages.iter().map(|g| (g.page, g.generation)))),
            "preemptions": account.map_or(0, |a| a.preemptions),
        },
    })
}

fn runs(runs: &[ReusedRun]) -> Vec<Value> {
    runs.iter()
        .map(|r| {
            json!({
                "tokens": r.tokens,
                "namespace": Namespace::from_wire(&r.namespace)
                    .map_or_else(|| "invalid".to_string(), |n| n.tag()),
                "producer_request_id": hex::encode(&r.producer_request_id),
                "pages": pairs(r.pages.iter().map(|g| (g.page, g.generation))),
            })
        })
        .collect()
}

fn pairs(pages: impl Iterator<Item = (u32, u64)>) -> Vec<Value> {
    pages.map(|(p, g)| json!([p, g])).collect()
}

/// SHA-256 of the running executable's file ("unknown" when it cannot be read).
fn executable_sha256() -> String {
    let hash = || -> std::io::Result<String> {
        let mut f = std::fs::File::open(std::env::current_exe()?)?;
        let mut h = Sha256::new();
        std::io::copy(&mut f, &mut h)?;
        Ok(hex::encode(&h.finalize()))
    };
    hash().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot hash the router's executable for receipts");
        "unknown".into()
    })
}
