//! The OpenAI-compatible request bodies `plateau serve` takes and the responses it writes.
//!
//! `/v1/completions` takes a prompt as text or as token ids; `/v1/chat/completions` takes messages
//! whose content is text or parts (text and `image_url` parts with base64 `data:` URLs; the server
//! fetches nothing). There is no chat template: the user messages' parts are joined in order, each
//! image standing where its part is. The tokenizer is the engine's byte tokenizer, so a stop string
//! is one character. Unknown fields are accepted and ignored, as OpenAI-compatible servers do.

use base64::Engine as _;
use plateau_engine::tokenizer::{self, BOS, BYTE_OFFSET, IMAGE_PAD};
use plateau_engine::{ImageInput, Request, SamplingParams};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The sampling fields both endpoints share (OpenAI's, and vLLM's `top_k`, `ignore_eos`).
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub n: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub stop: Option<Stop>,
    pub seed: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub ignore_eos: bool,
}

#[derive(Debug, Deserialize)]
pub struct CompletionBody {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Debug, Deserialize)]
pub struct ChatBody {
    pub messages: Vec<Message>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Content,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Debug, Deserialize)]
pub struct ImageUrl {
    pub url: String,
}

impl Sampling {
    /// The engine's sampling parameters (its defaults where the body is silent: n 1, temperature 1,
    /// top_p 1, 16 tokens). A stop string longer than one character is refused: the byte tokenizer
    /// stops on single tokens.
    pub fn params(&self) -> Result<SamplingParams, String> {
        let stops: Vec<&String> = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v.iter().collect(),
        };
        let mut stop_token_ids = Vec::with_capacity(stops.len());
        for s in stops {
            match s.as_bytes() {
                [b] => stop_token_ids.push(BYTE_OFFSET + *b as u32),
                _ => return Err(format!("stop: {s:?}: plateau serve stops on single characters (a byte tokenizer)")),
            }
        }
        let d = SamplingParams::default();
        Ok(SamplingParams {
            n: self.n.unwrap_or(d.n),
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            // vLLM's -1 (and any negative) means all candidates, as the engine's 0 does.
            top_k: self.top_k.map(|k| k.clamp(0, u32::MAX as i64) as u32).unwrap_or(d.top_k),
            max_tokens: self.max_tokens.or(self.max_completion_tokens).unwrap_or(d.max_tokens),
            stop_token_ids,
            ignore_eos: self.ignore_eos,
            seed: self.seed,
        })
    }
}

impl CompletionBody {
    pub fn request(&self) -> Result<Request, String> {
        let prompt = match &self.prompt {
            Prompt::Text(t) if t.is_empty() => Vec::new(),
            Prompt::Text(t) => tokenizer::encode(t),
            Prompt::Tokens(ids) => ids.clone(),
        };
        Ok(Request { id: 0, prompt, params: self.sampling.params()?, images: Vec::new() })
    }
}

impl ChatBody {
    pub fn request(&self) -> Result<Request, String> {
        let mut prompt = vec![BOS];
        let mut images = Vec::new();
        for (i, m) in self.messages.iter().enumerate() {
            if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
                return Err(format!("messages[{i}].role: {:?} is not system, user or assistant", m.role));
            }
            match &m.content {
                Content::Text(t) => prompt.extend(&tokenizer::encode(t)[1..]),
                Content::Parts(parts) => {
                    for (j, p) in parts.iter().enumerate() {
                        match p {
                            Part::Text { text } => prompt.extend(&tokenizer::encode(text)[1..]),
                            Part::ImageUrl { image_url } => {
                                let bytes = data_url(&image_url.url)
                                    .map_err(|e| format!("messages[{i}].content[{j}].image_url: {e}"))?;
                                images.push(ImageInput::Encoded(bytes));
                                prompt.push(IMAGE_PAD);
                            }
                        }
                    }
                }
            }
        }
        Ok(Request { id: 0, prompt, params: self.sampling.params()?, images })
    }
}

/// The bytes of a base64 `data:` URL.
fn data_url(url: &str) -> Result<Vec<u8>, String> {
    let rest = url.strip_prefix("data:").ok_or("only data: URLs are taken (plateau serve fetches nothing)")?;
    let (meta, data) = rest.split_once(',').ok_or("a data: URL without a comma")?;
    if !meta.ends_with(";base64") {
        return Err("a data: URL that is not base64".into());
    }
    base64::engine::general_purpose::STANDARD.decode(data.trim()).map_err(|e| format!("base64: {e}"))
}

/// OpenAI's name for how a sequence ended.
pub fn finish_reason(f: plateau_engine::request::FinishReason) -> &'static str {
    use plateau_engine::request::FinishReason::*;
    match f {
        Stopped => "stop",
        Length => "length",
        Aborted => "abort",
        Error => "error",
    }
}

/// Which endpoint a response is for: the shape of its choices differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    /// One choice of a streamed chunk.
    pub fn chunk(self, id: &str, model: &str, index: u32, text: &str, finish: Option<&str>) -> Value {
        match self {
            Endpoint::Completions => json!({
                "id": id, "object": "text_completion", "model": model,
                "choices": [{"index": index, "text": text, "finish_reason": finish}],
            }),
            Endpoint::Chat => json!({
                "id": id, "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": index, "delta": {"content": text}, "finish_reason": finish}],
            }),
        }
    }

    /// The whole response of a request that was not streamed.
    pub fn response(self, id: &str, model: &str, out: &plateau_engine::RequestOutput) -> Value {
        let choices: Vec<Value> = out
            .seqs
            .iter()
            .map(|s| {
                let text = tokenizer::decode(&s.tokens);
                let reason = finish_reason(s.finish);
                match self {
                    Endpoint::Completions => json!({"index": s.index, "text": text, "finish_reason": reason}),
                    Endpoint::Chat => json!({
                        "index": s.index, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                    }),
                }
            })
            .collect();
        let completion: usize = out.seqs.iter().map(|s| s.tokens.len()).sum();
        let object = if self == Endpoint::Chat { "chat.completion" } else { "text_completion" };
        json!({
            "id": id, "object": object, "model": model, "choices": choices,
            "usage": {
                "prompt_tokens": out.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": out.prompt_tokens as usize + completion,
            },
        })
    }
}

/// An OpenAI-style error body.
pub fn error_body(message: &str, kind: &str) -> Value {
    json!({"error": {"message": message, "type": kind}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_single_characters() {
        let s = Sampling { stop: Some(Stop::Many(vec![".".into(), "\n".into()])), ..Sampling::default() };
        assert_eq!(s.params().unwrap().stop_token_ids, vec![BYTE_OFFSET + b'.' as u32, BYTE_OFFSET + b'\n' as u32]);
        let s = Sampling { stop: Some(Stop::One("end".into())), ..Sampling::default() };
        assert!(s.params().unwrap_err().contains("single characters"));
    }

    #[test]
    fn chat_parts_keep_their_order() {
        let png = base64::engine::general_purpose::STANDARD.encode([1u8, 2, 3]);
        let body: ChatBody = serde_json::from_value(json!({
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{png}")}},
                {"type": "text", "text": "b"},
            ]}],
            "max_tokens": 3,
        }))
        .unwrap();
        let r = body.request().unwrap();
        assert_eq!(r.prompt, vec![BOS, BYTE_OFFSET + b'a' as u32, IMAGE_PAD, BYTE_OFFSET + b'b' as u32]);
        assert_eq!(r.images, vec![ImageInput::Encoded(vec![1, 2, 3])]);
        assert_eq!(r.params.max_tokens, 3);
    }

    #[test]
    fn remote_images_are_refused() {
        assert!(data_url("http://example.com/a.png").unwrap_err().contains("fetches nothing"));
    }
}
