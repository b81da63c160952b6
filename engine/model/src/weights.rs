//! Model weights: seeded from a preset, or loaded from (and saved to) a directory in the Hugging
//! Face Llama layout (`config.json` and `*.safetensors`).
//!
//! Every tensor is listed once in [`tensor_specs`], in a fixed order; seeding, loading, saving and
//! the backends' views all walk that list, so a tensor cannot be known to one and missing from another.

use std::collections::BTreeMap;
use std::path::Path;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use safetensors::{Dtype, SafeTensors};

use super::config::ModelConfig;
use crate::error::{ModelError, Result};

/// Per-layer tensor suffixes, in the order of [`tensor_specs`].
pub const LAYER_TENSORS: [&str; 9] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

/// Every tensor's Hugging Face name and shape ([out, in] for projections), in a fixed order.
pub fn tensor_specs(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, q, kv, i) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let mut specs = vec![("model.embed_tokens.weight".to_string(), vec![c.vocab_size, h])];
    for l in 0..c.num_hidden_layers {
        let shapes =
            [vec![h], vec![q, h], vec![kv, h], vec![kv, h], vec![h, q], vec![h], vec![i, h], vec![i, h], vec![h, i]];
        for (suffix, shape) in LAYER_TENSORS.iter().zip(shapes) {
            specs.push((format!("model.layers.{l}.{suffix}"), shape));
        }
    }
    specs.push(("model.norm.weight".to_string(), vec![h]));
    specs.push(("lm_head.weight".to_string(), vec![c.vocab_size, h]));
    if let Some(v) = &c.vision {
        let (vh, vi, merged) = (v.hidden_size, v.intermediate_size, v.spatial_merge * v.spatial_merge * v.hidden_size);
        specs.push(("visual.patch_embed.weight".to_string(), vec![vh, 3 * v.patch_size * v.patch_size]));
        for l in 0..v.num_layers {
            let shapes = [vec![vh], vec![3 * vh, vh], vec![vh, vh], vec![vh], vec![vi, vh], vec![vh, vi]];
            for (suffix, shape) in VISION_BLOCK_TENSORS.iter().zip(shapes) {
                specs.push((format!("visual.blocks.{l}.{suffix}"), shape));
            }
        }
        specs.push(("visual.merger.ln_q.weight".to_string(), vec![vh]));
        specs.push(("visual.merger.mlp.0.weight".to_string(), vec![merged, merged]));
        specs.push(("visual.merger.mlp.2.weight".to_string(), vec![h, merged]));
    }
    specs
}

/// Per-block tensor suffixes of the vision encoder, in the order of [`tensor_specs`].
pub const VISION_BLOCK_TENSORS: [&str; 6] =
    ["norm1.weight", "attn.qkv.weight", "attn.proj.weight", "norm2.weight", "mlp.fc1.weight", "mlp.fc2.weight"];

/// Where a model's weights come from.
#[derive(Debug, Clone, PartialEq)]
pub enum WeightSource {
    /// A named preset with weights drawn from `seed`.
    Preset { name: String, seed: u64 },
    /// A directory with config.json and *.safetensors.
    Dir(std::path::PathBuf),
}

impl WeightSource {
    pub fn load(&self) -> Result<ModelWeights> {
        match self {
            WeightSource::Preset { name, seed } => Ok(ModelWeights::seeded(ModelConfig::preset(name)?, *seed)),
            WeightSource::Dir(dir) => ModelWeights::load_dir(dir),
        }
    }

    pub fn config(&self) -> Result<ModelConfig> {
        match self {
            WeightSource::Preset { name, .. } => ModelConfig::preset(name),
            WeightSource::Dir(dir) => {
                let p = dir.join("config.json");
                let text =
                    std::fs::read_to_string(&p).map_err(|e| ModelError::Weights(format!("{}: {e}", p.display())))?;
                ModelConfig::from_hf_json(&text)
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub config: ModelConfig,
    /// In [`tensor_specs`] order, f32, row-major.
    tensors: Vec<Vec<f32>>,
}

/// One decoder layer's tensors.
pub struct LayerView<'a> {
    pub attn_norm: &'a [f32],
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub o: &'a [f32],
    pub mlp_norm: &'a [f32],
    pub gate: &'a [f32],
    pub up: &'a [f32],
    pub down: &'a [f32],
}

/// The vision encoder's tensors.
pub struct VisionView<'a> {
    pub patch_embed: &'a [f32],
    blocks: &'a [Vec<f32>],
    pub merger_norm: &'a [f32],
    pub merger_fc1: &'a [f32],
    pub merger_fc2: &'a [f32],
}

/// One vision block's tensors.
pub struct VisionBlock<'a> {
    pub norm1: &'a [f32],
    pub qkv: &'a [f32],
    pub proj: &'a [f32],
    pub norm2: &'a [f32],
    pub fc1: &'a [f32],
    pub fc2: &'a [f32],
}

impl<'a> VisionView<'a> {
    pub fn block(&self, l: usize) -> VisionBlock<'a> {
        let t = &self.blocks[l * VISION_BLOCK_TENSORS.len()..];
        VisionBlock { norm1: &t[0], qkv: &t[1], proj: &t[2], norm2: &t[3], fc1: &t[4], fc2: &t[5] }
    }
}

fn name_seed(seed: u64, name: &str) -> u64 {
    crate::stable_hash::StableHasher::new().u64(seed).str(name).finish()
}

impl ModelWeights {
    /// Weights drawn from `seed`: projections uniform in ±1/sqrt(fan_in), norms 1, embeddings ±1.
    pub fn seeded(config: ModelConfig, seed: u64) -> ModelWeights {
        let tensors = tensor_specs(&config)
            .into_iter()
            .map(|(name, shape)| {
                let n: usize = shape.iter().product();
                if shape.len() == 1 {
                    return vec![1.0; n];
                }
                let scale = if name.contains("embed_tokens") { 1.0 } else { 1.0 / (shape[1] as f32).sqrt() };
                let mut rng = ChaCha8Rng::seed_from_u64(name_seed(seed, &name));
                (0..n).map(|_| ((rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale).collect()
            })
            .collect();
        ModelWeights { config, tensors }
    }

    pub fn embed(&self) -> &[f32] {
        &self.tensors[0]
    }

    pub fn layer(&self, l: usize) -> LayerView<'_> {
        let t = &self.tensors[1 + l * LAYER_TENSORS.len()..];
        LayerView {
            attn_norm: &t[0],
            q: &t[1],
            k: &t[2],
            v: &t[3],
            o: &t[4],
            mlp_norm: &t[5],
            gate: &t[6],
            up: &t[7],
            down: &t[8],
        }
    }

    pub fn final_norm(&self) -> &[f32] {
        &self.tensors[1 + self.config.num_hidden_layers * LAYER_TENSORS.len()]
    }

    pub fn lm_head(&self) -> &[f32] {
        &self.tensors[2 + self.config.num_hidden_layers * LAYER_TENSORS.len()]
    }

    /// The vision encoder's tensors. Panics on a model without one (callers check the config).
    pub fn vision(&self) -> VisionView<'_> {
        let v = self.config.vision.as_ref().expect("model has no vision encoder");
        let start = 3 + self.config.num_hidden_layers * LAYER_TENSORS.len();
        let t = &self.tensors[start..];
        let merger = 1 + v.num_layers * VISION_BLOCK_TENSORS.len();
        VisionView {
            patch_embed: &t[0],
            blocks: &t[1..merger],
            merger_norm: &t[merger],
            merger_fc1: &t[merger + 1],
            merger_fc2: &t[merger + 2],
        }
    }

    pub fn bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.len() * 4).sum()
    }

    /// Every tensor with its name and shape, in spec order.
    pub fn named(&self) -> impl Iterator<Item = (String, Vec<usize>, &[f32])> {
        tensor_specs(&self.config).into_iter().zip(&self.tensors).map(|((n, s), t)| (n, s, t.as_slice()))
    }

    /// Writes `config.json` and `model.safetensors` (f32) into `dir`, creating it.
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        let io = |e: std::io::Error| ModelError::Weights(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::write(dir.join("config.json"), self.config.to_hf_json()).map_err(io)?;
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
            self.named().map(|(n, s, t)| (n, s, t.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
            .iter()
            .map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).expect("view")))
            .collect();
        let mut meta = std::collections::HashMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let out =
            safetensors::serialize(views, Some(meta)).map_err(|e| ModelError::Weights(format!("serialize: {e}")))?;
        std::fs::write(dir.join("model.safetensors"), out).map_err(io)
    }

    /// Loads `config.json` and every `*.safetensors` of `dir` (f32, bf16 or f16, converted to f32).
    /// A missing tensor or a wrong shape is an error naming the tensor and both shapes.
    pub fn load_dir(dir: &Path) -> Result<ModelWeights> {
        let config = WeightSource::Dir(dir.to_path_buf()).config()?;
        let entries = std::fs::read_dir(dir).map_err(|e| ModelError::Weights(format!("{}: {e}", dir.display())))?;
        let mut files: Vec<_> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::Weights(format!("{}: no *.safetensors file", dir.display())));
        }
        let mut found: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
        for f in &files {
            let bytes = std::fs::read(f).map_err(|e| ModelError::Weights(format!("{}: {e}", f.display())))?;
            let st =
                SafeTensors::deserialize(&bytes).map_err(|e| ModelError::Weights(format!("{}: {e}", f.display())))?;
            for (name, view) in st.tensors() {
                let data = to_f32(view.dtype(), view.data())
                    .map_err(|m| ModelError::Weights(format!("{}: tensor {name}: {m}", f.display())))?;
                found.insert(name, (view.shape().to_vec(), data));
            }
        }
        let mut tensors = Vec::new();
        for (name, shape) in tensor_specs(&config) {
            let (got_shape, data) = found.remove(&name).ok_or_else(|| {
                ModelError::Weights(format!("{}: missing tensor {name} (expected shape {shape:?})", dir.display()))
            })?;
            if got_shape != shape {
                return Err(ModelError::Weights(format!(
                    "{}: tensor {name} has shape {got_shape:?}, expected {shape:?}",
                    dir.display()
                )));
            }
            tensors.push(data);
        }
        Ok(ModelWeights { config, tensors })
    }
}

fn to_f32(dtype: Dtype, data: &[u8]) -> std::result::Result<Vec<f32>, String> {
    match dtype {
        Dtype::F32 => Ok(data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()),
        Dtype::BF16 => Ok(data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()),
        Dtype::F16 => Ok(data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()),
        other => Err(format!("unsupported dtype {other:?} (f32, bf16, f16)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("plateau-weights-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn save_and_load_round_trip() {
        let w = ModelWeights::seeded(ModelConfig::preset("tiny").unwrap(), 3);
        let d = tmp("rt");
        w.save_dir(&d).unwrap();
        let back = ModelWeights::load_dir(&d).unwrap();
        assert_eq!(back.config, w.config);
        assert_eq!(back.tensors, w.tensors);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn missing_tensor_and_wrong_shape_are_named() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let d = tmp("bad");
        let mut w = ModelWeights::seeded(cfg.clone(), 1);
        // Wrong shape: a config that says hidden 64 with a q_proj of another size.
        let idx = 2; // layer 0 q_proj
        w.tensors[idx].truncate(64 * 32);
        let mut specs = tensor_specs(&cfg);
        specs[idx].1 = vec![32, 64];
        let bytes: Vec<Vec<u8>> = w.tensors.iter().map(|t| t.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
        let views: Vec<_> = specs
            .iter()
            .zip(&bytes)
            .map(|((n, s), b)| (n.clone(), safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
            .collect();
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("config.json"), cfg.to_hf_json()).unwrap();
        std::fs::write(d.join("model.safetensors"), safetensors::serialize(views.clone(), None).unwrap()).unwrap();
        let e = ModelWeights::load_dir(&d).unwrap_err().to_string();
        assert!(
            e.contains("model.layers.0.self_attn.q_proj.weight") && e.contains("[32, 64]") && e.contains("[64, 64]"),
            "{e}"
        );
        // Missing tensor.
        std::fs::write(d.join("model.safetensors"), safetensors::serialize(views[5..].to_vec(), None).unwrap())
            .unwrap();
        let e = ModelWeights::load_dir(&d).unwrap_err().to_string();
        assert!(e.contains("missing tensor model.embed_tokens.weight"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
