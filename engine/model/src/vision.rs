//! The vision encoder (CPU): patchify, patch embedding, a few bidirectional transformer layers,
//! merging each 2x2 group of neighbouring patches, and a projection to the language model's width.
//! Its outputs replace the embeddings of an image's placeholder positions.
//!
//! Patches are laid out merge-group by merge-group (the four patches of a 2x2 group are
//! consecutive), so merging is a reshape.

use crate::config::{ModelConfig, VisionConfig};
use crate::layers::{linear, rms_norm};
use crate::weights::ModelWeights;

/// A processed image: normalised RGB (HWC, values in [-1, 1]) on the encoder's grid.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelTensor {
    pub width: u32,
    pub height: u32,
    pub values: Vec<f32>,
    /// Content hash of the processed pixels: the encoder cache key and the prefix-cache extra key.
    pub hash: u64,
}

impl PixelTensor {
    pub fn bytes(&self) -> usize {
        self.values.len() * 4
    }
}

/// Embedding rows the encoder produces for a `width` x `height` image on its grid.
pub fn num_tokens(v: &VisionConfig, width: u32, height: u32) -> usize {
    let cell = (v.patch_size * v.spatial_merge) as u32;
    ((width / cell) * (height / cell)) as usize
}

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// Encodes one image into `num_tokens` rows of the language model's hidden size.
pub fn encode(cfg: &ModelConfig, w: &ModelWeights, px: &PixelTensor) -> Vec<f32> {
    let v = cfg.vision.as_ref().expect("encode on a model without a vision encoder");
    let (p, m, vh) = (v.patch_size, v.spatial_merge, v.hidden_size);
    let (gw, gh) = (px.width as usize / p, px.height as usize / p);
    assert!(gw % m == 0 && gh % m == 0, "image not on the encoder's grid");
    let n = gw * gh;
    let pdim = 3 * p * p;
    let (patches, rows) = patchify(px, p, m);
    let vw = w.vision();
    let mut x = linear(&patches, vw.patch_embed, n, pdim, vh);
    // Fixed 2-D sinusoidal positions: the first half of the width from the row, the rest the column.
    let half = vh / 2;
    for (i, &(r, c)) in rows.iter().enumerate() {
        for k in 0..half {
            let freq = 1.0 / 10000f32.powf((2 * (k / 2)) as f32 / half as f32);
            let (pos_r, pos_c) = (r as f32 * freq, c as f32 * freq);
            x[i * vh + k] += if k % 2 == 0 { pos_r.sin() } else { pos_r.cos() };
            x[i * vh + half + k] += if k % 2 == 0 { pos_c.sin() } else { pos_c.cos() };
        }
    }
    let heads = v.num_heads;
    let hd = vh / heads;
    let scale = 1.0 / (hd as f32).sqrt();
    for l in 0..v.num_layers {
        let b = vw.block(l);
        let hn = rms_norm(&x, b.norm1, 1e-6);
        let qkv = linear(&hn, b.qkv, n, vh, 3 * vh);
        let mut attn = vec![0.0f32; n * vh];
        let mut scores = vec![0.0f32; n * n];
        for h in 0..heads {
            // scores = Q_h K_h^T, straight from the strided qkv rows.
            // SAFETY: every index the strides reach stays inside qkv (n rows of 3*vh) and scores (n*n).
            unsafe {
                matrixmultiply::sgemm(
                    n,
                    hd,
                    n,
                    scale,
                    qkv.as_ptr().add(h * hd),
                    (3 * vh) as isize,
                    1,
                    qkv.as_ptr().add(vh + h * hd),
                    1,
                    (3 * vh) as isize,
                    0.0,
                    scores.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
            for row in scores.chunks_exact_mut(n) {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                for s in row.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                row.iter_mut().for_each(|s| *s /= sum);
            }
            // SAFETY: as above; the output rows are n of vh floats, written at column h*hd.
            unsafe {
                matrixmultiply::sgemm(
                    n,
                    n,
                    hd,
                    1.0,
                    scores.as_ptr(),
                    n as isize,
                    1,
                    qkv.as_ptr().add(2 * vh + h * hd),
                    (3 * vh) as isize,
                    1,
                    0.0,
                    attn.as_mut_ptr().add(h * hd),
                    vh as isize,
                    1,
                );
            }
        }
        let o = linear(&attn, b.proj, n, vh, vh);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let hn = rms_norm(&x, b.norm2, 1e-6);
        let mut f = linear(&hn, b.fc1, n, vh, v.intermediate_size);
        f.iter_mut().for_each(|a| *a = gelu(*a));
        let d = linear(&f, b.fc2, n, v.intermediate_size, vh);
        x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
    }
    let merged_in = m * m * vh;
    let groups = n / (m * m);
    let hn = rms_norm(&x, vw.merger_norm, 1e-6);
    let mut g = linear(&hn, vw.merger_fc1, groups, merged_in, merged_in);
    g.iter_mut().for_each(|a| *a = gelu(*a));
    linear(&g, vw.merger_fc2, groups, merged_in, cfg.hidden_size)
}

/// The image's patches in merge-group order (each `3 * p * p` values, channel-major), and each
/// patch's (row, column) on the patch grid.
fn patchify(px: &PixelTensor, p: usize, m: usize) -> (Vec<f32>, Vec<(usize, usize)>) {
    let (gw, gh) = (px.width as usize / p, px.height as usize / p);
    let n = gw * gh;
    let pdim = 3 * p * p;
    let mut patches = Vec::with_capacity(n * pdim);
    let mut rows = Vec::with_capacity(n);
    for gy in 0..gh / m {
        for gx in 0..gw / m {
            for dy in 0..m {
                for dx in 0..m {
                    let (py, pxx) = (gy * m + dy, gx * m + dx);
                    rows.push((py, pxx));
                    for c in 0..3 {
                        for yy in 0..p {
                            for xx in 0..p {
                                let (y, x) = (py * p + yy, pxx * p + xx);
                                patches.push(px.values[(y * px.width as usize + x) * 3 + c]);
                            }
                        }
                    }
                }
            }
        }
    }
    (patches, rows)
}
