//! The shape of a Llama-style decoder, named presets, and the Hugging Face `config.json` fields.

use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::vocab::MIN_VOCAB;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    /// The vision encoder, for models that take images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionConfig>,
}

/// The vision encoder's shape (Qwen2-VL style: patches, transformer blocks, 2x2 merge).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub patch_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    /// Neighbouring patches merged per side (2: each output token covers 2x2 patches).
    pub spatial_merge: usize,
}

impl VisionConfig {
    /// Image sides must be multiples of this.
    pub fn grid_factor(&self) -> u32 {
        (self.patch_size * self.spatial_merge) as u32
    }
}

/// The presets, by name, with a one-line description each.
pub const PRESETS: [(&str, &str); 4] = [
    ("tiny", "2 layers, hidden 64: tests, CI and the default soak"),
    ("tiny-vl", "tiny with a 2-block vision encoder (patch 14, 2x2 merge): images"),
    ("small", "4 layers, hidden 256: a heavier CPU soak"),
    ("tinyllama-1.1b", "TinyLlama-1.1B's shape (22 layers, hidden 2048, GQA 32/4): GPU runs"),
];

impl ModelConfig {
    pub fn preset(name: &str) -> Result<ModelConfig> {
        let c = |vocab, hidden, layers, heads, kv, hd, inter, maxpos| ModelConfig {
            vocab_size: vocab,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim: hd,
            intermediate_size: inter,
            max_position_embeddings: maxpos,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            vision: None,
        };
        match name {
            "tiny" => Ok(c(320, 64, 2, 4, 2, 16, 160, 2048)),
            "tiny-vl" => Ok(ModelConfig {
                vision: Some(VisionConfig {
                    patch_size: 14,
                    hidden_size: 64,
                    num_layers: 2,
                    num_heads: 4,
                    intermediate_size: 128,
                    spatial_merge: 2,
                }),
                ..c(320, 64, 2, 4, 2, 16, 160, 2048)
            }),
            "small" => Ok(c(512, 256, 4, 8, 2, 32, 688, 4096)),
            "tinyllama-1.1b" => Ok(c(32000, 2048, 22, 32, 4, 64, 5632, 2048)),
            _ => {
                let known: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
                Err(ModelError::Config(format!("unknown model preset `{name}`; known: {}", known.join(", "))))
            }
        }
    }

    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Bytes of K and V for one token across all layers, in f32.
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.num_hidden_layers * self.kv_dim() * 4
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.vocab_size < MIN_VOCAB {
            return bad(format!("vocab_size {} is below the byte tokenizer's {MIN_VOCAB}", self.vocab_size));
        }
        if self.hidden_size == 0 || self.num_hidden_layers == 0 || self.intermediate_size == 0 {
            return bad("hidden_size, num_hidden_layers and intermediate_size must be positive".into());
        }
        if self.num_key_value_heads == 0 || self.num_attention_heads % self.num_key_value_heads != 0 {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return bad(format!("head_dim {} must be even and positive", self.head_dim));
        }
        if let Some(v) = &self.vision {
            if v.patch_size == 0 || v.spatial_merge == 0 || v.num_layers == 0 || v.intermediate_size == 0 {
                return bad(
                    "vision_config: patch_size, spatial_merge, num_layers and intermediate_size must be positive"
                        .into(),
                );
            }
            if v.num_heads == 0 || v.hidden_size % v.num_heads != 0 || v.hidden_size % 4 != 0 {
                return bad(format!(
                    "vision_config: hidden_size {} must be a multiple of 4 and of num_heads {}",
                    v.hidden_size, v.num_heads
                ));
            }
        }
        Ok(())
    }

    /// Reads a Hugging Face Llama `config.json`.
    pub fn from_hf_json(text: &str) -> Result<ModelConfig> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ModelError::Weights(format!("config.json: {e}")))?;
        let get = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| ModelError::Weights(format!("config.json: missing or non-integer field `{k}`")))
        };
        unsupported(&v)?;
        let heads = get("num_attention_heads")?;
        if heads == 0 {
            return Err(ModelError::Weights("config.json: num_attention_heads must be at least 1".into()));
        }
        let hidden = get("hidden_size")?;
        let cfg = ModelConfig {
            vocab_size: get("vocab_size")?,
            hidden_size: hidden,
            num_hidden_layers: get("num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: get("num_key_value_heads").unwrap_or(heads),
            head_dim: get("head_dim").unwrap_or(hidden.checked_div(heads).unwrap_or(0)),
            intermediate_size: get("intermediate_size")?,
            max_position_embeddings: get("max_position_embeddings")?,
            rope_theta: v.get("rope_theta").and_then(|x| x.as_f64()).unwrap_or(10000.0) as f32,
            rms_norm_eps: v.get("rms_norm_eps").and_then(|x| x.as_f64()).unwrap_or(1e-6) as f32,
            vision: match v.get("vision_config") {
                None => None,
                Some(vc) => Some(
                    serde_json::from_value(vc.clone())
                        .map_err(|e| ModelError::Weights(format!("config.json: vision_config: {e}")))?,
                ),
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// A Hugging Face Llama `config.json` that transformers loads.
    pub fn to_hf_json(&self) -> String {
        let v = serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "attention_bias": false,
            "mlp_bias": false,
            "bos_token_id": crate::vocab::BOS,
            "eos_token_id": crate::vocab::EOS,
            "torch_dtype": "float32",
        });
        let mut v = v;
        if let Some(vc) = &self.vision {
            v["vision_config"] = serde_json::to_value(vc).expect("json");
        }
        serde_json::to_string_pretty(&v).expect("json")
    }
}

/// Refuses, by name, what a Llama `config.json` may ask for that this model does not compute:
/// loading it anyway would give wrong logits, not an error.
fn unsupported(v: &serde_json::Value) -> Result<()> {
    let refuse =
        |what: String| Err(ModelError::Weights(format!("config.json: {what} is not implemented by this model")));
    if let Some(rs) = v.get("rope_scaling").filter(|x| !x.is_null()) {
        return refuse(format!("rope_scaling {rs} (scaled RoPE; plain RoPE only)"));
    }
    if let Some(act) = v.get("hidden_act").filter(|x| x.as_str() != Some("silu")) {
        return refuse(format!("hidden_act {act} (SiLU only)"));
    }
    for flag in ["attention_bias", "mlp_bias", "tie_word_embeddings"] {
        if v.get(flag).and_then(|x| x.as_bool()) == Some(true) {
            return refuse(format!("{flag} = true"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ModelConfig;

    #[test]
    fn what_the_model_does_not_compute_is_refused_by_name() {
        let good = ModelConfig::preset("tiny").unwrap().to_hf_json();
        assert_eq!(ModelConfig::from_hf_json(&good).unwrap(), ModelConfig::preset("tiny").unwrap());
        let with = |k: &str, v: serde_json::Value| {
            let mut j: serde_json::Value = serde_json::from_str(&good).unwrap();
            j[k] = v;
            ModelConfig::from_hf_json(&j.to_string()).unwrap_err().to_string()
        };
        assert!(with("rope_scaling", serde_json::json!({"type": "linear", "factor": 2.0})).contains("rope_scaling"));
        assert!(with("hidden_act", "gelu".into()).contains("hidden_act \"gelu\""));
        assert!(with("attention_bias", true.into()).contains("attention_bias = true"));
        assert!(with("num_attention_heads", 0.into()).contains("num_attention_heads must be at least 1"));
        let mut j: serde_json::Value = serde_json::from_str(&good).unwrap();
        j["rope_scaling"] = serde_json::Value::Null;
        assert!(ModelConfig::from_hf_json(&j.to_string()).is_ok(), "a null rope_scaling is plain RoPE");
    }
}
