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
// f32 to bf16 bits, rounding to nearest even (a NaN stays a quiet NaN).
__device__ __forceinline__ bf16 bf16_bits(float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (bf16)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}
__device__ __forceinline__ void st(bf16* p, long long i, float v) { p[i] = bf16_bits(v); }

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

// The residual add and the next norm in one pass: x[r] += y[r], then out[r] = x[r] / rms(x[r]) * w
// (the sum as stored, rounded to T, is what is normed, as two launches would have it). One block per
// row; each thread reads back only what it wrote.
template <typename T> __device__ void add_rmsnorm(T* x, const T* y, const T* w, T* out, int hidden, float eps) {
    const long long o = (long long)blockIdx.x * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        st(x, o + i, ld(x, o + i) + ld(y, o + i));
        const float v = ld(x, o + i);
        ss += v * v;
    }
    const float r = 1.0f / sqrtf(block_reduce(ss, false) / hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) st(out, o + i, ld(x, o + i) * r * ld(w, i));
}

// One block per token of the fused projection's rows [q (nh heads) | k (nkv heads) | v]: rotary
// positions (rotate-half) applied to the query heads in place and to the key heads on their way
// into the cache slot; the value row copied to the cache. Replaces three launches (rope of q, rope
// of k, the KV store).
template <typename T> __device__ void rope_store(T* qkv, const int* pos, const float* inv_freq, T* kc, T* vc,
                                                 const long long* slots, int nh, int nkv, int hd) {
    const int half = hd / 2, kvd = nkv * hd;
    const long long row = (long long)blockIdx.x * (nh + 2 * nkv) * hd, dst = slots[blockIdx.x] * kvd;
    const float p = (float)pos[blockIdx.x];
    for (int j = threadIdx.x; j < (nh + nkv) * half; j += blockDim.x) {
        const int h = j / half, i = j % half;
        float s, c;
        sincosf(p * inv_freq[i], &s, &c);
        const long long a = row + (long long)h * hd + i;
        const float va = ld(qkv, a), vb = ld(qkv, a + half);
        const float ra = va * c - vb * s, rb = vb * c + va * s;
        if (h < nh) {
            st(qkv, a, ra);
            st(qkv, a + half, rb);
        } else {
            const long long o = dst + (long long)(h - nh) * hd + i;
            st(kc, o, ra);
            st(kc, o + half, rb);
        }
    }
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) st(vc, dst + i, ld(qkv, row + (long long)(nh + nkv) * hd + i));
}

// out[r][i] = silu(gate) * up over rows of the fused projection [gate | up] (`inter` each).
template <typename T> __device__ void silu_mul(const T* gate_up, T* out, int inter, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long at = i / inter * 2 * inter + i % inter;
        const float g = ld(gate_up, at);
        st(out, i, g / (1.0f + expf(-g)) * ld(gate_up, at + inter));
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
extern "C" __global__ void add_rmsnorm_##S(T* x, const T* y, const T* w, T* out, int hidden, float eps) { add_rmsnorm<T>(x, y, w, out, hidden, eps); } \
extern "C" __global__ void rope_store_##S(T* qkv, const int* pos, const float* inv_freq, T* kc, T* vc, const long long* slots, int nh, int nkv, int hd) { rope_store<T>(qkv, pos, inv_freq, kc, vc, slots, nh, nkv, hd); } \
extern "C" __global__ void silu_mul_##S(const T* gate_up, T* out, int inter, long long n) { silu_mul<T>(gate_up, out, inter, n); } \
extern "C" __global__ void add_##S(T* x, const T* y, long long n) { add<T>(x, y, n); } \
extern "C" __global__ void copy_blocks_##S(const u64* bases, const int* pairs, int block_elems) { copy_blocks<T>(bases, pairs, block_elems); } \
extern "C" __global__ void gather_blocks_##S(const u64* bases, const int* blocks, int n_blocks, int block_elems, float* staging) { gather_blocks<T>(bases, blocks, n_blocks, block_elems, staging); } \
extern "C" __global__ void scatter_blocks_##S(const u64* bases, const int* blocks, int n_blocks, int block_elems, const float* staging) { scatter_blocks<T>(bases, blocks, n_blocks, block_elems, staging); } \
extern "C" __global__ void to_f32_##S(const T* x, float* out, long long n) { to_f32<T>(x, out, n); } \
extern "C" __global__ void from_f32_##S(const float* x, T* out, long long n) { from_f32<T>(x, out, n); }

INSTANTIATE(float, f32)
INSTANTIATE(bf16, bf16)
