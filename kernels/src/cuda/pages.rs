//! Launch wrappers for `pages.cu`: checksums, zeroing and guard words of whole device pages.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::context::CudaBackend;
use super::error::{CudaError, DriverContext};
use super::pool::DeviceKvPool;
use super::source::Module;

fn check_ids(op: &'static str, pool: &DeviceKvPool, ids: &[u32]) -> Result<u32, CudaError> {
    if let Some(bad) = ids.iter().find(|&&p| p as usize >= pool.pages) {
        return Err(CudaError::Shape {
            op,
            why: format!("page {bad} out of range (pool has {} pages)", pool.pages),
        });
    }
    u32::try_from(ids.len()).map_err(|_| CudaError::Shape {
        op,
        why: format!("{} pages in one call", ids.len()),
    })
}

fn flat(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    fn page_words(pool: &DeviceKvPool) -> u32 {
        (pool.shape.page_bytes() / 4) as u32
    }

    /// PWSUM64 ([`super::checksum::pwsum64`]) of each listed page, read back.
    pub fn page_checksums(&self, pool: &DeviceKvPool, ids: &[u32]) -> Result<Vec<u64>, CudaError> {
        let n = check_ids("page_checksums", pool, ids)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let d_ids = self.upload(ids)?;
        let mut out: CudaSlice<u64> = self.zeros(ids.len())?;
        let words = Self::page_words(pool);
        let f = self.func(Module::Pages, "page_checksum")?;
        let cfg = LaunchConfig {
            grid_dim: (n, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&pool.data).arg(&d_ids).arg(&mut out).arg(&words);
        // SAFETY: ids checked against the pool; each block reads one page.
        unsafe { b.launch(cfg) }.during("launching page_checksum")?;
        self.download(&out)
    }

    /// Zeroes every listed page.
    pub fn zero_pages(&self, pool: &mut DeviceKvPool, ids: &[u32]) -> Result<(), CudaError> {
        let n = check_ids("zero_pages", pool, ids)?;
        if n == 0 {
            return Ok(());
        }
        let d_ids = self.upload(ids)?;
        let words = Self::page_words(pool);
        let f = self.func(Module::Pages, "page_zero")?;
        let cfg = LaunchConfig {
            grid_dim: (n, words.div_ceil(256).clamp(1, 64), 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(&mut pool.data).arg(&d_ids).arg(&words);
        // SAFETY: ids checked against the pool; each block writes inside its page.
        unsafe { b.launch(cfg) }.during("launching page_zero")?;
        Ok(())
    }

    /// Writes `values[i]` as the guard word of page `ids[i]`.
    pub fn stamp_guards(
        &self,
        pool: &mut DeviceKvPool,
        ids: &[u32],
        values: &[u64],
    ) -> Result<(), CudaError> {
        let n = check_ids("stamp_guards", pool, ids)?;
        self.scatter_u64("stamp_guards", &mut pool.guards, ids, values, n)
    }

    /// Records `gens[i]` as the current generation of page `ids[i]` (the kvcache owner calls this
    /// whenever it bumps a page's generation, so attention on the GPU checks against it).
    pub fn set_generations(
        &self,
        pool: &mut DeviceKvPool,
        ids: &[u32],
        gens: &[u64],
    ) -> Result<(), CudaError> {
        let n = check_ids("set_generations", pool, ids)?;
        self.scatter_u64("set_generations", &mut pool.generations, ids, gens, n)
    }

    /// `dst[ids[i]] = values[i]` with the `guard_stamp` kernel (ids already checked).
    fn scatter_u64(
        &self,
        op: &'static str,
        dst: &mut CudaSlice<u64>,
        ids: &[u32],
        values: &[u64],
        n: u32,
    ) -> Result<(), CudaError> {
        super::error::ensure(values.len() == ids.len(), op, || {
            format!("{} values for {} pages", values.len(), ids.len())
        })?;
        if n == 0 {
            return Ok(());
        }
        let (d_ids, d_vals) = (self.upload(ids)?, self.upload(values)?);
        let f = self.func(Module::Pages, "guard_stamp")?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(dst).arg(&d_ids).arg(&d_vals).arg(&n);
        // SAFETY: ids were checked against the pool; dst has one word per page.
        unsafe { b.launch(flat(n)) }.during("launching guard_stamp")?;
        Ok(())
    }

    /// For each listed page, true when its guard word is NOT the expected value (corrupt).
    pub fn check_guards(
        &self,
        pool: &DeviceKvPool,
        ids: &[u32],
        expected: &[u64],
    ) -> Result<Vec<bool>, CudaError> {
        let n = check_ids("check_guards", pool, ids)?;
        super::error::ensure(expected.len() == ids.len(), "check_guards", || {
            format!("{} expected values for {} pages", expected.len(), ids.len())
        })?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let (d_ids, d_exp) = (self.upload(ids)?, self.upload(expected)?);
        let mut bad: CudaSlice<u32> = self.zeros(ids.len())?;
        let f = self.func(Module::Pages, "guard_check")?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&pool.guards)
            .arg(&d_ids)
            .arg(&d_exp)
            .arg(&mut bad)
            .arg(&n);
        // SAFETY: ids checked against the pool.
        unsafe { b.launch(flat(n)) }.during("launching guard_check")?;
        Ok(self.download(&bad)?.into_iter().map(|b| b != 0).collect())
    }
}
