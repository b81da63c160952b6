// Attention as forward.rs dispatches it: one-token chunks through attention_decode (cut into
// splits of `split_len` positions, merged by attention_combine when there are several), longer
// chunks through attention_prefill in tiles of `bq` query tokens and `bk` key positions.
#pragma once
#include <cstdio>
#include <vector>
#include "plan.hpp"

struct Shape { int nh, nkv, hd, bs, max_blocks; };
struct Tuning { int split_len, bq, bk; };

// q: rows of q_stride values (query heads first); tok_seq, tok_pos: each token's chunk and
// position; chunk_first / chunk_len: each chunk's tokens. Returns false when no plan fits.
template <typename T>
bool attend(const Shape& s, const Tuning& tune, const T* q, int q_stride, const T* kc, const T* vc, T* out,
            const std::vector<int>& tok_seq, const std::vector<int>& tok_pos, const std::vector<int>& tables,
            const std::vector<int>& chunk_first, const std::vector<int>& chunk_len) {
  const int G = s.nh / s.nkv, W = warp_for(THREADS);
  const float scale = 1.0f / std::sqrt((float)s.hd);
  std::vector<int> rows, tile_tok, tile_n;
  int max_ctx = 1;
  // bf16 prefill goes to the tensor-core kernel where it applies (and the warp is a device's).
  const int tc_tokens = W == 32 ? tc_tile_tokens(sizeof(T) == 2, G, s.hd, THREADS / 32) : 0;
  const int bq = tc_tokens ? tc_tokens : tune.bq;
  for (size_t c = 0; c < chunk_first.size(); ++c) {
    if (chunk_len[c] == 1) {
      rows.push_back(chunk_first[c]);
      max_ctx = std::max(max_ctx, tok_pos[chunk_first[c]] + 1);
      continue;
    }
    for (int i = 0; i < chunk_len[c]; i += bq) {
      tile_tok.push_back(chunk_first[c] + i);
      tile_n.push_back(std::min(bq, chunk_len[c] - i));
    }
  }
  if (!rows.empty()) {
    const int lp = lanes_per_position(G, s.hd, W);
    if (lp == 0) return false;
    const int split_len = std::min(tune.split_len, max_ctx), splits = (max_ctx + split_len - 1) / split_len;
    const int tbl_cap = (split_len + s.bs - 1) / s.bs + 1;
    if (decode_shared_bytes(G, s.hd, tbl_cap, THREADS / W) > sizeof(plateau_emulated_smem)) return false;
    const int R = rows.size();
    std::vector<float> part(splits > 1 ? (size_t)R * s.nh * splits * (2 + s.hd) : 1);
    // The kernel instantiated for the smallest group bound that holds G, as attention.rs picks it.
    auto decode = [&]<int GM>() {
      launch(R, s.nkv, splits, [&] {
        attention_decode<T, GM>(q, q_stride, kc, vc, out, rows.data(), tok_seq.data(), tok_pos.data(), tables.data(),
                                s.max_blocks, s.bs, s.nh, s.nkv, s.hd, scale, lp, split_len, tbl_cap, part.data());
      });
    };
    if (G <= 1) decode.template operator()<1>();
    else if (G <= 2) decode.template operator()<2>();
    else if (G <= 4) decode.template operator()<4>();
    else if (G <= 8) decode.template operator()<8>();
    else decode.template operator()<16>();
    if (splits > 1)
      launch(R, s.nh, 1, [&] { attention_combine<T>(part.data(), rows.data(), out, s.nh, s.hd, splits); });
  }
  if (!tile_tok.empty() && tc_tokens) {
    if constexpr (sizeof(T) == 2) {
      launch(tile_tok.size(), s.nkv, 1, [&] {
        auto kernel = s.hd == 64 ? attention_prefill_tc<64> : attention_prefill_tc<128>;
        kernel(q, q_stride, kc, vc, out, tile_tok.data(), tile_n.data(), tok_seq.data(), tok_pos.data(), tables.data(),
               s.max_blocks, s.bs, s.nh, s.nkv, scale);
      });
    }
  } else if (!tile_tok.empty()) {
    if (prefill_shared_bytes(G, s.hd, tune.bq, tune.bk) > sizeof(plateau_emulated_smem)) return false;
    launch(tile_tok.size(), s.nkv, 1, [&] {
      attention_prefill<T>(q, q_stride, kc, vc, out, tile_tok.data(), tile_n.data(), tok_seq.data(), tok_pos.data(),
                           tables.data(), s.max_blocks, s.bs, s.nh, s.nkv, s.hd, scale, tune.bq, tune.bk);
    });
  }
  return true;
}
