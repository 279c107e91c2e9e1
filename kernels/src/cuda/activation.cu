// Elementwise ops, mirroring kernels/src/cpu/activation.rs.
//
// swiglu_f32: gate[i] = silu(gate[i]) * up[i] in place, silu(x) = x / (1 + exp(-x)).
// add_f32: a[i] += b[i] (the residual connection).
// q8_roundtrip_f32: out[i] = x[i] as the CPU's quantized matmuls see it
//   (kernels/src/cpu/act.rs, like llama.cpp's Q8 activations): per 32-element block,
//   d = amax / 127 kept as f16 and q = round-half-even(x * 127 / amax), out = q * d. n must be
//   a multiple of 32 (one warp per block: warps are whole or absent under the bounds check).
// Launch: block (256), grid (ceil(n / 256)).

extern "C" __global__ void swiglu_f32(float* __restrict__ gate, const float* __restrict__ up, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
}

extern "C" __global__ void add_f32(float* __restrict__ a, const float* __restrict__ b, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    a[i] += b[i];
}

extern "C" __global__ void q8_roundtrip_f32(float* __restrict__ out, const float* __restrict__ x, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    out[i] = rintf(v * id) * h2f(f2h(d));
}
