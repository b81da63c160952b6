// The launch plans of engine/model/src/cuda/attention.rs, for the harness: the same rules, so the
// emulation runs the kernels in the shapes the backend launches them.
#pragma once
#include <cstddef>

const int MAX_GROUP = 16;

// Lanes per position of attention_decode for `hd` dimensions and a warp of `warp` lanes: the
// fewest that leave a lane at most PLATEAU_LANE_DIMS dimensions. 0 when the warp is too narrow or
// the group too wide.
inline int lanes_per_position(int group, int hd, int warp) {
  if (group > MAX_GROUP) return 0;
  int lp = 1;
  while ((hd + lp - 1) / lp > PLATEAU_LANE_DIMS) lp *= 2;
  return lp <= warp ? lp : 0;
}

inline size_t decode_shared_bytes(int group, int hd, int tbl_cap, int warps) {
  return 4 * ((size_t)group * hd + tbl_cap + (size_t)warps * (2 * group + group * hd));
}

inline size_t prefill_shared_bytes(int group, int hd, int bq, int bk) {
  const size_t rows = (size_t)bq * group;
  return 4 * (2 * rows * hd + 2 * (size_t)bk * hd + rows * bk + 3 * rows + bk);
}

// attention_prefill_tc: bf16, heads of 64 or 128 dimensions, 16 query rows a warp (the tile's
// tokens are the block's rows over the group). 0 tokens when it does not apply.
inline int tc_tile_tokens(bool bf16, int group, int hd, int warps) {
  if (!bf16 || (hd != 64 && hd != 128) || group > 16 * warps) return 0;
  return 16 * warps / group;
}
inline size_t tc_shared_bytes(int hd) { return 2 * 64 * (size_t)(hd + 8) * 2 + 64 * 4; }
