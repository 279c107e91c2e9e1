// Elementwise ops, mirroring kernels/src/cpu/activation.rs.
//
// swiglu_f32: gate[i] = silu(gate[i]) * up[i] in place, silu(x) = x / (1 + exp(-x)).
// add_f32: a[i] += b[i] (the residual connection).
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
