//! Start-up: load the model, size the KV pool, run the preflight (I7) before the pool's memory
//! is allocated.

use std::path::PathBuf;
use std::sync::Arc;

use pagewarden_common::admission::Admission;
use pagewarden_common::config::ModelSource;
use pagewarden_common::preflight::{preflight, PreflightError, PreflightInput, PreflightReport};
use pagewarden_common::vllm_metrics::CacheConfig;
use pagewarden_common::worker_config::{PoolSize, WorkerConfig};
use pagewarden_kernels::Device;
use pagewarden_kvcache::{KvPool, PoolConfig};
use pagewarden_model::{GgufFile, LoadOptions, Model, ModelError, Packing};

/// What start-up produced.
pub struct Loaded {
    /// The model, shared by the service and its compute engine.
    pub model: Arc<Model>,
    /// The name the worker advertises: the model file's stem, or `tiny-test-N`.
    pub model_name: String,
    /// The preflighted KV pool.
    pub pool: KvPool,
    /// What the preflight decided (advertised context, pool tokens).
    pub preflight: PreflightReport,
    /// The pool's shape as `vllm:cache_config_info` reports it.
    pub cache_config: CacheConfig,
    /// The forward pass's arithmetic, as `Info` reports it (see `Model::arithmetic`).
    pub arithmetic: String,
}

impl Loaded {
    /// Admission (I3) against what the preflight advertised and the pool holds.
    pub fn admission(&self) -> Admission {
        Admission::new(
            self.preflight.advertised_context,
            self.preflight.pool_tokens,
        )
    }
}

/// The role-specific choices about the pool.
#[derive(Clone, Copy, Debug)]
pub struct PoolOptions {
    /// Where the worker computes (logged with the pool's size).
    pub device: Device,
    /// Whether released pages are zeroed in the host pool.
    pub zero_on_release: bool,
    /// Whether commit re-hashes every landed page (`PoolConfig::commit_rehash`).
    pub commit_rehash: bool,
    /// Whether finished prompts' pages stay in a prefix cache (prefill on the CPU), within
    /// `--prefix-cache-tokens` per namespace.
    pub prefix_cache: bool,
}

/// Why a worker could not load its model or size its pool.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The model file could not be loaded.
    #[error("loading model {}", .path.display())]
    Model {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: ModelError,
    },
    /// The built-in tiny test model could not be loaded.
    #[error("tiny test model")]
    Tiny(#[source] ModelError),
    /// The pool cannot serve the context (I7).
    #[error("preflight")]
    Preflight(#[source] PreflightError),
    /// `--flash-attention` asks for the CPU engine's emulation of llama.cpp's arithmetic.
    #[error("--flash-attention is the CPU engine's; this worker runs on {0}")]
    FlashAttentionOffCpu(Device),
}

/// Loads the model, its weights repacked for `packing` (a prefill worker's for compute), and
/// builds a preflighted pool.
pub fn load(
    cfg: &WorkerConfig,
    opts: PoolOptions,
    packing: Packing,
) -> Result<Loaded, StartupError> {
    if cfg.flash_attention && opts.device != Device::Cpu {
        return Err(StartupError::FlashAttentionOffCpu(opts.device));
    }
    let load_opts = LoadOptions {
        threads: cfg.threads,
        prefill_chunk: cfg.chunk_tokens,
        flash_attention: cfg.flash_attention,
        packing,
    };
    let (model, model_name) = match &cfg.model {
        ModelSource::File(path) => {
            let m = Model::load(path, &load_opts).map_err(|source| StartupError::Model {
                path: path.clone(),
                source,
            })?;
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into());
            (m, name)
        }
        ModelSource::TinyTest(seed) => {
            let m = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(*seed))
                .map_err(ModelError::from)
                .and_then(|f| Model::from_gguf(f, &load_opts))
                .map_err(StartupError::Tiny)?;
            (m, format!("tiny-test-{seed}"))
        }
    };
    let layout = model.kv_layout(cfg.page_size);
    let pages = match cfg.pool {
        PoolSize::Tokens(t) => t.div_ceil(cfg.page_size),
        PoolSize::Bytes(b) => b / layout.page_bytes().max(1),
        // Two of the contexts the worker will advertise: `--context-length` when given.
        PoolSize::TwoContexts => {
            2 * cfg
                .context_length
                .unwrap_or(model.context_length())
                .div_ceil(cfg.page_size)
        }
    };
    let input = PreflightInput {
        model_context: model.context_length(),
        context_override: cfg.context_length,
        pool_tokens: pages * cfg.page_size,
        lower_to_fit: cfg.lower_context_to_fit,
    };
    #[cfg(feature = "unsafe-test-switches")]
    let input = switched::preflight_input(input);
    let report = preflight(input).map_err(StartupError::Preflight)?;
    #[cfg(feature = "unsafe-test-switches")]
    let report = switched::report(report, pages * cfg.page_size);
    if let Some(from) = report.lowered_from {
        tracing::warn!(
            from,
            to = report.advertised_context,
            "advertised context lowered to fit the KV pool"
        );
    }
    let mut pc = PoolConfig::with_pages(layout, pages);
    pc.zero_on_release = opts.zero_on_release;
    pc.drain_timeout = cfg.drain_timeout;
    pc.grant_ttl = cfg.grant_ttl;
    pc.commit_rehash = opts.commit_rehash;
    // The transfer receivers (TCP, and RDMA through its staging copy) write only through
    // `KvPool::write_page`: revoking a grant fences every write of it.
    pc.revocation_drains = true;
    if opts.prefix_cache {
        let tokens = cfg.prefix_cache_tokens.unwrap_or(report.advertised_context);
        pc.prefix_pages_per_namespace = tokens.div_ceil(cfg.page_size);
    }
    #[cfg(feature = "unsafe-test-switches")]
    {
        pc.defenses = switched::pool_defenses();
    }
    let prefix_cache_pages = pc.prefix_pages_per_namespace;
    let pool = KvPool::new(pc);
    tracing::info!(
        model = %model_name,
        pages,
        device = %opts.device,
        commit_rehash = opts.commit_rehash,
        prefix_cache_pages,
        page_bytes = layout.page_bytes(),
        pool_tokens = report.pool_tokens,
        context = report.advertised_context,
        "model loaded, pool sized"
    );
    let arithmetic = match opts.device {
        Device::Cpu => model.arithmetic(),
        // Which GPU does not change the arithmetic.
        Device::Cuda(_) => "cuda".to_string(),
    };
    Ok(Loaded {
        arithmetic,
        model: Arc::new(model),
        model_name,
        pool,
        preflight: report,
        cache_config: CacheConfig {
            block_size: layout.page_size,
            num_blocks: pages,
            prefix_caching: prefix_cache_pages > 0,
        },
    })
}

/// TEST-ONLY (feature `unsafe-test-switches`): what the switches change at start-up.
#[cfg(feature = "unsafe-test-switches")]
mod switched {
    use pagewarden_common::preflight::{PreflightInput, PreflightReport};
    use pagewarden_common::test_switches::{Switch, TestSwitches};
    use pagewarden_kvcache::Defenses;

    /// With the preflight off, the preflight is asked about a pool as large as the context, so
    /// the worker starts (and advertises the context) with its smaller pool, as in the incident.
    pub(super) fn preflight_input(mut input: PreflightInput) -> PreflightInput {
        if TestSwitches::current().is_off(Switch::PoolPreflight) {
            let context = input.context_override.unwrap_or(input.model_context);
            input.pool_tokens = input.pool_tokens.max(context);
        }
        input
    }

    /// The report with the pool's real capacity (what admission and `Info` use).
    pub(super) fn report(mut report: PreflightReport, pool_tokens: usize) -> PreflightReport {
        if TestSwitches::current().is_off(Switch::PoolPreflight) {
            if pool_tokens < report.advertised_context {
                tracing::error!(
                    pool_tokens,
                    context = report.advertised_context,
                    "UNSAFE TEST SWITCH: started with a pool smaller than the advertised context"
                );
            }
            report.pool_tokens = pool_tokens;
        }
        report
    }

    /// The kvcache pool's checks, each on unless switched off.
    pub(super) fn pool_defenses() -> Defenses {
        let s = TestSwitches::current();
        Defenses {
            read_generation_check: s.is_on(Switch::ReadGeneration),
            commit_token_count: s.is_on(Switch::CommitTokenCount),
            checksum_check: s.is_on(Switch::Checksums),
            grant_fencing: s.is_on(Switch::GrantFencing),
        }
    }
}
