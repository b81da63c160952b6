//! Which engine an external server is, as far as its control endpoints go: vLLM, SGLang,
//! llama.cpp, or a plain OpenAI-compatible server. The completions API is the same for all four;
//! what differs is how an RL trainer puts the engine to sleep, updates its weights and wakes it.
//!
//! Found once, before the run, from what the server answers (read-only requests, none of which
//! changes its state): `GET /is_sleeping` (vLLM, served in dev mode with sleep mode on),
//! `GET /get_server_info` (SGLang), `GET /props` (llama.cpp), and `/v1/models`' `owned_by`. An
//! endpoint that answers outweighs `owned_by`, which proxies and forks rewrite. `--dialect` names
//! it instead; the endpoints are still read, to know whether its control calls are there.

use std::time::Duration;

use serde_json::Value;

/// How long one detection request may take: they are cheap reads, and a server that does not
/// know the path answers 404 at once.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Vllm,
    Sglang,
    LlamaCpp,
    OpenAi,
}

impl Dialect {
    pub const ALL: [Dialect; 4] = [Dialect::Vllm, Dialect::Sglang, Dialect::LlamaCpp, Dialect::OpenAi];

    /// The name `--dialect` takes and the verdict records.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Vllm => "vllm",
            Dialect::Sglang => "sglang",
            Dialect::LlamaCpp => "llamacpp",
            Dialect::OpenAi => "openai",
        }
    }

    /// `--dialect NAME`, or an error listing the names.
    pub fn parse(name: &str) -> Result<Dialect, String> {
        Dialect::ALL.into_iter().find(|d| d.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Dialect::ALL.iter().map(|d| d.name()).collect();
            format!("--dialect {name}: unknown; one of {}", names.join(", "))
        })
    }
}

/// What the server showed of itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub dialect: Dialect,
    /// The evidence, for the verdict: `GET /is_sleeping answered; owned_by vllm`.
    pub found: String,
    /// Why the dialect cannot sleep and wake over HTTP here, or None when it can.
    pub no_sleep: Option<String>,
    /// SGLang's model path (`/get_server_info`), what a weight update from disk reloads.
    pub model_path: Option<String>,
}

/// What the detection requests saw.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Seen {
    pub owned_by: Option<String>,
    /// `GET /is_sleeping` answered with `is_sleeping`.
    pub is_sleeping: bool,
    /// `GET /get_server_info` answered a JSON object (its `model_path`, if any).
    pub server_info: Option<Option<String>>,
    /// `GET /props` answered a JSON object.
    pub props: bool,
}

/// Reads what the server shows (`owned_by` from the client's `/v1/models`).
pub async fn look(base: &str, owned_by: Option<&str>) -> Seen {
    let Ok(http) = reqwest::Client::builder().no_proxy().timeout(PROBE_TIMEOUT).build() else {
        return Seen { owned_by: owned_by.map(String::from), ..Seen::default() };
    };
    let get = |path: &'static str| {
        let http = http.clone();
        let url = format!("{base}{path}");
        async move {
            let r = http.get(url).send().await.ok().filter(|r| r.status().is_success())?;
            r.json::<Value>().await.ok().filter(Value::is_object)
        }
    };
    let is_sleeping = get("/is_sleeping").await.is_some_and(|v| v["is_sleeping"].is_boolean());
    let server_info = get("/get_server_info").await.map(|v| v["model_path"].as_str().map(String::from));
    let props = get("/props").await.is_some();
    Seen { owned_by: owned_by.map(String::from), is_sleeping, server_info, props }
}

/// The dialect `seen` shows, or the one `named`; and whether its sleep and wake are there.
pub fn decide(seen: &Seen, named: Option<Dialect>) -> Found {
    let mut evidence = Vec::new();
    if let Some(d) = named {
        evidence.push(format!("named by --dialect {}", d.name()));
    }
    if seen.is_sleeping {
        evidence.push("GET /is_sleeping answered".to_string());
    }
    if seen.server_info.is_some() {
        evidence.push("GET /get_server_info answered".to_string());
    }
    if seen.props {
        evidence.push("GET /props answered".to_string());
    }
    if let Some(o) = &seen.owned_by {
        evidence.push(format!("/v1/models owned_by {o}"));
    }
    let by_owner = match seen.owned_by.as_deref() {
        Some("vllm") => Some(Dialect::Vllm),
        Some("sglang") => Some(Dialect::Sglang),
        Some("llamacpp") => Some(Dialect::LlamaCpp),
        _ => None,
    };
    let dialect = named.unwrap_or(if seen.is_sleeping {
        Dialect::Vllm
    } else if seen.server_info.is_some() {
        Dialect::Sglang
    } else if seen.props {
        Dialect::LlamaCpp
    } else {
        by_owner.unwrap_or(Dialect::OpenAi)
    });
    if evidence.is_empty() {
        evidence.push("none of vLLM's, SGLang's or llama.cpp's endpoints answered".to_string());
    }
    let no_sleep = match dialect {
        Dialect::Vllm if !seen.is_sleeping => Some(
            "this vLLM server does not answer GET /is_sleeping: vLLM serves /sleep, /wake_up and /is_sleeping only with VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode".to_string(),
        ),
        Dialect::Vllm | Dialect::Sglang => None,
        Dialect::LlamaCpp => Some("llama.cpp's server has no sleep or wake over HTTP".to_string()),
        Dialect::OpenAi => Some("a plain OpenAI-compatible server has no sleep or wake over HTTP".to_string()),
    };
    let model_path = seen.server_info.clone().flatten();
    Found { dialect, found: evidence.join("; "), no_sleep, model_path }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(owned_by: Option<&str>) -> Seen {
        Seen { owned_by: owned_by.map(String::from), ..Seen::default() }
    }

    #[test]
    fn an_endpoint_that_answers_decides_before_owned_by() {
        let f = decide(&Seen { is_sleeping: true, ..seen(Some("plateau")) }, None);
        assert_eq!(f.dialect, Dialect::Vllm);
        assert_eq!(f.no_sleep, None);
        assert_eq!(f.found, "GET /is_sleeping answered; /v1/models owned_by plateau");
        let f = decide(&Seen { server_info: Some(Some("/models/q".into())), ..seen(Some("vllm")) }, None);
        assert_eq!((f.dialect, f.model_path.as_deref()), (Dialect::Sglang, Some("/models/q")));
        assert_eq!(decide(&Seen { props: true, ..seen(None) }, None).dialect, Dialect::LlamaCpp);
    }

    #[test]
    fn vllm_without_dev_mode_is_vllm_that_cannot_sleep() {
        let f = decide(&seen(Some("vllm")), None);
        assert_eq!(f.dialect, Dialect::Vllm);
        assert!(f.no_sleep.as_deref().is_some_and(|w| w.contains("VLLM_SERVER_DEV_MODE=1")), "{f:?}");
    }

    #[test]
    fn nothing_known_is_plain_openai_and_says_so() {
        let f = decide(&seen(None), None);
        assert_eq!(f.dialect, Dialect::OpenAi);
        assert!(f.found.contains("none of"), "{f:?}");
        assert!(f.no_sleep.is_some());
    }

    #[test]
    fn a_named_dialect_wins_and_is_said() {
        let f = decide(&Seen { is_sleeping: true, ..seen(None) }, Some(Dialect::Sglang));
        assert_eq!(f.dialect, Dialect::Sglang);
        assert!(f.found.starts_with("named by --dialect sglang"), "{f:?}");
        assert_eq!(Dialect::parse("vllm"), Ok(Dialect::Vllm));
        let e = Dialect::parse("tgi").unwrap_err();
        assert!(e.contains("--dialect tgi") && e.contains("vllm, sglang, llamacpp, openai"), "{e}");
    }
}
