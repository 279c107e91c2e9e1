//! The model: loading (`Model::load`), prefill and batched decode over paged KV, for every
//! architecture in `arch/`.
//!
//! - `error.rs`: `ModelError`.
//! - `forward.rs`: the batched transformer forward pass over `ReadablePages`.

mod error;
pub(crate) mod forward;

use std::path::Path;

use pagewarden_kernels::{Isa, PackedRows, Packing, Parallel};
use pagewarden_kvcache::{KvLayout, ReadablePages, SharedPages};

pub use error::ModelError;

use crate::backend::Backend;
use crate::chat::ChatTemplate;
use crate::config::LlamaConfig;
use crate::gguf::{Contents, GgufError, GgufFile};
use crate::logprobs::TokenLogprobs;
use crate::tokenizer::Tokenizer;
use crate::weights::LlamaWeights;
use forward::{Logits, SeqWork};

/// How to load and run a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Kernel threads (0 = every available CPU).
    pub threads: usize,
    /// Largest number of prompt tokens run through one forward pass during prefill.
    pub prefill_chunk: usize,
    /// Attention with llama.cpp's flash-attention arithmetic (`-fa on`: f16 value
    /// accumulation, online softmax; `attention_flash`) instead of its default CPU attention.
    /// A reference path for parity with runs that used it; slower.
    pub flash_attention: bool,
    /// How the weights are repacked at load: for decode's memory-bound steps (the default),
    /// or for compute, at more bytes, in a model that only runs prefill (a prefill worker).
    pub packing: Packing,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: 0,
            prefill_chunk: 256,
            flash_attention: false,
            packing: Packing::Bandwidth,
        }
    }
}

/// A loaded model (any architecture of `arch/`). `Send + Sync`: share it with `Arc`.
pub struct Model {
    // Declared before `file` so it is dropped first: it borrows the file's bytes.
    weights: LlamaWeights<'static>,
    // Declared before `file`, after `weights`: the weights borrow these too.
    packed: Vec<PackedRows>,
    file: Box<GgufFile>,
    config: LlamaConfig,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    par: Parallel,
    opts: LoadOptions,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.config)
            .field("opts", &self.opts)
            .finish()
    }
}

/// Most positions one scored pass computes logits for ([`Model::prefill_scored`]).
const SCORED_ROWS: usize = 64;

impl Model {
    /// Memory-maps and loads the GGUF model at `path`.
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Model, ModelError> {
        Model::from_gguf(GgufFile::open(path)?, opts)
    }

    /// Loads a model from an opened GGUF file.
    pub fn from_gguf(file: GgufFile, opts: &LoadOptions) -> Result<Model, ModelError> {
        if file.contents() == Contents::MetadataOnly {
            return Err(GgufError::MetadataOnly.into());
        }
        let config = LlamaConfig::from_gguf(&file)?;
        let tokenizer =
            Tokenizer::from_gguf(&file).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let chat_template =
            ChatTemplate::from_gguf(&file).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let file = Box::new(file);
        // SAFETY: the weights borrow tensor bytes owned by `file` (a memory map or a heap
        // buffer, neither of which moves when the `GgufFile` value moves, and neither is ever
        // mutated). `file` lives in the same `Model` and is dropped after `weights` (field
        // order), and `weights()` hands out borrows no longer than `&self`.
        let file_ref: &'static GgufFile = unsafe { &*(file.as_ref() as *const GgufFile) };
        let mut weights = LlamaWeights::from_gguf(file_ref, &config)?;
        let packed = pack_for_cpu(&mut weights, file_ref, opts.packing);
        let mut opts = opts.clone();
        opts.prefill_chunk = opts.prefill_chunk.max(1);
        Ok(Model {
            weights,
            packed,
            file,
            config,
            tokenizer,
            chat_template,
            par: Parallel::new(opts.threads),
            opts,
        })
    }

    /// Runs `f` (calls into this model) as urgent work: while it runs, other threads'
    /// forward passes over this model wait before each of their parallel regions
    /// ([`Parallel::urgent`]). For a short pass that must not queue behind a long one.
    pub fn urgent<R>(&self, f: impl FnOnce() -> R) -> R {
        self.par.urgent(f)
    }

    /// This model's CPU backend: its thread pool, its attention arithmetic.
    pub(crate) fn cpu(&self) -> crate::backend::cpu::Cpu<'_> {
        crate::backend::cpu::Cpu {
            par: &self.par,
            flash: self.opts.flash_attention,
        }
    }

    /// The CPU forward pass's arithmetic: the instruction set its kernels use, and `:flash`
    /// under llama.cpp's flash-attention arithmetic (`cpu:avx512`, `cpu:avx2:flash`). The same
    /// model file on the same arithmetic computes bit-equal logits for a sequence, whatever
    /// the batch it ran in or the chunks its prompt ran in.
    pub fn arithmetic(&self) -> String {
        let isa = pagewarden_kernels::Isa::detect().name();
        match self.opts.flash_attention {
            true => format!("cpu:{isa}:flash"),
            false => format!("cpu:{isa}"),
        }
    }

    /// Bytes of weights repacked for this CPU's kernels (0 where none are).
    pub fn packed_bytes(&self) -> usize {
        self.packed.iter().map(|p| p.bytes()).sum()
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The tokenizer built from the file's metadata.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template, when the file has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The weights (views into the file).
    pub fn weights(&self) -> &LlamaWeights<'_> {
        &self.weights
    }

    /// The underlying GGUF file.
    pub fn gguf(&self) -> &GgufFile {
        &self.file
    }

    /// Kernel threads in use.
    pub fn threads(&self) -> usize {
        self.par.threads()
    }

    /// The KV page shape this model needs for pages of `page_size` tokens.
    pub fn kv_layout(&self, page_size: usize) -> KvLayout {
        KvLayout {
            layers: self.config.layers,
            kv_heads: self.config.kv_heads,
            head_dim: self.config.head_dim,
            page_size,
        }
    }

    /// The trained context length.
    pub fn context_length(&self) -> usize {
        self.config.context_length
    }

    /// Runs `tokens` at positions `[seq.len(), seq.len() + tokens.len())` in chunks, writing
    /// their K/V into `seq`'s pages (growing them) and reading earlier KV only through `seq`
    /// (generation-checked). Returns the logits of the last position.
    pub fn prefill(&self, seq: &mut ReadablePages, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.prefill_after(None, seq, tokens)
    }

    /// As [`Model::prefill`], for a sequence whose first `prefix.len()` positions are a cached
    /// prefix's read-only pages: `tokens` run at positions `[prefix.len() + seq.len(), ...)`,
    /// attending over the prefix's pages and then `seq`'s, and only `seq` is written.
    pub fn prefill_after(
        &self,
        prefix: Option<&SharedPages>,
        seq: &mut ReadablePages,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        self.run_prefill(&self.cpu(), prefix, seq, tokens, None, None)
            .map(|(logits, _)| logits)
    }

    /// As [`Model::prefill_after`] for a part of a prompt whose positions end at `prompt_end`:
    /// the part is split into passes as llama-server splits
    /// that whole prompt ([`prefill_chunks`]), and the last position's logits are computed and
    /// returned only when the part reaches the prompt's end (else an empty vector: an earlier
    /// part only fills the cache).
    pub fn prefill_part(
        &self,
        prefix: Option<&SharedPages>,
        seq: &mut ReadablePages,
        tokens: &[u32],
        prompt_end: usize,
    ) -> Result<Vec<f32>, ModelError> {
        self.run_prefill(&self.cpu(), prefix, seq, tokens, Some(prompt_end), None)
            .map(|(logits, _)| logits)
    }

    /// As [`Model::prefill_after`], scoring the prompt as it runs: also the logprobs (with
    /// `top` top logprobs) of each token of `tokens` after the first, and of `next` (the
    /// prompt's token after `tokens`, when they are not its end) after the last. Every
    /// position's logits are computed, one pass per chunk.
    pub fn prefill_scored(
        &self,
        prefix: Option<&SharedPages>,
        seq: &mut ReadablePages,
        tokens: &[u32],
        next: Option<u32>,
        top: usize,
    ) -> Result<(Vec<f32>, Vec<TokenLogprobs>), ModelError> {
        self.run_prefill(&self.cpu(), prefix, seq, tokens, None, Some((next, top)))
    }

    /// The prefill of all of them, on backend `b`: the last position's logits, and with
    /// `score` (the token after `tokens`, how many top logprobs) the scored positions.
    pub(crate) fn run_prefill<B: Backend>(
        &self,
        b: &B,
        prefix: Option<&SharedPages>,
        seq: &mut ReadablePages,
        tokens: &[u32],
        prompt_end: Option<usize>,
        score: Option<(Option<u32>, usize)>,
    ) -> Result<(Vec<f32>, Vec<TokenLogprobs>), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        // Refuse the whole prompt before any chunk runs (no partial prefill).
        let before = prefix.map_or(0, SharedPages::len);
        let end = before + seq.len() + tokens.len();
        if end > self.config.context_length {
            return Err(ModelError::ContextExceeded {
                tokens: end,
                context: self.config.context_length,
            });
        }
        let next = score.and_then(|(next, _)| next);
        if let Some(&t) = tokens
            .iter()
            .chain(&next)
            .find(|&&t| t as usize >= self.config.vocab)
        {
            return Err(ModelError::TokenOutOfRange {
                token: t,
                vocab: self.config.vocab,
            });
        }
        seq.grow(end - before)?;
        let vocab = self.config.vocab;
        let mut scored = Vec::new();
        let mut last = Vec::new();
        let mut at = 0;
        // Scoring holds every row's logits of a pass (rows × vocabulary floats): passes of at
        // most SCORED_ROWS bound that (39 MB at a 152k vocabulary) whatever the chunk size.
        let chunk_size = match score {
            Some(_) => self.opts.prefill_chunk.min(SCORED_ROWS),
            None => self.opts.prefill_chunk,
        };
        let start = before + seq.len();
        // Where the prompt ends: this call's end unless the caller runs it in parts.
        let prompt_end = prompt_end.map_or(start + tokens.len(), |e| e.max(start + tokens.len()));
        let split_tail = self.weights.layers.iter().any(|l| l.attn.window.is_some());
        let chunks = prefill_chunks(start, tokens.len(), prompt_end, chunk_size, split_tail);
        for range in chunks {
            let final_chunk = start + range.end == prompt_end;
            let chunk = &tokens[range];
            let mut work = [SeqWork::after(prefix, &mut *seq, chunk)];
            work[0].logits = match (score, final_chunk) {
                (Some(_), _) => Logits::Every,
                (None, true) => Logits::Last,
                // Only the prompt's last position's logits are returned.
                (None, false) => Logits::Skip,
            };
            let logits = self.forward_on(b, &mut work).pop().expect("one sequence")?;
            at += chunk.len();
            let Some((_, top)) = score else {
                last = logits;
                continue;
            };
            for (i, row) in logits.chunks_exact(vocab).enumerate() {
                // Only the prompt's last position has no following token among `tokens`.
                let following = tokens.get(at - chunk.len() + i + 1).copied().or(next);
                if let Some(t) = following {
                    scored.push(TokenLogprobs::compute(row, t, top));
                }
            }
            last = logits[logits.len() - vocab..].to_vec();
        }
        Ok((last, scored))
    }

    /// One batched decode step: each sequence gets one new token at position `seq.len()`.
    /// A failure (e.g. a generation mismatch) fails only that sequence.
    pub fn decode_step(
        &self,
        batch: &mut [(&mut ReadablePages, u32)],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        let mut work: Vec<SeqWork<'_>> = batch
            .iter_mut()
            .map(|(pages, tok)| SeqWork::new(pages, std::slice::from_ref(tok)))
            .collect();
        self.forward_on(&self.cpu(), &mut work)
    }

    /// As [`Model::decode_step`], for sequences whose first positions are a cached prefix's
    /// read-only pages (attended over, never written): the new token goes at position
    /// `prefix.len() + pages.len()`.
    pub fn decode_step_after(
        &self,
        batch: &mut [(Option<&SharedPages>, &mut ReadablePages, u32)],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        self.decode_step_after_on(&self.cpu(), batch)
    }

    /// [`Model::decode_step_after`] on backend `b`.
    pub(crate) fn decode_step_after_on<B: Backend>(
        &self,
        b: &B,
        batch: &mut [(Option<&SharedPages>, &mut ReadablePages, u32)],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        let mut work: Vec<SeqWork<'_>> = batch
            .iter_mut()
            .map(|(prefix, pages, tok)| SeqWork::after(*prefix, pages, std::slice::from_ref(tok)))
            .collect();
        self.forward_on(b, &mut work)
    }
}

/// On a CPU with the AVX2 or 512-bit kernels, repacks every matrix they can take
/// (`PackedRows`) and points the weights at the packing; returns the packings, which the
/// weights now borrow.
///
/// A packed matrix is read from its packing from then on, so its file pages are released as
/// soon as it is packed: they need not stay resident beside it (SmolLM2: 95 MB per process).
fn pack_for_cpu(
    weights: &mut LlamaWeights<'static>,
    file: &GgufFile,
    packing: Packing,
) -> Vec<PackedRows> {
    let isa = Isa::detect();
    if isa == Isa::Portable {
        return Vec::new();
    }
    let mut at = Vec::new();
    let packed: Vec<PackedRows> = weights
        .products_mut()
        .enumerate()
        .filter_map(|(i, m)| {
            let p = PackedRows::pack_as(isa, m, packing)?;
            file.release(m.data);
            at.push(i);
            Some(p)
        })
        .collect();
    // The vector is complete: its elements no longer move (moving the vector moves only its
    // handle).
    let mut next = at.iter().zip(&packed).peekable();
    for (i, m) in weights.products_mut().enumerate() {
        if let Some((_, p)) = next.next_if(|(j, _)| **j == i) {
            // SAFETY: the packing is never moved or changed while the weights live: the
            // `Model` that receives both drops `weights` before `packed` (field order), and
            // `weights()` hands out borrows no longer than `&self`.
            let r: &'static PackedRows = unsafe { &*(p as *const PackedRows) };
            *m = m.with_packed(r);
        }
    }
    packed
}

/// llama-server's batch ends before a prompt's last tokens (`checkpoint_offsets` in
/// server-context.cpp: `4 + n_ubatch` and 4, its default `n_ubatch` being 512), so that it can
/// save a checkpoint of a sliding-window cache there.
const SERVER_TAIL_SPLITS: [usize; 2] = [4 + 512, 4];

/// The chunks one prefill of `len` tokens at positions `start..` runs in, as ranges of those
/// tokens, when the prompt they belong to ends at position `prompt_end`: at most `chunk`
/// tokens each, counted from the start of each run between the splits. With `split_tail` (a
/// model with sliding-window layers) a chunk also ends where llama-server ends a batch before
/// the prompt's last tokens ([`SERVER_TAIL_SPLITS`]): the row count of a product picks
/// llama.cpp's kernel and so its float order (a Q4_K row's repacked `gemm` or `gemv`, a Q6_K
/// product's tiled or `vec_dot` order), so a prompt split as the reference server splits it
/// gets the reference's logits bit for bit.
pub(crate) fn prefill_chunks(
    start: usize,
    len: usize,
    prompt_end: usize,
    chunk: usize,
    split_tail: bool,
) -> Vec<std::ops::Range<usize>> {
    let end = start + len;
    let mut cuts: Vec<usize> = if split_tail {
        SERVER_TAIL_SPLITS
            .iter()
            .filter_map(|&k| prompt_end.checked_sub(k))
            .filter(|&at| at > start && at < end)
            .map(|at| at - start)
            .collect()
    } else {
        Vec::new()
    };
    cuts.push(len);
    let mut out = Vec::new();
    let mut from = 0;
    for to in cuts {
        while from < to {
            let next = (from + chunk.max(1)).min(to);
            out.push(from..next);
            from = next;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::prefill_chunks;

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // One chunk is one range.
    fn prefill_chunks_split_where_llama_server_ends_a_batch_for_sliding_window_models() {
        // Plain models: chunks from the start.
        assert_eq!(prefill_chunks(0, 7, 7, 256, false), [0..7]);
        assert_eq!(
            prefill_chunks(0, 600, 600, 256, false),
            [0..256, 256..512, 512..600]
        );
        // Sliding-window models: the last 4 tokens, and from 516 tokens before the end.
        assert_eq!(prefill_chunks(0, 7, 7, 256, true), [0..3, 3..7]);
        assert_eq!(prefill_chunks(0, 4, 4, 256, true), [0..4]);
        assert_eq!(
            prefill_chunks(0, 600, 600, 256, true),
            [0..84, 84..340, 340..596, 596..600]
        );
        // A prompt continuing cached positions splits by its absolute end.
        assert_eq!(prefill_chunks(10, 3, 13, 256, true), [0..3]);
        assert_eq!(prefill_chunks(10, 8, 18, 256, true), [0..4, 4..8]);
        // A part of a longer prompt splits where that prompt's splits fall inside it.
        assert_eq!(prefill_chunks(0, 100, 600, 256, true), [0..84, 84..100]);
        assert_eq!(prefill_chunks(0, 50, 600, 256, true), [0..50]);
        assert_eq!(prefill_chunks(500, 98, 600, 256, true), [0..96, 96..98]);
    }
}
