//! Llama (llama.cpp's `llama` graph): RMSNorm, attention with normal-style RoPE, RMSNorm,
//! SwiGLU FFN, each added back to the residual stream.

use pagewarden_kernels::activation::swiglu;
use pagewarden_kernels::norm::rms_norm;

use crate::llama::forward::{add_into, Pass, SeqWork};
use crate::llama::Model;
use crate::weights::LayerWeights;

impl Model {
    /// One Llama block over the batch's rows.
    pub(crate) fn llama_block(
        &self,
        l: usize,
        lw: &LayerWeights<'_>,
        seqs: &mut [SeqWork<'_>],
        p: &mut Pass,
    ) {
        let cfg = self.config();
        rms_norm(&p.x, &lw.attn_norm, cfg.rms_eps, &mut p.xn);
        self.project_qkv(lw, p);
        p.rope(cfg, lw.attn.rope_base, false);
        self.attention(l, lw, seqs, p);
        add_into(&mut p.x, &p.proj);
        rms_norm(&p.x, &lw.ffn_norm, cfg.rms_eps, &mut p.xn);
        self.project_gate_up(lw, p);
        swiglu(&mut p.gate, &p.up);
        self.project_down(lw, p);
        add_into(&mut p.x, &p.proj);
    }
}
