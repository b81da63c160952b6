// Host emulation of engine/model/src/cuda/kernels.cu: every block in order, its threads as OS
// threads meeting at a barrier for __syncthreads, launched the way backend.rs launches them (with a
// plain loop for cuBLAS's products), against a reference forward pass in double precision; plus
// the block gather / scatter / copy kernels. Run by engine/tests/kernels_emulated.rs with g++.
// Usage: harness THREADS_PER_BLOCK...   (exit 0 and PASS when every run is within its limits)
#include <cstring>
#include <cmath>
#include <cstdio>
#include <vector>
#include <random>
#include <algorithm>
#include <cstdlib>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct Dim { unsigned int x, y, z; };
#include <barrier>
#include <thread>
#include <memory>
static thread_local Dim threadIdx{0,0,0};
static Dim blockIdx{0,0,0}, blockDim{1,1,1}, gridDim{1,1,1};
static std::unique_ptr<std::barrier<>> bar;
inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline void __syncthreads() { if (blockDim.x > 1) bar->arrive_and_wait(); }
inline void sincosf(float x, float* s, float* c) { *s = std::sin(x); *c = std::cos(x); }
static float plateau_emulated_smem[1 << 16];
#define PLATEAU_EMULATED
#include "../../model/src/cuda/kernels.cu"

static unsigned THREADS = 1;
template <class F> void launch(unsigned gx, unsigned gy, F f) {
  gridDim = {gx, gy, 1};
  blockDim = {THREADS, 1, 1};
  for (unsigned y = 0; y < gy; ++y) for (unsigned x = 0; x < gx; ++x) {
    blockIdx = {x, y, 0};
    if (THREADS == 1) { threadIdx = {0, 0, 0}; f(); continue; }
    bar = std::make_unique<std::barrier<>>(THREADS);
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < THREADS; ++t) ts.emplace_back([&, t] { threadIdx = {t, 0, 0}; f(); });
    for (auto& th : ts) th.join();
  }
}
typedef unsigned long long u64;
const int H = 64, NH = 4, NKV = 2, HD = 16, I = 160, V = 320, L = 2, BS = 16, NBLK = 32;
const int QD = NH * HD, KVD = NKV * HD;
std::mt19937 rng(7);
std::vector<float> randv(size_t n, float s) { std::normal_distribution<float> d(0, s); std::vector<float> v(n); for (auto& x : v) x = d(rng); return v; }
struct W { std::vector<float> an, q, k, v, o, mn, g, u, d; };
std::vector<W> layers; std::vector<float> embedw, fnorm, lmh;

// Reference: full recompute of one sequence, logits at its last position (double precision).
std::vector<double> reference(const std::vector<unsigned>& toks) {
  int T = toks.size();
  std::vector<double> x(T * H);
  for (int t = 0; t < T; ++t) for (int i = 0; i < H; ++i) x[t * H + i] = embedw[toks[t] * H + i];
  auto norm = [&](const std::vector<double>& a, const std::vector<float>& w) { std::vector<double> o(a.size()); for (int t = 0; t < (int)a.size() / H; ++t) { double ss = 0; for (int i = 0; i < H; ++i) ss += a[t*H+i]*a[t*H+i]; double r = 1.0 / std::sqrt(ss / H + 1e-5); for (int i = 0; i < H; ++i) o[t*H+i] = a[t*H+i]*r*w[i]; } return o; };
  auto lin = [&](const std::vector<double>& a, const std::vector<float>& w, int in, int out) { int t = a.size() / in; std::vector<double> y(t * out); for (int r = 0; r < t; ++r) for (int o = 0; o < out; ++o) { double s = 0; for (int i = 0; i < in; ++i) s += a[r*in+i]*w[o*in+i]; y[r*out+o] = s; } return y; };
  auto rope = [&](std::vector<double>& a, int heads) { for (int t = 0; t < T; ++t) for (int h = 0; h < heads; ++h) for (int i = 0; i < HD/2; ++i) { double f = 1.0 / std::pow(10000.0, 2.0*i/HD); double an = t * f; double c = std::cos(an), s = std::sin(an); double& A = a[t*heads*HD+h*HD+i]; double& B = a[t*heads*HD+h*HD+i+HD/2]; double a0 = A, b0 = B; A = a0*c - b0*s; B = b0*c + a0*s; } };
  for (auto& w : layers) {
    auto hn = norm(x, w.an); auto q = lin(hn, w.q, H, QD), k = lin(hn, w.k, H, KVD), v = lin(hn, w.v, H, KVD);
    rope(q, NH); rope(k, NKV);
    std::vector<double> att(T * QD, 0);
    for (int t = 0; t < T; ++t) for (int h = 0; h < NH; ++h) { int g = h / (NH / NKV); std::vector<double> sc(t + 1); double m = -1e300; for (int p = 0; p <= t; ++p) { double s = 0; for (int d = 0; d < HD; ++d) s += q[t*QD+h*HD+d]*k[p*KVD+g*HD+d]; sc[p] = s / std::sqrt((double)HD); m = std::max(m, sc[p]); } double z = 0; for (auto& s : sc) { s = std::exp(s - m); z += s; } for (int p = 0; p <= t; ++p) for (int d = 0; d < HD; ++d) att[t*QD+h*HD+d] += sc[p]/z * v[p*KVD+g*HD+d]; }
    auto o = lin(att, w.o, QD, H); for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    hn = norm(x, w.mn); auto gg = lin(hn, w.g, H, I), uu = lin(hn, w.u, H, I); for (size_t i = 0; i < gg.size(); ++i) gg[i] = gg[i] / (1 + std::exp(-gg[i])) * uu[i];
    auto dd = lin(gg, w.d, I, H); for (size_t i = 0; i < x.size(); ++i) x[i] += dd[i];
  }
  std::vector<double> last(x.end() - H, x.end()); last = norm(last, fnorm); return lin(last, lmh, H, V);
}

template <typename T> void store(std::vector<T>& dst, const std::vector<float>& src);
template <> void store<float>(std::vector<float>& d, const std::vector<float>& s) { d = s; }
template <> void store<bf16>(std::vector<bf16>& d, const std::vector<float>& s) { d.resize(s.size()); std::vector<float> tmp(s); Dim saved = blockDim; blockDim = {1,1,1}; gridDim = {1,1,1}; blockIdx = {0,0,0}; from_f32<bf16>(tmp.data(), d.data(), s.size()); blockDim = saved; }

template <typename T> void gemm(const T* x, const T* w, T* y, int t, int in, int out) { for (int r = 0; r < t; ++r) for (int o = 0; o < out; ++o) { float s = 0; for (int i = 0; i < in; ++i) s += ld(x, (long long)r*in+i) * ld(w, (long long)o*in+i); st(y, (long long)r*out+o, s); } }

struct Chunk { std::vector<unsigned> toks; int start; std::vector<int> table; };

template <typename T> double run(const char* name) {
  struct LW { std::vector<T> an, q, k, v, o, mn, g, u, d; };
  std::vector<LW> lw(L);
  for (int l = 0; l < L; ++l) { store(lw[l].an, layers[l].an); store(lw[l].q, layers[l].q); store(lw[l].k, layers[l].k); store(lw[l].v, layers[l].v); store(lw[l].o, layers[l].o); store(lw[l].mn, layers[l].mn); store(lw[l].g, layers[l].g); store(lw[l].u, layers[l].u); store(lw[l].d, layers[l].d); }
  std::vector<T> emb, fn, lm; store(emb, embedw); store(fn, fnorm); store(lm, lmh);
  std::vector<std::vector<T>> kc(L, std::vector<T>(NBLK * BS * KVD)), vc(L, std::vector<T>(NBLK * BS * KVD));
  std::vector<float> invf(HD / 2); for (int i = 0; i < HD / 2; ++i) invf[i] = 1.0f / std::pow(10000.0f, (float)(2 * i) / HD);
  std::vector<unsigned> seqA, seqB; for (int i = 0; i < 45; ++i) seqA.push_back((i * 31 + 3) % V); for (int i = 0; i < 30; ++i) seqB.push_back((i * 17 + 5) % V);
  std::vector<std::vector<Chunk>> steps = {
    {{std::vector<unsigned>(seqA.begin(), seqA.begin() + 37), 0, {0, 1, 2}}, {std::vector<unsigned>(seqB.begin(), seqB.begin() + 20), 0, {5, 6}}},
    {{{seqA[37]}, 37, {0, 1, 2}}, {std::vector<unsigned>(seqB.begin() + 20, seqB.begin() + 25), 20, {5, 6}}},
    {{std::vector<unsigned>(seqA.begin() + 38, seqA.begin() + 45), 38, {0, 1, 2}}, {{seqB[25]}, 25, {5, 6}}},
  };
  double worst = 0;
  for (auto& chunks : steps) {
    std::vector<unsigned> tokens; std::vector<int> pos, tseq, tables; std::vector<long long> slots; std::vector<int> lrows; int maxb = 3, maxctx = 1;
    for (size_t c = 0; c < chunks.size(); ++c) { auto& ch = chunks[c]; for (int b = 0; b < maxb; ++b) tables.push_back(b < (int)ch.table.size() ? ch.table[b] : 0);
      for (size_t j = 0; j < ch.toks.size(); ++j) { int p = ch.start + j; tokens.push_back(ch.toks[j]); pos.push_back(p); tseq.push_back(c); slots.push_back((long long)ch.table[p / BS] * BS + p % BS); maxctx = std::max(maxctx, p + 1); }
      lrows.push_back(tokens.size() - 1); }
    int T_ = tokens.size();
    std::vector<T> x(T_ * H), hn(T_ * H), q(T_ * QD), k(T_ * KVD), v(T_ * KVD), att(T_ * QD), tmp(T_ * H), g(T_ * I), u(T_ * I);
    launch(T_, 1, [&] { embed<T>(emb.data(), tokens.data(), x.data(), H); });
    for (int l = 0; l < L; ++l) {
      launch(T_, 1, [&] { rmsnorm<T>(x.data(), nullptr, lw[l].an.data(), hn.data(), H, 1e-5f); });
      gemm(hn.data(), lw[l].q.data(), q.data(), T_, H, QD); gemm(hn.data(), lw[l].k.data(), k.data(), T_, H, KVD); gemm(hn.data(), lw[l].v.data(), v.data(), T_, H, KVD);
      launch(T_, 1, [&] { rope<T>(q.data(), pos.data(), invf.data(), NH, HD); });
      launch(T_, 1, [&] { rope<T>(k.data(), pos.data(), invf.data(), NKV, HD); });
      launch(T_, 1, [&] { store_kv<T>(k.data(), v.data(), kc[l].data(), vc[l].data(), slots.data(), KVD); });
      launch(T_, NH, [&] { attention<T>(q.data(), kc[l].data(), vc[l].data(), att.data(), tseq.data(), pos.data(), tables.data(), maxb, BS, NH, NKV, HD, 1.0f / std::sqrt((float)HD)); });
      gemm(att.data(), lw[l].o.data(), tmp.data(), T_, QD, H);
      launch(1, 1, [&] { add<T>(x.data(), tmp.data(), (long long)T_ * H); });
      launch(T_, 1, [&] { rmsnorm<T>(x.data(), nullptr, lw[l].mn.data(), hn.data(), H, 1e-5f); });
      gemm(hn.data(), lw[l].g.data(), g.data(), T_, H, I); gemm(hn.data(), lw[l].u.data(), u.data(), T_, H, I);
      launch(1, 1, [&] { silu_mul<T>(g.data(), u.data(), g.data(), (long long)T_ * I); });
      gemm(g.data(), lw[l].d.data(), tmp.data(), T_, I, H);
      launch(1, 1, [&] { add<T>(x.data(), tmp.data(), (long long)T_ * H); });
    }
    int R = lrows.size(); std::vector<T> nr(R * H), lg(R * V); std::vector<float> out(R * V);
    launch(R, 1, [&] { rmsnorm<T>(x.data(), lrows.data(), fn.data(), nr.data(), H, 1e-5f); });
    gemm(nr.data(), lm.data(), lg.data(), R, H, V);
    launch(1, 1, [&] { to_f32<T>(lg.data(), out.data(), (long long)R * V); });
    for (int c = 0; c < R; ++c) {
      auto& ch = chunks[c]; int end = ch.start + ch.toks.size();
      std::vector<unsigned> full(c == 0 ? seqA.begin() : seqB.begin(), (c == 0 ? seqA.begin() : seqB.begin()) + end);
      auto ref = reference(full); double m = 0, e = 0; for (int i = 0; i < V; ++i) { m = std::max(m, std::fabs(ref[i])); e = std::max(e, std::fabs(ref[i] - out[c * V + i])); }
      worst = std::max(worst, e / m);
    }
  }
  // Block gather/scatter round trip and copy through the address table.
  std::vector<u64> bases; for (int l = 0; l < L; ++l) { bases.push_back((u64)kc[l].data()); bases.push_back((u64)vc[l].data()); }
  int blocks[2] = {1, 5}; int be = BS * KVD; std::vector<float> staging(2 * L * 2 * be);
  launch(2, 2 * L, [&] { gather_blocks<T>(bases.data(), blocks, 2, be, staging.data()); });
  bool order_ok = staging[0] == ld(kc[0].data(), 1LL * be) && staging[be] == ld(kc[0].data(), 5LL * be) && staging[2 * be] == ld(vc[0].data(), 1LL * be);
  int dst[2] = {20, 21};
  launch(2, 2 * L, [&] { scatter_blocks<T>(bases.data(), dst, 2, be, staging.data()); });
  int pairs[2] = {5, 22};
  launch(1, 2 * L, [&] { copy_blocks<T>(bases.data(), pairs, be); });
  bool moved = true; for (int e = 0; e < be; ++e) moved &= ld(kc[1].data(), 21LL * be + e) == ld(kc[1].data(), 5LL * be + e) && ld(vc[1].data(), 22LL * be + e) == ld(vc[1].data(), 5LL * be + e);
  printf("%s: worst relative logit error %.3g; gather order %s; scatter+copy %s\n", name, worst, order_ok ? "ok" : "WRONG", moved ? "ok" : "WRONG");
  return (order_ok && moved) ? worst : 1e9;
}

int main(int argc, char** argv) {
  embedw = randv(V * H, 1.0f); fnorm = randv(H, 0.1f); for (auto& f : fnorm) f += 1; lmh = randv(V * H, 0.1f);
  for (int l = 0; l < L; ++l) { W w; w.an = randv(H, 0.1f); for (auto& f : w.an) f += 1; w.q = randv(QD * H, 0.15f); w.k = randv(KVD * H, 0.15f); w.v = randv(KVD * H, 0.15f); w.o = randv(H * QD, 0.1f); w.mn = randv(H, 0.1f); for (auto& f : w.mn) f += 1; w.g = randv(I * H, 0.1f); w.u = randv(I * H, 0.1f); w.d = randv(H * I, 0.1f); layers.push_back(w); }
  double e32 = 0, e16 = 0;
  for (int a = 1; a < argc; ++a) {
    unsigned threads = (unsigned)atoi(argv[a]);
    THREADS = threads;
    printf("threads per block %u\n", threads);
    e32 = std::max(e32, run<float>("f32"));
    e16 = std::max(e16, run<bf16>("bf16"));
  }
  bool ok = e32 < 1e-4 && e16 < 2e-2;
  printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
