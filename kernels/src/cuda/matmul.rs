//! Launch wrappers for `matmul.cu`: weight matrices on the device, products (over f32
//! activations, or over activations quantized to 8 bits as the CPU's are), embedding rows.

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

impl DeviceMatrix {
    /// Whether this type has a product over 8-bit activations ([`CudaBackend::matmul_q8`]),
    /// the CPU's arithmetic; the others multiply f32 activations ([`CudaBackend::matmul`]).
    pub fn takes_q8_acts(&self) -> bool {
        kernels(self.ty).matmul_q8.is_some()
    }
}

/// A batch of activation rows quantized per 32-element block on the device, bit for bit as
/// [`crate::act::quantize_acts`] quantizes them on the CPU: what a quantized weight's
/// [`CudaBackend::matmul_q8`] multiplies.
#[derive(Debug)]
pub struct DeviceQ8Acts {
    /// Quantized values, `capacity` of them.
    pub qs: CudaSlice<i8>,
    /// Per block: the scale, through f16.
    pub d: CudaSlice<f32>,
    /// Per block: the scale times the sum of the block's values, through f16 (Q4_1's minimum
    /// is applied with it).
    pub s: CudaSlice<f32>,
}

/// The kernels of one weight type.
struct Kernels {
    /// Over f32 activations.
    matmul: &'static str,
    /// Over 8-bit activations (the quantized types).
    matmul_q8: Option<&'static str>,
    get_rows: &'static str,
}

/// `ty`'s kernels (every weight type has one over f32 activations).
fn kernels(ty: WeightType) -> Kernels {
    let k = |matmul, matmul_q8, get_rows| Kernels {
        matmul,
        matmul_q8,
        get_rows,
    };
    match ty {
        WeightType::Q4_0 => k("matmul_q4_0", Some("matmul_q8_q4_0"), "get_rows_q4_0"),
        WeightType::Q4_1 => k("matmul_q4_1", Some("matmul_q8_q4_1"), "get_rows_q4_1"),
        WeightType::Q8_0 => k("matmul_q8_0", Some("matmul_q8_q8_0"), "get_rows_q8_0"),
        WeightType::F16 => k("matmul_f16", None, "get_rows_f16"),
        WeightType::F32 => k("matmul_f32", None, "get_rows_f32"),
        WeightType::BF16 => k("matmul_bf16", None, "get_rows_bf16"),
        WeightType::Q5_0 => k("matmul_q5_0", None, "get_rows_q5_0"),
        WeightType::Q4_K => k("matmul_q4_k", None, "get_rows_q4_k"),
        WeightType::Q5_K => k("matmul_q5_k", None, "get_rows_q5_k"),
        WeightType::Q6_K => k("matmul_q6_k", None, "get_rows_q6_k"),
    }
}

/// A product's shape as its kernel takes it, and its grid.
struct Launch {
    rows: u32,
    cols: u32,
    batch: u32,
    cfg: LaunchConfig,
}

/// The checks both products share (`out` holds `tokens` rows, `w`'s bytes match its shape) and
/// their launch; `None` when there is nothing to compute.
fn launch_shape(
    op: &'static str,
    w: &DeviceMatrix,
    tokens: usize,
    out: &CudaSlice<f32>,
) -> Result<Option<Launch>, CudaError> {
    ensure(out.len() >= tokens * w.rows, op, || {
        format!(
            "out holds {} floats, {tokens} x {} needed",
            out.len(),
            w.rows
        )
    })?;
    ensure(
        w.ty.row_bytes(w.cols).map(|b| b * w.rows) == Some(w.data.len()),
        op,
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
        return Ok(None);
    }
    let (rows, cols, batch) = (
        as_u32(op, "rows", w.rows)?,
        as_u32(op, "cols", w.cols)?,
        as_u32(op, "tokens", tokens)?,
    );
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(ROWS_PER_BLOCK), batch.div_ceil(BATCH_TILE), 1),
        block_dim: (32 * ROWS_PER_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    Ok(Some(Launch {
        rows,
        cols,
        batch,
        cfg,
    }))
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
        Ok(DeviceMatrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            data: self.upload(w.data)?,
        })
    }

    /// `out[t * rows + r] = sum_c w[r][c] * x[t * cols + c]` for `t < tokens` over f32
    /// activations (for a quantized `w`, the CPU's [`crate::matmul`] quantizes them to 8 bits
    /// first: [`CudaBackend::matmul_q8`] is that function).
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
        let Some(Launch {
            rows,
            cols,
            batch,
            cfg,
        }) = launch_shape(OP, w, tokens, out)?
        else {
            return Ok(());
        };
        let f = self.func(Module::Matmul, kernels(w.ty).matmul)?;
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

    /// Room for `elems` quantized activation values (a multiple of 32).
    pub fn q8_acts(&self, elems: usize) -> Result<DeviceQ8Acts, CudaError> {
        ensure(elems.is_multiple_of(32), "q8_acts", || {
            format!("{elems} elements is not a whole number of 32-element blocks")
        })?;
        Ok(DeviceQ8Acts {
            qs: self.zeros(elems)?,
            d: self.zeros(elems / 32)?,
            s: self.zeros(elems / 32)?,
        })
    }

    /// Quantizes `x[..n]` (`n % 32 == 0`) into `out` per 32-element block, the bits of
    /// [`crate::act::quantize_acts`].
    pub fn quantize_q8(
        &self,
        x: &CudaSlice<f32>,
        n: usize,
        out: &mut DeviceQ8Acts,
    ) -> Result<(), CudaError> {
        const OP: &str = "quantize_q8";
        ensure(n.is_multiple_of(32), OP, || {
            format!("{n} elements is not a whole number of 32-element blocks")
        })?;
        ensure(x.len() >= n && out.qs.len() >= n, OP, || {
            format!(
                "x holds {}, out {} values, {n} needed",
                x.len(),
                out.qs.len()
            )
        })?;
        if n == 0 {
            return Ok(());
        }
        let n32 = as_u32(OP, "n", n)?;
        let f = self.func(Module::Matmul, "quantize_q8_f32")?;
        let cfg = LaunchConfig {
            grid_dim: (n32.div_ceil(256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(x)
            .arg(&mut out.qs)
            .arg(&mut out.d)
            .arg(&mut out.s)
            .arg(&n32);
        // SAFETY: x holds n floats, out n values and n / 32 scales and sums (checked above).
        unsafe { b.launch(cfg) }.during("launching quantize_q8")?;
        Ok(())
    }

    /// [`crate::matmul`] on the device for a quantized `w`: `acts` holds `tokens` rows of
    /// `w.cols` values from [`CudaBackend::quantize_q8`], and each block's term is the CPU's,
    /// rounded in the same order (only the order of the blocks' sum differs).
    pub fn matmul_q8(
        &self,
        w: &DeviceMatrix,
        acts: &DeviceQ8Acts,
        tokens: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "matmul_q8";
        let name = kernels(w.ty).matmul_q8.ok_or_else(|| CudaError::Shape {
            op: OP,
            why: format!("{:?} weights take f32 activations (use matmul)", w.ty),
        })?;
        ensure(acts.qs.len() >= tokens * w.cols, OP, || {
            format!(
                "acts hold {} values, {tokens} x {} needed",
                acts.qs.len(),
                w.cols
            )
        })?;
        let Some(Launch {
            rows,
            cols,
            batch,
            cfg,
        }) = launch_shape(OP, w, tokens, out)?
        else {
            return Ok(());
        };
        let f = self.func(Module::Matmul, name)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&w.data)
            .arg(&acts.qs)
            .arg(&acts.d)
            .arg(&acts.s)
            .arg(out)
            .arg(&rows)
            .arg(&cols)
            .arg(&batch);
        // SAFETY: sizes checked above; the kernel reads rows * row_bytes bytes of w, batch *
        // cols values and batch * cols / 32 scales and sums of acts, writes batch * rows floats.
        unsafe { b.launch(cfg) }.during("launching matmul_q8")?;
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
        let f = self.func(Module::Matmul, kernels(w.ty).get_rows)?;
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
