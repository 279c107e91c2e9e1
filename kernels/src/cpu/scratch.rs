//! A thread's scratch buffer, kept from task to task: a kernel whose every element read is
//! first written by the same task takes a prefix of it, with no allocation and no memset per
//! task.

/// The first `len` elements of `buf`, grown (zero-filled, once) when shorter, never cleared.
pub(crate) fn prefix(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}
