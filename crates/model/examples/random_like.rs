//! Writes a GGUF with another file's metadata and tensor layout and seeded random weights
//! (`gguf::write_random_like`): a complete model of a real model's shapes, vocabulary and chat
//! template, e.g. Qwen2-7B Q4_K_M from the header `cargo run -p pagewarden -- fetch qwen2-7b-header`
//! cuts out (`scripts/qwen2-7b-random.sh` drives it).
//!
//! `cargo run --release -p pagewarden-model --example random_like -- LIKE.gguf OUT.gguf [SEED]`

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use pagewarden_model::gguf::{write_random_like, GgufFile};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(like), Some(out)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: random_like LIKE.gguf OUT.gguf [SEED]");
    };
    let seed: u64 = match args.next() {
        Some(s) => s.parse().context("SEED is an integer")?,
        None => 1,
    };
    let like = GgufFile::open_metadata(&PathBuf::from(&like)).with_context(|| like.clone())?;
    // Written beside the destination and renamed: an interrupted run leaves no half file
    // under the name a later run would take for complete.
    let out = PathBuf::from(out);
    let part = out.with_extension("gguf.part");
    let file = std::fs::File::create(&part).with_context(|| part.display().to_string())?;
    let mut w = BufWriter::with_capacity(1 << 22, file);
    write_random_like(&like, seed, &mut w)?;
    w.flush()?;
    std::fs::rename(&part, &out)?;
    println!("{}", out.display());
    Ok(())
}
