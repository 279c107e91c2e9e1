// Rotary position embedding (ggml's GGML_ROPE_TYPE_NORM and _NEOX), bit for bit as
// kernels/src/cpu/rope.rs rotates: each row's pairs are turned by the angles whose cosines and
// sines the host computed for that row's position with `Rope::cos_sin_scaled` (the CPU's own
// bits, RoPE scaling and frequency factors included: its angles come from libm, which the
// device's sincosf does not reproduce), with the CPU's fused multiply-adds: x0*c - x1*s as
// fma(x0, c, -(x1*s)), x0*s + x1*c as fma(x0, s, x1*c). Pairs at or past n_dims / 2 are left
// alone.
//
// rope_rows_f32: normal pairs (x[2i], x[2i+1]) or, with `neox`, pairs (x[i], x[i + n_dims / 2])
// of every head.
//
// x: f32 [rows, heads, head_dim], rotated in place; cs: f32 [rows][n_dims / 2][2].
// Launch: one thread per (row, head, pair < n_dims / 2): block (256), grid (ceil(n / 256)).

extern "C" __global__ void rope_rows_f32(float* __restrict__ x, const float* __restrict__ cs,
                                         u32 rows, u32 heads, u32 head_dim, u32 n_dims,
                                         u32 neox) {
    const u32 pairs = n_dims / 2;
    const size_t n = (size_t)rows * heads * pairs;
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const u32 i = t % pairs;
    const size_t rh = t / pairs;  // row * heads + head
    const size_t row = rh / heads;
    const float* at = cs + (row * pairs + i) * 2;
    const float c = at[0], s = at[1];
    float* h = x + rh * head_dim;
    float* p0 = neox ? h + i : h + 2 * i;
    float* p1 = neox ? h + i + pairs : h + 2 * i + 1;
    const float a = *p0, b = *p1;
    *p0 = __fmaf_rn(a, c, -__fmul_rn(b, s));
    *p1 = __fmaf_rn(a, s, __fmul_rn(b, c));
}
