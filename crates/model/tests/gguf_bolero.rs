//! Bolero fuzz targets for the GGUF reader, run under plain `cargo test` for a bounded number of
//! generated inputs (`ITERATIONS` each; under `cargo bolero test` the same targets run
//! coverage-guided with libFuzzer or AFL).
//!
//! - `structured_headers`: whole GGUF headers built from a typed description (`FuzzFile`) in
//!   which every declared count and length may lie, keys repeat, value and tensor types may be
//!   unknown and sizes may overflow. Keys come from the names the loader reads, so the config,
//!   tokenizer and chat-template paths see junk of every type.
//! - `mutated_tiny_model`: edits (`Edit`) applied to a valid tiny Llama file.
//!
//! Each input must parse to `Ok` or a typed error, never panic; whatever parses is then read
//! through every consumer (`common::exercise`).

mod common;

use std::sync::OnceLock;

use bolero::generator::TypeGenerator;
use pagewarden_model::tiny_llama_gguf;

/// Generated inputs per target under `cargo test` (about a second each in a dev build).
const ITERATIONS: usize = 20_000;

fn tiny() -> &'static [u8] {
    static B: OnceLock<Vec<u8>> = OnceLock::new();
    B.get_or_init(|| tiny_llama_gguf(5))
}

/// Keys the loader looks up (plus a few others), so the fuzzer reaches typed getters.
const KEYS: [&str; 24] = [
    "general.architecture",
    "general.alignment",
    "general.name",
    "llama.block_count",
    "llama.context_length",
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.rope.freq_base",
    "llama.rope.dimension_count",
    "llama.attention.layer_norm_rms_epsilon",
    "llama.vocab_size",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
    "token_embd.weight",
    "output.weight",
];

/// A number biased towards the values where size arithmetic breaks.
#[derive(Clone, Copy, Debug, TypeGenerator)]
enum Num {
    Small(u8),
    Medium(u16),
    Max,
    NearMax(u8),
    Pow2(u8),
    Any(u64),
}

impl Num {
    fn get(self) -> u64 {
        match self {
            Num::Small(v) => v as u64,
            Num::Medium(v) => v as u64,
            Num::Max => u64::MAX,
            Num::NearMax(v) => u64::MAX - v as u64,
            Num::Pow2(v) => 1u64 << (v % 64),
            Num::Any(v) => v,
        }
    }
}

/// How a declared length lies about the bytes that follow it.
#[derive(Clone, Copy, Debug, TypeGenerator)]
enum Lie {
    Short(u8),
    Long(u8),
    Absurd(Num),
}

/// A declared length: true about half of the time, so inputs get past the first field.
#[derive(Clone, Copy, Debug, TypeGenerator)]
struct Len(Option<Lie>);

impl Len {
    const EXACT: Len = Len(None);

    fn declare(self, actual: usize) -> u64 {
        let a = actual as u64;
        match self.0 {
            None => a,
            Some(Lie::Short(d)) => a.saturating_sub(d as u64),
            Some(Lie::Long(d)) => a + d as u64,
            Some(Lie::Absurd(n)) => n.get(),
        }
    }
}

/// A string: one of the loader's keys or raw bytes (possibly not UTF-8).
#[derive(Clone, Debug, TypeGenerator)]
enum Text {
    Known(u8),
    Raw(Vec<u8>),
}

impl Text {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Text::Known(i) => KEYS[*i as usize % KEYS.len()].as_bytes().to_vec(),
            Text::Raw(b) => b.clone(),
        }
    }
}

/// A scalar or string metadata value.
#[derive(Clone, Debug, TypeGenerator)]
enum Scalar {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(u8),
    Str(Text, Len),
    U64(Num),
    I64(i64),
    F64(f64),
}

impl Scalar {
    fn type_id(&self) -> u32 {
        match self {
            Scalar::U8(_) => 0,
            Scalar::I8(_) => 1,
            Scalar::U16(_) => 2,
            Scalar::I16(_) => 3,
            Scalar::U32(_) => 4,
            Scalar::I32(_) => 5,
            Scalar::F32(_) => 6,
            Scalar::Bool(_) => 7,
            Scalar::Str(..) => 8,
            Scalar::U64(_) => 10,
            Scalar::I64(_) => 11,
            Scalar::F64(_) => 12,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Scalar::U8(v) => out.push(*v),
            Scalar::I8(v) => out.extend(v.to_le_bytes()),
            Scalar::U16(v) => out.extend(v.to_le_bytes()),
            Scalar::I16(v) => out.extend(v.to_le_bytes()),
            Scalar::U32(v) => out.extend(v.to_le_bytes()),
            Scalar::I32(v) => out.extend(v.to_le_bytes()),
            Scalar::F32(v) => out.extend(v.to_le_bytes()),
            Scalar::Bool(v) => out.push(*v),
            Scalar::Str(t, len) => write_str(out, &t.bytes(), *len),
            Scalar::U64(v) => out.extend(v.get().to_le_bytes()),
            Scalar::I64(v) => out.extend(v.to_le_bytes()),
            Scalar::F64(v) => out.extend(v.to_le_bytes()),
        }
    }
}

/// A metadata value as it appears after the key.
#[derive(Clone, Debug, TypeGenerator)]
enum Value {
    Scalar(Scalar),
    /// An array whose items are written with the first item's encoding but tagged
    /// `elem_type` (they may disagree), with a declared count that may lie.
    Array {
        elem_type: Option<u32>,
        count: Len,
        items: Vec<Scalar>,
    },
    /// Nested arrays.
    Nested(u8, Len),
    /// A type id outside the format, followed by bytes.
    Unknown(u32, Vec<u8>),
}

impl Value {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Value::Scalar(s) => {
                out.extend(s.type_id().to_le_bytes());
                s.write(out);
            }
            Value::Array {
                elem_type,
                count,
                items,
            } => {
                out.extend(9u32.to_le_bytes());
                let first = items.first().map_or(8, Scalar::type_id);
                out.extend(elem_type.unwrap_or(first).to_le_bytes());
                out.extend(count.declare(items.len()).to_le_bytes());
                // Items of the first item's type only, so the tag is right unless overridden.
                for it in items.iter().filter(|i| i.type_id() == first) {
                    it.write(out);
                }
            }
            Value::Nested(depth, count) => {
                out.extend(9u32.to_le_bytes());
                for _ in 0..*depth % 8 {
                    out.extend(9u32.to_le_bytes());
                    out.extend(count.declare(1).to_le_bytes());
                }
                out.extend(4u32.to_le_bytes());
                out.extend(count.declare(1).to_le_bytes());
                out.extend(7u32.to_le_bytes());
            }
            Value::Unknown(t, bytes) => {
                out.extend((13 + t % 1000).to_le_bytes());
                out.extend(bytes);
            }
        }
    }
}

#[derive(Clone, Debug, TypeGenerator)]
struct Kv {
    key: Text,
    /// `None`: the key's length is declared truthfully.
    key_len: Option<Len>,
    value: Value,
}

/// A tensor info record; `ty` is taken modulo 40 (ggml's ids and some unknown ones).
#[derive(Clone, Debug, TypeGenerator)]
struct Tensor {
    name: Text,
    n_dims: u8,
    dims: Vec<Num>,
    ty: u8,
    offset: Num,
}

/// A whole file: header fields, metadata, tensor infos and a data section.
#[derive(Clone, Debug, TypeGenerator)]
struct FuzzFile {
    /// `None` is version 3; others are taken modulo 5 (only 2 and 3 are valid).
    version: Option<u8>,
    n_tensors: Len,
    n_kv: Len,
    kvs: Vec<Kv>,
    tensors: Vec<Tensor>,
    pad: u8,
    data_len: u16,
}

fn write_str(out: &mut Vec<u8>, bytes: &[u8], len: Len) {
    out.extend(len.declare(bytes.len()).to_le_bytes());
    out.extend(bytes);
}

impl FuzzFile {
    fn encode(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(u32::from(self.version.map_or(3, |v| v % 5)).to_le_bytes());
        out.extend(self.n_tensors.declare(self.tensors.len()).to_le_bytes());
        out.extend(self.n_kv.declare(self.kvs.len()).to_le_bytes());
        for kv in &self.kvs {
            write_str(&mut out, &kv.key.bytes(), kv.key_len.unwrap_or(Len::EXACT));
            kv.value.write(&mut out);
        }
        for t in &self.tensors {
            write_str(&mut out, &t.name.bytes(), Len::EXACT);
            out.extend(u32::from(t.n_dims % 6).to_le_bytes());
            for d in t.dims.iter().take(usize::from(t.n_dims % 6)) {
                out.extend(d.get().to_le_bytes());
            }
            out.extend(u32::from(t.ty % 40).to_le_bytes());
            out.extend(t.offset.get().to_le_bytes());
        }
        // Data starts at the next multiple of the default alignment; a high `pad` misplaces it.
        let misplace = if self.pad >= 224 { self.pad % 32 } else { 0 };
        out.resize(out.len().next_multiple_of(32) + usize::from(misplace), 0);
        out.extend((0..self.data_len).map(|i| i as u8));
        out
    }
}

/// One edit of a valid file.
#[derive(Clone, Copy, Debug, TypeGenerator)]
enum Edit {
    SetByte { at: u16, val: u8 },
    FlipBit { at: u16, bit: u8 },
    PutU32 { at: u16, val: u32 },
    PutU64 { at: u16, val: Num },
    Truncate { at: u32 },
    Copy { from: u16, to: u16, len: u8 },
    Delete { at: u16, len: u8 },
    Insert { at: u16, len: u8, val: u8 },
}

impl Edit {
    fn apply(self, b: &mut Vec<u8>) {
        let at = |p: u16, b: &Vec<u8>| usize::from(p) % b.len().max(1);
        if b.is_empty() {
            return;
        }
        match self {
            Edit::SetByte { at: p, val } => {
                let i = at(p, b);
                b[i] = val;
            }
            Edit::FlipBit { at: p, bit } => {
                let i = at(p, b);
                b[i] ^= 1 << (bit % 8);
            }
            Edit::PutU32 { at: p, val } => {
                let i = at(p, b);
                put(b, i, &val.to_le_bytes());
            }
            Edit::PutU64 { at: p, val } => {
                let i = at(p, b);
                put(b, i, &val.get().to_le_bytes());
            }
            Edit::Truncate { at: p } => b.truncate(p as usize % (b.len() + 1)),
            Edit::Copy { from, to, len } => {
                let (f, t) = (at(from, b), at(to, b));
                let n = usize::from(len).min(b.len() - f).min(b.len() - t);
                b.copy_within(f..f + n, t);
            }
            Edit::Delete { at: p, len } => {
                let i = at(p, b);
                let n = usize::from(len).min(b.len() - i);
                b.drain(i..i + n);
            }
            Edit::Insert { at: p, len, val } => {
                let i = at(p, b);
                b.splice(i..i, std::iter::repeat_n(val, usize::from(len)));
            }
        }
    }
}

fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    let n = bytes.len().min(b.len() - at);
    b[at..at + n].copy_from_slice(&bytes[..n]);
}

#[test]
fn structured_headers() {
    bolero::check!()
        .with_type::<FuzzFile>()
        .with_iterations(ITERATIONS)
        .for_each(|f| common::exercise(f.encode()));
}

#[test]
fn mutated_tiny_model() {
    bolero::check!()
        .with_type::<Vec<Edit>>()
        .with_iterations(ITERATIONS)
        .for_each(|edits| {
            let mut b = tiny().to_vec();
            for e in edits.iter().take(8) {
                e.apply(&mut b);
            }
            common::exercise(b);
        });
}

/// Positive control: the encoder can produce a file the reader accepts, so the structured
/// target does reach past the header checks.
#[test]
fn encoder_makes_valid_files() {
    let f = FuzzFile {
        version: None,
        n_tensors: Len::EXACT,
        n_kv: Len::EXACT,
        kvs: vec![Kv {
            key: Text::Known(0),
            key_len: None,
            value: Value::Scalar(Scalar::Str(Text::Raw(b"llama".to_vec()), Len::EXACT)),
        }],
        tensors: vec![Tensor {
            name: Text::Raw(b"t".to_vec()),
            n_dims: 1,
            dims: vec![Num::Small(32)],
            ty: 0,
            offset: Num::Small(0),
        }],
        pad: 0,
        data_len: 256,
    };
    let file = pagewarden_model::GgufFile::from_bytes(f.encode()).expect("valid file parses");
    assert_eq!(file.architecture().unwrap(), "llama");
    assert_eq!(file.tensors().len(), 1);
}
