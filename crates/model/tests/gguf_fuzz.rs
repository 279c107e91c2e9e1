//! Fuzzing the GGUF reader under `cargo test`: bounded proptest mutations of a valid tiny model
//! (byte flips, u64 field overwrites, truncation, splices). The reader must return `Ok` or a
//! typed error, never panic, and every tensor it accepts must be readable; the tokenizer and
//! chat template built from whatever metadata survives must not panic either. A second base
//! file holds Q5_0 and K-quant tensors, so their block sizes and dequantization are fuzzed too.

mod common;

use pagewarden_model::{tiny_llama_gguf, GgmlType, GgufWriter};
use proptest::prelude::*;
use std::sync::OnceLock;

fn base() -> &'static [u8] {
    static B: OnceLock<Vec<u8>> = OnceLock::new();
    B.get_or_init(|| tiny_llama_gguf(11))
}

/// A small file with one tensor of each block type a Q4_K_M model mixes (Q5_0 and the
/// K-quants), filled with arbitrary bytes: every bit pattern of a block is readable.
fn k_base() -> &'static [u8] {
    static B: OnceLock<Vec<u8>> = OnceLock::new();
    B.get_or_init(|| {
        let mut w = GgufWriter::new();
        for (i, (name, ty, dims)) in [
            ("q5_0", GgmlType::Q5_0, vec![64u64, 2]),
            ("q4_k", GgmlType::Q4_K, vec![256, 2]),
            ("q5_k", GgmlType::Q5_K, vec![512]),
            ("q6_k", GgmlType::Q6_K, vec![256, 3]),
        ]
        .into_iter()
        .enumerate()
        {
            let n: u64 = dims.iter().product();
            let bytes = ty.row_bytes(n).expect("whole blocks") as usize;
            let data = (0..bytes).map(|j| (j * 131 + i * 17) as u8).collect();
            w.add_tensor(name, &dims, ty, data);
        }
        w.to_bytes()
    })
}

/// Mutations concentrate on the header, where the parser makes its decisions.
const HEADER: usize = 8192;

fn check(bytes: Vec<u8>) {
    common::exercise(bytes);
}

fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX - 31),
        Just(u32::MAX as u64),
        Just(1 << 63),
        Just(i64::MAX as u64),
        0u64..4096,
        any::<u64>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn byte_flips_never_panic(flips in prop::collection::vec((0usize..HEADER, any::<u8>()), 1..8)) {
        let mut b = base().to_vec();
        for (pos, val) in flips {
            let n = b.len();
            b[pos % n] = val;
        }
        check(b);
    }

    #[test]
    fn u64_overwrites_never_panic(pos in 0usize..HEADER, val in interesting_u64(), width in prop_oneof![Just(4usize), Just(8)]) {
        let mut b = base().to_vec();
        let pos = pos.min(b.len() - width);
        b[pos..pos + width].copy_from_slice(&val.to_le_bytes()[..width]);
        check(b);
    }

    #[test]
    fn truncations_and_splices_never_panic(
        cut in 0usize..HEADER * 2,
        from in 0usize..HEADER,
        to in 0usize..HEADER,
        len in 0usize..256,
        tail in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let src = base();
        let mut b = src.to_vec();
        // Copy a run of the file over another place (duplicates keys, shifts fields).
        let len = len.min(src.len() - from).min(b.len() - to);
        b[to..to + len].copy_from_slice(&src[from..from + len]);
        b.truncate(cut.min(b.len()));
        b.extend_from_slice(&tail);
        check(b);
    }

    #[test]
    fn k_quant_file_mutations_never_panic(
        flips in prop::collection::vec((0usize..512, any::<u8>()), 0..8),
        cut in 0usize..4096,
    ) {
        let mut b = k_base().to_vec();
        for (pos, val) in flips {
            let n = b.len();
            b[pos % n] = val;
        }
        b.truncate(cut.min(b.len()));
        check(b);
    }

    #[test]
    fn random_bodies_after_a_valid_prefix_never_panic(
        version in prop_oneof![Just(2u32), Just(3)],
        n_tensors in interesting_u64(),
        n_kv in interesting_u64(),
        body in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&(n_tensors % 8).to_le_bytes());
        b.extend_from_slice(&(n_kv % 8).to_le_bytes());
        b.extend_from_slice(&body);
        check(b);
    }
}
