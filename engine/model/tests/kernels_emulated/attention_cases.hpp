// Attention alone, in the shapes of real models, against double precision: a batch of decode
// tokens (contexts of odd lengths) beside one prefill chunk whose first positions are already in
// the cache, over shuffled block tables, with one split and several, and query tiles of 1 to 4
// (bf16 prefill of 64- and 128-dimension heads on the tensor-core kernel where the warp is 32).
#pragma once
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>
#include "attend.hpp"
#include "host.hpp"

struct AttentionCase { int nh, nkv, hd, bs; std::vector<int> decode_ctx; int prefill_start, prefill_len; Tuning tune; };

// The worst error relative to the largest output value over every case this warp can run.
template <typename T> double attention_cases(const char* name) {
  const std::vector<AttentionCase> cases = {
    {16, 2, 64, 16, {1, 17, 301}, 250, 37, {1 << 20, 4, 32}},  // TinyLlama's group of 8 and 64 dimensions
    {16, 2, 64, 16, {1, 17, 301}, 250, 37, {100, 1, 16}},      // several splits, one-token tiles
    {6, 2, 40, 16, {5, 64, 129}, 3, 9, {48, 2, 8}},             // a group of 3, 40 dimensions
    {4, 4, 24, 8, {2, 33}, 0, 13, {16, 4, 8}},                  // no grouping, 24 dimensions
    {12, 4, 64, 16, {7, 130}, 70, 45, {64, 4, 16}},             // a group of 3: tiles whose rows end mid-warp
    {8, 2, 128, 16, {3, 200}, 100, 20, {1 << 20, 2, 16}},       // 128 dimensions
  };
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0, 1);
  double worst = 0;
  for (const auto& c : cases) {
    const int G = c.nh / c.nkv, kvd = c.nkv * c.hd, q_stride = (c.nh + 2 * c.nkv) * c.hd + 3;
    if (lanes_per_position(G, c.hd, warp_for(THREADS)) == 0) { printf("  %s attention %dx%d/%d: no lane plan in a warp of %u (a device has 32)\n", name, c.nh, c.hd, c.nkv, warp_for(THREADS)); continue; }
    std::vector<int> tok_seq, tok_pos, first, len;
    std::vector<int> seq_end;  // each sequence's context length
    for (int ctx : c.decode_ctx) { first.push_back(tok_pos.size()); len.push_back(1); tok_seq.push_back(seq_end.size()); tok_pos.push_back(ctx - 1); seq_end.push_back(ctx); }
    first.push_back(tok_pos.size()); len.push_back(c.prefill_len);
    for (int i = 0; i < c.prefill_len; ++i) { tok_seq.push_back(seq_end.size()); tok_pos.push_back(c.prefill_start + i); }
    seq_end.push_back(c.prefill_start + c.prefill_len);
    int max_blocks = 1;
    for (int e : seq_end) max_blocks = std::max(max_blocks, (e + c.bs - 1) / c.bs);
    const int n_blocks = max_blocks * seq_end.size();
    std::vector<int> ids(n_blocks);
    for (int i = 0; i < n_blocks; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), gen);
    std::vector<int> tables(ids);  // sequence s's table: ids[s * max_blocks ..]
    std::vector<float> kf(n_blocks * c.bs * kvd), vf(kf.size()), qf(tok_pos.size() * q_stride);
    for (auto* v : {&kf, &vf, &qf}) for (auto& x : *v) x = normal(gen);
    std::vector<T> k, v, q, out(tok_pos.size() * c.nh * c.hd);
    store(k, kf); store(v, vf); store(q, qf);
    if (!attend<T>({c.nh, c.nkv, c.hd, c.bs, max_blocks}, c.tune, q.data(), q_stride, k.data(), v.data(), out.data(), tok_seq, tok_pos, tables, first, len)) {
      printf("  %s attention: no plan fits\n", name);
      return 1e9;
    }
    double big = 0, err = 0;
    for (size_t t = 0; t < tok_pos.size(); ++t) {
      const int* table = &tables[tok_seq[t] * max_blocks];
      for (int h = 0; h < c.nh; ++h) {
        const int g = h / G, n = tok_pos[t] + 1;
        std::vector<double> w(n);
        double m = -1e300, z = 0;
        for (int p = 0; p < n; ++p) {
          long long row = ((long long)table[p / c.bs] * c.bs + p % c.bs) * kvd + g * c.hd;
          double s = 0;
          for (int d = 0; d < c.hd; ++d) s += (double)ld(q.data(), (long long)t * q_stride + h * c.hd + d) * ld(k.data(), row + d);
          w[p] = s / std::sqrt((double)c.hd);
          m = std::max(m, w[p]);
        }
        for (auto& x : w) { x = std::exp(x - m); z += x; }
        for (int d = 0; d < c.hd; ++d) {
          double r = 0;
          for (int p = 0; p < n; ++p) r += w[p] / z * ld(v.data(), ((long long)table[p / c.bs] * c.bs + p % c.bs) * kvd + g * c.hd + d);
          big = std::max(big, std::fabs(r));
          err = std::max(err, std::fabs(r - ld(out.data(), (long long)t * c.nh * c.hd + h * c.hd + d)));
        }
      }
    }
    const bool tc = tc_tile_tokens(sizeof(T) == 2, G, c.hd, THREADS / 32) > 0 && warp_for(THREADS) == 32;
    printf("  %s attention %d heads of %d over %d KV heads (split %d, prefill %s): relative error %.3g\n", name, c.nh, c.hd, c.nkv, c.tune.split_len, tc ? "on tensor cores" : ("tile " + std::to_string(c.tune.bq) + "x" + std::to_string(c.tune.bk)).c_str(), err / big);
    worst = std::max(worst, err / big);
  }
  return worst;
}
