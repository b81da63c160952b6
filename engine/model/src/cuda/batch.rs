//! The forward batch flattened for the kernels: one row per token (its id, position and KV slot),
//! each sequence's block table padded to the longest, the rows whose logits come back, and the
//! image embedding rows that replace placeholder tokens.

use crate::backend::ForwardBatch;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// Per-forward metadata: the flattened batch as the kernels take it.
#[derive(Debug)]
pub(super) struct Flat {
    pub(super) tokens: Vec<u32>,
    pub(super) positions: Vec<i32>,
    pub(super) tok_seq: Vec<i32>,
    pub(super) slots: Vec<i64>,
    pub(super) tables: Vec<i32>,
    pub(super) max_blocks: usize,
    pub(super) max_ctx: usize,
    pub(super) logit_rows: Vec<i32>,
    /// For each logit row, the index of its chunk in the batch.
    pub(super) logit_chunks: Vec<usize>,
    /// Each chunk's first row and number of tokens.
    pub(super) chunks: Vec<(usize, usize)>,
    /// (flattened row, f32 embedding row) for image placeholders.
    pub(super) embed_rows: Vec<i32>,
    pub(super) embed_data: Vec<f32>,
}

pub(super) fn flatten(batch: &ForwardBatch, c: &ModelConfig, bs: usize) -> Result<Flat> {
    let h = c.hidden_size;
    let max_blocks = batch.chunks.iter().map(|ch| ch.block_table.len()).max().unwrap_or(0).max(1);
    let mut f = Flat {
        tokens: Vec::new(),
        positions: Vec::new(),
        tok_seq: Vec::new(),
        slots: Vec::new(),
        tables: vec![0; batch.chunks.len() * max_blocks],
        max_blocks,
        max_ctx: 1,
        logit_rows: Vec::new(),
        logit_chunks: Vec::new(),
        chunks: Vec::new(),
        embed_rows: Vec::new(),
        embed_data: Vec::new(),
    };
    for (ci, ch) in batch.chunks.iter().enumerate() {
        f.tables[ci * max_blocks..ci * max_blocks + ch.block_table.len()]
            .iter_mut()
            .zip(&ch.block_table)
            .for_each(|(d, &b)| *d = b as i32);
        f.chunks.push((f.tokens.len(), ch.tokens.len()));
        for (j, &tok) in ch.tokens.iter().enumerate() {
            if tok as usize >= c.vocab_size {
                return Err(ModelError::Backend(format!("token id {tok} outside the vocabulary")));
            }
            let pos = ch.start_pos + j;
            let block = *ch.block_table.get(pos / bs).ok_or_else(|| {
                ModelError::Backend(format!("position {pos} is past the block table ({} blocks)", ch.block_table.len()))
            })?;
            for (img_start, e) in &ch.embeds {
                let rows = e.len() / h;
                if pos >= *img_start && pos < img_start + rows {
                    let r = pos - img_start;
                    f.embed_rows.push(f.tokens.len() as i32);
                    f.embed_data.extend_from_slice(&e[r * h..(r + 1) * h]);
                }
            }
            f.tokens.push(tok);
            f.positions.push(pos as i32);
            f.tok_seq.push(ci as i32);
            f.slots.push(block as i64 * bs as i64 + (pos % bs) as i64);
            f.max_ctx = f.max_ctx.max(pos + 1);
        }
        if ch.want_logits && !ch.tokens.is_empty() {
            f.logit_rows.push(f.tokens.len() as i32 - 1);
            f.logit_chunks.push(ci);
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BlockId;
    use crate::backend::SeqChunk;
    use std::sync::Arc;

    fn chunk(tokens: Vec<u32>, start_pos: usize, table: Vec<BlockId>, want_logits: bool) -> SeqChunk {
        SeqChunk { tokens, start_pos, block_table: table, want_logits, embeds: Vec::new() }
    }

    #[test]
    fn a_batch_flattens_to_slots_tables_and_logit_rows() {
        let c = ModelConfig::preset("tiny").unwrap();
        let mut image = chunk(vec![1, 2, 2, 5], 0, vec![7], false);
        image.embeds.push((1, Arc::new(vec![0.5; 2 * c.hidden_size])));
        let batch = ForwardBatch {
            copies: Vec::new(),
            chunks: vec![chunk(vec![10, 11, 12], 15, vec![3, 9], true), chunk(vec![20], 4, vec![6], true), image],
        };
        let f = flatten(&batch, &c, 16).unwrap();
        assert_eq!(f.tokens, vec![10, 11, 12, 20, 1, 2, 2, 5]);
        assert_eq!(f.positions, vec![15, 16, 17, 4, 0, 1, 2, 3]);
        assert_eq!(
            f.slots,
            vec![3 * 16 + 15, 9 * 16, 9 * 16 + 1, 6 * 16 + 4, 7 * 16, 7 * 16 + 1, 7 * 16 + 2, 7 * 16 + 3]
        );
        assert_eq!(f.tok_seq, vec![0, 0, 0, 1, 2, 2, 2, 2]);
        assert_eq!((f.max_blocks, f.max_ctx), (2, 18));
        assert_eq!(f.tables, vec![3, 9, 6, 0, 7, 0]);
        assert_eq!(f.logit_rows, vec![2, 3]);
        assert_eq!(f.logit_chunks, vec![0, 1]);
        assert_eq!(f.chunks, vec![(0, 3), (3, 1), (4, 4)]);
        assert_eq!(f.embed_rows, vec![5, 6]);
        assert_eq!(f.embed_data.len(), 2 * c.hidden_size);
    }

    #[test]
    fn bad_batches_are_errors_not_panics() {
        let c = ModelConfig::preset("tiny").unwrap();
        let past_table = ForwardBatch { copies: Vec::new(), chunks: vec![chunk(vec![1, 2], 15, vec![0], true)] };
        assert!(flatten(&past_table, &c, 16).unwrap_err().to_string().contains("past the block table"));
        let bad_token = ForwardBatch { copies: Vec::new(), chunks: vec![chunk(vec![100_000], 0, vec![0], true)] };
        assert!(flatten(&bad_token, &c, 16).unwrap_err().to_string().contains("outside the vocabulary"));
    }
}
