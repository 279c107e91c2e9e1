//! `write_random_like`: a GGUF with another file's metadata and tensor entries (names, shapes,
//! types, in order) and seeded random weights: a model of real shapes, vocabulary and chat
//! template where its weights cannot be had. The Qwen2-7B Q4_K_M header cut from its first
//! published part (`cargo run -p pagewarden -- fetch qwen2-7b-header`) becomes a complete 7B file this
//! way, written to disk a tensor at a time (never held in memory).
//!
//! Quantized blocks are random bytes with their scales set so that every matrix's weights
//! have a standard deviation near `1 / sqrt(row length)`: products keep the magnitude of their
//! normalized inputs and the residual stream stays finite over dozens of layers. Norm weights
//! are near 1, biases small, RoPE frequency factors 1. The text such a model writes is noise;
//! its shapes, memory and speed are the real model's.

use std::io::{self, Write};

use half::f16;

use super::tiny::Rng;
use super::{GgmlType, GgufFile, GgufWriter, TensorEntry};

/// Writes to `out` a GGUF with `like`'s metadata and tensor entries and random weights drawn
/// from `seed` (same seed, same bytes). `like` may be a header without its tensor data
/// ([`GgufFile::open_metadata`]).
///
/// # Errors
/// An I/O error, or `InvalidInput` naming a tensor whose type has no random block layout
/// here (the IQ and ternary types, Q2_K, Q3_K, integers).
pub fn write_random_like<W: Write>(like: &GgufFile, seed: u64, out: &mut W) -> io::Result<()> {
    let mut w = GgufWriter::new();
    w.set_version(like.version());
    for (k, v) in like.metadata().entries() {
        if k != "general.alignment" {
            w.add_value(k, v.clone());
        }
    }
    w.set_alignment(like.alignment());
    let entries: Vec<TensorEntry> = like
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone(), t.ggml_type))
        .collect();
    write_random(&w, &entries, seed, out)
}

/// Writes to `out` `header`'s metadata and the tensors `entries` names (name, ggml dims,
/// type, in order) with random weights drawn from `seed`, as [`write_random_like`] does for
/// another file's entries (the shapes of a model described here, e.g.
/// [`super::llama_3_2_1b_q4_k_m`]).
///
/// # Errors
/// As [`write_random_like`].
pub fn write_random<W: Write>(
    header: &GgufWriter,
    entries: &[TensorEntry],
    seed: u64,
    out: &mut W,
) -> io::Result<()> {
    if let Some((name, _, ty)) = entries.iter().find(|t| block_stats(t.2).is_none()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "tensor {name}: no random weights of type {ty} (F32, F16, BF16, Q4_0, Q4_1, Q5_0, \
                 Q8_0, Q4_K, Q5_K, Q6_K are written)"
            ),
        ));
    }
    let mut rng = Rng(seed);
    header.write_streamed(out, entries, |i, buf| {
        let (name, dims, ty) = &entries[i];
        random_tensor(name, dims, *ty, &mut rng, buf)
    })
}

/// For a block-quantized type: bytes per block and the standard deviation of the integer
/// part of a weight (what multiplies the block's `d`) when its bytes are uniform, with the
/// minimum (`dmin`, `m`) chosen to centre it. `Some((0, 0.0))` for the float types.
fn block_stats(ty: GgmlType) -> Option<(usize, f32)> {
    Some(match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => (0, 0.0),
        // q - 8, q uniform in 0..16.
        GgmlType::Q4_0 | GgmlType::Q4_1 => (ty.type_size(), 4.61),
        // q - 16, q uniform in 0..32.
        GgmlType::Q5_0 => (ty.type_size(), 9.23),
        // i8 uniform.
        GgmlType::Q8_0 => (ty.type_size(), 73.9),
        // sc * q - m * (dmin / d), 6-bit sc and m, q in 0..16, dmin = 7.5 d.
        GgmlType::Q4_K => (ty.type_size(), 258.0),
        // The same with q in 0..32, dmin = 15.5 d.
        GgmlType::Q5_K => (ty.type_size(), 528.0),
        // i8 scale times (q - 32), q in 0..64.
        GgmlType::Q6_K => (ty.type_size(), 1369.0),
        _ => return None,
    })
}

fn random_tensor(name: &str, dims: &[u64], ty: GgmlType, rng: &mut Rng, buf: &mut Vec<u8>) {
    let n = dims.iter().product::<u64>() as usize;
    let cols = dims.first().copied().unwrap_or(1).max(1) as f32;
    let sigma = 1.0 / cols.sqrt();
    // Uniform in [-a, a) has standard deviation a / sqrt(3).
    let amp = sigma * 3f32.sqrt();
    let sub_seed = rng.next_u64();
    let floats = || -> Vec<f32> {
        let mut r = Rng(sub_seed);
        if name.starts_with("rope_freqs") {
            vec![1.0; n]
        } else if name.contains("norm") {
            r.vec(n, 0.1, 1.0)
        } else if name.ends_with(".bias") {
            r.vec(n, 0.1, 0.0)
        } else {
            r.vec(n, amp, 0.0)
        }
    };
    match ty {
        GgmlType::F32 => buf.extend(floats().iter().flat_map(|v| v.to_le_bytes())),
        GgmlType::F16 => buf.extend(
            floats()
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes()),
        ),
        GgmlType::BF16 => buf.extend(
            floats()
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()),
        ),
        ty => {
            let (block, spread) = block_stats(ty).expect("checked before writing");
            let d = f16::from_f32(sigma / spread).to_le_bytes();
            let blocks = n / ty.block_size();
            buf.reserve(blocks * block);
            let mut fill = [0u8; 8];
            for _ in 0..blocks {
                let start = buf.len();
                for _ in 0..block.div_ceil(8) {
                    fill.copy_from_slice(&rng.next_u64().to_le_bytes());
                    buf.extend_from_slice(&fill);
                }
                buf.truncate(start + block);
                let b = &mut buf[start..];
                match ty {
                    GgmlType::Q6_K => b[208..210].copy_from_slice(&d),
                    _ => b[0..2].copy_from_slice(&d),
                }
                // The minimum that centres the block: Q4_1's `m` (a value), the K-quants'
                // `dmin` (a scale of the 6-bit mins).
                let centre = match ty {
                    GgmlType::Q4_1 => Some(-7.5 * sigma / spread),
                    GgmlType::Q4_K => Some(7.5 * sigma / spread),
                    GgmlType::Q5_K => Some(15.5 * sigma / spread),
                    _ => None,
                };
                if let Some(m) = centre {
                    b[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
                }
            }
        }
    }
}

#[cfg(all(test, feature = "engine"))]
mod tests {
    use super::*;
    use crate::gguf::{dequantize, tiny_arch_writer, ArchSpec, TinyArch};

    /// A tiny Qwen2 of every quantized type the writer knows, as the header to copy.
    fn like_file() -> GgufFile {
        let mut w = tiny_arch_writer(&ArchSpec::parity(TinyArch::Qwen2));
        for (i, ty) in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::BF16,
        ]
        .into_iter()
        .enumerate()
        {
            let bytes = ty.row_bytes(512).unwrap() as usize * 64;
            w.add_tensor(&format!("extra.{i}.weight"), &[512, 64], ty, vec![0; bytes]);
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    }

    fn written(like: &GgufFile, seed: u64) -> Vec<u8> {
        let mut out = Vec::new();
        write_random_like(like, seed, &mut out).unwrap();
        out
    }

    #[test]
    fn same_entries_and_metadata_seeded_bytes() {
        let like = like_file();
        let bytes = written(&like, 7);
        assert_eq!(bytes, written(&like, 7), "same seed, same file");
        assert_ne!(bytes, written(&like, 8), "another seed, other weights");
        let got = GgufFile::from_bytes(bytes).unwrap();
        let names = |f: &GgufFile| -> Vec<(String, Vec<u64>, GgmlType)> {
            f.tensors()
                .iter()
                .map(|t| (t.name.clone(), t.dims.clone(), t.ggml_type))
                .collect()
        };
        assert_eq!(names(&got), names(&like));
        assert_eq!(got.metadata().entries(), like.metadata().entries());
    }

    #[test]
    fn every_matrix_has_the_spread_of_its_row_length() {
        let like = like_file();
        let got = GgufFile::from_bytes(written(&like, 3)).unwrap();
        for t in got
            .tensors()
            .iter()
            .filter(|t| t.name.starts_with("extra."))
        {
            let view = got.tensor(&t.name).unwrap();
            let x = dequantize(t.ggml_type, view.data, t.n_elements() as usize).unwrap();
            let n = x.len() as f32;
            let mean = x.iter().sum::<f32>() / n;
            let sd = (x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n).sqrt();
            let want = 1.0 / 512f32.sqrt();
            assert!(
                (sd / want - 1.0).abs() < 0.2 && mean.abs() < 0.2 * want,
                "{} {}: sd {sd} (want {want}), mean {mean}",
                t.name,
                t.ggml_type
            );
        }
    }

    #[test]
    fn refuses_a_type_it_cannot_fill() {
        let mut w = tiny_arch_writer(&ArchSpec::parity(TinyArch::Qwen2));
        let bytes = GgmlType::IQ4_XS.row_bytes(256).unwrap() as usize;
        w.add_tensor("odd.weight", &[256, 1], GgmlType::IQ4_XS, vec![0; bytes]);
        let like = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let err = write_random_like(&like, 1, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("odd.weight"), "{err}");
    }
}
