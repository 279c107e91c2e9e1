//! Single-process reference outputs: `pagewarden_model::Engine` over a local pool.

use std::sync::Arc;

use pagewarden_kvcache::{KvPool, PoolConfig};
use pagewarden_model::{Engine, GenerationOutput, GgufFile, LoadOptions, Model, SamplingParams};

use crate::ModelArg;

/// Loads the model a worker started with `arg` runs.
pub fn load(arg: &ModelArg) -> Arc<Model> {
    let opts = &LoadOptions::default();
    Arc::new(match arg {
        ModelArg::Real => Model::load(&crate::model_path(), opts).expect("load model"),
        ModelArg::Gemma => Model::load(&crate::gemma_model_path(), opts).expect("load gemma"),
        ModelArg::Tiny(seed) => {
            let f =
                GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(*seed)).expect("tiny gguf");
            Model::from_gguf(f, opts).expect("tiny model")
        }
    })
}

/// An engine with room for one full context.
pub fn engine(model: Arc<Model>) -> Engine {
    let pages = model.context_length().div_ceil(16) + 1;
    let pool = KvPool::new(PoolConfig::with_pages(model.kv_layout(16), pages));
    Engine::new(model, pool)
}

/// Greedy generation of `max_tokens` for `prompt`.
pub fn greedy(engine: &Engine, prompt: &[u32], max_tokens: usize) -> GenerationOutput {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    };
    engine.generate(prompt, &params).expect("engine generate")
}
