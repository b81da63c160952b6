//! The load generator's client: a scenario's requests as an OpenAI client sends them.
//!
//! Text requests go to `/v1/completions`, requests with images to `/v1/chat/completions` with
//! base64 `data:` URL image parts, each in its place in the prompt. Every request streams (SSE), as
//! production clients do. An abort is what a real client does: it closes the connection, before
//! the first token (a few ms after sending) or after k streamed chunks. Invalid requests expect a
//! 4xx. A 5xx or a refused connection is retried [`RETRIES`] times with doubling backoff, never more:
//! a failing server is not hammered.

use std::time::Duration;

use base64::Engine as _;
use plateau_engine::tokenizer::{BOS, BYTE_OFFSET, IMAGE_PAD};
use plateau_engine::{ImageInput, Request};
use serde_json::{json, Map, Value};

/// Attempts after the first for a request that met a 5xx or a refused connection.
pub const RETRIES: u32 = 3;
/// The first retry's wait; each next one doubles it.
const BACKOFF: Duration = Duration::from_millis(250);

/// What the client does with a request once sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Read it to its end.
    Complete,
    /// Close the connection this many ms after sending, before any token is read.
    CloseBeforeFirstToken { after_ms: u64 },
    /// Close the stream after this many chunks with text.
    CloseAfterChunks(u32),
    /// An invalid request: expect a 4xx. `as_tokens`: its prompt goes as token ids (a token no
    /// text can stand for).
    ExpectRefusal { as_tokens: bool },
}

/// How a request ended, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Streamed to its end: `chunks` with text; `missing` of the `n` choices asked for never
    /// appeared in it (see [`crate::short_streams`]).
    Completed { chunks: u32, n: u32, missing: u32 },
    /// Closed by the client as its action said.
    Aborted,
    /// Ended before the client's abort point (it finished first).
    EndedFirst,
    /// An invalid request answered 4xx, as it should be.
    Refused,
    /// An invalid request answered 2xx: the server took what it should have refused.
    Accepted,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answers at the address (after the retries).
    #[error("{0}")]
    Unreachable(String),
    /// Something answers, but not as an OpenAI-compatible server.
    #[error("{0}")]
    NotOpenAi(String),
    /// The server failed (5xx after the retries, or a broken stream).
    #[error("{0}")]
    Server(String),
    /// The server refused a request the scenario made valid (4xx): the scenario does not fit it.
    #[error("{0}")]
    Refused(String),
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    model: String,
    /// `/v1/models`' `owned_by` for the model (vLLM says `vllm`, SGLang `sglang`, llama.cpp
    /// `llamacpp`): one sign of the server's dialect.
    owned_by: Option<String>,
}

impl Client {
    /// A client of the server at `base` (`http://127.0.0.1:8000`); asks it for its model's name.
    /// Connects to `base`: `GET /v1/models` must answer with a model within `ready_timeout`
    /// (a server that accepts connections and never answers fails then, not after the much
    /// longer `request_timeout` that every later request gets).
    pub async fn connect(
        base: &str,
        request_timeout: Duration,
        ready_timeout: Duration,
    ) -> Result<Client, ClientError> {
        let base = base.trim_end_matches('/').to_string();
        let http = reqwest::Client::builder()
            .timeout(request_timeout)
            .connect_timeout(Duration::from_secs(5))
            .no_proxy()
            .build()
            .map_err(|e| ClientError::Server(format!("HTTP client: {e}")))?;
        let url = format!("{base}/v1/models");
        let resp = http.get(&url).timeout(ready_timeout).send().await.map_err(|e| {
            if e.is_timeout() {
                ClientError::Unreachable(format!(
                    "GET {url}: no answer within {} s (--ready-timeout-s)",
                    ready_timeout.as_secs_f64()
                ))
            } else {
                ClientError::Unreachable(format!("GET {url}: {}", cause(&e)))
            }
        })?;
        let status = resp.status();
        if status.is_server_error() {
            // Something answers and fails: the target's failure, not a wrong address.
            let text = resp.text().await.unwrap_or_default();
            return Err(ClientError::Server(format!("GET {url} answered {status}: {}", snippet(&text))));
        }
        let body: Value = resp.json().await.map_err(|_| {
            ClientError::NotOpenAi(format!(
                "GET {url} answered {status} without OpenAI JSON: is this an OpenAI-compatible server?"
            ))
        })?;
        let model = body["data"][0]["id"].as_str().ok_or_else(|| {
            ClientError::NotOpenAi(format!(
                "GET {url} answered {status} with no model in data[0].id: is this an OpenAI-compatible server?"
            ))
        })?;
        let owned_by = body["data"][0]["owned_by"].as_str().map(String::from);
        Ok(Client { http, base, model: model.to_string(), owned_by })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn owned_by(&self) -> Option<&str> {
        self.owned_by.as_deref()
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Sends `r` and does what `action` says; retries as the module says.
    pub async fn send(&self, r: &Request, action: Action) -> Result<Outcome, ClientError> {
        let (path, body) = request_body(&self.model, r, matches!(action, Action::ExpectRefusal { as_tokens: true }));
        let url = format!("{}{path}", self.base);
        let mut wait = BACKOFF;
        for attempt in 0..=RETRIES {
            let last = attempt == RETRIES;
            let send = self.http.post(&url).json(&body).send();
            let resp = match action {
                Action::CloseBeforeFirstToken { after_ms } => {
                    match tokio::time::timeout(Duration::from_millis(after_ms), send).await {
                        Err(_) => return Ok(Outcome::Aborted),
                        Ok(r) => r,
                    }
                }
                _ => send.await,
            };
            let resp = match resp {
                Ok(r) => r,
                // A refused connection, or a kept-alive one the server closed as the request went
                // out (llama.cpp's server closes a connection after its 100th request): nothing was
                // answered, so the request is sent again.
                Err(e) if !last && !e.is_timeout() && (e.is_connect() || e.is_request()) => {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    continue;
                }
                Err(e) if e.is_connect() => return Err(ClientError::Unreachable(format!("POST {url}: {}", cause(&e)))),
                Err(e) => return Err(ClientError::Server(format!("POST {url}: {}", cause(&e)))),
            };
            let status = resp.status();
            if status.is_server_error() {
                if !last {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    continue;
                }
                let text = resp.text().await.unwrap_or_default();
                return Err(ClientError::Server(format!(
                    "POST {url} answered {status} {} times: {}",
                    RETRIES + 1,
                    snippet(&text)
                )));
            }
            if let Action::ExpectRefusal { .. } = action {
                return Ok(if status.is_client_error() { Outcome::Refused } else { Outcome::Accepted });
            }
            if status == reqwest::StatusCode::NOT_FOUND {
                return Err(ClientError::NotOpenAi(format!(
                    "POST {url} answered 404: is this an OpenAI-compatible server?"
                )));
            }
            if !status.is_success() {
                let text = resp.text().await.unwrap_or_default();
                return Err(ClientError::Refused(format!("POST {url} answered {status}: {}", snippet(&text))));
            }
            if let Action::CloseBeforeFirstToken { .. } = action {
                return Ok(Outcome::Aborted);
            }
            return read_stream(resp, action, &url, r.params.n).await;
        }
        unreachable!("the last attempt returns")
    }
}

/// The endpoint and JSON body of a request to `model` (what plateau sends, and what a
/// reproduction without plateau sends again).
pub fn request_body(model: &str, r: &Request, as_tokens: bool) -> (&'static str, Value) {
    let p = &r.params;
    let mut b = Map::new();
    b.insert("model".into(), json!(model));
    b.insert("n".into(), json!(p.n));
    b.insert("temperature".into(), json!(p.temperature));
    b.insert("top_p".into(), json!(p.top_p));
    b.insert("max_tokens".into(), json!(p.max_tokens));
    b.insert("stream".into(), json!(true));
    if let Some(seed) = p.seed {
        // OpenAI's seed is a signed 64-bit integer in practice (vLLM, llama.cpp).
        b.insert("seed".into(), json!(seed & (i64::MAX as u64)));
    }
    if p.top_k > 0 {
        b.insert("top_k".into(), json!(p.top_k));
    }
    if p.ignore_eos {
        b.insert("ignore_eos".into(), json!(true));
    }
    if !p.stop_token_ids.is_empty() {
        let stops: Vec<String> = p.stop_token_ids.iter().map(|&t| text_of(&[t])).collect();
        b.insert("stop".into(), json!(stops));
    }
    let body_tokens = r.prompt.strip_prefix(&[BOS]).unwrap_or(&r.prompt);
    if r.images.is_empty() {
        // Tokens no text stands for (an invalid request's) go as a token array, as OpenAI allows.
        let prompt = if as_tokens { json!(r.prompt) } else { json!(text_of(body_tokens)) };
        b.insert("prompt".into(), prompt);
        return ("/v1/completions", Value::Object(b));
    }
    let mut parts = Vec::new();
    let mut images = r.images.iter();
    for (k, text) in body_tokens.split(|&t| t == IMAGE_PAD).enumerate() {
        if k > 0 {
            if let Some(img) = images.next() {
                parts.push(json!({"type": "image_url", "image_url": {"url": data_url(img)}}));
            }
        }
        if !text.is_empty() {
            parts.push(json!({"type": "text", "text": text_of(text)}));
        }
    }
    b.insert("messages".into(), json!([{"role": "user", "content": parts}]));
    ("/v1/chat/completions", Value::Object(b))
}

/// Reads a streamed response: to its end, or until the chunk count the action closes at. What a
/// server that did not do the work answers is its error, never a completion: a 200 whose body is
/// not an event stream, a stream that ends with no choice in it, or one that answers fewer
/// choices than the `n` asked for.
async fn read_stream(mut resp: reqwest::Response, action: Action, url: &str, n: u32) -> Result<Outcome, ClientError> {
    let close_at = match action {
        Action::CloseAfterChunks(k) => Some(k),
        _ => None,
    };
    let status = resp.status();
    let content_type =
        resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    if !content_type.starts_with("text/event-stream") {
        let text = resp.text().await.unwrap_or_default();
        return Err(ClientError::Server(format!(
            "POST {url} answered {} with a body that is not the event stream asked for (stream: true; Content-Type {}): {}: a completion without its stream is an error of the target",
            status,
            if content_type.is_empty() { "none" } else { &content_type },
            snippet(&text)
        )));
    }
    let mut chunks = 0u32;
    let mut choices = ChoicesSeen::default();
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let bytes = match resp.chunk().await {
            Ok(Some(b)) => b,
            Ok(None) => break,
            Err(e) => return Err(ClientError::Server(format!("POST {url}: the stream broke: {}", cause(&e)))),
        };
        pending.extend_from_slice(&bytes);
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            for line in String::from_utf8_lossy(&event).lines() {
                let Some(data) = line.strip_prefix("data:").map(str::trim) else { continue };
                if data == "[DONE]" {
                    continue;
                }
                // The server answered /v1/models as an OpenAI server does before any request was
                // sent: an event it then streams that is not JSON is its failure, not the user's.
                let v: Value = serde_json::from_str(data).map_err(|e| {
                    ClientError::Server(format!(
                        "POST {url}: a stream event that is not JSON ({e}): `{}`: an error of the target",
                        snippet(data)
                    ))
                })?;
                if let Some(err) = v.get("error") {
                    return Err(ClientError::Server(format!("POST {url}: the stream ended in an error: {err}")));
                }
                let Some(cs) = v["choices"].as_array() else { continue };
                choices.see(cs);
                let has_text = cs.iter().any(|c| {
                    c["text"].as_str().or_else(|| c["delta"]["content"].as_str()).is_some_and(|t| !t.is_empty())
                });
                if has_text {
                    chunks += 1;
                    if close_at.is_some_and(|k| chunks >= k) {
                        // Dropping the response closes the connection: the client is gone.
                        return Ok(Outcome::Aborted);
                    }
                }
            }
        }
    }
    if choices.events == 0 {
        return Err(ClientError::Server(format!(
            "POST {url}: the stream ended with no choice in it (no token, no finish): an error of the target"
        )));
    }
    Ok(match close_at {
        Some(_) => Outcome::EndedFirst,
        None => Outcome::Completed { chunks, n, missing: choices.missing(n) },
    })
}

/// The choice indexes a stream has carried (a completion with `n` asks for indexes 0..n).
#[derive(Default)]
struct ChoicesSeen {
    events: u32,
    /// Indexes below [`ChoicesSeen::TRACKED`] seen, one bit each.
    indexes: u128,
}

impl ChoicesSeen {
    /// Indexes tracked one by one: `n` is capped far below this by the scenario's own limits.
    const TRACKED: u32 = 128;

    /// An event whose `choices` is empty (a usage event, a keep-alive) carries no choice: a stream
    /// of only such events did no work.
    fn see(&mut self, choices: &[Value]) {
        if choices.is_empty() {
            return;
        }
        self.events += 1;
        for c in choices {
            let i = c["index"].as_u64().unwrap_or(0);
            if i < u64::from(Self::TRACKED) {
                self.indexes |= 1u128 << i;
            }
        }
    }

    /// How many of the `n` choices a stream asked for it never carried.
    fn missing(&self, n: u32) -> u32 {
        let want = n.clamp(1, Self::TRACKED);
        let all = if want == Self::TRACKED { u128::MAX } else { (1u128 << want) - 1 };
        want - (self.indexes & all).count_ones()
    }
}

/// Prompt tokens as text: each byte token as its byte, kept printable ASCII so that the text has
/// one character per token (a byte tokenizer reads back the same length); a token no byte stands
/// for (random prompt padding) as a letter.
pub fn text_of(tokens: &[u32]) -> String {
    tokens
        .iter()
        .map(|&t| {
            let b = t.checked_sub(BYTE_OFFSET).filter(|&b| b < 256).map(|b| b as u8);
            match b {
                Some(b) if b == b'\n' || (0x20..0x7f).contains(&b) => b as char,
                _ => (b'a' + (t % 26) as u8) as char,
            }
        })
        .collect()
}

/// An image as a base64 `data:` URL (PNG or JPEG as given; raw RGB encoded as PNG).
fn data_url(img: &ImageInput) -> String {
    let (mime, bytes) = match img {
        ImageInput::Encoded(b)
            if plateau_engine::multimodal::codec::sniff(b) == Some(plateau_engine::multimodal::codec::Format::Jpeg) =>
        {
            ("image/jpeg", b.clone())
        }
        ImageInput::Encoded(b) => ("image/png", b.clone()),
        ImageInput::Rgb { width, height, pixels } => {
            // A size the engine would refuse encodes to nothing: the server refuses it too.
            ("image/png", plateau_engine::multimodal::codec::encode_png(*width, *height, pixels).unwrap_or_default())
        }
    };
    format!("data:{mime};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// An error's innermost cause (reqwest's outer layers repeat the URL), one line.
fn cause(e: &dyn std::error::Error) -> String {
    let mut last = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        last = c.to_string();
        src = c.source();
    }
    last
}

/// The start of what a server sent, for a message: one line, its control characters (a
/// terminal's escapes) made spaces.
fn snippet(text: &str) -> String {
    text.chars().take(200).map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_has_one_character_per_token() {
        let tokens = [BYTE_OFFSET + b'h' as u32, BYTE_OFFSET + 7, 9999, BYTE_OFFSET + b'\n' as u32];
        let t = text_of(&tokens);
        assert_eq!(t.chars().count(), tokens.len());
        assert!(t.starts_with('h') && t.ends_with('\n'));
    }
}
