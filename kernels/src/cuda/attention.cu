// Causal grouped-query attention over the paged f16 KV pool, with the page-generation check
// (invariant I1) done on the device, mirroring kernels/src/cpu/attention.rs for the arithmetic.
//
// KV pool: `kv` holds every page back to back, `page_elems = layers * 2 * page_size * kv_heads
// * head_dim` f16 each, laid out as KvLayout::block_offset says: [layer][K|V][slot][head][dim].
//
// Queries: q and out are f32 [n_q, heads, head_dim]. Query i belongs to sequence q_seq[i] and
// sits at position q_pos[i]; it attends to keys 0..=q_pos[i] of that sequence, or with a
// sliding window (window > 0) to the last `window` of them, itself included.
//
// Page table: sequence s owns table entries table_start[s] .. table_start[s + 1] of page_ids /
// expected_gen (page index j of the sequence is page_ids[table_start[s] + j], presented with
// the generation the owner holds). current_gen[p] is the pool's generation of page p.
//
// Before reading any K/V, every block checks EVERY entry of its sequence's table: a page id out
// of range (bit 2), a generation that is not the page's current one (bit 1), or a table too short
// for the query position (bit 4) ORs the bits into flags[s] and the block returns without reading
// K/V and without writing out. Since all blocks of a sequence check the same table, a failed
// sequence's output is left entirely untouched; the host reads flags back after the step and
// fails only those sequences.
//
// Launch: grid (heads, n_q), block (ATT_THREADS), dynamic shared memory
// (max_pos + 1 + head_dim + ATT_THREADS) * 4 bytes. head_dim must be even and <= ATT_THREADS.

#define ATT_THREADS 128

#define ATT_GEN_MISMATCH 1u
#define ATT_BAD_PAGE 2u
#define ATT_SHORT_TABLE 4u

extern "C" __global__ void paged_attention_f32(
    const float* __restrict__ q, float* __restrict__ out, const u16* __restrict__ kv,
    const u32* __restrict__ q_seq, const u32* __restrict__ q_pos,
    const u32* __restrict__ table_start, const u32* __restrict__ page_ids,
    const u64* __restrict__ expected_gen, const u64* __restrict__ current_gen, u32 n_pages,
    u32* __restrict__ flags, u32 layer, u32 layers, u32 heads, u32 kv_heads, u32 head_dim,
    u32 page_size, float scale, u32 window) {
    extern __shared__ float smem[];
    __shared__ u32 bad;
    __shared__ float scratch[32];

    const u32 head = blockIdx.x, qi = blockIdx.y, tid = threadIdx.x;
    const u32 seq = q_seq[qi], pos = q_pos[qi];
    const u32 t0 = table_start[seq], t1 = table_start[seq + 1];
    // Keys lo..=pos: every earlier one, or the window's.
    const u32 lo = (window > 0u && pos + 1 > window) ? pos + 1 - window : 0u;
    const u32 n_tok = pos + 1 - lo;

    if (tid == 0) bad = (pos / page_size + 1 > t1 - t0) ? ATT_SHORT_TABLE : 0u;
    __syncthreads();
    u32 mine = 0;
    for (u32 j = t0 + tid; j < t1; j += blockDim.x) {
        const u32 p = page_ids[j];
        if (p >= n_pages) mine |= ATT_BAD_PAGE;
        else if (current_gen[p] != expected_gen[j]) mine |= ATT_GEN_MISMATCH;
    }
    if (mine) atomicOr(&bad, mine);
    __syncthreads();
    if (bad) {
        if (tid == 0) atomicOr(&flags[seq], bad);
        return;
    }

    const u32 tw = kv_heads * head_dim;
    const size_t page_elems = (size_t)layers * 2 * page_size * tw;
    const u32 kvh = head / (heads / kv_heads);
    float* scores = smem;                 // n_tok
    float* qs = smem + n_tok;             // head_dim
    float* part = qs + head_dim;          // blockDim.x
    const float* qrow = q + ((size_t)qi * heads + head) * head_dim;
    // Like the CPU reference (and llama.cpp with an f16 KV cache), q and the probabilities are
    // rounded to f16 before they meet K and V, so both backends pick the same tokens.
    for (u32 d = tid; d < head_dim; d += blockDim.x) qs[d] = h2f(f2h(qrow[d]));
    __syncthreads();

    // Scores: one warp per key, lanes over pairs of dims.
    const u32 lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const u32 k_off = (layer * 2) * page_size * tw + kvh * head_dim;
    for (u32 i = warp; i < n_tok; i += warps) {
        const u32 t = lo + i;
        const u32 page = page_ids[t0 + t / page_size];
        const u16* k = kv + page * page_elems + k_off + (t % page_size) * tw;
        float s = 0.0f;
        for (u32 d2 = lane; d2 < head_dim / 2; d2 += 32) {
            const u32 two = *(const u32*)(k + 2 * d2);
            s += qs[2 * d2] * h2f((u16)(two & 0xffff)) + qs[2 * d2 + 1] * h2f((u16)(two >> 16));
        }
        s = warp_sum(s);
        if (lane == 0) scores[i] = s * scale;
    }
    __syncthreads();

    // Softmax (max subtracted, sum in f64 like the CPU), probabilities left in `scores`.
    float m = PW_NEG_INF;
    for (u32 t = tid; t < n_tok; t += blockDim.x) m = fmaxf(m, scores[t]);
    m = block_max(m, scratch);
    double sum = 0.0;
    for (u32 t = tid; t < n_tok; t += blockDim.x) {
        const float e = expf(scores[t] - m);
        scores[t] = e;
        sum += (double)e;
    }
    // The f64 sum needs its own shared scratch (one slot per warp).
    __shared__ double dscratch[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) dscratch[warp] = sum;
    __syncthreads();
    if (tid == 0) {
        double total = 0.0;
        for (u32 w = 0; w < warps; w++) total += dscratch[w];
        dscratch[0] = total;
    }
    __syncthreads();
    const float inv = (float)(1.0 / dscratch[0]);
    for (u32 t = tid; t < n_tok; t += blockDim.x) scores[t] = h2f(f2h(scores[t] * inv));
    __syncthreads();

    // Output: thread (g, d) sums keys g, g + groups, ... for dim d; groups are then added.
    const u32 groups = blockDim.x / head_dim;
    const u32 g = tid / head_dim, d = tid % head_dim;
    const u32 v_off = (layer * 2 + 1) * page_size * tw + kvh * head_dim;
    float acc = 0.0f;
    if (g < groups) {
        for (u32 i = g; i < n_tok; i += groups) {
            const u32 t = lo + i;
            const u32 page = page_ids[t0 + t / page_size];
            const u16* v = kv + page * page_elems + v_off + (t % page_size) * tw;
            acc += scores[i] * h2f(v[d]);
        }
    }
    part[tid] = acc;
    __syncthreads();
    if (tid < head_dim) {
        float o = 0.0f;
        for (u32 gg = 0; gg < groups; gg++) o += part[gg * head_dim + tid];
        out[((size_t)qi * heads + head) * head_dim + tid] = o;
    }
}
