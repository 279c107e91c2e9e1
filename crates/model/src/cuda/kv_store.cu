// Writes one layer's K and V rows (f32, from the projections) into their slots of the device KV
// pool as f16, checking each row's page generation first (invariant I1 on the write side too).
//
// Pool layout as kvcache's KvLayout: page after page, each [layer][K|V][slot][kv head][dim] f16.
// Row r goes to page row_page[r], slot row_slot[r], presented at generation row_gen[r]. A page
// out of range (bit 2) or a generation that is not current_gen[page] (bit 1) ORs the bits into
// flags[row_seq[r]] (the same flag word the attention kernel uses) and writes nothing.
//
// Launch: grid (rows), block (128).

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u16 kv_f2h(float f) {
    u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }\n" : "=h"(h) : "f"(f));
    return h;
}

extern "C" __global__ void kv_store_f16(
    u16* __restrict__ kv, const float* __restrict__ k, const float* __restrict__ v,
    const u32* __restrict__ row_seq, const u32* __restrict__ row_page,
    const u32* __restrict__ row_slot, const u64* __restrict__ row_gen,
    const u64* __restrict__ current_gen, u32 n_pages, u32* __restrict__ flags, u32 layer,
    u32 layers, u32 page_size, u32 tw) {
    const u32 r = blockIdx.x;
    const u32 p = row_page[r];
    u32 bad = 0u;
    if (p >= n_pages) bad = 2u;
    else if (current_gen[p] != row_gen[r]) bad = 1u;
    if (bad) {
        if (threadIdx.x == 0) atomicOr(&flags[row_seq[r]], bad);
        return;
    }
    const size_t page_elems = (size_t)layers * 2 * page_size * tw;
    u16* dst = kv + (size_t)p * page_elems + (size_t)layer * 2 * page_size * tw +
               (size_t)row_slot[r] * tw;
    const float* kr = k + (size_t)r * tw;
    const float* vr = v + (size_t)r * tw;
    const size_t v_off = (size_t)page_size * tw;
    for (u32 i = threadIdx.x; i < tw; i += blockDim.x) {
        dst[i] = kv_f2h(kr[i]);
        dst[v_off + i] = kv_f2h(vr[i]);
    }
}
