//! What one choice was computed over, as its workers reported it along the way: which workers,
//! which cached page runs (and whose), the grant prefill wrote into, the commit manifest
//! decode verified, and decode's page table at the end. A [`Flight`](crate::dispatch::Flight)
//! fills it as the request moves; an isolation receipt ([`crate::receipt`]) is written from it.

use pagewarden_proto::v1::{CommitManifest, PrefillReply, ReusedRun, SequenceAccount, WriteGrant};

/// One choice's provenance (see the module docs). Empty fields: that step has not happened.
#[derive(Clone, Debug, Default)]
pub struct Provenance {
    /// The prefill worker that computed the prompt (node id, or URL before a poll named it).
    pub prefill_worker: String,
    /// The decode worker that generated.
    pub decode_worker: String,
    /// Each worker's arithmetic as its last `Info` said (`prefill`, then `decode`; empty
    /// before a poll told it).
    pub arithmetic: [String; 2],
    /// Leading prompt tokens decode took from its own prefix cache (the grant's).
    pub decode_prefix_tokens: u32,
    /// Tokens a page of decode's pool holds.
    pub page_size: u32,
    /// The grant prefill wrote the rest of the prompt's KV under: (page, generation) each.
    pub granted_pages: Vec<(u32, u64)>,
    /// What prefill claimed it wrote, which decode verified before its first token (I2).
    pub manifest: Option<Manifest>,
    /// The runs of prefill's prefix cache the prompt's computation read.
    pub prefill_reused: Vec<ReusedRun>,
    /// Decode's account of the sequence, from its last token event.
    pub account: Option<SequenceAccount>,
    /// The completion's token ids, in order (end markers excluded).
    pub output_ids: Vec<u32>,
    /// For a choice picked for the recompute audit: its prompt and each output token's served
    /// logprob (`None` for every other choice).
    pub recompute: Option<RecomputeCapture>,
}

/// What the recompute audit needs of a served choice beyond its provenance.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecomputeCapture {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Each output token's raw logprob as decode (or prefill, for the first) computed it, as
    /// long as every one came with its logprob (shorter than the output: it cannot be scored).
    pub served: Vec<f32>,
    /// The request's temperature (recorded with the audit; raw logprobs are scored).
    pub temperature: f32,
}

/// The commit manifest's summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// Tokens prefill wrote.
    pub tokens_written: u32,
    /// Pages it wrote (one checksum each).
    pub pages: u32,
    /// The digest over the pages' checksums.
    pub digest: u64,
}

impl From<&CommitManifest> for Manifest {
    fn from(m: &CommitManifest) -> Self {
        Self {
            tokens_written: m.tokens_written,
            pages: m.page_checksums.len() as u32,
            digest: m.digest,
        }
    }
}

impl Provenance {
    /// Decode granted `grant`.
    pub fn granted(&mut self, grant: &WriteGrant) {
        self.decode_prefix_tokens = grant.prefix_tokens;
        self.page_size = grant.page_size;
        self.granted_pages = grant.pages.iter().map(|p| (p.page, p.generation)).collect();
    }

    /// Prefill replied with `reply`.
    pub fn prefilled(&mut self, reply: &PrefillReply) {
        self.manifest = reply.manifest.as_ref().map(Manifest::from);
        self.prefill_reused = reply.reused.clone();
    }
}
