// Whole-page maintenance on the device KV pool: checksum, zeroing, guard words.
//
// The pool is viewed as u32 words; page p spans words [p * page_words, (p + 1) * page_words).
// Page ids are checked against the pool size on the host before launch.
//
// page_checksum (PWSUM64, see kernels/src/cuda/checksum.rs for the CPU twin and rationale):
//   h = sum over word index i of fmix64(((u64)i << 32 | w_i) + 0x9E3779B97F4A7C15)  (mod 2^64)
//   checksum = fmix64(h ^ page_bytes)
// fmix64 is MurmurHash3's 64-bit finalizer, a bijection, so changing any single word always
// changes the checksum; the sum makes the hash order-free to reduce in parallel while the index
// inside each term makes it position-sensitive. Launch: grid (n), block (256); out: u64 [n].
//
// page_zero: grid (n, chunks), block (256): zeroes every listed page.
// guard_stamp: guards[ids[i]] = values[i]. guard_check: bad[i] = guards[ids[i]] != expected[i].
//   Guard words live in their own u64 array beside the pool (one per page), so a transfer into
//   page data cannot forge them. Launch: block (256), grid (ceil(n / 256)).

__device__ __forceinline__ u64 fmix64(u64 k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

extern "C" __global__ void page_checksum(const u32* __restrict__ pool, const u32* __restrict__ ids,
                                         u64* __restrict__ out, u32 page_words) {
    __shared__ u64 scratch[32];
    const u32* page = pool + (size_t)ids[blockIdx.x] * page_words;
    u64 h = 0;
    for (u32 i = threadIdx.x; i < page_words; i += blockDim.x)
        h += fmix64((((u64)i << 32) | (u64)page[i]) + 0x9E3779B97F4A7C15ull);
    h = warp_sum_u64(h);
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = h;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 total = 0;
        for (u32 w = 0; w < (blockDim.x + 31) / 32; w++) total += scratch[w];
        out[blockIdx.x] = fmix64(total ^ ((u64)page_words * 4));
    }
}

extern "C" __global__ void page_zero(u32* __restrict__ pool, const u32* __restrict__ ids,
                                     u32 page_words) {
    u32* page = pool + (size_t)ids[blockIdx.x] * page_words;
    for (u32 i = blockIdx.y * blockDim.x + threadIdx.x; i < page_words; i += gridDim.y * blockDim.x)
        page[i] = 0;
}

extern "C" __global__ void guard_stamp(u64* __restrict__ guards, const u32* __restrict__ ids,
                                       const u64* __restrict__ values, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) guards[ids[i]] = values[i];
}

extern "C" __global__ void guard_check(const u64* __restrict__ guards, const u32* __restrict__ ids,
                                       const u64* __restrict__ expected, u32* __restrict__ bad, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) bad[i] = guards[ids[i]] != expected[i] ? 1u : 0u;
}
