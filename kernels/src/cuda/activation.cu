// Elementwise ops, mirroring kernels/src/cpu/activation.rs.
//
// swiglu_f32: gate[i] = silu(gate[i]) * up[i] in place, silu(x) = x / (1 + exp(-x)), with exp
//   the CPU's (kernels/src/cpu/expf.rs: ggml's AVX-512 ggml_v_expf, Arm's polynomial then a
//   scale by 2^n), operation for operation, so the two backends agree bit for bit. (The CPU
//   takes libm's expf for a row tail shorter than 16 elements, ggml's leftover loop; model
//   widths are multiples of 16.)
// add_f32: a[i] += b[i] (the residual connection).
// Launch: block (256), grid (ceil(n / 256)).

// 2^e for -126 <= e <= 127.
__device__ __forceinline__ float pow2i(int e) { return __int_as_float((e + 127) << 23); }

// kernels/src/cpu/expf.rs's expf: the same constants, fused multiply-adds and roundings.
__device__ __forceinline__ float cpu_expf(float x) {
    const float shift = __int_as_float(0x4b400000), log2e = __int_as_float(0x3fb8aa3b);
    const float ln2_hi = __int_as_float(0x3f317200), ln2_lo = __int_as_float(0x35bfbe8e);
    const float c4 = __int_as_float(0x3c072010), c3 = __int_as_float(0x3d2b9f17);
    const float c2 = __int_as_float(0x3e2aaf33), c1 = __int_as_float(0x3efffedb);
    const float c0 = __int_as_float(0x3f7ffff6);
    const float z = __fmaf_rn(x, log2e, shift);
    const float n = __fsub_rn(z, shift);
    const float b = __fmaf_rn(-n, ln2_lo, __fmaf_rn(-n, ln2_hi, x));
    const float u = __fmul_rn(b, b);
    const float j = __fmaf_rn(__fmaf_rn(__fmaf_rn(c4, b, c3), u, __fmaf_rn(c2, b, c1)), u,
                              __fmaf_rn(c0, b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : __int_as_float(0x7f800000);
    const int e = (int)n;
    if (abs(e) <= 126) return __fmul_rn(j, pow2i(e));
    const int h = e / 2;  // two exact steps; only the second rounds
    return __fmul_rn(__fmul_rn(j, pow2i(h)), pow2i(e - h));
}

extern "C" __global__ void swiglu_f32(float* __restrict__ gate, const float* __restrict__ up, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    const float silu = __fdiv_rn(g, __fadd_rn(1.0f, cpu_expf(-g)));
    gate[i] = __fmul_rn(silu, up[i]);
}

extern "C" __global__ void add_f32(float* __restrict__ a, const float* __restrict__ b, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    a[i] += b[i];
}

// geglu_f32: gate[i] = gelu(gate[i]) * up[i] as the CPU's `geglu` (ggml's GGML_GELU_FP16):
//   zero at or below -10, the identity at or above 10, otherwise the CPU's own f16 GELU table
//   (uploaded from the host: 65,536 entries) at the f16 rounding of the input.
extern "C" __global__ void geglu_f32(float* __restrict__ gate, const float* __restrict__ up,
                                     const u16* __restrict__ table, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = gate[i];
    float g;
    if (x <= -10.0f) g = 0.0f;
    else if (x >= 10.0f) g = __fmul_rn(x, up[i]);
    else g = __fmul_rn(h2f(table[f2h(x)]), up[i]);
    gate[i] = g;
}

// scale_f32: x[i] *= s.
extern "C" __global__ void scale_f32(float* __restrict__ x, float s, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = __fmul_rn(x[i], s);
}

// softcap_f32: x[i] = tanh(x[i] * (1 / cap)) * cap, llama.cpp's order (the device's tanhf,
//   not libm's: the last bit may differ from the CPU's).
extern "C" __global__ void softcap_f32(float* __restrict__ x, float cap, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = __fmul_rn(tanhf(__fmul_rn(x[i], 1.0f / cap)), cap);
}

// add_rows_f32: x[r, j] += bias[j] for every `width`-wide row r (a projection's bias).
extern "C" __global__ void add_rows_f32(float* __restrict__ x, const float* __restrict__ bias,
                                        u32 width, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] += bias[i % width];
}
