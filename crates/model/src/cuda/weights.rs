//! The model's weights in device memory, quantized as they are in the GGUF file.

use pagewarden_kernels::cuda::cudarc::driver::CudaSlice;
use pagewarden_kernels::cuda::{CudaBackend, DeviceMatrix};

use crate::weights::LlamaWeights;

use super::error::GpuError;

/// One transformer block on the device.
pub(crate) struct GpuLayer {
    pub attn_norm: CudaSlice<f32>,
    pub wq: DeviceMatrix,
    pub wk: DeviceMatrix,
    pub wv: DeviceMatrix,
    pub wo: DeviceMatrix,
    pub ffn_norm: CudaSlice<f32>,
    pub gate: DeviceMatrix,
    pub up: DeviceMatrix,
    pub down: DeviceMatrix,
}

/// Every weight on the device.
pub(crate) struct GpuWeights {
    pub token_embd: DeviceMatrix,
    pub layers: Vec<GpuLayer>,
    pub output_norm: CudaSlice<f32>,
    /// `None` when the head is tied to the embeddings (uploaded once).
    output: Option<DeviceMatrix>,
}

impl GpuWeights {
    /// Copies `w` to the device (once; about the size of the model file).
    pub fn upload(b: &CudaBackend, w: &LlamaWeights<'_>) -> Result<GpuWeights, GpuError> {
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(GpuLayer {
                    attn_norm: b.upload(&l.attn_norm)?,
                    wq: b.upload_matrix(&l.wq)?,
                    wk: b.upload_matrix(&l.wk)?,
                    wv: b.upload_matrix(&l.wv)?,
                    wo: b.upload_matrix(&l.wo)?,
                    ffn_norm: b.upload(&l.ffn_norm)?,
                    gate: b.upload_matrix(&l.gate)?,
                    up: b.upload_matrix(&l.up)?,
                    down: b.upload_matrix(&l.down)?,
                })
            })
            .collect::<Result<Vec<_>, GpuError>>()?;
        let tied = std::ptr::eq(w.output.data.as_ptr(), w.token_embd.data.as_ptr())
            && w.output.data.len() == w.token_embd.data.len();
        let output = if tied {
            None
        } else {
            Some(b.upload_matrix(&w.output)?)
        };
        Ok(GpuWeights {
            token_embd: b.upload_matrix(&w.token_embd)?,
            layers,
            output_norm: b.upload(&w.output_norm)?,
            output,
        })
    }

    /// The output head.
    pub fn output(&self) -> &DeviceMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}
