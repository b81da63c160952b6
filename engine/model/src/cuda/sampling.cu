// Sampling on the device (appended after kernels.cu by kernels.rs: it uses that file's ld and
// u64). Both kernels answer what engine/src/sampler.rs answers on the host, so only a token id
// per row comes back instead of a row of the vocabulary.

// Greedy sampling on the device: ids[r] = the host sampler's argmax of logits row r (the lowest id
// among the largest values; a NaN never wins, and a NaN at id 0 answers 0, as the host's scan
// does). One block per row; the block's candidates meet in a fixed pairwise order.
template <typename T> __device__ void argmax_rows(const T* logits, unsigned int* ids, int vocab) {
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    const long long row = (long long)blockIdx.x * vocab;
    float bv = -PLATEAU_INF;
    int bi = -1;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = ld(logits, row + i);
        if (v == v && (bi < 0 || v > bv)) { bv = v; bi = i; }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (unsigned int stride = 1; stride < blockDim.x; stride *= 2) {
        const unsigned int i = threadIdx.x;
        if (i % (2 * stride) == 0 && i + stride < blockDim.x) {
            const float v = best_v[i + stride];
            const int j = best_i[i + stride];
            if (j >= 0 && (best_i[i] < 0 || v > best_v[i] || (v == best_v[i] && j < best_i[i]))) { best_v[i] = v; best_i[i] = j; }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float first = ld(logits, row);
        ids[blockIdx.x] = (first != first || best_i[0] < 0) ? 0u : (unsigned int)best_i[0];
    }
}

// The host sampler's order of candidates as one integer (sampler.rs's `key`): the logit's rank,
// highest first as f32::total_cmp orders them, in the high half, the id in the low half.
__device__ __forceinline__ u64 rank_key(float logit, int id) {
    const unsigned int b = __float_as_uint(logit);
    const unsigned int ascending = (b >> 31) ? ~b : (b | 0x80000000u);
    return ((u64)(~ascending) << 32) | (unsigned int)id;
}

// A candidate's weight exp((logit - max) / T), as the host computes it in double, in fixed point
// of 40 fractional bits (the top candidate weighs exactly 2^40). Sums of these are integers:
// atomic adds of them in any order give the same bits, so the kernel is deterministic. A weight
// under 2^-40 of the top's counts as nothing (the host keeps it; a draw lands on it with a
// probability below 1e-12).
#define PLATEAU_FIXED_ONE 1099511627776.0
__device__ __forceinline__ u64 fixed_weight(float logit, double max, double inv_t) {
    return (u64)(exp(((double)logit - max) * inv_t) * PLATEAU_FIXED_ONE);
}

// Among the candidates (key <= limit), the smallest key K whose cumulative value over the keys up
// to K (a count, or the fixed-point weights) reaches `target` (> target when `strict`, >=
// otherwise): a byte of K a pass, most significant first, from a histogram of the candidates that
// share the bytes found so far. `through` gets the cumulative value up to and including K. The
// target must be reachable (the caller checks it against the candidates' total).
template <typename T>
__device__ u64 radix_find(const T* row, int vocab, double max, double inv_t, u64 limit, bool weighted, double target,
                          bool strict, u64* through) {
    __shared__ u64 buckets[256];
    __shared__ u64 found, below, reached;
    __syncthreads();
    if (threadIdx.x == 0) { found = 0; below = 0; }
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) buckets[b] = 0;
        __syncthreads();
        const u64 prefix = found;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float l = ld(row, i);
            const u64 k = rank_key(l, i);
            if (k > limit || (shift < 56 && (k >> (shift + 8)) != prefix)) continue;
            atomicAdd(&buckets[(k >> shift) & 255], weighted ? fixed_weight(l, max, inv_t) : 1ull);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u64 base = below;
            int d = 0;
            for (; d < 255; ++d) {
                const double reach = (double)(base + buckets[d]);
                if (strict ? reach > target : reach >= target) break;
                base += buckets[d];
            }
            found = (prefix << 8) | (u64)d;
            below = base;
            reached = base + buckets[d];
        }
        __syncthreads();
    }
    *through = reached;
    return found;
}

// The seeded sampler's draw on the device, one block per row. params holds four doubles a row:
// 1 / temperature, top_k (0: off), top_p, and the draw u in [0, 1) the host took from the
// sequence's RNG. As sampler.rs defines it: candidates in rank order, top-k, top-p over the
// weights, then u times the kept weight walks them; here each step is a radix search over the
// rank keys instead of a sort. ids[r] is the token, or 0xffffffff where the host must decide
// (a logit that is not finite, a temperature whose inverse is not, or a draw that rounding
// carried past every kept weight).
template <typename T> __device__ void sample_rows(const T* logits, const double* params, unsigned int* ids, int vocab) {
    __shared__ u64 best, total;
    __shared__ int bad;
    const T* row = logits + (long long)blockIdx.x * vocab;
    const double* p = params + 4 * (long long)blockIdx.x;
    const double inv_t = p[0], top_k = p[1], top_p = p[2], u = p[3];
    if (threadIdx.x == 0) { best = ~0ull; total = 0; bad = 0; }
    __syncthreads();
    u64 mine = ~0ull;
    int non_finite = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float l = ld(row, i);
        non_finite |= (__float_as_uint(l) & 0x7f800000u) == 0x7f800000u;
        const u64 k = rank_key(l, i);
        mine = k < mine ? k : mine;
    }
    atomicMin(&best, mine);
    if (non_finite) atomicOr(&bad, 1);
    __syncthreads();
    const unsigned int undecided = 0xffffffffu;
    if (bad || !(inv_t > 0.0 && inv_t <= 1.7976931348623157e308)) {
        if (threadIdx.x == 0) ids[blockIdx.x] = undecided;
        return;
    }
    const double max = (double)ld(row, (long long)(best & 0xffffffffull));
    u64 limit = ~0ull, through = 0;
    if (top_k > 0.0 && top_k < (double)vocab) limit = radix_find(row, vocab, max, inv_t, limit, false, top_k, false, &through);
    u64 sum = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float l = ld(row, i);
        if (rank_key(l, i) <= limit) sum += fixed_weight(l, max, inv_t);
    }
    atomicAdd(&total, sum);
    __syncthreads();
    u64 kept = total;
    if (top_p < 1.0) limit = radix_find(row, vocab, max, inv_t, limit, true, top_p * (double)kept, false, &kept);
    const double r = u * (double)kept;
    if (!((double)kept > r)) {
        if (threadIdx.x == 0) ids[blockIdx.x] = undecided;
        return;
    }
    const u64 key = radix_find(row, vocab, max, inv_t, limit, true, r, true, &through);
    if (threadIdx.x == 0) ids[blockIdx.x] = (unsigned int)(key & 0xffffffffull);
}

#define INSTANTIATE_SAMPLING(T, S) \
extern "C" __global__ void argmax_rows_##S(const T* logits, unsigned int* ids, int vocab) { argmax_rows<T>(logits, ids, vocab); } \
extern "C" __global__ void sample_rows_##S(const T* logits, const double* params, unsigned int* ids, int vocab) { sample_rows<T>(logits, params, ids, vocab); }

INSTANTIATE_SAMPLING(float, f32)
INSTANTIATE_SAMPLING(bf16, bf16)
