//! Writes a GGUF holding the first `K` blocks of another, real weights and all (metadata as the
//! original's, with `{arch}.block_count = K`): a smaller model of real weights where the whole
//! file cannot go, e.g. SmolLM2 cut to 5 of its 30 blocks (42 MB) for a GPU host whose transfer
//! is capped (`scripts/gpu/run.sh bundle`). Its text is not the original model's, so it is
//! checked against the CPU engine, never against the original's llama.cpp reference.
//!
//! `cargo run --release -p pagewarden-model --example truncate_layers -- IN.gguf OUT.gguf K`

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use pagewarden_model::gguf::{GgufFile, GgufWriter, MetaValue};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, out, keep] = args.as_slice() else {
        bail!("usage: truncate_layers IN.gguf OUT.gguf K");
    };
    let keep: u32 = keep.parse().context("K is a block count")?;
    let file = GgufFile::open(&PathBuf::from(input)).with_context(|| input.clone())?;
    let arch = file.architecture()?.to_string();
    let count_key = format!("{arch}.block_count");
    let mut w = GgufWriter::new();
    w.set_version(file.version());
    for (k, v) in file.metadata().entries() {
        match k.as_str() {
            "general.alignment" => {}
            k if k == count_key => {
                let had = v.as_int().context("block_count is an integer")?;
                if i128::from(keep) > had || keep == 0 {
                    bail!("K = {keep}: the model has {had} blocks");
                }
                w.add_value(k, MetaValue::U32(keep));
            }
            k => {
                w.add_value(k, v.clone());
            }
        }
    }
    w.set_alignment(file.alignment());
    let kept: Vec<_> = file
        .tensors()
        .iter()
        .filter(|t| block_of(&t.name).is_none_or(|b| b < keep))
        .collect();
    let entries: Vec<_> = kept
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone(), t.ggml_type))
        .collect();
    let out = PathBuf::from(out);
    let part = out.with_extension("gguf.part");
    let mut sink = BufWriter::with_capacity(1 << 22, std::fs::File::create(&part)?);
    w.write_streamed(&mut sink, &entries, |i, buf| {
        let view = file
            .tensor(&kept[i].name)
            .expect("a listed tensor has its data");
        buf.extend_from_slice(view.data);
    })?;
    sink.flush()?;
    std::fs::rename(&part, &out)?;
    println!("{} ({} tensors, {keep} blocks)", out.display(), kept.len());
    Ok(())
}

/// The block index of a `blk.N.…` tensor.
fn block_of(name: &str) -> Option<u32> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}
