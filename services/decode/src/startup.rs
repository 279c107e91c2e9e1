//! Start-up: load the model, size the KV pool, run the preflight (I7) before the pool's memory
//! is allocated.

use std::sync::Arc;

use anyhow::Context;
use pagewarden_common::config::{ModelSource, PoolSize, WorkerConfig};
use pagewarden_common::preflight::{preflight, PreflightInput, PreflightReport};
use pagewarden_kvcache::{KvPool, PoolConfig};
use pagewarden_model::{GgufFile, LoadOptions, Model, Tokenizer};

/// What start-up produced.
pub struct Loaded {
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub model_name: String,
    pub pool: KvPool,
    pub preflight: PreflightReport,
}

/// Loads the model and builds a preflighted pool.
pub fn load(cfg: &WorkerConfig) -> anyhow::Result<Loaded> {
    let opts = LoadOptions {
        threads: cfg.threads,
        prefill_chunk: cfg.chunk_tokens,
    };
    let (model, model_name) = match &cfg.model {
        ModelSource::File(path) => {
            let m = Model::load(path, &opts)
                .with_context(|| format!("loading model {}", path.display()))?;
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into());
            (m, name)
        }
        ModelSource::TinyTest(seed) => {
            let f = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(*seed))
                .context("tiny test model")?;
            (
                Model::from_gguf(f, &opts).context("tiny test model")?,
                format!("tiny-test-{seed}"),
            )
        }
    };
    let layout = model.kv_layout(cfg.page_size);
    let pages = match cfg.pool {
        PoolSize::Tokens(t) => t.div_ceil(cfg.page_size),
        PoolSize::Bytes(b) => b / layout.page_bytes().max(1),
        PoolSize::TwoContexts => 2 * model.context_length().div_ceil(cfg.page_size),
    };
    let report = preflight(PreflightInput {
        model_context: model.context_length(),
        context_override: cfg.context_length,
        pool_tokens: pages * cfg.page_size,
        lower_to_fit: cfg.lower_context_to_fit,
    })
    .context("preflight")?;
    if let Some(from) = report.lowered_from {
        tracing::warn!(
            from,
            to = report.advertised_context,
            "advertised context lowered to fit the KV pool"
        );
    }
    let mut pc = PoolConfig::with_pages(layout, pages);
    pc.zero_on_release = cfg.zero_on_release;
    pc.drain_timeout = cfg.drain_timeout;
    pc.grant_ttl = cfg.grant_ttl;
    pc.commit_rehash = cfg.commit_rehash;
    let pool = KvPool::new(pc);
    tracing::info!(
        model = %model_name,
        pages,
        commit_rehash = cfg.commit_rehash,
        page_bytes = layout.page_bytes(),
        pool_tokens = report.pool_tokens,
        context = report.advertised_context,
        "model loaded, pool sized"
    );
    let tokenizer = Tokenizer::from_gguf(model.gguf()).context("tokenizer")?;
    Ok(Loaded {
        tokenizer: Arc::new(tokenizer),
        model: Arc::new(model),
        model_name,
        pool,
        preflight: report,
    })
}
