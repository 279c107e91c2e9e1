//! One test body per device: [`device_test!`] runs a body taking a [`Device`] once on the CPU
//! and, in a build with the `cuda` feature, once on `cuda:0` (ignored unless asked for:
//! `cargo test --features pagewarden-model/cuda -- --ignored` on a GPU host; the build machine
//! only compiles it). [`OnDevice`] is the model on that device over a host pool, as the
//! workers run it: the CPU's forward pass, or a `GpuWorker` mirroring the pool's pages.

// Each test target that includes this module uses part of it.
#![allow(dead_code)]

use std::sync::Arc;

use pagewarden_kernels::Device;
use pagewarden_kvcache::{KvPool, ReadablePages};
use pagewarden_model::{Model, ModelError};

/// A test body run on every device: `device_test!(name, body)` makes `name::cpu` and, with
/// the `cuda` feature, `name::cuda`, each calling `body(device)`.
#[macro_export]
macro_rules! device_test {
    ($name:ident, $body:ident) => {
        mod $name {
            #[test]
            fn cpu() {
                super::$body(pagewarden_kernels::Device::Cpu)
            }

            #[cfg(feature = "cuda")]
            #[test]
            #[ignore = "needs a GPU: run with --ignored on a GPU host"]
            fn cuda() {
                super::$body(pagewarden_kernels::Device::Cuda(0))
            }
        }
    };
}

/// Why a pass on a device failed.
#[derive(Debug)]
pub enum RunError {
    /// The CPU engine's error.
    Cpu(ModelError),
    /// The GPU worker's error.
    #[cfg(feature = "cuda")]
    Gpu(pagewarden_model::cuda::GpuError),
}

impl RunError {
    /// The model's own error (a sequence refused before or during its pass), on any device.
    pub fn model(&self) -> Option<&ModelError> {
        match self {
            RunError::Cpu(e) => Some(e),
            #[cfg(feature = "cuda")]
            RunError::Gpu(pagewarden_model::cuda::GpuError::Model(e)) => Some(e),
            #[cfg(feature = "cuda")]
            RunError::Gpu(_) => None,
        }
    }

    /// A KV read refused by a generation check (I1), on the host or on the device.
    pub fn is_kv_refusal(&self) -> bool {
        #[cfg(feature = "cuda")]
        if let RunError::Gpu(pagewarden_model::cuda::GpuError::HostRead(_)) = self {
            return true;
        }
        matches!(
            self.model(),
            Some(ModelError::KvRead(_) | ModelError::DevicePageFault(_))
        )
    }
}

/// A model on one device over a host pool.
pub struct OnDevice {
    model: Arc<Model>,
    #[cfg(feature = "cuda")]
    gpu: Option<pagewarden_model::cuda::GpuWorker>,
}

impl OnDevice {
    /// `model` on `device`, its pages `pool`'s.
    pub fn open(device: Device, model: Model, pool: &KvPool) -> OnDevice {
        let model = Arc::new(model);
        match device {
            Device::Cpu => OnDevice {
                model,
                #[cfg(feature = "cuda")]
                gpu: None,
            },
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => {
                let opts = pagewarden_model::cuda::GpuWorkerOptions {
                    device: n,
                    staging_pages: 16,
                    zero_new_pages: true,
                };
                let gpu =
                    pagewarden_model::cuda::GpuWorker::new(model.clone(), pool.clone(), &opts)
                        .unwrap_or_else(|e| panic!("cuda:{n}: {e}"));
                OnDevice {
                    model,
                    gpu: Some(gpu),
                }
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(n) => {
                let _ = pool;
                panic!("cuda:{n} asked of a build without the cuda feature")
            }
        }
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// `tokens` after those already in `seq`; the last position's logits.
    pub fn prefill(
        &mut self,
        seq: &mut ReadablePages,
        tokens: &[u32],
    ) -> Result<Vec<f32>, RunError> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &mut self.gpu {
            return g.prefill(None, seq, tokens).map_err(RunError::Gpu);
        }
        self.model.prefill(seq, tokens).map_err(RunError::Cpu)
    }

    /// One batched decode step.
    pub fn decode_step(
        &mut self,
        batch: &mut [(&mut ReadablePages, u32)],
    ) -> Vec<Result<Vec<f32>, RunError>> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &mut self.gpu {
            let mut with: Vec<_> = batch
                .iter_mut()
                .map(|(pages, t)| (None, &mut **pages, *t))
                .collect();
            return g
                .decode_step(&mut with)
                .into_iter()
                .map(|r| r.map_err(RunError::Gpu))
                .collect();
        }
        self.model
            .decode_step(batch)
            .into_iter()
            .map(|r| r.map_err(RunError::Cpu))
            .collect()
    }

    /// One decode step of one sequence.
    pub fn decode(&mut self, seq: &mut ReadablePages, token: u32) -> Result<Vec<f32>, RunError> {
        self.decode_step(&mut [(seq, token)])
            .pop()
            .expect("one result")
    }
}
