// Rotary position embedding, llama "normal" style (ggml GGML_ROPE_TYPE_NORM), mirroring
// kernels/src/cpu/rope.rs: pair (x[2i], x[2i+1]) of every head is rotated by theta_i, where
// theta_0 = pos and theta_{i+1} = theta_i * scale, multiplied in f32 exactly as the CPU does
// (scale = base^(-2 / n_dims) is computed on the host, so both sides use the same bits).
// Pairs at or past n_dims / 2 are left alone.
//
// x: f32 [tokens, heads, head_dim], rotated in place; pos: u32 [tokens].
// Launch: one thread per (token, head, pair < n_dims / 2): block (256), grid (ceil(n / 256)).

extern "C" __global__ void rope_norm_f32(float* __restrict__ x, const u32* __restrict__ pos,
                                         u32 tokens, u32 heads, u32 head_dim, u32 n_dims,
                                         float scale) {
    const u32 pairs = n_dims / 2;
    const size_t n = (size_t)tokens * heads * pairs;
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const u32 i = t % pairs;
    const size_t th = t / pairs;  // token * heads + head
    const u32 tok = th / heads;
    float theta = (float)pos[tok];
    for (u32 j = 0; j < i; j++) theta *= scale;
    float s, c;
    sincosf(theta, &s, &c);
    float* p = x + th * head_dim + 2 * i;
    const float a = p[0], b = p[1];
    p[0] = a * c - b * s;
    p[1] = a * s + b * c;
}
