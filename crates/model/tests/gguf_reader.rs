//! GGUF reader: round trips through the writer, and one typed error per malformed-input case.

use pagewarden_model::gguf::{
    dequantize, quantize, quantize_q4_0, quantize_q4_1, quantize_q8_0, tiny_llama_gguf,
    tiny_llama_gguf_with, GgmlType, GgufError, GgufFile, GgufWriter, MetaArray, MetaValue,
    TinyLlamaSpec,
};

/// A raw file: header fields then `body` (kv pairs and tensor infos written by hand).
fn raw(version: u32, n_tensors: u64, n_kv: u64, body: &[u8]) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&n_tensors.to_le_bytes());
    v.extend_from_slice(&n_kv.to_le_bytes());
    v.extend_from_slice(body);
    v
}

fn s(out: &mut Vec<u8>, x: &str) {
    out.extend_from_slice(&(x.len() as u64).to_le_bytes());
    out.extend_from_slice(x.as_bytes());
}

/// One tensor info: name, dims, type id, offset.
fn tensor_info(name: &str, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut v = Vec::new();
    s(&mut v, name);
    v.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&offset.to_le_bytes());
    v
}

fn err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(f) => panic!("malformed file was accepted: {f:?}"),
        Err(e) => e,
    }
}

#[test]
fn tiny_model_round_trips() {
    let bytes = tiny_llama_gguf(7);
    assert_eq!(bytes, tiny_llama_gguf(7), "generator must be deterministic");
    assert_ne!(bytes, tiny_llama_gguf(8), "seed must change the weights");
    let f = GgufFile::from_bytes(bytes).expect("tiny model parses");
    assert_eq!(f.version(), 3);
    assert_eq!(f.architecture().unwrap(), "llama");
    let md = f.metadata();
    assert_eq!(md.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(md.get_u32("llama.embedding_length").unwrap(), 64);
    assert_eq!(md.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(
        tokens.len(),
        md.get_u32("llama.vocab_size").unwrap() as usize
    );
    assert_eq!(
        md.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        tokens.len()
    );
    assert!(md
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("im_start"));
    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.info.dims, vec![64, tokens.len() as u64]);
    assert_eq!(embd.info.ggml_type, GgmlType::Q8_0);
    assert_eq!(embd.data.len() as u64, embd.info.n_bytes);
    let mut types: Vec<GgmlType> = f.tensors().iter().map(|t| t.ggml_type).collect();
    types.sort_by_key(|t| t.id());
    types.dedup();
    assert_eq!(
        types,
        [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0
        ]
    );
    for l in 0..2 {
        for role in [
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            assert!(
                f.tensor(&format!("blk.{l}.{role}.weight")).is_some(),
                "blk.{l}.{role}"
            );
        }
    }
    assert!(f.tensor("output_norm.weight").is_some());
    assert!(f.tensor("output.weight").is_some());
    let tied = tiny_llama_gguf_with(&TinyLlamaSpec {
        tied_output: true,
        ..TinyLlamaSpec::default()
    });
    assert!(GgufFile::from_bytes(tied)
        .unwrap()
        .tensor("output.weight")
        .is_none());
}

#[test]
fn tensor_data_and_alignment_survive_writing() {
    let x: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 8.0).collect();
    let mut w = GgufWriter::new();
    w.set_version(2)
        .set_alignment(64)
        .add_str("general.architecture", "llama")
        .add_value("k.u8", MetaValue::U8(7))
        .add_value("k.f64", MetaValue::F64(1.5))
        .add_value(
            "k.nested",
            MetaValue::Array(MetaArray::Array(vec![MetaArray::U8(vec![1, 2])])),
        )
        .add_tensor(
            "a",
            &[3],
            GgmlType::F32,
            quantize(GgmlType::F32, &[1.0, 2.0, 3.0]),
        )
        .add_tensor("b", &[32, 2], GgmlType::F16, quantize(GgmlType::F16, &x));
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.metadata().get_u32("k.u8").unwrap(), 7);
    assert_eq!(f.metadata().get_f32("k.f64").unwrap(), 1.5);
    let b = f.tensor("b").unwrap();
    assert_eq!(b.info.offset % 64, 0);
    assert_eq!(dequantize(GgmlType::F16, b.data, 64).unwrap(), x);
    let a = f.tensor("a").unwrap();
    assert_eq!(
        a.data.as_ptr() as usize % 4,
        0,
        "owned bytes keep f32 alignment"
    );
    assert_eq!(
        dequantize(GgmlType::F32, a.data, 3).unwrap(),
        [1.0, 2.0, 3.0]
    );
    // Getter type errors name the key.
    let e = f.metadata().get_str("k.u8").unwrap_err().to_string();
    assert!(e.contains("k.u8") && e.contains("string"), "{e}");
    let e = f.metadata().get_u32("missing.key").unwrap_err().to_string();
    assert!(e.contains("missing.key"), "{e}");
}

#[test]
fn open_maps_a_file_and_reports_io_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    std::fs::write(&path, tiny_llama_gguf(1)).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 1 + 2 * 9 + 2);
    let e = GgufFile::open(&dir.path().join("absent.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e}");
    fn send_sync<T: Send + Sync>() {}
    send_sync::<GgufFile>();
}

#[test]
fn quantizers_match_ggml_layouts() {
    // Q8_0: d = amax/127 as f16, q = round(x/d).
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = -63.5;
    x[2] = 1.0;
    let q = quantize_q8_0(&x);
    assert_eq!(q.len(), 34);
    assert_eq!(&q[..2], &half::f16::from_f32(1.0).to_le_bytes());
    assert_eq!(&q[2..5], &[127u8, (-64i8) as u8, 1]);
    // Q4_0: d = max/-8; byte j = q[j] | q[j+16] << 4, q offset by 8.
    let mut x = [0f32; 32];
    x[0] = -8.0;
    x[16] = 7.0;
    let q = quantize_q4_0(&x);
    assert_eq!(q.len(), 18);
    assert_eq!(&q[..2], &half::f16::from_f32(1.0).to_le_bytes());
    assert_eq!(
        q[2],
        15 << 4,
        "low nibble 0 (for -8), high nibble 15 (for 7)"
    );
    assert_eq!(q[3], 8 | (8 << 4));
    // Q4_1: d = (max-min)/15, m = min.
    let mut x = [1f32; 32];
    x[0] = 1.0;
    x[17] = 16.0;
    let q = quantize_q4_1(&x);
    assert_eq!(q.len(), 20);
    assert_eq!(
        &q[..4],
        &[
            half::f16::from_f32(1.0).to_le_bytes(),
            half::f16::from_f32(1.0).to_le_bytes()
        ]
        .concat()[..]
    );
    assert_eq!(q[4], 0);
    assert_eq!(q[5], 15 << 4);
    // Round trips stay within half a quantization step.
    let y: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0)
        .collect();
    for (ty, tol) in [
        (GgmlType::Q8_0, 0.02),
        (GgmlType::Q4_0, 0.5),
        (GgmlType::Q4_1, 0.27),
        (GgmlType::F16, 0.01),
    ] {
        let d = dequantize(ty, &quantize(ty, &y), y.len()).unwrap();
        let worst = y
            .iter()
            .zip(&d)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= tol, "{ty}: worst error {worst}");
    }
    assert!(dequantize(GgmlType::Q4_0, &[0; 17], 32).is_err());
}

#[test]
fn rejects_bad_magic_and_versions() {
    let mut b = tiny_llama_gguf(0);
    b[0] = b'X';
    assert!(matches!(err(b), GgufError::BadMagic(m) if &m == b"XGUF"));
    for v in [0u32, 1, 4, 0x0300_0000] {
        let e = err(raw(v, 0, 0, &[]));
        assert!(
            matches!(e, GgufError::UnsupportedVersion(x) if x == v),
            "{e}"
        );
    }
    assert!(matches!(err(Vec::new()), GgufError::Truncated { .. }));
}

#[test]
fn every_truncation_is_an_error() {
    let b = tiny_llama_gguf(3);
    let mut cut = 0;
    let mut n = 0;
    while cut < b.len() {
        let e = err(b[..cut].to_vec());
        assert!(
            matches!(
                e,
                GgufError::Truncated { .. }
                    | GgufError::TensorOutOfBounds { .. }
                    | GgufError::AbsurdCount { .. }
            ),
            "cut at {cut}: {e}"
        );
        n += 1;
        // Every byte of the header, then strides through the data.
        cut += if cut < 8192 { 1 } else { 997 };
    }
    assert!(n > 8000);
}

#[test]
fn rejects_tensor_out_of_bounds() {
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[8], GgmlType::F32, vec![0; 32]);
    let mut b = w.to_bytes();
    b.truncate(b.len() - 4);
    assert!(matches!(err(b), GgufError::TensorOutOfBounds { tensor, .. } if tensor == "t"));
    // An offset far past the end.
    let e = err(raw(3, 1, 0, &tensor_info("t", &[8], 0, 1 << 40)));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    // An offset that overflows when added to the data start.
    let e = err(raw(3, 1, 0, &tensor_info("t", &[8], 0, u64::MAX - 31)));
    assert!(matches!(e, GgufError::Overflow(_)), "{e}");
}

#[test]
fn rejects_misaligned_offsets_and_bad_alignment() {
    let e = err(raw(3, 1, 0, &tensor_info("t", &[1], 0, 4)));
    assert!(
        matches!(
            e,
            GgufError::Misaligned {
                offset: 4,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
    for a in [0u32, 3, 48] {
        let mut w = GgufWriter::new();
        w.add_u32("general.alignment", a);
        assert!(matches!(err(w.to_bytes()), GgufError::BadAlignment(x) if x == u64::from(a)));
    }
}

#[test]
fn rejects_size_overflow_and_bad_shapes() {
    let e = err(raw(3, 1, 0, &tensor_info("t", &[1 << 40, 1 << 40], 0, 0)));
    assert!(matches!(e, GgufError::Overflow(_)), "{e}");
    let e = err(raw(3, 1, 0, &tensor_info("t", &[u64::MAX], 0, 0)));
    assert!(matches!(e, GgufError::Overflow(_)), "{e}");
    let e = err(raw(3, 1, 0, &tensor_info("t", &[1, 1, 1, 1, 1], 0, 0)));
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
    let e = err(raw(3, 1, 0, &tensor_info("t", &[], 0, 0)));
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
    let e = err(raw(
        3,
        1,
        0,
        &tensor_info("t", &[33], GgmlType::Q8_0.id(), 0),
    ));
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
}

#[test]
fn rejects_unknown_types() {
    for id in [4u32, 5, 31, 40, u32::MAX] {
        let e = err(raw(3, 1, 0, &tensor_info("t", &[32], id, 0)));
        assert!(
            matches!(e, GgufError::UnknownTensorType { type_id, .. } if type_id == id),
            "{e}"
        );
    }
    let mut body = Vec::new();
    s(&mut body, "k");
    body.extend_from_slice(&13u32.to_le_bytes());
    body.extend_from_slice(&[0; 8]);
    assert!(matches!(
        err(raw(3, 0, 1, &body)),
        GgufError::UnknownValueType { type_id: 13, .. }
    ));
}

#[test]
fn rejects_duplicates() {
    let mut w = GgufWriter::new();
    w.add_u32("a", 1).add_u32("a", 2);
    assert!(matches!(err(w.to_bytes()), GgufError::DuplicateKey(k) if k == "a"));
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[1], GgmlType::F32, vec![0; 4]);
    w.add_tensor("t", &[1], GgmlType::F32, vec![0; 4]);
    assert!(matches!(err(w.to_bytes()), GgufError::DuplicateTensor(t) if t == "t"));
}

#[test]
fn rejects_absurd_lengths_and_counts() {
    // Counts larger than the file could hold.
    assert!(matches!(
        err(raw(3, 0, u64::MAX, &[])),
        GgufError::AbsurdCount { .. }
    ));
    assert!(matches!(
        err(raw(3, u64::MAX, 0, &[])),
        GgufError::AbsurdCount { .. }
    ));
    // A key whose length runs past the end of the file.
    let mut body = Vec::new();
    body.extend_from_slice(&u64::MAX.to_le_bytes());
    body.extend_from_slice(&[b'a'; 40]);
    assert!(matches!(
        err(raw(3, 0, 1, &body)),
        GgufError::Truncated { .. }
    ));
    // An array whose element count cannot fit.
    let mut body = Vec::new();
    s(&mut body, "arr");
    body.extend_from_slice(&9u32.to_le_bytes());
    body.extend_from_slice(&8u32.to_le_bytes());
    body.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(
        err(raw(3, 0, 1, &body)),
        GgufError::AbsurdCount { .. }
    ));
    // Arrays of arrays nested without end.
    let mut body = Vec::new();
    s(&mut body, "deep");
    body.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..64 {
        body.extend_from_slice(&9u32.to_le_bytes());
        body.extend_from_slice(&1u64.to_le_bytes());
    }
    assert!(matches!(
        err(raw(3, 0, 1, &body)),
        GgufError::NestingTooDeep(_)
    ));
}

#[test]
fn rejects_invalid_utf8() {
    let mut body = Vec::new();
    body.extend_from_slice(&2u64.to_le_bytes());
    body.extend_from_slice(&[0xff, 0xfe]);
    body.extend_from_slice(&4u32.to_le_bytes());
    body.extend_from_slice(&[0; 4]);
    assert!(matches!(
        err(raw(3, 0, 1, &body)),
        GgufError::InvalidUtf8(_)
    ));
}

/// Q5_0 and the K-quants: ggml's exact block sizes; a row that is not a whole number of
/// blocks, data one byte short of the declared blocks, and dims that claim more blocks than
/// the data holds are refused with typed errors; well-formed tensors read and dequantize.
#[test]
fn q5_0_and_k_quant_tensors_have_exact_block_sizes() {
    for (ty, block, bytes) in [
        (GgmlType::Q5_0, 32usize, 22usize),
        (GgmlType::Q4_K, 256, 144),
        (GgmlType::Q5_K, 256, 176),
        (GgmlType::Q6_K, 256, 210),
    ] {
        assert!(ty.is_supported(), "{ty}");
        assert_eq!((ty.block_size(), ty.type_size()), (block, bytes), "{ty}");
        let e = err(raw(
            3,
            1,
            0,
            &tensor_info("t", &[block as u64 / 2], ty.id(), 0),
        ));
        assert!(matches!(e, GgufError::BadShape { .. }), "{ty}: {e}");

        // Two rows of two blocks.
        let data = vec![0u8; 4 * bytes];
        let mut w = GgufWriter::new();
        w.add_tensor("t", &[2 * block as u64, 2], ty, data.clone());
        let b = w.to_bytes();
        let f = GgufFile::from_bytes(b.clone()).expect("well-formed");
        let t = f.tensor("t").expect("tensor");
        assert_eq!(t.data.len(), 4 * bytes, "{ty}");
        assert_eq!(
            dequantize(ty, t.data, 4 * block).unwrap(),
            vec![0.0; 4 * block]
        );
        assert!(dequantize(ty, &data[..4 * bytes - 1], 4 * block).is_err());

        // The file cut one byte into the last block (the writer pads after the data).
        let padding = (4 * bytes).next_multiple_of(32) - 4 * bytes;
        let short = b[..b.len() - padding - 1].to_vec();
        let e = err(short);
        assert!(
            matches!(e, GgufError::TensorOutOfBounds { .. }),
            "{ty}: {e}"
        );

        // Dims that claim a third row the data does not have.
        let mut lying = raw(
            3,
            1,
            0,
            &tensor_info("t", &[2 * block as u64, 3], ty.id(), 0),
        );
        lying.resize(lying.len().next_multiple_of(32), 0);
        lying.extend(data);
        let e = err(lying);
        assert!(
            matches!(e, GgufError::TensorOutOfBounds { .. }),
            "{ty}: {e}"
        );
    }
}
