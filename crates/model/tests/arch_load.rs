//! Loading the architectures of `arch/`: what a file asks for that the engine does not
//! implement is refused with a `ModelError` that names it (never run silently without it),
//! and fused tensors are views of the mapped file, not copies.

use pagewarden_model::gguf::{f32_bytes, tiny_arch_writer, ArchSpec, GgmlType, TinyArch};
use pagewarden_model::{GgufFile, LoadOptions, Model, ModelError};

fn load(bytes: Vec<u8>) -> Result<Model, ModelError> {
    Model::from_gguf(
        GgufFile::from_bytes(bytes).unwrap(),
        &LoadOptions::default(),
    )
}

fn refused(bytes: Vec<u8>, says: &str) {
    match load(bytes) {
        Err(e @ (ModelError::Unsupported(_) | ModelError::BadConfig(_))) => {
            let msg = e.to_string();
            assert!(msg.contains(says), "{msg:?} should name {says:?}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("loaded a file asking for {says}"),
    }
}

#[test]
fn every_tiny_arch_loads() {
    for arch in TinyArch::ALL {
        let m = load(tiny_arch_writer(&ArchSpec::parity(arch)).to_bytes()).expect("loads");
        assert_eq!(m.config().arch.name(), arch.gguf_arch());
    }
}

#[test]
fn rope_scaling_kinds_not_implemented_are_refused() {
    for kind in ["yarn", "longrope", "made-up"] {
        let mut w = tiny_arch_writer(&ArchSpec::parity(TinyArch::Qwen2));
        w.add_str("qwen2.rope.scaling.type", kind)
            .add_f32("qwen2.rope.scaling.factor", 4.0);
        refused(w.to_bytes(), kind);
    }
    let mut w = tiny_arch_writer(&ArchSpec::parity(TinyArch::Qwen2));
    w.add_str("qwen2.rope.scaling.type", "none")
        .add_f32("qwen2.rope.scaling.factor", 4.0);
    let m = load(w.to_bytes()).expect("type none loads");
    assert_eq!(m.config().rope_scaling.freq_scale, 1.0, "none never scales");
    let mut w = tiny_arch_writer(&ArchSpec::parity(TinyArch::Qwen3));
    w.add_f32("qwen3.rope.scaling.factor", -2.0);
    refused(w.to_bytes(), "positive");
    let mut w = tiny_arch_writer(&ArchSpec::parity(TinyArch::Qwen3));
    w.add_f32("qwen3.rope.scaling.attn_factor", 1.5);
    refused(w.to_bytes(), "attn_factor");
}

#[test]
fn llama3_scaling_is_read_from_the_file() {
    let m = load(tiny_arch_writer(&ArchSpec::parity(TinyArch::Llama3)).to_bytes()).unwrap();
    let s = &m.config().rope_scaling;
    assert_eq!(s.freq_scale, 0.5);
    let f = s.factors.as_ref().expect("rope_freqs.weight");
    assert_eq!((f.len(), f[0], f[7]), (8, 1.0, 8.0));
}

#[test]
fn tensors_llama_cpp_would_not_use_are_refused() {
    let spec = ArchSpec::parity(TinyArch::Qwen2);
    let cases: [(&str, usize, &str); 4] = [
        ("blk.0.attn_output.bias", 64, "attn_output.bias"),
        ("output.bias", 64, "output.bias"),
        ("rope_freqs.weight", 8, "rope_freqs"),
        ("rope_factors_long.weight", 8, "LongRoPE"),
    ];
    for (name, n, says) in cases {
        let mut w = tiny_arch_writer(&spec);
        w.add_tensor(name, &[n as u64], GgmlType::F32, f32_bytes(&vec![1.0; n]));
        refused(w.to_bytes(), says);
    }
}

#[test]
fn experts_are_refused() {
    let mut w = tiny_arch_writer(&ArchSpec::parity(TinyArch::Mistral));
    w.add_u32("llama.expert_count", 8);
    refused(w.to_bytes(), "expert_count");
    let mut w = tiny_arch_writer(&ArchSpec::parity(TinyArch::Phi3));
    w.add_u32("phi3.expert_count", 16);
    refused(w.to_bytes(), "expert_count");
}

#[test]
fn fused_phi3_tensors_are_views_of_the_file() {
    let m = load(tiny_arch_writer(&ArchSpec::parity(TinyArch::Phi3)).to_bytes()).unwrap();
    let f = m.gguf();
    let within = |part: &[u8], name: &str| {
        let whole = f.tensor(name).unwrap().data;
        let (p, w) = (part.as_ptr() as usize, whole.as_ptr() as usize);
        p >= w && p + part.len() <= w + whole.len()
    };
    let l = &m.weights().layers[0];
    // The packed kernels read their own packing; the views must still point into the file.
    for (part, name) in [
        (l.wq.data, "blk.0.attn_qkv.weight"),
        (l.wk.data, "blk.0.attn_qkv.weight"),
        (l.wv.data, "blk.0.attn_qkv.weight"),
        (l.gate.data, "blk.0.ffn_up.weight"),
        (l.up.data, "blk.0.ffn_up.weight"),
    ] {
        assert!(within(part, name), "a copy instead of a view of {name}");
    }
    assert_eq!((l.wq.rows, l.wk.rows, l.wv.rows), (64, 32, 32));
    assert_eq!((l.gate.rows, l.up.rows), (128, 128));
    assert!(std::ptr::eq(
        l.up.data.as_ptr(),
        l.gate.data[l.gate.data.len()..].as_ptr()
    ));
}
