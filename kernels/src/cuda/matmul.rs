//! Launch wrappers for `matmul.cu`: weight matrices on the device, products, embedding rows.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::context::CudaBackend;
use super::error::{ensure, CudaError, DriverContext};
use super::source::Module;
use crate::matmul::QMatrix;
use crate::quant::WeightType;

/// Weight rows per thread block (one warp each), as in matmul.cu.
const ROWS_PER_BLOCK: u32 = 4;
/// Activation rows per block along grid y, as in matmul.cu.
const BATCH_TILE: u32 = 8;

/// A weight matrix in device memory, in the same ggml layout as [`QMatrix`].
#[derive(Debug)]
pub struct DeviceMatrix {
    /// Storage type.
    pub ty: WeightType,
    /// Output rows.
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
    /// `rows * ty.row_bytes(cols)` bytes.
    pub data: CudaSlice<u8>,
}

/// The (matmul, get_rows) kernels for `ty`; `None` for types with no CUDA kernel yet.
fn suffix(ty: WeightType) -> Option<(&'static str, &'static str)> {
    match ty {
        WeightType::Q4_0 => Some(("matmul_q4_0", "get_rows_q4_0")),
        WeightType::Q4_1 => Some(("matmul_q4_1", "get_rows_q4_1")),
        WeightType::Q8_0 => Some(("matmul_q8_0", "get_rows_q8_0")),
        WeightType::F16 => Some(("matmul_f16", "get_rows_f16")),
        WeightType::F32 => Some(("matmul_f32", "get_rows_f32")),
        WeightType::Q5_0
        | WeightType::Q4_K
        | WeightType::Q5_K
        | WeightType::Q6_K
        | WeightType::BF16 => None,
    }
}

fn as_u32(op: &'static str, what: &str, v: usize) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| CudaError::Shape {
        op,
        why: format!("{what} = {v} does not fit in 32 bits"),
    })
}

impl CudaBackend {
    /// Copies a weight matrix to the device.
    pub fn upload_matrix(&self, w: &QMatrix<'_>) -> Result<DeviceMatrix, CudaError> {
        ensure(suffix(w.ty).is_some(), "upload_matrix", || {
            format!(
                "{:?} weights have no CUDA kernel yet (run them on the CPU)",
                w.ty
            )
        })?;
        Ok(DeviceMatrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            data: self.upload(w.data)?,
        })
    }

    /// `out[t * rows + r] = sum_c w[r][c] * x[t * cols + c]` for `t < tokens`, the same function
    /// as [`crate::matmul`] (activations stay f32 here; the CPU quantizes them to 8 bits).
    pub fn matmul(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        tokens: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "matmul";
        ensure(x.len() >= tokens * w.cols, OP, || {
            format!("x holds {} floats, {tokens} x {} needed", x.len(), w.cols)
        })?;
        ensure(out.len() >= tokens * w.rows, OP, || {
            format!(
                "out holds {} floats, {tokens} x {} needed",
                out.len(),
                w.rows
            )
        })?;
        ensure(
            w.ty.row_bytes(w.cols).map(|b| b * w.rows) == Some(w.data.len()),
            OP,
            || {
                format!(
                    "{:?} {}x{} does not match {} bytes",
                    w.ty,
                    w.rows,
                    w.cols,
                    w.data.len()
                )
            },
        )?;
        if tokens == 0 || w.rows == 0 {
            return Ok(());
        }
        let (rows, cols, batch) = (
            as_u32(OP, "rows", w.rows)?,
            as_u32(OP, "cols", w.cols)?,
            as_u32(OP, "tokens", tokens)?,
        );
        let f = self.func(Module::Matmul, suffix(w.ty).expect("checked at upload").0)?;
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(ROWS_PER_BLOCK), batch.div_ceil(BATCH_TILE), 1),
            block_dim: (32 * ROWS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&w.data)
            .arg(x)
            .arg(out)
            .arg(&rows)
            .arg(&cols)
            .arg(&batch);
        // SAFETY: buffer sizes were checked against the shape above; the kernel reads
        // rows * row_bytes bytes of w, batch * cols floats of x, writes batch * rows floats.
        unsafe { b.launch(cfg) }.during("launching matmul")?;
        Ok(())
    }

    /// Embedding lookup: `out[i * cols..][..cols] = dequantize(w.row(ids[i]))`.
    pub fn get_rows(
        &self,
        w: &DeviceMatrix,
        ids: &[u32],
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "get_rows";
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= w.rows) {
            return Err(CudaError::Shape {
                op: OP,
                why: format!("row id {bad} out of range (matrix has {} rows)", w.rows),
            });
        }
        ensure(out.len() >= ids.len() * w.cols, OP, || {
            format!(
                "out holds {} floats, {} x {} needed",
                out.len(),
                ids.len(),
                w.cols
            )
        })?;
        if ids.is_empty() {
            return Ok(());
        }
        let cols = as_u32(OP, "cols", w.cols)?;
        let n = as_u32(OP, "ids", ids.len())?;
        let dev_ids = self.upload(ids)?;
        let f = self.func(Module::Matmul, suffix(w.ty).expect("checked at upload").1)?;
        let cfg = LaunchConfig {
            grid_dim: (cols.div_ceil(16).div_ceil(128), n, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&w.data).arg(&dev_ids).arg(out).arg(&cols);
        // SAFETY: ids were checked against rows, out against ids.len() * cols.
        unsafe { b.launch(cfg) }.during("launching get_rows")?;
        Ok(())
    }
}
