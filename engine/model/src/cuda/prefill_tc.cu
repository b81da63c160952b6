// Prefill attention on tensor cores, for bf16 (appended after attention.cu by kernels.rs; the f32
// backend keeps attention_prefill). Same inputs and output as attention_prefill.
//
// A block takes a tile of one chunk's query tokens and one KV head: R = tokens x G query rows
// (block row r: token r / G, head r % G), 16 rows a warp. Keys and values come through shared
// memory in tiles of PLATEAU_TC_KEYS positions (rows padded by 8 values against bank conflicts;
// positions past the context zeroed). Per key tile each warp computes its 16 x 64 scores with
// mma.sync m16n8k16 (f32 accumulators): its queries as the A operand, loaded once from global
// memory into registers; keys as B. Scores past a row's position are masked; the online softmax
// of a row runs over the four lanes of a quad (a row's scores are spread over them: shuffles
// within the quad); then P . V with mma, the scores' accumulator layout reused as P's A operand
// (rounded to bf16). Fragment layouts are the PTX ISA's for m16n8k16 (groupID = lane / 4, t =
// lane % 4): A holds (g, 2t..2t+1), (g+8, ..), (g, 2t+8..), (g+8, 2t+8..); B holds rows (k)
// 2t..2t+1 and 2t+8..2t+9 of column (n) g; C holds (g, 2t..2t+1) and (g+8, 2t..2t+1).
// HD (the head's dimensions) is the template bound: 64 or 128.

#define PLATEAU_TC_KEYS 64

// D = A . B + D for one warp: A 16 x 16 and B 16 x 8 bf16 in the ISA's fragments, D 16 x 8 f32.
__device__ __forceinline__ void mma_bf16_16816(float* d, const unsigned int* a, const unsigned int* b) {
#if defined(PLATEAU_EMULATED)
    plateau_emulated_mma_bf16(d, a, b);
#elif __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();  // never launched before compute capability 8.0 (Kernels::tensor_cores)
#endif
}

// Two bf16 values in one register, the first in the low half (the ISA's element order).
__device__ __forceinline__ unsigned int pack2(bf16 lo, bf16 hi) { return (unsigned int)lo | ((unsigned int)hi << 16); }

template <int HD>
__device__ void attention_prefill_tc(const bf16* q, int q_stride, const bf16* kc, const bf16* vc, bf16* out,
                                     const int* tile_tok, const int* tile_n, const int* tok_seq, const int* tok_pos,
                                     const int* tables, int max_blocks, int bs, int nh, int nkv, float scale) {
#ifndef PLATEAU_EMULATED
    extern __shared__ float smem[];
#else
    float* smem = plateau_emulated_smem;
#endif
    const int BK = PLATEAU_TC_KEYS, STRIDE = HD + 8;
    bf16* ks = (bf16*)smem;
    bf16* vs = ks + BK * STRIDE;
    int* slot = (int*)(vs + BK * STRIDE);
    const int tok0 = tile_tok[blockIdx.x], n = tile_n[blockIdx.x], g = blockIdx.y, G = nh / nkv, R = n * G;
    const long long kvd = (long long)nkv * HD;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gid = lane / 4, t = lane % 4;
    const int ra = warp * 16 + gid, rb = ra + 8;
    const int pos_a = ra < R ? tok_pos[tok0 + ra / G] : -1, pos_b = rb < R ? tok_pos[tok0 + rb / G] : -1;
    // The warp's queries as A fragments, one set per 16 dimensions.
    unsigned int qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int row = (r & 1) ? rb : ra, col = kk * 16 + (r >> 1) * 8 + 2 * t;
            const bf16* p = q + (long long)(tok0 + row / G) * q_stride + (long long)(g * G + row % G) * HD + col;
            qf[kk][r] = row < R ? pack2(p[0], p[1]) : 0u;
        }
    }
    float o[HD / 8][4];
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt)
        for (int i = 0; i < 4; ++i) o[nt][i] = 0.0f;
    float m_a = -PLATEAU_INF, m_b = -PLATEAU_INF, l_a = 0.0f, l_b = 0.0f;
    const int* table = tables + (long long)tok_seq[tok0] * max_blocks;
    const int n_ctx = tok_pos[tok0 + n - 1] + 1;
    const bool busy = warp * 16 < R;
    for (int kb = 0; kb < n_ctx; kb += BK) {
        const int jn = min(BK, n_ctx - kb);
        __syncthreads();
        for (int j = threadIdx.x; j < jn; j += blockDim.x) { const int p = kb + j; slot[j] = table[p / bs] * bs + p % bs; }
        __syncthreads();
        for (int e = threadIdx.x; e < BK * (HD / 2); e += blockDim.x) {
            const int j = e / (HD / 2), w = e % (HD / 2);
            unsigned int kw = 0, vw = 0;
            if (j < jn) {
                const long long at = (long long)slot[j] * kvd + (long long)g * HD + 2 * w;
                kw = pack2(kc[at], kc[at + 1]);
                vw = pack2(vc[at], vc[at + 1]);
            }
            ((unsigned int*)ks)[(j * STRIDE) / 2 + w] = kw;
            ((unsigned int*)vs)[(j * STRIDE) / 2 + w] = vw;
        }
        __syncthreads();
        if (!busy) continue;
        float s[BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; ++nt) {
            for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk) {
                const bf16* krow = ks + (nt * 8 + gid) * STRIDE + kk * 16 + 2 * t;
                const unsigned int b[2] = {pack2(krow[0], krow[1]), pack2(krow[8], krow[9])};
                mma_bf16_16816(s[nt], qf[kk], b);
            }
        }
        float mx_a = m_a, mx_b = m_b;
#pragma unroll
        for (int nt = 0; nt < BK / 8; ++nt)
            for (int i = 0; i < 4; ++i) {
                const int key = kb + nt * 8 + 2 * t + (i & 1);
                const int pos = i < 2 ? pos_a : pos_b;
                s[nt][i] = key <= pos ? s[nt][i] * scale : -PLATEAU_INF;
                if (i < 2) mx_a = fmaxf(mx_a, s[nt][i]); else mx_b = fmaxf(mx_b, s[nt][i]);
            }
        for (int off = 1; off < 4; off *= 2) {
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
        }
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int nt = 0; nt < BK / 8; ++nt)
            for (int i = 0; i < 4; ++i) {
                const float mx = i < 2 ? mx_a : mx_b;
                const float e = mx == -PLATEAU_INF ? 0.0f : expf(s[nt][i] - mx);
                s[nt][i] = e;
                if (i < 2) sum_a += e; else sum_b += e;
            }
        for (int off = 1; off < 4; off *= 2) {
            sum_a += __shfl_xor_sync(0xffffffffu, sum_a, off);
            sum_b += __shfl_xor_sync(0xffffffffu, sum_b, off);
        }
        const float ca = m_a == -PLATEAU_INF ? 0.0f : expf(m_a - mx_a), cb = m_b == -PLATEAU_INF ? 0.0f : expf(m_b - mx_b);
        l_a = l_a * ca + sum_a;
        l_b = l_b * cb + sum_b;
        m_a = mx_a;
        m_b = mx_b;
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt) {
            o[nt][0] *= ca;
            o[nt][1] *= ca;
            o[nt][2] *= cb;
            o[nt][3] *= cb;
        }
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            const unsigned int a[4] = {
                pack2(bf16_bits(s[2 * kk][0]), bf16_bits(s[2 * kk][1])),
                pack2(bf16_bits(s[2 * kk][2]), bf16_bits(s[2 * kk][3])),
                pack2(bf16_bits(s[2 * kk + 1][0]), bf16_bits(s[2 * kk + 1][1])),
                pack2(bf16_bits(s[2 * kk + 1][2]), bf16_bits(s[2 * kk + 1][3])),
            };
            const bf16* v0 = vs + (kk * 16 + 2 * t) * STRIDE + gid;
#pragma unroll
            for (int nt = 0; nt < HD / 8; ++nt) {
                const bf16* v = v0 + nt * 8;
                const unsigned int b[2] = {pack2(v[0], v[STRIDE]), pack2(v[8 * STRIDE], v[9 * STRIDE])};
                mma_bf16_16816(o[nt], a, b);
            }
        }
    }
    if (!busy) return;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt)
        for (int i = 0; i < 4; ++i) {
            const int row = i < 2 ? ra : rb;
            if (row >= R) continue;
            const float l = i < 2 ? l_a : l_b;
            const long long at = (long long)(tok0 + row / G) * nh * HD + (long long)(g * G + row % G) * HD + nt * 8 + 2 * t + (i & 1);
            st(out, at, o[nt][i] / l);
        }
}

#define INSTANTIATE_PREFILL_TC(H) \
extern "C" __global__ void attention_prefill_tc_h##H##_bf16(const bf16* q, int q_stride, const bf16* kc, const bf16* vc, bf16* out, const int* tile_tok, const int* tile_n, const int* tok_seq, const int* tok_pos, const int* tables, int max_blocks, int bs, int nh, int nkv, int hd, float scale) { attention_prefill_tc<H>(q, q_stride, kc, vc, out, tile_tok, tile_n, tok_seq, tok_pos, tables, max_blocks, bs, nh, nkv, scale); }

INSTANTIATE_PREFILL_TC(64)
INSTANTIATE_PREFILL_TC(128)
