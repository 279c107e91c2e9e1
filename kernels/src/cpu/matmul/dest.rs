//! Where a job's products go. The row kernels fill a job's own `n x tokens` buffer by weight
//! row, which `matmul_many_with` then scatters into the token-major output one element at a
//! time. The packed-group kernels compute sixteen (or eight) consecutive rows of one token at
//! once, so they can store those straight into the token-major output as one run: no buffer,
//! no scatter (a strided scalar copy of every result, 4% of a Gemma 3 prefill on one thread).

use std::marker::PhantomData;

/// Rows `0..n` of a job (weight rows `r0..r0 + n`) for every token: element `(r, t)` at
/// `r * row_step + t * token_step` from `ptr`, inside `len` elements.
pub(crate) struct Dest<'a> {
    ptr: *mut f32,
    len: usize,
    row_step: usize,
    token_step: usize,
    _out: PhantomData<&'a mut [f32]>,
}

impl<'a> Dest<'a> {
    /// A job's own buffer by weight row: element `(r, t)` at `r * tokens + t`.
    pub(crate) fn by_row(out: &'a mut [f32], tokens: usize) -> Self {
        Self {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            row_step: tokens,
            token_step: 1,
            _out: PhantomData,
        }
    }

    /// Rows `r0..` of a token-major output of `ld` elements a token: element `(r, t)` at
    /// `t * ld + r0 + r` of `out`.
    ///
    /// # Safety
    /// `out` must be valid for `len` elements from its start, for as long as the result
    /// lives, and no one else may read or write the elements this job's rows address while it
    /// does (another thread's job writes other rows).
    pub(crate) unsafe fn by_token(out: *mut f32, len: usize, r0: usize, ld: usize) -> Self {
        assert!(r0 <= len, "rows inside the output");
        Self {
            // SAFETY: r0 <= len, inside (or one past) the allocation the caller vouches for.
            ptr: unsafe { out.add(r0) },
            len: len - r0,
            row_step: 1,
            token_step: ld,
            _out: PhantomData,
        }
    }

    /// Stores `vals[i]` as row `r + i` of token `t`.
    #[inline(always)]
    pub(crate) fn put(&mut self, r: usize, t: usize, vals: &[f32]) {
        let Some(last) = vals.len().checked_sub(1) else {
            return;
        };
        let end = (r + last) * self.row_step + t * self.token_step;
        assert!(
            end < self.len,
            "element ({}, {t}) outside the destination",
            r + last
        );
        if self.row_step == 1 {
            // SAFETY: the run ends at `end`, inside the destination (checked).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    vals.as_ptr(),
                    self.ptr.add(t * self.token_step + r),
                    vals.len(),
                )
            };
        } else {
            for (i, v) in vals.iter().enumerate() {
                // SAFETY: every element is at or before `end` (steps are positive).
                unsafe { *self.ptr.add((r + i) * self.row_step + t * self.token_step) = *v };
            }
        }
    }
}
