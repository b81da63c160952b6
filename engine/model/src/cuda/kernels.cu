// plateau's CUDA kernels, compiled with NVRTC when the CUDA backend starts. Every kernel exists
// for f32 and bf16 storage (suffix _f32 / _bf16); arithmetic is always in f32. bf16 is handled as
// raw 16-bit words (no CUDA headers needed): widen by shifting, narrow with round-to-nearest-even.
// Layouts follow the CPU backend exactly (engine/model/src/cpu.rs): rows of `hidden` values,
// heads contiguous within a row, KV cache per layer as [slot][kv_dim], slot = block * bs + offset.

typedef unsigned short bf16;
typedef unsigned long long u64;
// NVRTC compiles without the C headers, so infinity is spelled out.
#define PLATEAU_INF __int_as_float(0x7f800000)

__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, long long i) { return __uint_as_float(((unsigned int)p[i]) << 16); }
__device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, long long i, float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) { p[i] = (bf16)((u >> 16) | 0x40u); return; }
    u += 0x7fffu + ((u >> 16) & 1u);
    p[i] = (bf16)(u >> 16);
}

// Block-wide reductions through shared memory, pairwise in a fixed order (deterministic, and
// correct for any block size up to 1024). Every thread of the block must call them.
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float buf[1024];
    __syncthreads();
    buf[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int stride = 1; stride < blockDim.x; stride *= 2) {
        unsigned int i = threadIdx.x;
        if (i % (2 * stride) == 0 && i + stride < blockDim.x)
            buf[i] = is_max ? fmaxf(buf[i], buf[i + stride]) : buf[i] + buf[i + stride];
        __syncthreads();
    }
    return buf[0];
}

// out[t] = table[tokens[t]], one block per token.
template <typename T> __device__ void embed(const T* table, const unsigned int* tokens, T* out, int hidden) {
    long long src = (long long)tokens[blockIdx.x] * hidden, dst = (long long)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) st(out, dst + i, ld(table, src + i));
}

// x[rows[r]] = src[r] (f32 rows: image embeddings replacing placeholder tokens).
template <typename T> __device__ void set_rows(T* x, const float* src, const int* rows, int hidden) {
    long long dst = (long long)rows[blockIdx.x] * hidden, s = (long long)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) st(x, dst + i, src[s + i]);
}

// out[r] = x[row] / rms(x[row]) * w, row = rows ? rows[r] : r. One block per output row.
template <typename T> __device__ void rmsnorm(const T* x, const int* rows, const T* w, T* out, int hidden, float eps) {
    long long row = rows ? rows[blockIdx.x] : blockIdx.x;
    const long long in = row * hidden, o = (long long)blockIdx.x * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) { float v = ld(x, in + i); ss += v * v; }
    float total = block_reduce(ss, false);
    float r = 1.0f / sqrtf(total / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) st(out, o + i, ld(x, in + i) * r * ld(w, i));
}

// Rotate-half rotary embedding in place on `heads` heads of each token's row.
template <typename T> __device__ void rope(T* x, const int* pos, const float* inv_freq, int heads, int hd) {
    int half = hd / 2;
    long long base = (long long)blockIdx.x * heads * hd;
    float p = (float)pos[blockIdx.x];
    for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
        int h = j / half, i = j % half;
        float s, c;
        sincosf(p * inv_freq[i], &s, &c);
        long long a = base + (long long)h * hd + i, b = a + half;
        float va = ld(x, a), vb = ld(x, b);
        st(x, a, va * c - vb * s);
        st(x, b, vb * c + va * s);
    }
}

// Writes each token's K and V rows into its cache slot. One block per token.
template <typename T> __device__ void store_kv(const T* k, const T* v, T* kc, T* vc, const long long* slots, int kvd) {
    long long src = (long long)blockIdx.x * kvd, dst = slots[blockIdx.x] * kvd;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) { st(kc, dst + i, ld(k, src + i)); st(vc, dst + i, ld(v, src + i)); }
}

// Paged attention over block tables, one block per (query token, query head): the token attends
// to positions 0..=pos of its sequence. Serves prefill chunks and decode (a one-token chunk) alike.
// Dynamic shared memory (attention_shared_bytes in forward.rs): hd floats of query, max_ctx
// scores, max_ctx cache slots, then hd partial sums for each of the block's position groups.
// Scores: each thread takes positions tid, tid + blockDim, ... and finds each one's slot once.
// Weighted sum: the block's threads form groups of hd threads (one thread per dimension); group s
// sums positions s, s + groups, ... with no load waiting on another, and group 0 adds the groups'
// partial sums in a fixed order (deterministic). With fewer threads than hd, one group loops over
// the dimensions.
template <typename T> __device__ void attention(const T* q, const T* kc, const T* vc, T* out, const int* tok_seq,
                                                const int* tok_pos, const int* tables, int max_blocks, int bs, int nh,
                                                int nkv, int hd, float scale) {
#ifndef PLATEAU_EMULATED
    extern __shared__ float smem[];
#else
    float* smem = plateau_emulated_smem; // engine/tests/kernels_emulated: the host emulation
#endif
    int t = blockIdx.x, h = blockIdx.y, g = h / (nh / nkv);
    int seq = tok_seq[t], n_ctx = tok_pos[t] + 1, kvd = nkv * hd;
    int groups = blockDim.x >= hd ? blockDim.x / hd : 1;
    float* qs = smem;
    float* scores = qs + hd;
    int* slots = (int*)(scores + n_ctx);
    float* partial = (float*)(slots + n_ctx);
    const int* table = tables + (long long)seq * max_blocks;
    long long qoff = (long long)t * nh * hd + (long long)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = ld(q, qoff + d);
    __syncthreads();
    float local_max = -PLATEAU_INF;
    for (int p = threadIdx.x; p < n_ctx; p += blockDim.x) {
        int slot = table[p / bs] * bs + p % bs;
        slots[p] = slot;
        long long koff = (long long)slot * kvd + (long long)g * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; ++d) s += qs[d] * ld(kc, koff + d);
        s *= scale;
        scores[p] = s;
        local_max = fmaxf(local_max, s);
    }
    float m = block_reduce(local_max, true);
    float local_sum = 0.0f;
    for (int p = threadIdx.x; p < n_ctx; p += blockDim.x) { float e = expf(scores[p] - m); scores[p] = e; local_sum += e; }
    float inv = 1.0f / block_reduce(local_sum, false);
    __syncthreads();
    int group = (int)threadIdx.x / hd;
    if (group < groups) {
        for (int d = (int)threadIdx.x % hd; d < hd; d += (blockDim.x >= hd ? hd : blockDim.x)) {
            float acc = 0.0f;
            for (int p = group; p < n_ctx; p += groups)
                acc += scores[p] * ld(vc, (long long)slots[p] * kvd + (long long)g * hd + d);
            partial[group * hd + d] = acc;
        }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < groups; ++s) acc += partial[s * hd + d];
        st(out, qoff + d, acc * inv);
    }
}

template <typename T> __device__ void silu_mul(const T* gate, const T* up, T* out, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float g = ld(gate, i);
        st(out, i, g / (1.0f + expf(-g)) * ld(up, i));
    }
}

template <typename T> __device__ void add(T* x, const T* y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        st(x, i, ld(x, i) + ld(y, i));
}

// For every cache tensor (bases[b]: K and V of every layer) copies block pairs[2i] to pairs[2i+1].
template <typename T> __device__ void copy_blocks(const u64* bases, const int* pairs, int block_elems) {
    T* base = (T*)bases[blockIdx.y];
    long long src = (long long)pairs[2 * blockIdx.x] * block_elems, dst = (long long)pairs[2 * blockIdx.x + 1] * block_elems;
    for (int e = threadIdx.x; e < block_elems; e += blockDim.x) st(base, dst + e, ld(base, src + e));
}

// staging[(b * n_blocks + i) * block_elems + e] <-> cache b, block blocks[i]: the order of read_kv
// (per layer: K of every block, then V).
template <typename T> __device__ void gather_blocks(const u64* bases, const int* blocks, int n_blocks, int block_elems, float* staging) {
    const T* base = (const T*)bases[blockIdx.y];
    long long src = (long long)blocks[blockIdx.x] * block_elems;
    long long dst = ((long long)blockIdx.y * n_blocks + blockIdx.x) * block_elems;
    for (int e = threadIdx.x; e < block_elems; e += blockDim.x) staging[dst + e] = ld(base, src + e);
}

template <typename T> __device__ void scatter_blocks(const u64* bases, const int* blocks, int n_blocks, int block_elems, const float* staging) {
    T* base = (T*)bases[blockIdx.y];
    long long dst = (long long)blocks[blockIdx.x] * block_elems;
    long long src = ((long long)blockIdx.y * n_blocks + blockIdx.x) * block_elems;
    for (int e = threadIdx.x; e < block_elems; e += blockDim.x) st(base, dst + e, staging[src + e]);
}

template <typename T> __device__ void to_f32(const T* x, float* out, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) out[i] = ld(x, i);
}

template <typename T> __device__ void from_f32(const float* x, T* out, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) st(out, i, x[i]);
}

#define INSTANTIATE(T, S) \
extern "C" __global__ void embed_##S(const T* table, const unsigned int* tokens, T* out, int hidden) { embed<T>(table, tokens, out, hidden); } \
extern "C" __global__ void set_rows_##S(T* x, const float* src, const int* rows, int hidden) { set_rows<T>(x, src, rows, hidden); } \
extern "C" __global__ void rmsnorm_##S(const T* x, const int* rows, const T* w, T* out, int hidden, float eps) { rmsnorm<T>(x, rows, w, out, hidden, eps); } \
extern "C" __global__ void rope_##S(T* x, const int* pos, const float* inv_freq, int heads, int hd) { rope<T>(x, pos, inv_freq, heads, hd); } \
extern "C" __global__ void store_kv_##S(const T* k, const T* v, T* kc, T* vc, const long long* slots, int kvd) { store_kv<T>(k, v, kc, vc, slots, kvd); } \
extern "C" __global__ void attention_##S(const T* q, const T* kc, const T* vc, T* out, const int* tok_seq, const int* tok_pos, const int* tables, int max_blocks, int bs, int nh, int nkv, int hd, float scale) { attention<T>(q, kc, vc, out, tok_seq, tok_pos, tables, max_blocks, bs, nh, nkv, hd, scale); } \
extern "C" __global__ void silu_mul_##S(const T* g, const T* u, T* out, long long n) { silu_mul<T>(g, u, out, n); } \
extern "C" __global__ void add_##S(T* x, const T* y, long long n) { add<T>(x, y, n); } \
extern "C" __global__ void copy_blocks_##S(const u64* bases, const int* pairs, int block_elems) { copy_blocks<T>(bases, pairs, block_elems); } \
extern "C" __global__ void gather_blocks_##S(const u64* bases, const int* blocks, int n_blocks, int block_elems, float* staging) { gather_blocks<T>(bases, blocks, n_blocks, block_elems, staging); } \
extern "C" __global__ void scatter_blocks_##S(const u64* bases, const int* blocks, int n_blocks, int block_elems, const float* staging) { scatter_blocks<T>(bases, blocks, n_blocks, block_elems, staging); } \
extern "C" __global__ void to_f32_##S(const T* x, float* out, long long n) { to_f32<T>(x, out, n); } \
extern "C" __global__ void from_f32_##S(const float* x, T* out, long long n) { from_f32<T>(x, out, n); }

INSTANTIATE(float, f32)
INSTANTIATE(bf16, bf16)
