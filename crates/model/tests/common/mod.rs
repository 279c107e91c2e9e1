//! Shared by the GGUF fuzz tests: what every fuzzed input is put through.

use pagewarden_model::gguf::{dequantize, GgufFile};
use pagewarden_model::{
    ChatMessage, ChatTemplate, LlamaConfig, LoadOptions, Model, StreamDecoder, Tokenizer,
};

/// Parses `bytes`; the reader must return `Ok` or a typed error, never panic. Whatever it
/// accepts is then read through every consumer: each tensor's bytes (and dequantized values),
/// the Llama config, the tokenizer, the chat template and the model loader.
pub fn exercise(bytes: Vec<u8>) {
    let Ok(f) = GgufFile::from_bytes(bytes) else {
        return;
    };
    for t in f.tensors() {
        let v = f.tensor(&t.name).expect("listed tensor is found");
        assert_eq!(v.data.len() as u64, t.n_bytes);
        if t.ggml_type.is_supported() && t.n_elements() <= 1 << 16 {
            dequantize(t.ggml_type, v.data, t.n_elements() as usize)
                .expect("dequantize accepted tensor");
        }
    }
    let _ = f.architecture();
    let _ = LlamaConfig::from_gguf(&f);
    // Whatever metadata survived, building and using the tokenizer and template is safe.
    if let Ok(tok) = Tokenizer::from_gguf(&f) {
        let ids = tok.encode("Hi <|im_start|>user 123 héllo<|im_end|>", true);
        let mut d = StreamDecoder::new(&tok);
        for &id in &ids {
            let _ = d.push(id);
        }
        let _ = tok.decode(&ids);
    }
    if let Ok(Some(t)) = ChatTemplate::from_gguf(&f) {
        let _ = t.render(&[ChatMessage::new("user", "hi")], true);
    }
    let _ = Model::from_gguf(
        f,
        &LoadOptions {
            threads: 1,
            ..LoadOptions::default()
        },
    );
}
