// Host emulation of the CUDA backend's kernels (engine/model/src/cuda/*.cu, through emulate.hpp),
// run by engine/model/tests/kernels_emulated.rs with g++. Four checks at each block size given:
// - a two-layer model through the kernels the way forward.rs launches them (fused QKV and
//   gate-up products as a plain loop for cuBLAS, rope_store, decode attention with its splits,
//   prefill tiles, add_rmsnorm, silu_mul, argmax_rows): chunked prefill and decode over block
//   tables, f32 and bf16, against a double-precision forward pass; the device argmax against
//   the host's;
// - attention alone in the shapes of real models (attention_cases.hpp): GQA groups of 1 to 8,
//   24 to 128 dimensions, odd context lengths, one split and several, query tiles of 1 to 4
//   tokens, bf16 prefill on tensor cores where the warp has 32 lanes;
// - sampling against the host sampler's definition (sampling_cases.hpp);
// - the block gather / scatter / copy kernels.
// Usage: harness THREADS_PER_BLOCK...   (exit 0 and PASS when every run is within its limits)
#include <cstdio>
#include <cstdlib>
#include <random>
#include "emulate.hpp"
#include "../../src/cuda/kernels.cu"
#include "../../src/cuda/attention.cu"
#include "../../src/cuda/prefill_tc.cu"
#include "../../src/cuda/sampling.cu"
#include "host.hpp"
#include "attend.hpp"
#include "attention_cases.hpp"
#include "sampling_cases.hpp"

const int H = 64, NH = 8, NKV = 2, HD = 8, I = 160, V = 320, L = 2, BS = 16, NBLK = 32;
const int QD = NH * HD, KVD = NKV * HD, QKV = QD + 2 * KVD;
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

template <typename T> void gemm(const T* x, const T* w, T* y, int t, int in, int out) { for (int r = 0; r < t; ++r) for (int o = 0; o < out; ++o) { float s = 0; for (int i = 0; i < in; ++i) s += ld(x, (long long)r*in+i) * ld(w, (long long)o*in+i); st(y, (long long)r*out+o, s); } }
std::vector<float> cat(std::initializer_list<const std::vector<float>*> parts) { std::vector<float> o; for (auto* p : parts) o.insert(o.end(), p->begin(), p->end()); return o; }

struct Chunk { std::vector<unsigned> toks; int start; std::vector<int> table; };

// The model's logits through the kernels; false on a wrong argmax or block kernel.
template <typename T> double run(const char* name, const Tuning& tune) {
  struct LW { std::vector<T> an, qkv, o, mn, gu, d; };
  std::vector<LW> lw(L);
  for (int l = 0; l < L; ++l) { auto& w = layers[l]; store(lw[l].an, w.an); store(lw[l].qkv, cat({&w.q, &w.k, &w.v})); store(lw[l].o, w.o); store(lw[l].mn, w.mn); store(lw[l].gu, cat({&w.g, &w.u})); store(lw[l].d, w.d); }
  std::vector<T> emb, fn, lm; store(emb, embedw); store(fn, fnorm); store(lm, lmh);
  std::vector<std::vector<T>> kc(L, std::vector<T>(NBLK * BS * KVD)), vc(L, std::vector<T>(NBLK * BS * KVD));
  std::vector<float> invf(HD / 2); for (int i = 0; i < HD / 2; ++i) invf[i] = 1.0f / std::pow(10000.0f, (float)(2 * i) / HD);
  std::vector<unsigned> seqA, seqB; for (int i = 0; i < 45; ++i) seqA.push_back((i * 31 + 3) % V); for (int i = 0; i < 30; ++i) seqB.push_back((i * 17 + 5) % V);
  std::vector<std::vector<Chunk>> steps = {
    {{std::vector<unsigned>(seqA.begin(), seqA.begin() + 37), 0, {4, 1, 2}}, {std::vector<unsigned>(seqB.begin(), seqB.begin() + 20), 0, {5, 6}}},
    {{{seqA[37]}, 37, {4, 1, 2}}, {std::vector<unsigned>(seqB.begin() + 20, seqB.begin() + 25), 20, {5, 6}}},
    {{std::vector<unsigned>(seqA.begin() + 38, seqA.begin() + 45), 38, {4, 1, 2}}, {{seqB[25]}, 25, {5, 6}}},
    {{{seqA[44]}, 44, {4, 1, 2}}, {{seqB[26]}, 26, {5, 6}}},
  };
  double worst = 0; bool argmax_ok = true;
  const Shape shape{NH, NKV, HD, BS, 3};
  for (size_t step = 0; step < steps.size(); ++step) {
    auto& chunks = steps[step];
    // The last step recomputes seqA's last position: its KV slot is written again, with the same values.
    std::vector<unsigned> tokens; std::vector<int> pos, tseq, tables, lrows, first, len; std::vector<long long> slots;
    for (size_t c = 0; c < chunks.size(); ++c) { auto& ch = chunks[c]; for (int b = 0; b < 3; ++b) tables.push_back(b < (int)ch.table.size() ? ch.table[b] : 0);
      first.push_back(tokens.size()); len.push_back(ch.toks.size());
      for (size_t j = 0; j < ch.toks.size(); ++j) { int p = ch.start + j; tokens.push_back(ch.toks[j]); pos.push_back(p); tseq.push_back(c); slots.push_back((long long)ch.table[p / BS] * BS + p % BS); }
      lrows.push_back(tokens.size() - 1); }
    int T_ = tokens.size();
    std::vector<T> x(T_ * H), hn(T_ * H), qkv(T_ * QKV), att(T_ * QD), tmp(T_ * H), gu(T_ * 2 * I), act(T_ * I);
    launch(T_, 1, [&] { embed<T>(emb.data(), tokens.data(), x.data(), H); });
    launch(T_, 1, [&] { rmsnorm<T>(x.data(), nullptr, lw[0].an.data(), hn.data(), H, 1e-5f); });
    for (int l = 0; l < L; ++l) {
      gemm(hn.data(), lw[l].qkv.data(), qkv.data(), T_, H, QKV);
      launch(T_, 1, [&] { rope_store<T>(qkv.data(), pos.data(), invf.data(), kc[l].data(), vc[l].data(), slots.data(), NH, NKV, HD); });
      if (!attend<T>(shape, tune, qkv.data(), QKV, kc[l].data(), vc[l].data(), att.data(), tseq, pos, tables, first, len)) { printf("%s: no attention plan fits\n", name); return 1e9; }
      gemm(att.data(), lw[l].o.data(), tmp.data(), T_, QD, H);
      launch(T_, 1, [&] { add_rmsnorm<T>(x.data(), tmp.data(), lw[l].mn.data(), hn.data(), H, 1e-5f); });
      gemm(hn.data(), lw[l].gu.data(), gu.data(), T_, H, 2 * I);
      launch(3, 1, [&] { silu_mul<T>(gu.data(), act.data(), I, (long long)T_ * I); });
      gemm(act.data(), lw[l].d.data(), tmp.data(), T_, I, H);
      if (l + 1 < L) launch(T_, 1, [&] { add_rmsnorm<T>(x.data(), tmp.data(), lw[l + 1].an.data(), hn.data(), H, 1e-5f); });
      else launch(2, 1, [&] { add<T>(x.data(), tmp.data(), (long long)T_ * H); });
    }
    int R = lrows.size(); std::vector<T> nr(R * H), lg(R * V); std::vector<float> out(R * V); std::vector<unsigned> ids(R);
    launch(R, 1, [&] { rmsnorm<T>(x.data(), lrows.data(), fn.data(), nr.data(), H, 1e-5f); });
    gemm(nr.data(), lm.data(), lg.data(), R, H, V);
    launch(1, 1, [&] { to_f32<T>(lg.data(), out.data(), (long long)R * V); });
    launch(R, 1, [&] { argmax_rows<T>(lg.data(), ids.data(), V); });
    for (int c = 0; c < R; ++c) {
      auto& ch = chunks[c]; int end = ch.start + ch.toks.size();
      std::vector<unsigned> full(c == 0 ? seqA.begin() : seqB.begin(), (c == 0 ? seqA.begin() : seqB.begin()) + end);
      auto ref = reference(full); double m = 0, e = 0; for (int i = 0; i < V; ++i) { m = std::max(m, std::fabs(ref[i])); e = std::max(e, std::fabs(ref[i] - out[c * V + i])); }
      worst = std::max(worst, e / m);
      unsigned host = 0; for (int i = 0; i < V; ++i) if (out[c * V + i] > out[c * V + host]) host = i;
      argmax_ok &= host == ids[c];
    }
  }
  bool blocks_ok = block_kernels<T>(kc, vc, BS * KVD, L);
  printf("%s (split %d, tile %dx%d): worst relative logit error %.3g; argmax %s; block kernels %s\n", name, tune.split_len, tune.bq, tune.bk, worst, argmax_ok ? "ok" : "WRONG", blocks_ok ? "ok" : "WRONG");
  return (argmax_ok && blocks_ok) ? worst : 1e9;
}

int main(int argc, char** argv) {
  embedw = randv(V * H, 1.0f); fnorm = randv(H, 0.1f); for (auto& f : fnorm) f += 1; lmh = randv(V * H, 0.1f);
  for (int l = 0; l < L; ++l) { W w; w.an = randv(H, 0.1f); for (auto& f : w.an) f += 1; w.q = randv(QD * H, 0.15f); w.k = randv(KVD * H, 0.15f); w.v = randv(KVD * H, 0.15f); w.o = randv(H * QD, 0.1f); w.mn = randv(H, 0.1f); for (auto& f : w.mn) f += 1; w.g = randv(I * H, 0.1f); w.u = randv(I * H, 0.1f); w.d = randv(H * I, 0.1f); layers.push_back(w); }
  double e32 = 0, e16 = 0, a32 = 0, a16 = 0;
  int sampling_wrong = 0;
  for (int a = 1; a < argc; ++a) {
    THREADS = (unsigned)atoi(argv[a]);
    printf("threads per block %u (warp of %u)\n", THREADS, warp_for(THREADS));
    for (Tuning tune : {Tuning{1 << 20, 4, 32}, Tuning{16, 3, 8}}) {
      e32 = std::max(e32, run<float>("f32", tune));
      e16 = std::max(e16, run<bf16>("bf16", tune));
    }
    a32 = std::max(a32, attention_cases<float>("f32"));
    a16 = std::max(a16, attention_cases<bf16>("bf16"));
    sampling_wrong += sampling_cases<float>("f32") + sampling_cases<bf16>("bf16");
  }
  // f32: the kernels' float arithmetic against double (1e-4 of the largest logit); bf16: storage
  // rounding of every activation (2e-2). Attention alone: its output against double, relative to
  // the largest value, f32 1e-5, bf16 1e-2 (the output's own rounding is 4e-3).
  // Sampling: the device's token is the host's for every draw and argmax.
  bool ok = e32 < 1e-4 && e16 < 2e-2 && a32 < 1e-5 && a16 < 1e-2 && sampling_wrong == 0;
  printf("model f32 %.3g, bf16 %.3g; attention f32 %.3g, bf16 %.3g; sampling %d differ\n%s\n", e32, e16, a32, a16, sampling_wrong, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
