//! Writes a GGUF of a real model's shapes with seeded random weights: another file's metadata
//! and tensor layout (`gguf::write_random_like`), e.g. Qwen2-7B Q4_K_M from the header
//! `cargo run -p pagewarden -- fetch qwen2-7b-header` cuts out (`scripts/qwen2-7b-random.sh`
//! drives it), or a published model's shapes described in `gguf::shapes`
//! (`--shape llama-3.2-1b-q4_k_m`).
//!
//! `cargo run --release -p pagewarden-model --example random_like -- LIKE.gguf OUT.gguf [SEED]`
//! `cargo run --release -p pagewarden-model --example random_like -- --shape NAME OUT.gguf [SEED]`

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use pagewarden_model::gguf::{llama_3_2_1b_q4_k_m, write_random, write_random_like, GgufFile};

const USAGE: &str = "usage: random_like (LIKE.gguf | --shape llama-3.2-1b-q4_k_m) OUT.gguf [SEED]";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (source, rest) = match args.as_slice() {
        [flag, shape, rest @ ..] if flag == "--shape" => (Source::Shape(shape.clone()), rest),
        [like, rest @ ..] => (Source::Like(PathBuf::from(like)), rest),
        [] => anyhow::bail!(USAGE),
    };
    let (out, seed) = match rest {
        [out] => (PathBuf::from(out), 1),
        [out, seed] => (
            PathBuf::from(out),
            seed.parse().context("SEED is an integer")?,
        ),
        _ => anyhow::bail!(USAGE),
    };
    // Written beside the destination and renamed: an interrupted run leaves no half file
    // under the name a later run would take for complete.
    let part = out.with_extension("gguf.part");
    let file = std::fs::File::create(&part).with_context(|| part.display().to_string())?;
    let mut w = BufWriter::with_capacity(1 << 22, file);
    match source {
        Source::Like(like) => {
            let like =
                GgufFile::open_metadata(&like).with_context(|| like.display().to_string())?;
            write_random_like(&like, seed, &mut w)?;
        }
        Source::Shape(name) => {
            let (header, entries) = match name.as_str() {
                "llama-3.2-1b-q4_k_m" => llama_3_2_1b_q4_k_m(),
                other => anyhow::bail!("unknown shape {other:?}; {USAGE}"),
            };
            write_random(&header, &entries, seed, &mut w)?;
        }
    }
    w.flush()?;
    std::fs::rename(&part, &out)?;
    println!("{}", out.display());
    Ok(())
}

/// Where the shapes come from.
enum Source {
    /// Another GGUF's header.
    Like(PathBuf),
    /// A shape `gguf::shapes` describes.
    Shape(String),
}
