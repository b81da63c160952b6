// The device's sampling kernels against a port of engine/src/sampler.rs's definition (candidates
// ranked by logit, ties to the lower id; top-k; top-p over exp((logit - max) / T) in double; the
// draw walks the kept weights): rows of several vocabularies and shapes (ties, a peaked one, a
// flat one, a NaN), temperatures, top-k and top-p, many draws. The device's fixed-point sums may
// land a draw within about 1e-12 of a boundary on the neighbouring token: never met here.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

// sampler.rs's `sample_ranked`, for a finite row.
inline unsigned host_sample(const std::vector<float>& logits, double inv_t, unsigned top_k, float top_p, double u) {
  auto key = [&](size_t i) {
    unsigned b; memcpy(&b, &logits[i], 4);
    unsigned asc = (b >> 31) ? ~b : (b | 0x80000000u);
    return ((unsigned long long)(~asc) << 32) | i;
  };
  std::vector<unsigned long long> keys(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) keys[i] = key(i);
  std::sort(keys.begin(), keys.end());
  if (top_k > 0 && top_k < keys.size()) keys.resize(top_k);
  const double max = logits[keys[0] & 0xffffffffu];
  std::vector<double> w;
  for (auto k : keys) w.push_back(std::exp(((double)logits[k & 0xffffffffu] - max) * inv_t));
  double total = 0;
  for (double x : w) total += x;
  size_t keep = w.size();
  if (top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < w.size(); ++i) { acc += w[i] / total; if (acc >= (double)top_p) { keep = i + 1; break; } }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += w[i];
  double r = u * kept;
  for (size_t i = 0; i < keep; ++i) { if (r < w[i]) return keys[i] & 0xffffffffu; r -= w[i]; }
  return keys[keep - 1] & 0xffffffffu;
}

// Mismatches between the device and the host over every case (a wrong argmax or an undecided
// row where the host decides counts too).
template <typename T> int sampling_cases(const char* name) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0, 1);
  std::uniform_real_distribution<double> unit(0, 1);
  int bad = 0, draws = 0;
  for (int vocab : {7, 300, 1000}) {
    // Rows: wide logits with repeated values (ties), one peaked, one flat, one with a NaN.
    std::vector<std::vector<float>> rows(4, std::vector<float>(vocab));
    for (int i = 0; i < vocab; ++i) {
      rows[0][i] = std::round(normal(gen) * 4) / 2;
      rows[1][i] = normal(gen) * (i == vocab / 3 ? 0 : 1) + (i == vocab / 3 ? 12 : 0);
      rows[2][i] = 0.25f * normal(gen);
      rows[3][i] = normal(gen);
    }
    rows[3][vocab / 2] = std::nanf("");
    for (auto& row : rows) { std::vector<T> stored; store(stored, row); for (int i = 0; i < vocab; ++i) row[i] = ld(stored.data(), i); }
    std::vector<float> flat;
    for (auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
    std::vector<T> dev;
    store(dev, flat);
    const int R = rows.size();
    std::vector<unsigned> ids(R);
    launch(R, 1, [&] { argmax_rows<T>(dev.data(), ids.data(), vocab); });
    for (int r = 0; r < R; ++r) {
      unsigned host = 0;
      for (int i = 0; i < vocab; ++i) if (rows[r][i] > rows[r][host]) host = i;
      bad += ids[r] != host;
    }
    for (double t : {0.7, 1.0, 2.5})
      for (unsigned k : {0u, 1u, 5u, 50u})
        for (float p : {1.0f, 0.9f, 0.3f}) {
          std::vector<double> params;
          std::vector<double> us;
          for (int r = 0; r < R; ++r) { double u = unit(gen); us.push_back(u); params.insert(params.end(), {1.0 / t, (double)k, (double)p, u}); }
          launch(R, 1, [&] { sample_rows<T>(dev.data(), params.data(), ids.data(), vocab); });
          for (int r = 0; r < R; ++r) {
            ++draws;
            const bool finite = std::all_of(rows[r].begin(), rows[r].end(), [](float x) { return std::isfinite(x); });
            const unsigned want = finite ? host_sample(rows[r], 1.0 / t, k, p, us[r]) : 0xffffffffu;
            if (ids[r] != want) {
              if (bad < 5) printf("  %s sample: vocab %d row %d T %.1f top_k %u top_p %.1f u %.17g: device %u, host %u\n", name, vocab, r, t, k, p, us[r], ids[r], want);
              ++bad;
            }
          }
        }
  }
  printf("  %s sampling: %d draws and %d argmaxes against the host's definition: %d differ\n", name, draws, 12, bad);
  return bad;
}
