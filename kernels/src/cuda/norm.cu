// Row-wise reductions, mirroring kernels/src/cpu/{norm,activation}.rs (sums in f64, as the CPU
// reference does, so the two agree to a few ulps).
//
// rmsnorm_f32: y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w. Launch: grid (rows),
//   block (256).
// softmax_f32: x[r, :] = exp(x - max) / sum, in place. Launch: grid (rows), block (256).

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ double block_sum_f64(double v) {
    __shared__ double scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = warp_sum_f64(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0;
    return warp_sum_f64(v);
}

extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ y, u32 dim, float eps) {
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* yr = y + (size_t)blockIdx.x * dim;
    double ss = 0.0;
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_f64(ss);
    const float mean = (float)(ss / (double)dim);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

extern "C" __global__ void softmax_f32(float* __restrict__ x, u32 cols) {
    __shared__ float scratch[32];
    float* xr = x + (size_t)blockIdx.x * cols;
    float m = PW_NEG_INF;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, xr[i]);
    m = block_max(m, scratch);
    double s = 0.0;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        const float e = expf(xr[i] - m);
        xr[i] = e;
        s += (double)e;
    }
    s = block_sum_f64(s);
    const float inv = (float)(1.0 / s);
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) xr[i] *= inv;
}
