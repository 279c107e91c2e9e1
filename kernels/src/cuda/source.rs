//! The CUDA kernel sources (the `.cu` files in this directory, each beside its launch wrapper),
//! embedded in the binary, one NVRTC module each.

/// Helpers prepended to every module (NVRTC gets no include path).
const PRELUDE: &str = include_str!("prelude.cuh");

/// One compilation unit of kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Module {
    /// Quantized and dense matrix products, embedding rows (`matmul.cu`).
    Matmul,
    /// RMSNorm and softmax (`norm.cu`).
    Norm,
    /// Rotary embedding from per-row angles (`rope.cu`).
    Rope,
    /// SwiGLU, GeGLU, residual and bias adds, scaling, soft-capping (`activation.cu`).
    Activation,
    /// Paged attention with the generation check (`attention.cu`).
    Attention,
    /// Page checksum, zeroing, guard words (`pages.cu`).
    Pages,
}

impl Module {
    /// Every module, in a fixed order.
    pub const ALL: [Module; 6] = [
        Module::Matmul,
        Module::Norm,
        Module::Rope,
        Module::Activation,
        Module::Attention,
        Module::Pages,
    ];

    /// File stem under kernels/src/cuda (also the PTX file stem).
    pub fn name(self) -> &'static str {
        match self {
            Module::Matmul => "matmul",
            Module::Norm => "norm",
            Module::Rope => "rope",
            Module::Activation => "activation",
            Module::Attention => "attention",
            Module::Pages => "pages",
        }
    }

    /// The .cu file without the prelude.
    fn body(self) -> &'static str {
        match self {
            Module::Matmul => include_str!("matmul.cu"),
            Module::Norm => include_str!("norm.cu"),
            Module::Rope => include_str!("rope.cu"),
            Module::Activation => include_str!("activation.cu"),
            Module::Attention => include_str!("attention.cu"),
            Module::Pages => include_str!("pages.cu"),
        }
    }

    /// The full source handed to NVRTC (prelude + file).
    pub fn source(self) -> String {
        format!(
            "{PRELUDE}\n// ---- {}.cu ----\n{}",
            self.name(),
            self.body()
        )
    }

    /// The `extern "C"` kernels this module defines (each is looked up after loading).
    pub fn functions(self) -> &'static [&'static str] {
        match self {
            Module::Matmul => &[
                "matmul_q4_0",
                "matmul_q4_1",
                "matmul_q8_0",
                "matmul_f16",
                "matmul_f32",
                "matmul_q5_0",
                "matmul_q4_k",
                "matmul_q5_k",
                "matmul_q6_k",
                "matmul_bf16",
                "get_rows_q4_0",
                "get_rows_q4_1",
                "get_rows_q8_0",
                "get_rows_f16",
                "get_rows_f32",
                "get_rows_q5_0",
                "get_rows_q4_k",
                "get_rows_q5_k",
                "get_rows_q6_k",
                "get_rows_bf16",
                "quantize_q8_f32",
                "matmul_q8_q4_0",
                "matmul_q8_q4_1",
                "matmul_q8_q8_0",
            ],
            Module::Norm => &["rmsnorm_f32", "softmax_f32"],
            Module::Rope => &["rope_rows_f32"],
            Module::Activation => &[
                "swiglu_f32",
                "add_f32",
                "geglu_f32",
                "scale_f32",
                "softcap_f32",
                "add_rows_f32",
            ],
            Module::Attention => &["paged_attention_f32"],
            Module::Pages => &["page_checksum", "page_zero", "guard_stamp", "guard_check"],
        }
    }

    /// A 64-bit FNV-1a hash of [`Module::source`], written into PTX files so a stale file is
    /// refused instead of silently running old code.
    pub fn source_hash(self) -> u64 {
        self.source()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
            })
    }
}
