//! Launch wrappers for `norm.cu`, `rope.cu` and `activation.cu`.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::context::CudaBackend;
use super::error::{ensure, CudaError, DriverContext};
use super::source::Module;
use crate::rope::Rope;

fn u32_of(op: &'static str, v: usize) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| CudaError::Shape {
        op,
        why: format!("size {v} does not fit in 32 bits"),
    })
}

fn flat(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn per_row(rows: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// RMSNorm of `rows` rows of `w.len()` elements, as [`crate::norm::rms_norm`].
    pub fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        eps: f32,
        rows: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "rms_norm";
        let dim = w.len();
        ensure(x.len() >= rows * dim && out.len() >= rows * dim, OP, || {
            format!(
                "x {} / out {} floats, {rows} x {dim} needed",
                x.len(),
                out.len()
            )
        })?;
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        let (r, d) = (u32_of(OP, rows)?, u32_of(OP, dim)?);
        let f = self.func(Module::Norm, "rmsnorm_f32")?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(w).arg(out).arg(&d).arg(&eps);
        // SAFETY: sizes checked above.
        unsafe { b.launch(per_row(r)) }.during("launching rmsnorm")?;
        Ok(())
    }

    /// Softmax in place over `rows` rows of `cols`, as [`crate::activation::softmax`].
    pub fn softmax(
        &self,
        x: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "softmax";
        ensure(x.len() >= rows * cols, OP, || {
            format!("x holds {}, {rows} x {cols} needed", x.len())
        })?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let (r, c) = (u32_of(OP, rows)?, u32_of(OP, cols)?);
        let f = self.func(Module::Norm, "softmax_f32")?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(&c);
        // SAFETY: sizes checked above.
        unsafe { b.launch(per_row(r)) }.during("launching softmax")?;
        Ok(())
    }

    /// SwiGLU in place on the first `n` elements: `gate = silu(gate) * up`.
    pub fn swiglu(
        &self,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        self.binary("swiglu", "swiglu_f32", gate, up, n)
    }

    /// Residual add on the first `n` elements: `a += b`.
    pub fn add(
        &self,
        a: &mut CudaSlice<f32>,
        b: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        self.binary("add", "add_f32", a, b, n)
    }

    fn binary(
        &self,
        op: &'static str,
        kernel: &'static str,
        a: &mut CudaSlice<f32>,
        b: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        ensure(a.len() >= n && b.len() >= n, op, || {
            format!("buffers hold {} and {}, {n} needed", a.len(), b.len())
        })?;
        if n == 0 {
            return Ok(());
        }
        let n32 = u32_of(op, n)?;
        let f = self.func(Module::Activation, kernel)?;
        let mut l = self.stream().launch_builder(&f);
        l.arg(a).arg(b).arg(&n32);
        // SAFETY: sizes checked above.
        unsafe { l.launch(flat(n32)) }.during("launching an elementwise kernel")?;
        Ok(())
    }

    /// Rotates each row of `q` (`[rows, heads, head_dim]`) and of `k` (`[rows, kv_heads,
    /// head_dim]`) in place by its own cosines and sines, `cs` = `[rows][n_dims / 2][cos, sin]`
    /// (the host's [`Rope::cos_sin_scaled`] bits), normal or NeoX pairs, bit for bit as
    /// [`Rope::apply_with`] and [`Rope::apply_neox_with`].
    pub fn rope_rows(
        &self,
        rope: &Rope,
        cs: &CudaSlice<f32>,
        rows: usize,
        neox: bool,
        x: &mut CudaSlice<f32>,
        heads: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "rope_rows";
        let pairs = rope.n_dims / 2;
        ensure(
            rope.n_dims.is_multiple_of(2) && rope.n_dims <= rope.head_dim,
            OP,
            || {
                format!(
                    "n_dims {} must be even and <= head_dim {}",
                    rope.n_dims, rope.head_dim
                )
            },
        )?;
        ensure(
            x.len() >= rows * heads * rope.head_dim && cs.len() >= rows * pairs * 2,
            OP,
            || {
                format!(
                    "x {} / cs {} floats for {rows} rows of {heads} heads",
                    x.len(),
                    cs.len()
                )
            },
        )?;
        let n = u32_of(OP, rows * heads * pairs)?;
        if n == 0 {
            return Ok(());
        }
        let (r, h, hd, nd) = (
            u32_of(OP, rows)?,
            u32_of(OP, heads)?,
            u32_of(OP, rope.head_dim)?,
            u32_of(OP, rope.n_dims)?,
        );
        let neox = u32::from(neox);
        let f = self.func(Module::Rope, "rope_rows_f32")?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x)
            .arg(cs)
            .arg(&r)
            .arg(&h)
            .arg(&hd)
            .arg(&nd)
            .arg(&neox);
        // SAFETY: sizes checked above.
        unsafe { b.launch(flat(n)) }.during("launching rope_rows")?;
        Ok(())
    }

    /// GeGLU in place on the first `n` elements with `table`, the CPU's f16 GELU table on the
    /// device ([`crate::activation::gelu_table`]): `gate = gelu(gate) * up`, the CPU's bits.
    pub fn geglu(
        &self,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
        table: &CudaSlice<half::f16>,
        n: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "geglu";
        ensure(
            gate.len() >= n && up.len() >= n && table.len() == 1 << 16,
            OP,
            || {
                format!(
                    "gate {} / up {} for {n}; table {}",
                    gate.len(),
                    up.len(),
                    table.len()
                )
            },
        )?;
        if n == 0 {
            return Ok(());
        }
        let n32 = u32_of(OP, n)?;
        let f = self.func(Module::Activation, "geglu_f32")?;
        let mut l = self.stream().launch_builder(&f);
        l.arg(gate).arg(up).arg(table).arg(&n32);
        // SAFETY: sizes checked above; every f16 bit pattern indexes inside the table.
        unsafe { l.launch(flat(n32)) }.during("launching geglu")?;
        Ok(())
    }

    /// `x *= s` on the first `n` elements.
    pub fn scale(&self, x: &mut CudaSlice<f32>, s: f32, n: usize) -> Result<(), CudaError> {
        self.unary("scale", "scale_f32", x, s, n)
    }

    /// `x = tanh(x / cap) * cap` on the first `n` elements (logit soft-capping; the device's
    /// `tanhf`).
    pub fn softcap(&self, x: &mut CudaSlice<f32>, cap: f32, n: usize) -> Result<(), CudaError> {
        self.unary("softcap", "softcap_f32", x, cap, n)
    }

    /// `x[r] += bias` for every `bias.len()`-wide row among the first `n` elements.
    pub fn add_rows(
        &self,
        x: &mut CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "add_rows";
        let width = bias.len();
        ensure(
            x.len() >= n && width > 0 && n.is_multiple_of(width),
            OP,
            || format!("x {} floats, {n} in rows of {width}", x.len()),
        )?;
        if n == 0 {
            return Ok(());
        }
        let (w32, n32) = (u32_of(OP, width)?, u32_of(OP, n)?);
        let f = self.func(Module::Activation, "add_rows_f32")?;
        let mut l = self.stream().launch_builder(&f);
        l.arg(x).arg(bias).arg(&w32).arg(&n32);
        // SAFETY: sizes checked above.
        unsafe { l.launch(flat(n32)) }.during("launching add_rows")?;
        Ok(())
    }

    fn unary(
        &self,
        op: &'static str,
        kernel: &'static str,
        x: &mut CudaSlice<f32>,
        s: f32,
        n: usize,
    ) -> Result<(), CudaError> {
        ensure(x.len() >= n, op, || {
            format!("x holds {}, {n} needed", x.len())
        })?;
        if n == 0 {
            return Ok(());
        }
        let n32 = u32_of(op, n)?;
        let f = self.func(Module::Activation, kernel)?;
        let mut l = self.stream().launch_builder(&f);
        l.arg(x).arg(&s).arg(&n32);
        // SAFETY: sizes checked above.
        unsafe { l.launch(flat(n32)) }.during("launching an elementwise kernel")?;
        Ok(())
    }
}
