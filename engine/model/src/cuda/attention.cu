// Paged attention over block tables (appended to kernels.cu by kernels.rs: it uses that file's
// ld/st, PLATEAU_INF and the emulation's shared memory). Queries come from the fused projection's
// rows (`q_stride` values apart, the query heads first); the output is [token][nh * hd].
//
// Two shapes, chosen per chunk by attention.rs:
// - attention_decode: one block per (query token, KV head, split of its context): the KV head's
//   GQA group of G query heads is computed together, so every key and value row is read once.
//   Flash-decoding's shape: long contexts are cut into splits that run side by side, and
//   attention_combine merges the splits' softmax states.
// - attention_prefill: one block per (tile of a chunk's query tokens, KV head): the tile's
//   queries and each tile of keys and values in shared memory, an online softmax per query row.
// Every merge runs in a fixed order: a token's output does not depend on timing.

// What a decode lane keeps in registers: for each query head of its group (at most GM, the
// kernel's template bound: 1, 2, 4, 8 or 16), the running max and sum, and accumulators for its
// share of the head's dimensions (at most PLATEAU_LANE_DIMS: attention.rs picks enough lanes per
// position). Every loop over them has a bound known when compiling and is unrolled, so the arrays
// live in registers, not in local memory.
#ifndef PLATEAU_LANE_DIMS
#define PLATEAU_LANE_DIMS 8
#endif

// Two softmax states (running max m, sum l, accumulator a) merged: the factors each side is scaled
// by. Commutative to the bit (each product and the one sum are the same whichever side calls), so
// the lanes of a butterfly agree. An empty state has m = -inf and weighs nothing.
__device__ __forceinline__ void merge_scale(float m, float mo, float* ca, float* cb, float* mn) {
    *mn = fmaxf(m, mo);
    *ca = m == -PLATEAU_INF ? 0.0f : expf(m - *mn);
    *cb = mo == -PLATEAU_INF ? 0.0f : expf(mo - *mn);
}

// Decode attention. Lanes: a warp's lanes form groups of `lp` (the lanes per position); a group
// takes one position at a time and each of its lanes holds every lp-th dimension, so a key row is
// read by lp neighbouring lanes at once. The block's groups take positions p0 + gg, p0 + gg +
// groups, ...; every lane runs the same number of rounds (an idle one adds nothing), so the
// shuffles always find their whole warp. Per round: the G scores of the position (the group's
// partial dot products summed with shuffles), then each head's online softmax update with the
// position's value row. Then the groups of a warp merge with shuffles, the warps through shared
// memory in warp order.
// Dynamic shared memory (decode_shared_bytes in attention.rs): G * hd query values (scaled), the
// split's block-table entries (`tbl_cap` ints), then 2G + G * hd floats per warp for the merge.
// With one split the block writes the output; with several, its state goes to `part`
// ([rows * nh * splits] maxima, then sums, then [rows * nh * splits * hd] accumulators).
template <typename T, int GM>
__device__ void attention_decode(const T* q, int q_stride, const T* kc, const T* vc, T* out, const int* rows,
                                 const int* tok_seq, const int* tok_pos, const int* tables, int max_blocks, int bs,
                                 int nh, int nkv, int hd, float scale, int lp, int split_len, int tbl_cap,
                                 float* part) {
#ifndef PLATEAU_EMULATED
    extern __shared__ float smem[];
#else
    float* smem = plateau_emulated_smem;
#endif
    const int LD = PLATEAU_LANE_DIMS;
    const int tok = rows[blockIdx.x], g = blockIdx.y, s = blockIdx.z, G = nh / nkv;
    const int n_ctx = tok_pos[tok] + 1, p0 = s * split_len, p1 = min(n_ctx, p0 + split_len);
    const int W = warpSize, lane = threadIdx.x % W, warp = threadIdx.x / W, nwarps = blockDim.x / W;
    const int per_warp = W / lp, li = lane % lp, groups = nwarps * per_warp, gg = warp * per_warp + lane / lp;
    const long long kvd = (long long)nkv * hd;
    float* qs = smem;
    int* tbl = (int*)(qs + G * hd);
    float* merged = (float*)(tbl + tbl_cap);
    const int first_blk = p0 / bs, n_tbl = p1 > p0 ? (p1 - 1) / bs - first_blk + 1 : 0;
    const long long qoff = (long long)tok * q_stride + (long long)g * G * hd;
    for (int e = threadIdx.x; e < G * hd; e += blockDim.x) qs[e] = ld(q, qoff + e) * scale;
    const int* table = tables + (long long)tok_seq[tok] * max_blocks + first_blk;
    for (int i = threadIdx.x; i < n_tbl; i += blockDim.x) tbl[i] = table[i];
    __syncthreads();
    float m[GM], l[GM], sc[GM], acc[GM][LD];
#pragma unroll
    for (int h = 0; h < GM; ++h) {
        m[h] = -PLATEAU_INF;
        l[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < LD; ++j) acc[h][j] = 0.0f;
    }
    for (int base = p0; base < p1; base += groups) {
        const int p = base + gg;
        const bool valid = p < p1;
        const long long off = valid ? ((long long)tbl[p / bs - first_blk] * bs + p % bs) * kvd + (long long)g * hd : 0;
#pragma unroll
        for (int h = 0; h < GM; ++h) sc[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < LD; ++j) {
            const int d = li + lp * j;
            if (!valid || d >= hd) continue;
            const float k = ld(kc, off + d);
#pragma unroll
            for (int h = 0; h < GM; ++h)
                if (h < G) sc[h] += qs[h * hd + d] * k;
        }
        for (int o = lp / 2; o >= 1; o /= 2) {
#pragma unroll
            for (int h = 0; h < GM; ++h) sc[h] += __shfl_xor_sync(0xffffffffu, sc[h], o);
        }
        if (!valid) continue;
#pragma unroll
        for (int h = 0; h < GM; ++h) {
            if (h >= G) continue;
            const float mn = fmaxf(m[h], sc[h]);
            const float c = expf(m[h] - mn), e = expf(sc[h] - mn);
            l[h] = l[h] * c + e;
            m[h] = mn;
            sc[h] = e;
#pragma unroll
            for (int j = 0; j < LD; ++j) acc[h][j] *= c;
        }
#pragma unroll
        for (int j = 0; j < LD; ++j) {
            const int d = li + lp * j;
            if (d >= hd) continue;
            const float v = ld(vc, off + d);
#pragma unroll
            for (int h = 0; h < GM; ++h) acc[h][j] += sc[h] * v;
        }
    }
    for (int o = lp; o < W; o *= 2) {
#pragma unroll
        for (int h = 0; h < GM; ++h) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[h], o), lo = __shfl_xor_sync(0xffffffffu, l[h], o);
            float ca, cb, mn;
            merge_scale(m[h], mo, &ca, &cb, &mn);
            l[h] = l[h] * ca + lo * cb;
#pragma unroll
            for (int j = 0; j < LD; ++j) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[h][j], o);
                acc[h][j] = acc[h][j] * ca + ao * cb;
            }
            m[h] = mn;
        }
    }
    const int stride = 2 * G + G * hd;
    if (lane < lp) {
        float* mine = merged + warp * stride;
#pragma unroll
        for (int h = 0; h < GM; ++h) {
            if (h >= G) continue;
            if (li == 0) {
                mine[h] = m[h];
                mine[G + h] = l[h];
            }
#pragma unroll
            for (int j = 0; j < LD; ++j) {
                const int d = li + lp * j;
                if (d < hd) mine[2 * G + h * hd + d] = acc[h][j];
            }
        }
    }
    __syncthreads();
    const int splits = gridDim.z;
    const long long states = (long long)gridDim.x * nh * splits;
    for (int e = threadIdx.x; e < G * hd; e += blockDim.x) {
        const int h = e / hd, d = e % hd;
        float M = -PLATEAU_INF, L = 0.0f, A = 0.0f;
        for (int w = 0; w < nwarps; ++w) {
            const float* theirs = merged + w * stride;
            float ca, cb, mn;
            merge_scale(M, theirs[h], &ca, &cb, &mn);
            L = L * ca + theirs[G + h] * cb;
            A = A * ca + theirs[2 * G + h * hd + d] * cb;
            M = mn;
        }
        const int head = g * G + h;
        if (splits == 1) {
            st(out, (long long)tok * nh * hd + (long long)head * hd + d, A / L);
        } else {
            const long long i = ((long long)blockIdx.x * nh + head) * splits + s;
            if (d == 0) {
                part[i] = M;
                part[states + i] = L;
            }
            part[2 * states + i * hd + d] = A;
        }
    }
}

// Merges the splits' states of attention_decode in split order. One block per (row, query head).
template <typename T> __device__ void attention_combine(const float* part, const int* rows, T* out, int nh, int hd,
                                                        int splits) {
    const int r = blockIdx.x, head = blockIdx.y, tok = rows[r];
    const long long states = (long long)gridDim.x * nh * splits, first = ((long long)r * nh + head) * splits;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float M = -PLATEAU_INF, L = 0.0f, A = 0.0f;
        for (int s = 0; s < splits; ++s) {
            float ca, cb, mn;
            merge_scale(M, part[first + s], &ca, &cb, &mn);
            L = L * ca + part[states + first + s] * cb;
            A = A * ca + part[2 * states + (first + s) * hd + d] * cb;
            M = mn;
        }
        st(out, (long long)tok * nh * hd + (long long)head * hd + d, A / L);
    }
}

// Prefill attention, tiled. A block takes up to `bq` consecutive query tokens of one chunk
// (tile_tok[b], tile_n[b]: the first token's row and how many) and one KV head: R = n * G query
// rows (row r: token r / G, head r % G). Keys and values come in tiles of `bk` positions, up to the
// tile's last position (causal: nothing after it is read). Per key tile: the slots, the K and V
// rows into shared memory (neighbouring threads read neighbouring dimensions), the R x bk scores
// (masked past each row's position), each row's online softmax update, and the accumulators.
// Dynamic shared memory (prefill_shared_bytes in attention.rs): queries and accumulators (R x hd
// each), K and V tiles (bk x hd each), scores (R x bk), per-row max, sum and correction, slots.
template <typename T> __device__ void attention_prefill(const T* q, int q_stride, const T* kc, const T* vc, T* out,
                                                        const int* tile_tok, const int* tile_n, const int* tok_seq,
                                                        const int* tok_pos, const int* tables, int max_blocks, int bs,
                                                        int nh, int nkv, int hd, float scale, int bq, int bk) {
#ifndef PLATEAU_EMULATED
    extern __shared__ float smem[];
#else
    float* smem = plateau_emulated_smem;
#endif
    const int tok0 = tile_tok[blockIdx.x], n = tile_n[blockIdx.x], g = blockIdx.y, G = nh / nkv, R = n * G;
    const long long kvd = (long long)nkv * hd;
    float* qs = smem;
    float* acc = qs + bq * G * hd;
    float* ks = acc + bq * G * hd;
    float* vs = ks + bk * hd;
    float* sc = vs + bk * hd;
    float* m = sc + bq * G * bk;
    float* l = m + bq * G;
    float* corr = l + bq * G;
    int* slot = (int*)(corr + bq * G);
    for (int e = threadIdx.x; e < R * hd; e += blockDim.x) {
        const int r = e / hd, d = e % hd;
        qs[e] = ld(q, (long long)(tok0 + r / G) * q_stride + (long long)(g * G + r % G) * hd + d) * scale;
        acc[e] = 0.0f;
    }
    for (int r = threadIdx.x; r < R; r += blockDim.x) { m[r] = -PLATEAU_INF; l[r] = 0.0f; }
    const int* table = tables + (long long)tok_seq[tok0] * max_blocks;
    const int n_ctx = tok_pos[tok0 + n - 1] + 1;
    for (int kb = 0; kb < n_ctx; kb += bk) {
        const int jn = min(bk, n_ctx - kb);
        __syncthreads();
        for (int j = threadIdx.x; j < jn; j += blockDim.x) { const int p = kb + j; slot[j] = table[p / bs] * bs + p % bs; }
        __syncthreads();
        for (int e = threadIdx.x; e < jn * hd; e += blockDim.x) {
            const int j = e / hd, d = e % hd;
            const long long off = (long long)slot[j] * kvd + (long long)g * hd + d;
            ks[e] = ld(kc, off);
            vs[e] = ld(vc, off);
        }
        __syncthreads();
        for (int e = threadIdx.x; e < R * jn; e += blockDim.x) {
            const int r = e / jn, j = e % jn;
            float s = -PLATEAU_INF;
            if (kb + j <= tok_pos[tok0 + r / G]) {
                s = 0.0f;
                for (int d = 0; d < hd; ++d) s += qs[r * hd + d] * ks[j * hd + d];
            }
            sc[r * bk + j] = s;
        }
        __syncthreads();
        for (int r = threadIdx.x; r < R; r += blockDim.x) {
            float mx = m[r];
            for (int j = 0; j < jn; ++j) mx = fmaxf(mx, sc[r * bk + j]);
            float sum = 0.0f;
            for (int j = 0; j < jn; ++j) {
                const float e = mx == -PLATEAU_INF ? 0.0f : expf(sc[r * bk + j] - mx);
                sc[r * bk + j] = e;
                sum += e;
            }
            corr[r] = m[r] == -PLATEAU_INF ? 0.0f : expf(m[r] - mx);
            l[r] = l[r] * corr[r] + sum;
            m[r] = mx;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < R * hd; e += blockDim.x) {
            const int r = e / hd, d = e % hd;
            float a = acc[e] * corr[r];
            for (int j = 0; j < jn; ++j) a += sc[r * bk + j] * vs[j * hd + d];
            acc[e] = a;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < R * hd; e += blockDim.x) {
        const int r = e / hd, d = e % hd;
        st(out, (long long)(tok0 + r / G) * nh * hd + (long long)(g * G + r % G) * hd + d, acc[e] / l[r]);
    }
}

#define INSTANTIATE_ATTENTION(T, S) \
extern "C" __global__ void attention_decode_g1_##S(const T* q, int q_stride, const T* kc, const T* vc, T* out, const int* rows, const int* tok_seq, const int* tok_pos, const int* tables, int max_blocks, int bs, int nh, int nkv, int hd, float scale, int lp, int split_len, int tbl_cap, float* part) { attention_decode<T, 1>(q, q_stride, kc, vc, out, rows, tok_seq, tok_pos, tables, max_blocks, bs, nh, nkv, hd, scale, lp, split_len, tbl_cap, part); } \
extern "C" __global__ void attention_decode_g2_##S(const T* q, int q_stride, const T* kc, const T* vc, T* out, const int* rows, const int* tok_seq, const int* tok_pos, const int* tables, int max_blocks, int bs, int nh, int nkv, int hd, float scale, int lp, int split_len, int tbl_cap, float* part) { attention_decode<T, 2>(q, q_stride, kc, vc, out, rows, tok_seq, tok_pos, tables, max_blocks, bs, nh, nkv, hd, scale, lp, split_len, tbl_cap, part); } \
extern "C" __global__ void attention_decode_g4_##S(const T* q, int q_stride, const T* kc, const T* vc, T* out, const int* rows, const int* tok_seq, const int* tok_pos, const int* tables, int max_blocks, int bs, int nh, int nkv, int hd, float scale, int lp, int split_len, int tbl_cap, float* part) { attention_decode<T, 4>(q, q_stride, kc, vc, out, rows, tok_seq, tok_pos, tables, max_blocks, bs, nh, nkv, hd, scale, lp, split_len, tbl_cap, part); } \
extern "C" __global__ void attention_decode_g8_##S(const T* q, int q_stride, const T* kc, const T* vc, T* out, const int* rows, const int* tok_seq, const int* tok_pos, const int* tables, int max_blocks, int bs, int nh, int nkv, int hd, float scale, int lp, int split_len, int tbl_cap, float* part) { attention_decode<T, 8>(q, q_stride, kc, vc, out, rows, tok_seq, tok_pos, tables, max_blocks, bs, nh, nkv, hd, scale, lp, split_len, tbl_cap, part); } \
extern "C" __global__ void attention_decode_g16_##S(const T* q, int q_stride, const T* kc, const T* vc, T* out, const int* rows, const int* tok_seq, const int* tok_pos, const int* tables, int max_blocks, int bs, int nh, int nkv, int hd, float scale, int lp, int split_len, int tbl_cap, float* part) { attention_decode<T, 16>(q, q_stride, kc, vc, out, rows, tok_seq, tok_pos, tables, max_blocks, bs, nh, nkv, hd, scale, lp, split_len, tbl_cap, part); } \
extern "C" __global__ void attention_combine_##S(const float* part, const int* rows, T* out, int nh, int hd, int splits) { attention_combine<T>(part, rows, out, nh, hd, splits); } \
extern "C" __global__ void attention_prefill_##S(const T* q, int q_stride, const T* kc, const T* vc, T* out, const int* tile_tok, const int* tile_n, const int* tok_seq, const int* tok_pos, const int* tables, int max_blocks, int bs, int nh, int nkv, int hd, float scale, int bq, int bk) { attention_prefill<T>(q, q_stride, kc, vc, out, tile_tok, tile_n, tok_seq, tok_pos, tables, max_blocks, bs, nh, nkv, hd, scale, bq, bk); }

INSTANTIATE_ATTENTION(float, f32)
INSTANTIATE_ATTENTION(bf16, bf16)
