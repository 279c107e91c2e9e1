// Weight matrix x activations: y[b, r] = sum_k W[r, k] * x[b, k].
//
// W is `rows` rows of `cols` elements in ggml layout (row-major, each row a run of blocks):
//   Q4_0: 32 elements per 18-byte block {f16 d; u8 qs[16]}, x = (q - 8) * d
//   Q4_1: 32 elements per 20-byte block {f16 d; f16 m; u8 qs[16]}, x = q * d + m
//   Q8_0: 32 elements per 34-byte block {f16 d; i8 qs[32]}, x = q * d
//   (q4: element j < 16 is the low nibble of qs[j], element j + 16 its high nibble)
//   F16 / F32: plain rows.
// x is f32 [batch, cols], y is f32 [batch, rows], both row-major and 16-byte aligned.
// Quantized formats need cols % 32 == 0; dense formats take any cols.
//
// Decode-shaped (batch 1..32): one warp per weight row, each lane takes 16-element units of the
// row, dequantizes them once into registers and dots them with up to 8 activation rows
// (blockIdx.y picks which 8). Launch: block (128, 1, 1) = 4 rows, grid (ceil(rows / 4),
// ceil(batch / 8), 1).

#define MM_ROWS_PER_BLOCK 4
#define MM_BATCH_TILE 8

struct FmtQ4_0 {
    static constexpr bool dense = false;
    __device__ static void unit(const u8* w, u32 row, u32 unit, u32 cols, float* out, int* idx) {
        const u32 blk = unit >> 1, half = unit & 1;
        const u8* b = w + ((size_t)row * (cols / 32) + blk) * 18;
        const float d = h2f(*(const u16*)b);
        const u16* qs = (const u16*)(b + 2 + 8 * half);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u16 two = qs[i];
            const int b0 = two & 0xff, b1 = two >> 8;
            out[2 * i] = (float)((b0 & 15) - 8) * d;
            out[2 * i + 1] = (float)((b1 & 15) - 8) * d;
            out[8 + 2 * i] = (float)((b0 >> 4) - 8) * d;
            out[8 + 2 * i + 1] = (float)((b1 >> 4) - 8) * d;
        }
        idx[0] = blk * 32 + 8 * half;
        idx[1] = blk * 32 + 16 + 8 * half;
    }
};

struct FmtQ4_1 {
    static constexpr bool dense = false;
    __device__ static void unit(const u8* w, u32 row, u32 unit, u32 cols, float* out, int* idx) {
        const u32 blk = unit >> 1, half = unit & 1;
        const u8* b = w + ((size_t)row * (cols / 32) + blk) * 20;
        const u32 dm = *(const u32*)b;
        const float d = h2f((u16)(dm & 0xffff)), m = h2f((u16)(dm >> 16));
        const u32* qs = (const u32*)(b + 4 + 8 * half);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const u32 four = qs[i];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 byte = (four >> (8 * j)) & 0xff;
                // Rounded multiply then add, never fused: bit-identical to the CPU dequantizer.
                out[4 * i + j] = __fadd_rn(__fmul_rn((float)(byte & 15), d), m);
                out[8 + 4 * i + j] = __fadd_rn(__fmul_rn((float)(byte >> 4), d), m);
            }
        }
        idx[0] = blk * 32 + 8 * half;
        idx[1] = blk * 32 + 16 + 8 * half;
    }
};

struct FmtQ8_0 {
    static constexpr bool dense = false;
    __device__ static void unit(const u8* w, u32 row, u32 unit, u32 cols, float* out, int* idx) {
        const u32 blk = unit >> 1, half = unit & 1;
        const u8* b = w + ((size_t)row * (cols / 32) + blk) * 34;
        const float d = h2f(*(const u16*)b);
        const u16* qs = (const u16*)(b + 2 + 16 * half);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u16 two = qs[i];
            out[2 * i] = (float)(i8)(two & 0xff) * d;
            out[2 * i + 1] = (float)(i8)(two >> 8) * d;
        }
        idx[0] = blk * 32 + 16 * half;
        idx[1] = blk * 32 + 16 * half + 8;
    }
};

struct FmtF16 {
    static constexpr bool dense = true;
    __device__ static void unit(const u8* w, u32 row, u32 unit, u32 cols, float* out, int* idx) {
        const u16* r = (const u16*)w + (size_t)row * cols;
        const u32 base = unit * 16;
#pragma unroll
        for (int i = 0; i < 16; i++) out[i] = base + i < cols ? h2f(r[base + i]) : 0.0f;
        idx[0] = base;
        idx[1] = base + 8;
    }
};

struct FmtF32 {
    static constexpr bool dense = true;
    __device__ static void unit(const u8* w, u32 row, u32 unit, u32 cols, float* out, int* idx) {
        const float* r = (const float*)w + (size_t)row * cols;
        const u32 base = unit * 16;
#pragma unroll
        for (int i = 0; i < 16; i++) out[i] = base + i < cols ? r[base + i] : 0.0f;
        idx[0] = base;
        idx[1] = base + 8;
    }
};

// Dot of 8 weights with x[at .. at + 8]; dense rows may end inside the run.
template <bool DENSE>
__device__ __forceinline__ float dot8(const float* w, const float* x, u32 at, u32 cols) {
    float s = 0.0f;
    if (!DENSE) {
        const float4 a = *(const float4*)(x + at), b = *(const float4*)(x + at + 4);
        s = w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w;
        s += w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) s += at + i < cols ? w[i] * x[at + i] : 0.0f;
    }
    return s;
}

template <typename F>
__device__ void matmul_body(const u8* __restrict__ w, const float* __restrict__ x,
                            float* __restrict__ y, u32 rows, u32 cols, u32 batch) {
    const u32 lane = threadIdx.x & 31;
    const u32 row = blockIdx.x * MM_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const u32 b0 = blockIdx.y * MM_BATCH_TILE;
    if (row >= rows || b0 >= batch) return;
    const u32 nb = min((u32)MM_BATCH_TILE, batch - b0);
    const u32 units = (cols + 15) / 16;

    float acc[MM_BATCH_TILE];
#pragma unroll
    for (int i = 0; i < MM_BATCH_TILE; i++) acc[i] = 0.0f;

    for (u32 u = lane; u < units; u += 32) {
        float wv[16];
        int idx[2];
        F::unit(w, row, u, cols, wv, idx);
#pragma unroll
        for (int i = 0; i < MM_BATCH_TILE; i++) {
            if (i < nb) {
                const float* xr = x + (size_t)(b0 + i) * cols;
                acc[i] += dot8<F::dense>(wv, xr, idx[0], cols) + dot8<F::dense>(wv + 8, xr, idx[1], cols);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MM_BATCH_TILE; i++) {
        const float s = warp_sum(acc[i]);
        if (lane == 0 && i < nb) y[(size_t)(b0 + i) * rows + row] = s;
    }
}

// Embedding lookup: out[i, :] = dequantize(W[ids[i], :]). Launch: block (128), grid
// (ceil(cols / 16 / 128), n_ids). ids are checked against `rows` on the host.
template <typename F>
__device__ void get_rows_body(const u8* __restrict__ w, const u32* __restrict__ ids,
                              float* __restrict__ out, u32 cols) {
    const u32 u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (cols + 15) / 16) return;
    float wv[16];
    int idx[2];
    F::unit(w, ids[blockIdx.y], u, cols, wv, idx);
    float* o = out + (size_t)blockIdx.y * cols;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (idx[0] + i < cols) o[idx[0] + i] = wv[i];
        if (idx[1] + i < cols) o[idx[1] + i] = wv[8 + i];
    }
}

#define PW_MATMUL(NAME, FMT)                                                                    \
    extern "C" __global__ void matmul_##NAME(const u8* __restrict__ w, const float* __restrict__ x, \
                                             float* __restrict__ y, u32 rows, u32 cols, u32 batch) { \
        matmul_body<FMT>(w, x, y, rows, cols, batch);                                           \
    }                                                                                           \
    extern "C" __global__ void get_rows_##NAME(const u8* __restrict__ w, const u32* __restrict__ ids, \
                                               float* __restrict__ out, u32 cols) {             \
        get_rows_body<FMT>(w, ids, out, cols);                                                  \
    }

PW_MATMUL(q4_0, FmtQ4_0)
PW_MATMUL(q4_1, FmtQ4_1)
PW_MATMUL(q8_0, FmtQ8_0)
PW_MATMUL(f16, FmtF16)
PW_MATMUL(f32, FmtF32)
