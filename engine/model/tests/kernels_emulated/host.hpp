// Host-side helpers of the harness: tensors stored as a kernel stores them, and the block kernels'
// round trip.
#pragma once
#include <vector>

// dst = src in T's storage (bf16 narrowed by the kernels' own from_f32).
template <typename T> void store(std::vector<T>& dst, const std::vector<float>& src) {
  dst.resize(src.size());
  std::vector<float> tmp(src);
  const unsigned saved = THREADS;
  THREADS = 1;
  launch(1, 1, [&] { from_f32<T>(tmp.data(), dst.data(), (long long)src.size()); });
  THREADS = saved;
}

// Gather of blocks 1 and 5 of every cache tensor in read_kv's order, scattered to blocks 20 and
// 21, then block 5 copied to 22 through the address table: true when each lands where it should.
template <typename T> bool block_kernels(std::vector<std::vector<T>>& kc, std::vector<std::vector<T>>& vc, int be, int layers) {
  std::vector<unsigned long long> bases;
  for (int l = 0; l < layers; ++l) { bases.push_back((unsigned long long)kc[l].data()); bases.push_back((unsigned long long)vc[l].data()); }
  int blocks[2] = {1, 5};
  std::vector<float> staging(2 * layers * 2 * be);
  launch(2, 2 * layers, [&] { gather_blocks<T>(bases.data(), blocks, 2, be, staging.data()); });
  bool order = staging[0] == ld(kc[0].data(), 1LL * be) && staging[be] == ld(kc[0].data(), 5LL * be) && staging[2 * be] == ld(vc[0].data(), 1LL * be);
  int dst[2] = {20, 21};
  launch(2, 2 * layers, [&] { scatter_blocks<T>(bases.data(), dst, 2, be, staging.data()); });
  int pairs[2] = {5, 22};
  launch(1, 2 * layers, [&] { copy_blocks<T>(bases.data(), pairs, be); });
  bool moved = true;
  for (int e = 0; e < be; ++e) moved &= ld(kc[1].data(), 21LL * be + e) == ld(kc[1].data(), 5LL * be + e) && ld(vc[1].data(), 22LL * be + e) == ld(vc[1].data(), 5LL * be + e);
  return order && moved;
}
