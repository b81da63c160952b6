//! Attention on the device: the launch plan of a forward pass and its launches (kernels in
//! `attention.cu`).
//!
//! A chunk of one token (a decode step) goes to `attention_decode`: one block per (token, KV head,
//! split of its context), the KV head's GQA group of query heads together so each key and value
//! row is read once; contexts long enough, in a batch too small to fill the device, are cut into
//! splits that `attention_combine` merges (flash-decoding's shape). A longer chunk (a prefill)
//! goes in tiles of query tokens to `attention_prefill_tc_h64`/`_h128` (bf16 heads of 64 or 128
//! dimensions on a device with bf16 tensor cores: `prefill_tc.cu`) or to `attention_prefill`. The plan is a pure function of the batch's
//! shape; the host emulation (`tests/kernels_emulated/plan.hpp`) follows the same rules.

use super::backend::CudaBackend;
use super::batch::Flat;
use super::device::Category;
use super::kernels::{cfg, Arg};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// The most dimensions of a head one decode lane holds (`PLATEAU_LANE_DIMS` in attention.cu: its
/// accumulators live in registers), and the widest GQA group a decode kernel is built for.
const LANE_DIMS: usize = 8;
const MAX_GROUP: usize = 16;
const WARP: usize = 32;
/// Four warps a decode block: 16 positions a round for 64-dimension heads (8 lanes a position).
const DECODE_THREADS: usize = 128;
const PREFILL_THREADS: usize = 256;
/// Four warps of 16 query rows each: a tensor-core prefill block's 64 rows.
const PREFILL_TC_THREADS: usize = 128;
const PREFILL_TC_ROWS: usize = 16 * PREFILL_TC_THREADS / WARP;
/// Key positions a tensor-core prefill block holds at once (`PLATEAU_TC_KEYS`).
const PREFILL_TC_KEYS: usize = 64;
/// Shared memory a block may use without opting in to more (every CUDA device since 2.0).
const SHARED_BYTES_LIMIT: usize = 48 * 1024;
/// Decode blocks the split aims for: four per multiprocessor of an H100 or H200 (132), so a
/// batch of one long context still occupies the device.
const DECODE_TARGET_BLOCKS: usize = 528;
/// The shortest split: below it, merging the splits costs more than the parallelism gives.
const MIN_SPLIT: usize = 128;
/// Key positions a prefill block holds in shared memory at once.
const PREFILL_KEY_TILE: usize = 32;

/// Lanes that share one position in `attention_decode`: the fewest (a power of two) that leave a
/// lane at most LANE_DIMS dimensions, so its accumulators stay in registers and a row's reads are
/// contiguous across the lanes. Errors when a warp cannot hold a head or the group is too wide.
pub(super) fn lanes_per_position(group: usize, hd: usize) -> Result<usize> {
    let mut lp = 1;
    while hd.div_ceil(lp) > LANE_DIMS {
        lp *= 2;
    }
    if group > MAX_GROUP || lp > WARP {
        return Err(ModelError::Backend(format!(
            "decode attention holds at most {MAX_GROUP} query heads a KV head and {} dimensions a head; this model has {group} heads of {hd} dimensions a KV head",
            LANE_DIMS * WARP
        )));
    }
    Ok(lp)
}

/// The decode kernel built for the smallest group bound (1, 2, 4, 8, 16) that holds `group`.
pub(super) fn decode_kernel(group: usize) -> &'static str {
    match group {
        0..=1 => "attention_decode_g1",
        2 => "attention_decode_g2",
        3..=4 => "attention_decode_g4",
        5..=8 => "attention_decode_g8",
        _ => "attention_decode_g16",
    }
}

/// The positions of one split of a decode context: the longest context cut so that `rows` tokens
/// of `nkv` KV heads make about DECODE_TARGET_BLOCKS blocks, never shorter than MIN_SPLIT.
pub(super) fn decode_split_len(rows: usize, nkv: usize, max_ctx: usize) -> usize {
    let want = DECODE_TARGET_BLOCKS.div_ceil((rows * nkv).max(1)).max(1);
    let most = max_ctx.div_ceil(MIN_SPLIT).max(1);
    max_ctx.div_ceil(want.min(most)).max(1)
}

/// attention_decode's dynamic shared memory: the group's scaled queries, the split's block-table
/// entries, and each warp's softmax states for the merge.
pub(super) fn decode_shared_bytes(group: usize, hd: usize, tbl_cap: usize, warps: usize) -> usize {
    4 * (group * hd + tbl_cap + warps * (2 * group + group * hd))
}

/// attention_prefill's dynamic shared memory for tiles of `bq` query tokens and `bk` positions.
pub(super) fn prefill_shared_bytes(group: usize, hd: usize, bq: usize, bk: usize) -> usize {
    let rows = bq * group;
    4 * (2 * rows * hd + 2 * bk * hd + rows * bk + 3 * rows + bk)
}

/// The tensor-core prefill kernel for bf16 heads of `hd` dimensions, where there is one.
fn prefill_tc_kernel(hd: usize) -> Option<&'static str> {
    match hd {
        64 => Some("attention_prefill_tc_h64"),
        128 => Some("attention_prefill_tc_h128"),
        _ => None,
    }
}

/// attention_prefill_tc's shared memory: the K and V tiles in bf16, rows padded by 8, and slots.
pub(super) fn prefill_tc_shared_bytes(hd: usize) -> usize {
    2 * PREFILL_TC_KEYS * (hd + 8) * 2 + PREFILL_TC_KEYS * 4
}

/// The most query tokens a prefill tile takes within the shared-memory limit (of 16, 8, 4, 2, 1).
fn prefill_tile_tokens(group: usize, hd: usize) -> Result<usize> {
    [16, 8, 4, 2, 1]
        .into_iter()
        .find(|&bq| prefill_shared_bytes(group, hd, bq, PREFILL_KEY_TILE) <= SHARED_BYTES_LIMIT)
        .ok_or_else(|| {
            ModelError::Backend(format!(
                "prefill attention over heads of {hd} dimensions, {group} a KV head, needs more than the {SHARED_BYTES_LIMIT} bytes of shared memory a block gets"
            ))
        })
}

/// Where each token's attention is computed in one forward pass, and the launch shapes.
#[derive(Debug, PartialEq)]
pub(super) struct AttentionPlan {
    /// Rows (flattened token indices) of one-token chunks, for attention_decode.
    pub(super) decode_rows: Vec<i32>,
    pub(super) decode_kernel: &'static str,
    pub(super) lanes: usize,
    pub(super) split_len: usize,
    pub(super) splits: usize,
    pub(super) tbl_cap: usize,
    pub(super) decode_shared: usize,
    /// Prefill tiles: each tile's first row and its number of tokens (at most `tile_tokens`).
    pub(super) tile_first: Vec<i32>,
    pub(super) tile_len: Vec<i32>,
    pub(super) tile_tokens: usize,
    pub(super) prefill: Prefill,
}

/// Which prefill kernel a plan launches, with its block and shared memory.
#[derive(Debug, PartialEq)]
pub(super) enum Prefill {
    /// attention_prefill_tc_h*: bf16 on tensor cores.
    TensorCores { kernel: &'static str, shared: usize },
    /// attention_prefill: f32 arithmetic, tiles of `tile_tokens` by PREFILL_KEY_TILE.
    Plain { shared: usize },
}

impl AttentionPlan {
    /// The plan for `f`; `tensor_cores`: the tensor-core prefill applies (bf16 on a device that
    /// has them).
    pub(super) fn new(f: &Flat, c: &ModelConfig, bs: usize, tensor_cores: bool) -> Result<AttentionPlan> {
        let (group, hd) = (c.num_attention_heads / c.num_key_value_heads, c.head_dim);
        let (tile_tokens, prefill) = match prefill_tc_kernel(hd).filter(|_| tensor_cores && group <= PREFILL_TC_ROWS) {
            Some(kernel) => {
                (PREFILL_TC_ROWS / group, Prefill::TensorCores { kernel, shared: prefill_tc_shared_bytes(hd) })
            }
            None => {
                let tokens = prefill_tile_tokens(group, hd)?;
                (tokens, Prefill::Plain { shared: prefill_shared_bytes(group, hd, tokens, PREFILL_KEY_TILE) })
            }
        };
        let mut p = AttentionPlan {
            decode_rows: Vec::new(),
            decode_kernel: decode_kernel(group),
            lanes: lanes_per_position(group, hd)?,
            split_len: 1,
            splits: 1,
            tbl_cap: 0,
            decode_shared: 0,
            tile_first: Vec::new(),
            tile_len: Vec::new(),
            tile_tokens,
            prefill,
        };
        let mut decode_ctx = 1;
        for &(first, len) in &f.chunks {
            if len == 1 {
                p.decode_rows.push(first as i32);
                decode_ctx = decode_ctx.max(f.positions[first] as usize + 1);
                continue;
            }
            for start in (0..len).step_by(tile_tokens) {
                p.tile_first.push((first + start) as i32);
                p.tile_len.push((len - start).min(tile_tokens) as i32);
            }
        }
        p.split_len = decode_split_len(p.decode_rows.len(), c.num_key_value_heads, decode_ctx);
        p.splits = decode_ctx.div_ceil(p.split_len);
        p.tbl_cap = p.split_len.div_ceil(bs) + 1;
        p.decode_shared = decode_shared_bytes(group, hd, p.tbl_cap, DECODE_THREADS / WARP);
        if p.decode_shared > SHARED_BYTES_LIMIT {
            return Err(ModelError::Backend(format!(
                "decode attention over splits of {} positions needs {} bytes of shared memory a block, more than the {SHARED_BYTES_LIMIT} a block gets",
                p.split_len, p.decode_shared
            )));
        }
        Ok(p)
    }
}

/// Device addresses one layer's attention reads and writes.
pub(super) struct AttentionIo {
    /// The fused projection's rows [q | k | v] and their length in values.
    pub(super) qkv: u64,
    pub(super) qkv_stride: usize,
    pub(super) k_cache: u64,
    pub(super) v_cache: u64,
    pub(super) out: u64,
}

/// The plan's metadata on the device (uploaded once a forward pass).
pub(super) struct AttentionMeta {
    pub(super) tok_seq: u64,
    pub(super) positions: u64,
    pub(super) tables: u64,
    pub(super) max_blocks: usize,
    pub(super) decode_rows: u64,
    pub(super) tile_first: u64,
    pub(super) tile_len: u64,
    /// Split states (f32), where the plan has several splits.
    pub(super) part: u64,
}

impl CudaBackend {
    /// Split states' buffer for `plan` (none is needed with one split).
    pub(super) fn split_states(&self, plan: &AttentionPlan) -> Result<Option<super::device::DeviceBuf>> {
        if plan.splits == 1 || plan.decode_rows.is_empty() {
            return Ok(None);
        }
        let c = &self.config;
        let floats = plan.decode_rows.len() * c.num_attention_heads * plan.splits * (2 + c.head_dim);
        Ok(Some(self.alloc.alloc(Category::Workspace, floats * 4, "decode attention's split states")?))
    }

    /// One layer's attention for every token of the pass, by the plan.
    pub(super) fn attention(&self, plan: &AttentionPlan, meta: &AttentionMeta, io: &AttentionIo) -> Result<()> {
        let c = &self.config;
        let (nh, nkv, hd) = (c.num_attention_heads as i32, c.num_key_value_heads as i32, c.head_dim as i32);
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let bs = self.kv_ref()?.block_size as i32;
        let common = |rows: u64| {
            [
                Arg::P(io.qkv),
                Arg::I(io.qkv_stride as i32),
                Arg::P(io.k_cache),
                Arg::P(io.v_cache),
                Arg::P(io.out),
                Arg::P(rows),
            ]
        };
        let shape = [
            Arg::P(meta.tok_seq),
            Arg::P(meta.positions),
            Arg::P(meta.tables),
            Arg::I(meta.max_blocks as i32),
            Arg::I(bs),
            Arg::I(nh),
            Arg::I(nkv),
            Arg::I(hd),
            Arg::F(scale),
        ];
        if !plan.decode_rows.is_empty() {
            let rows = plan.decode_rows.len() as u32;
            let mut args = common(meta.decode_rows).to_vec();
            args.extend(shape);
            args.extend([
                Arg::I(plan.lanes as i32),
                Arg::I(plan.split_len as i32),
                Arg::I(plan.tbl_cap as i32),
                Arg::P(meta.part),
            ]);
            let mut launch = cfg((rows, nkv as u32), DECODE_THREADS as u32, plan.decode_shared as u32);
            launch.grid_dim.2 = plan.splits as u32;
            self.kernels.launch(plan.decode_kernel, self.dtype, launch, &args)?;
            if plan.splits > 1 {
                let args = [
                    Arg::P(meta.part),
                    Arg::P(meta.decode_rows),
                    Arg::P(io.out),
                    Arg::I(nh),
                    Arg::I(hd),
                    Arg::I(plan.splits as i32),
                ];
                self.kernels.launch("attention_combine", self.dtype, cfg((rows, nh as u32), hd as u32, 0), &args)?;
            }
        }
        if !plan.tile_first.is_empty() {
            let mut args = common(meta.tile_first).to_vec();
            args.push(Arg::P(meta.tile_len));
            args.extend(shape);
            let grid = (plan.tile_first.len() as u32, nkv as u32);
            match plan.prefill {
                Prefill::TensorCores { kernel, shared } => {
                    let launch = cfg(grid, PREFILL_TC_THREADS as u32, shared as u32);
                    self.kernels.launch(kernel, self.dtype, launch, &args)?
                }
                Prefill::Plain { shared } => {
                    args.extend([Arg::I(plan.tile_tokens as i32), Arg::I(PREFILL_KEY_TILE as i32)]);
                    let launch = cfg(grid, PREFILL_THREADS as u32, shared as u32);
                    self.kernels.launch("attention_prefill", self.dtype, launch, &args)?
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_holds_at_most_eight_dimensions_and_the_group_picks_its_kernel() {
        // TinyLlama (group 8, 64 dimensions): 8 lanes of 8 dimensions.
        assert_eq!(lanes_per_position(8, 64).unwrap(), 8);
        // Llama-3-70B's shape (group 8, 128 dimensions): 16 lanes.
        assert_eq!(lanes_per_position(8, 128).unwrap(), 16);
        // A group of 3 over 40 dimensions: 5 values a lane, the group-4 kernel.
        assert_eq!(lanes_per_position(3, 40).unwrap(), 8);
        assert_eq!(decode_kernel(3), "attention_decode_g4");
        assert_eq!(decode_kernel(8), "attention_decode_g8");
        let err = lanes_per_position(32, 128).unwrap_err().to_string();
        assert!(err.contains("32 heads of 128"), "{err}");
        assert!(lanes_per_position(8, 512).is_err());
    }

    #[test]
    fn splits_fill_the_device_only_where_the_batch_does_not() {
        // One sequence of 2,048 positions over 4 KV heads: 16 splits of 128.
        assert_eq!(decode_split_len(1, 4, 2048), 128);
        // 64 sequences over 4 KV heads are 256 blocks: three splits of a 2,048 context.
        assert_eq!(decode_split_len(64, 4, 2048), 683);
        // 256 sequences fill the device alone: one split.
        assert_eq!(decode_split_len(256, 4, 2048), 2048);
        // A short context is never cut below MIN_SPLIT.
        assert_eq!(decode_split_len(1, 1, 100), 100);
    }

    #[test]
    fn shared_memory_is_within_the_limit_for_tinyllama_and_refused_past_it() {
        assert_eq!(prefill_tile_tokens(8, 64).unwrap(), 4);
        assert!(prefill_shared_bytes(8, 64, 4, PREFILL_KEY_TILE) <= SHARED_BYTES_LIMIT);
        assert_eq!(prefill_tile_tokens(1, 64).unwrap(), 16);
        assert!(prefill_tile_tokens(16, 512).is_err());
        // Tensor cores: TinyLlama's group of 8 is 8 tokens a tile of 64 rows, in 18.7 KB.
        assert_eq!(prefill_tc_shared_bytes(64), 18_688);
        assert!(prefill_tc_shared_bytes(128) <= SHARED_BYTES_LIMIT);
        assert_eq!(prefill_tc_kernel(128), Some("attention_prefill_tc_h128"));
        assert_eq!(prefill_tc_kernel(80), None);
        // A decode block of TinyLlama with one split of 2,048 positions (129 table entries).
        assert_eq!(decode_shared_bytes(8, 64, 129, 4), 4 * (512 + 129 + 4 * (16 + 512)));
    }
}
