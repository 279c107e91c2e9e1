//! The KV page pool in device memory: page data (f16), and beside it, where a transfer into page
//! data cannot reach them, each page's current generation and guard word.

use cudarc::driver::CudaSlice;
use half::f16;

use super::context::CudaBackend;
use super::error::{ensure, CudaError, DriverContext};

/// Shape of one page; the same fields and layout as `pagewarden_kvcache::KvLayout`
/// (kernels cannot depend on kvcache): `[layer][K|V][slot][kv head][dim]`, f16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageShape {
    /// Transformer layers.
    pub layers: usize,
    /// K/V heads per layer.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
}

impl PageShape {
    /// f16 elements per token per K or V.
    pub fn token_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// f16 elements per page.
    pub fn page_elems(&self) -> usize {
        self.layers * 2 * self.page_size * self.token_width()
    }

    /// Bytes per page.
    pub fn page_bytes(&self) -> usize {
        self.page_elems() * 2
    }

    /// Element offset inside a page of the K (`kind = 0`) or V (`kind = 1`) block of `layer`.
    pub fn block_offset(&self, layer: usize, kind: usize) -> usize {
        ((layer * 2 + kind) * self.page_size) * self.token_width()
    }
}

/// A pool of `pages` pages on one GPU.
#[derive(Debug)]
pub struct DeviceKvPool {
    /// Page shape.
    pub shape: PageShape,
    /// Number of pages.
    pub pages: usize,
    /// `pages * page_elems` f16, page after page.
    pub data: CudaSlice<f16>,
    /// The pool's current generation of each page (the kvcache owner keeps it in step with the
    /// host pool; attention compares the presented generation against it).
    pub generations: CudaSlice<u64>,
    /// One guard word per page (see `pages.cu`).
    pub guards: CudaSlice<u64>,
}

impl CudaBackend {
    /// Allocates a zeroed pool (generations 0, guards 0).
    pub fn kv_pool(&self, shape: PageShape, pages: usize) -> Result<DeviceKvPool, CudaError> {
        ensure(
            shape.token_width() > 0 && shape.page_size > 0 && shape.layers > 0,
            "kv_pool",
            || format!("empty page shape {shape:?}"),
        )?;
        ensure(shape.head_dim.is_multiple_of(2), "kv_pool", || {
            format!("head_dim {} must be even", shape.head_dim)
        })?;
        Ok(DeviceKvPool {
            shape,
            pages,
            data: self.zeros(pages * shape.page_elems())?,
            generations: self.zeros(pages)?,
            guards: self.zeros(pages)?,
        })
    }
}

impl CudaBackend {
    /// Copies page `page` to the host (the transfer sender's staging step).
    pub fn read_page(&self, pool: &DeviceKvPool, page: usize) -> Result<Vec<f16>, CudaError> {
        ensure(page < pool.pages, "read_page", || {
            format!("page {page} out of range ({} pages)", pool.pages)
        })?;
        let pe = pool.shape.page_elems();
        let view = pool.data.slice(page * pe..(page + 1) * pe);
        let mut host = vec![f16::ZERO; pe];
        self.stream()
            .memcpy_dtoh(&view, &mut host)
            .during("copying a page to the host")?;
        Ok(host)
    }

    /// Overwrites page `page` with `data` (`page_elems` f16; the transfer receiver's step, after
    /// the kvcache grant checks).
    pub fn write_page(
        &self,
        pool: &mut DeviceKvPool,
        page: usize,
        data: &[f16],
    ) -> Result<(), CudaError> {
        let pe = pool.shape.page_elems();
        ensure(page < pool.pages && data.len() == pe, "write_page", || {
            format!(
                "page {page} of {} with {} elements (page holds {pe})",
                pool.pages,
                data.len()
            )
        })?;
        let mut view = pool.data.slice_mut(page * pe..(page + 1) * pe);
        self.stream()
            .memcpy_htod(data, &mut view)
            .during("copying a page to the device")
    }
}
