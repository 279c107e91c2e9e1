//! `pagewarden generate`: run the model in this process on one prompt (no services needed).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use pagewarden_kvcache::{KvPool, PoolConfig, DEFAULT_PAGE_SIZE};
use pagewarden_model::{ChatMessage, Engine, LoadOptions, Model, SamplingParams};

/// Arguments of `pagewarden generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// GGUF model file, or a known model's name (`smollm2`, `gemma3-270m`), fetched when missing.
    #[arg(long, env = "PAGEWARDEN_MODEL", default_value = "smollm2")]
    pub model: PathBuf,
    /// Prompt text (special tokens such as <|im_start|> are parsed; BOS is added when the
    /// model asks for it).
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop sequence (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Kernel threads (0 = all CPUs).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Attention with llama.cpp's flash-attention arithmetic (as `llama-server -fa on`, its
    /// default on CPU) instead of its `-fa off` arithmetic: for bit-parity with such a run.
    #[arg(long)]
    pub flash_attention: bool,
    /// Print one JSON object {prompt_tokens, tokens, text, finish_reason} instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `pagewarden generate`.
pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    // A file, or a known model's name fetched when missing (as `up` resolves it).
    let a = GenerateArgs {
        model: crate::fetch::resolve(&a.model)?,
        ..a
    };
    let opts = LoadOptions {
        threads: a.threads,
        flash_attention: a.flash_attention,
        ..LoadOptions::default()
    };
    let model = Arc::new(
        Model::load(&a.model, &opts)
            .with_context(|| format!("loading model {}", a.model.display()))?,
    );
    let prompt = if a.chat {
        let tpl = model
            .chat_template()
            .context("--chat: the model has no chat template")?;
        // The prompt is a message: its text never becomes control tokens.
        tpl.encode(
            model.tokenizer(),
            &[ChatMessage::new("user", a.prompt.clone())],
            true,
        )
        .context("rendering the chat template")?
    } else {
        model.tokenizer().encode_prompt(&a.prompt)
    };
    let layout = model.kv_layout(DEFAULT_PAGE_SIZE);
    let pages = layout.pages_for(prompt.len() + a.max_tokens).max(1);
    let engine = Engine::new(model, KvPool::new(PoolConfig::with_pages(layout, pages)));
    let params = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
        max_tokens: a.max_tokens,
        stop: a.stop.clone(),
        ..SamplingParams::default()
    };
    if a.json {
        let out = engine.generate(&prompt, &params)?;
        let v = serde_json::json!({
            "prompt_tokens": out.prompt_tokens,
            "tokens": out.tokens,
            "text": out.text,
            "finish_reason": out.finish_reason.as_str(),
        });
        println!("{v}");
    } else {
        let mut stdout = std::io::stdout();
        engine.generate_streaming(&prompt, &params, |s| {
            let _ = stdout.write_all(s.as_bytes());
            let _ = stdout.flush();
        })?;
        println!();
    }
    Ok(())
}
