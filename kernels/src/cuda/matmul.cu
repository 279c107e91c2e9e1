// Weight matrix x activations: y[b, r] = sum_k W[r, k] * x[b, k].
//
// W is `rows` rows of `cols` elements in ggml layout (row-major, each row a run of blocks):
//   Q4_0: 32 elements per 18-byte block {f16 d; u8 qs[16]}, x = (q - 8) * d
//   Q4_1: 32 elements per 20-byte block {f16 d; f16 m; u8 qs[16]}, x = q * d + m
//   Q8_0: 32 elements per 34-byte block {f16 d; i8 qs[32]}, x = q * d
//   Q5_0: 32 elements per 22-byte block {f16 d; u8 qh[4]; u8 qs[16]}, x = (q | h << 4) - 16) * d
//   (q4: element j < 16 is the low nibble of qs[j], element j + 16 its high nibble)
//   Q4_K, Q5_K, Q6_K: 256-element super-blocks, unpacked as kernels/src/cpu/quant_k.rs does
//   (ggml's dequantize_row_q{4,5,6}_K, the same roundings: d1 * q - m1, (d * sc) * q)
//   F16 / BF16 / F32: plain rows.
// x is f32 [batch, cols], y is f32 [batch, rows], both row-major and 16-byte aligned.
// Quantized formats need cols % 32 == 0; dense formats take any cols.
//
// Q5_0, the K-quants and BF16 have float kernels only: the forward pass multiplies f32
// activations with them (the CPU's 8-bit activations are not reproduced for these types).
//
// Decode-shaped (batch 1..32): one warp per weight row, each lane takes 16-element units of the
// row, dequantizes them once into registers and dots them with up to 8 activation rows
// (blockIdx.y picks which 8). Launch: block (128, 1, 1) = 4 rows, grid (ceil(rows / 4),
// ceil(batch / 8), 1).
//
// The quantized formats also have integer kernels (matmul_q8_*), which is what the forward pass
// runs: the activations are first quantized per 32-element block exactly as the CPU's quantized
// matmuls quantize them (quantize_q8_f32, the bits of kernels/src/cpu/act.rs: d and s rounded
// through f16), and each block's term is the CPU reference's (kernels/src/cpu/matmul/portable.rs)
// in the same rounding order: (d_w * d_x) * sumi, plus m_w * s_x for Q4_1. Only the order in
// which the blocks' terms are summed differs from the CPU's (per lane, then across the warp),
// so the two backends agree to a few ulps of the sum instead of to the 8-bit activation error
// the float kernels show against the CPU. Same launch shape as the float kernels.

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

struct FmtQ5_0 {
    static constexpr bool dense = false;
    __device__ static void unit(const u8* w, u32 row, u32 unit, u32 cols, float* out, int* idx) {
        const u32 blk = unit >> 1, half = unit & 1;
        const u8* b = w + ((size_t)row * (cols / 32) + blk) * 22;
        const float d = h2f((u16)(b[0] | (b[1] << 8)));
        // Blocks are 22 bytes: the high bits are read byte by byte (no 4-byte alignment).
        const u32 qh = b[2] | (b[3] << 8) | (b[4] << 16) | ((u32)b[5] << 24);
        const u8* qs = b + 6 + 8 * half;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 j = 8 * half + i;
            const int lo = (int)((qs[i] & 15) | (((qh >> j) & 1) << 4)) - 16;
            const int hi = (int)((qs[i] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            out[i] = __fmul_rn((float)lo, d);
            out[8 + i] = __fmul_rn((float)hi, d);
        }
        idx[0] = blk * 32 + 8 * half;
        idx[1] = blk * 32 + 16 + 8 * half;
    }
};

// ggml's get_scale_min_k4: the 6-bit scale and minimum of sub-block j (0..8) from q[12].
__device__ __forceinline__ void scale_min_k4(u32 j, const u8* q, u32* sc, u32* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K (FIVE false, 144 bytes {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}) and Q5_K (FIVE
// true, 176 bytes, u8 qh[32] before qs): 16 elements of one 32-element sub-block.
template <bool FIVE>
struct FmtQ45_K {
    static constexpr bool dense = false;
    __device__ static void unit(const u8* w, u32 row, u32 unit, u32 cols, float* out, int* idx) {
        const u32 bytes = FIVE ? 176 : 144;
        const u32 blk = unit >> 4, o = (unit & 15) * 16;  // offset inside the super-block
        const u8* b = w + ((size_t)row * (cols / 256) + blk) * bytes;
        const float d = h2f(*(const u16*)b), dmin = h2f(*(const u16*)(b + 2));
        const u32 s = o / 32, j = s / 2, hi = s & 1, l0 = o % 32;
        u32 sc, m;
        scale_min_k4(s, b + 4, &sc, &m);
        const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const u8* qh = b + 16;
        const u8* qs = b + (FIVE ? 48 : 16) + 32 * j;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const u32 l = l0 + i;
            u32 q = hi ? (qs[l] >> 4) : (qs[l] & 15);
            if (FIVE) q |= ((qh[l] >> (2 * j + hi)) & 1) << 4;
            out[i] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
        }
        const int base = blk * 256 + o;
        idx[0] = base;
        idx[1] = base + 8;
    }
};

// Q6_K (210 bytes {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}): 16 elements, one scale.
struct FmtQ6_K {
    static constexpr bool dense = false;
    __device__ static void unit(const u8* w, u32 row, u32 unit, u32 cols, float* out, int* idx) {
        const u32 blk = unit >> 4, o = (unit & 15) * 16;
        const u8* b = w + ((size_t)row * (cols / 256) + blk) * 210;
        const float d = h2f(*(const u16*)(b + 208));
        const float ds = __fmul_rn(d, (float)(i8)b[192 + o / 16]);
        const u32 n = o / 128, r = o % 128, k = r / 32, l0 = r % 32;
        const u8* ql = b + 64 * n;
        const u8* qh = b + 128 + 32 * n;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const u32 l = l0 + i, h = qh[l];
            u32 q;
            if (k == 0) q = (ql[l] & 15) | ((h & 3) << 4);
            else if (k == 1) q = (ql[l + 32] & 15) | (((h >> 2) & 3) << 4);
            else if (k == 2) q = (ql[l] >> 4) | (((h >> 4) & 3) << 4);
            else q = (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4);
            out[i] = __fmul_rn(ds, (float)((int)q - 32));
        }
        const int base = blk * 256 + o;
        idx[0] = base;
        idx[1] = base + 8;
    }
};

// Dense rows: element i of a row is E::f(r[i]) (E: the storage type and its conversion).
struct F32Elem {
    typedef float T;
    __device__ static float f(float v) { return v; }
};
struct F16Elem {
    typedef u16 T;
    __device__ static float f(u16 v) { return h2f(v); }
};
struct BF16Elem {
    typedef u16 T;
    __device__ static float f(u16 v) { return __int_as_float((int)((u32)v << 16)); }
};

template <typename E>
struct FmtDense {
    static constexpr bool dense = true;
    __device__ static void unit(const u8* w, u32 row, u32 unit, u32 cols, float* out, int* idx) {
        const typename E::T* r = (const typename E::T*)w + (size_t)row * cols;
        const u32 base = unit * 16;
#pragma unroll
        for (int i = 0; i < 16; i++) out[i] = base + i < cols ? E::f(r[base + i]) : 0.0f;
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

// The end of both products: each activation row's sum over the warp's lanes, written by lane 0.
__device__ __forceinline__ void store_rows(const float* acc, float* __restrict__ y, u32 lane,
                                           u32 row, u32 rows, u32 b0, u32 nb) {
#pragma unroll
    for (int i = 0; i < MM_BATCH_TILE; i++) {
        const float v = warp_sum(acc[i]);
        if (lane == 0 && i < nb) y[(size_t)(b0 + i) * rows + row] = v;
    }
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
    store_rows(acc, y, lane, row, rows, b0, nb);
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
PW_MATMUL(f16, FmtDense<F16Elem>)
PW_MATMUL(f32, FmtDense<F32Elem>)
PW_MATMUL(q5_0, FmtQ5_0)
PW_MATMUL(q4_k, FmtQ45_K<false>)
PW_MATMUL(q5_k, FmtQ45_K<true>)
PW_MATMUL(q6_k, FmtQ6_K)
PW_MATMUL(bf16, FmtDense<BF16Elem>)

// ---- 8-bit activations and the integer kernels ----

// x (n = rows * cols floats, n % 32 == 0) -> qs (n i8), d and s (n / 32 floats each):
// d = f16(amax / 127), q = round-half-even(x * (127 / amax)), s = f16((amax / 127) * sum(q)).
// One thread per element, one warp per block. Launch: block (256), grid (ceil(n / 256)).
extern "C" __global__ void quantize_q8_f32(const float* __restrict__ x, i8* __restrict__ qs,
                                           float* __restrict__ d, float* __restrict__ s, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // whole warps only: n is a multiple of 32
    const float v = x[i];
    const float amax = warp_max(fabsf(v));
    const float dq = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = (int)rintf(__fmul_rn(v, id));
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    qs[i] = (i8)q;
    if ((threadIdx.x & 31) == 0) {
        d[i / 32] = h2f(f2h(dq));
        s[i / 32] = h2f(f2h(__fmul_rn(dq, (float)sum)));
    }
}

// Four signed bytes dotted with four, added to c.
__device__ __forceinline__ int dot4(int a, int b, int c) {
#if __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#else
    const char4 x = *(const char4*)&a, y = *(const char4*)&b;
    return c + x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
#endif
}

// Two-byte aligned loads of four bytes (Q4_0 and Q8_0 blocks are 18 and 34 bytes long).
__device__ __forceinline__ u32 load4_u16(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// Each format's block as eight ints of four signed bytes (elements 4k..4k+3 in int k), its
// scale and (Q4_1) its minimum.
struct IntQ4_0 {
    static constexpr u32 bytes = 18;
    static constexpr bool has_min = false;
    __device__ static void load(const u8* b, int* v, float* dw, float* mw) {
        *dw = h2f(*(const u16*)b);
        *mw = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 q = load4_u16(b + 2 + 4 * k);
            v[k] = (int)__vsubss4(q & 0x0f0f0f0fu, 0x08080808u);
            v[4 + k] = (int)__vsubss4((q >> 4) & 0x0f0f0f0fu, 0x08080808u);
        }
    }
};

struct IntQ4_1 {
    static constexpr u32 bytes = 20;
    static constexpr bool has_min = true;
    __device__ static void load(const u8* b, int* v, float* dw, float* mw) {
        const u32 dm = *(const u32*)b;
        *dw = h2f((u16)(dm & 0xffff));
        *mw = h2f((u16)(dm >> 16));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const u32 q = *(const u32*)(b + 4 + 4 * k);
            v[k] = (int)(q & 0x0f0f0f0fu);
            v[4 + k] = (int)((q >> 4) & 0x0f0f0f0fu);
        }
    }
};

struct IntQ8_0 {
    static constexpr u32 bytes = 34;
    static constexpr bool has_min = false;
    __device__ static void load(const u8* b, int* v, float* dw, float* mw) {
        *dw = h2f(*(const u16*)b);
        *mw = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = (int)load4_u16(b + 2 + 4 * k);
    }
};

template <typename F>
__device__ void matmul_q8_body(const u8* __restrict__ w, const i8* __restrict__ qs,
                               const float* __restrict__ d, const float* __restrict__ s,
                               float* __restrict__ y, u32 rows, u32 cols, u32 batch) {
    const u32 lane = threadIdx.x & 31;
    const u32 row = blockIdx.x * MM_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const u32 b0 = blockIdx.y * MM_BATCH_TILE;
    if (row >= rows || b0 >= batch) return;
    const u32 nb = min((u32)MM_BATCH_TILE, batch - b0);
    const u32 blocks = cols / 32;

    float acc[MM_BATCH_TILE];
#pragma unroll
    for (int i = 0; i < MM_BATCH_TILE; i++) acc[i] = 0.0f;

    for (u32 blk = lane; blk < blocks; blk += 32) {
        int wv[8];
        float dw, mw;
        F::load(w + ((size_t)row * blocks + blk) * F::bytes, wv, &dw, &mw);
#pragma unroll
        for (int i = 0; i < MM_BATCH_TILE; i++) {
            if (i < nb) {
                const size_t at = (size_t)(b0 + i) * blocks + blk;
                // 32-byte aligned: cols is a multiple of 32 and the buffer starts aligned.
                const int4* xq = (const int4*)(qs + at * 32);
                const int4 lo = xq[0], hi = xq[1];
                int si = dot4(wv[0], lo.x, 0);
                si = dot4(wv[1], lo.y, si);
                si = dot4(wv[2], lo.z, si);
                si = dot4(wv[3], lo.w, si);
                si = dot4(wv[4], hi.x, si);
                si = dot4(wv[5], hi.y, si);
                si = dot4(wv[6], hi.z, si);
                si = dot4(wv[7], hi.w, si);
                float t = __fmul_rn(__fmul_rn(dw, d[at]), (float)si);
                if (F::has_min) t = __fadd_rn(t, __fmul_rn(mw, s[at]));
                acc[i] = __fadd_rn(acc[i], t);
            }
        }
    }
    store_rows(acc, y, lane, row, rows, b0, nb);
}

#define PW_MATMUL_Q8(NAME, FMT)                                                                 \
    extern "C" __global__ void matmul_q8_##NAME(const u8* __restrict__ w, const i8* __restrict__ qs, \
                                                const float* __restrict__ d, const float* __restrict__ s, \
                                                float* __restrict__ y, u32 rows, u32 cols, u32 batch) { \
        matmul_q8_body<FMT>(w, qs, d, s, y, rows, cols, batch);                                 \
    }

PW_MATMUL_Q8(q4_0, IntQ4_0)
PW_MATMUL_Q8(q4_1, IntQ4_1)
PW_MATMUL_Q8(q8_0, IntQ8_0)
