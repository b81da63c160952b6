//! A scenario's sleep phase over HTTP: what an RL trainer does to the inference server between
//! rollouts, in the server's dialect ([`super::dialect`]).
//!
//! One phase, in order:
//! 1. sleep at the scenario's level: vLLM `POST /sleep?level=L`; SGLang
//!    `POST /release_memory_occupation` with tags (level 1 the KV cache, level 2 the weights too);
//! 2. wake the weights: vLLM `POST /wake_up?tags=weights`; SGLang
//!    `POST /resume_memory_occupation {"tags": ["weights"]}`;
//! 3. the weight update where the phase asks for one and the dialect has one over HTTP: SGLang
//!    `POST /update_weights_from_disk` with the server's own model path (vLLM has none: trainers
//!    send weights over NCCL);
//! 4. wake the KV cache (vLLM `tags=kv_cache`, SGLang `{"tags": ["kv_cache"]}`), the order
//!    verl and OpenRLHF use so that the KV cache is not held while weights load;
//! 5. the prefix-cache reset where the phase asks: vLLM `POST /reset_prefix_cache`, SGLang
//!    `POST /flush_cache`.
//!
//! The end of a sleep and of a wake is observed, not assumed: vLLM's `GET /is_sleeping` (and
//! SGLang's `memory_occupation_released` in `/get_server_info`, where it has one) is polled until
//! it reads what the call should have made it, within the request timeout. Each call's time runs
//! from its request to that observation. What the dialect lacks is counted per phase and said once
//! in the verdict; a call that answers an error stops the run (exit 3), naming the call.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use plateau_reports::{CallTimes, ControlRecord};
use serde_json::{json, Value};

use super::dialect::{Dialect, Found};
use plateau_driver::RunError;
use plateau_scenario::Sleep;

/// Poll period while waiting for a server to report the state a call asked for.
const STATE_POLL: Duration = Duration::from_millis(20);

pub struct Control {
    http: reqwest::Client,
    base: String,
    /// The served model's name, SGLang's model path when its server info gives none.
    model: String,
    found: Found,
    /// The longest one call and its observed end may take.
    timeout: Duration,
    /// Milliseconds per call kind (`sleep`, `wake weights`, ...).
    times: BTreeMap<&'static str, Vec<f64>>,
    /// What phases asked that the dialect lacks: (what, why) and how many phases asked.
    lacking: BTreeMap<(&'static str, String), u64>,
    /// Calls sent per kind, answered or not.
    sent: BTreeMap<&'static str, u64>,
    /// The call that failed: its kind, what it asked and what came back.
    failed: Option<String>,
}

impl Control {
    pub fn new(base: &str, model: &str, found: Found, timeout: Duration) -> Result<Control, RunError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .build()
            .map_err(|e| RunError::Harness(format!("HTTP client: {e}")))?;
        Ok(Control {
            http,
            base: base.to_string(),
            model: model.to_string(),
            found,
            timeout,
            times: BTreeMap::new(),
            lacking: BTreeMap::new(),
            sent: BTreeMap::new(),
            failed: None,
        })
    }

    pub fn dialect(&self) -> Dialect {
        self.found.dialect
    }

    /// Runs one sleep phase as the module says.
    pub async fn sleep_phase(&mut self, s: &Sleep) -> Result<(), RunError> {
        if let Some(why) = self.found.no_sleep.clone() {
            self.lack("sleep and wake", why);
            return Ok(());
        }
        let vllm = match self.found.dialect {
            Dialect::Vllm => true,
            Dialect::Sglang => false,
            Dialect::LlamaCpp | Dialect::OpenAi => unreachable!("no_sleep is set for dialects without sleep"),
        };
        // The dialect's calls for each step of the module's sequence.
        let (sleep, wake_weights, wake_kv, reset) = if vllm {
            let sleep = (format!("/sleep?level={}", s.level), None);
            (sleep, ("/wake_up?tags=weights", None), ("/wake_up?tags=kv_cache", None), "/reset_prefix_cache")
        } else {
            let tags: &[&str] = if s.level >= 2 { &["kv_cache", "weights"] } else { &["kv_cache"] };
            let resume = |tag: &str| Some(json!({ "tags": [tag] }));
            let sleep = ("/release_memory_occupation".to_string(), Some(json!({ "tags": tags })));
            (
                sleep,
                ("/resume_memory_occupation", resume("weights")),
                ("/resume_memory_occupation", resume("kv_cache")),
                "/flush_cache",
            )
        };
        self.timed_until("sleep", &sleep.0, sleep.1, true).await?;
        self.timed("wake weights", wake_weights.0, wake_weights.1).await?;
        if s.update_weights {
            if vllm {
                self.lack(
                    "weight update",
                    "vLLM serves no weight update over HTTP (RL trainers send weights over NCCL or collective_rpc)"
                        .into(),
                );
            } else {
                self.update_weights().await?;
            }
        }
        self.timed_until("wake kv_cache", wake_kv.0, wake_kv.1, false).await?;
        if s.reset_prefix_cache {
            self.timed("reset prefix cache", reset, None).await?;
        }
        Ok(())
    }

    /// SGLang's weight update from disk, with the server's own model path.
    async fn update_weights(&mut self) -> Result<(), RunError> {
        let path = self.found.model_path.clone().unwrap_or_else(|| self.model.clone());
        let t = Instant::now();
        let call = "update weights";
        *self.sent.entry(call).or_insert(0) += 1;
        let answer = self.post("/update_weights_from_disk", Some(json!({ "model_path": path }))).await;
        let answer = self.check(call, answer)?;
        if answer.get("success").and_then(Value::as_bool) == Some(false) {
            let e = RunError::Harness(format!(
                "POST {}/update_weights_from_disk (model_path {path}) answered success false: {}",
                self.base,
                answer.get("message").and_then(Value::as_str).unwrap_or("no message")
            ));
            return self.check(call, Err(e));
        }
        self.took("update weights", t);
        Ok(())
    }

    /// One call, timed.
    async fn timed(&mut self, call: &'static str, path: &str, body: Option<Value>) -> Result<(), RunError> {
        let t = Instant::now();
        *self.sent.entry(call).or_insert(0) += 1;
        let answer = self.post(path, body).await;
        self.check(call, answer)?;
        self.took(call, t);
        Ok(())
    }

    /// A call's outcome: a failure is remembered (the run's end names it) and said with the
    /// call's kind.
    fn check<T>(&mut self, call: &'static str, r: Result<T, RunError>) -> Result<T, RunError> {
        r.map_err(|e| {
            let what = format!("the {call} call failed: {e}");
            self.failed = Some(what.clone());
            RunError::Harness(what)
        })
    }

    /// One call that puts the engine to sleep (`asleep`) or wakes it, timed to the moment the
    /// server reports that state.
    async fn timed_until(
        &mut self,
        call: &'static str,
        path: &str,
        body: Option<Value>,
        asleep: bool,
    ) -> Result<(), RunError> {
        let t = Instant::now();
        *self.sent.entry(call).or_insert(0) += 1;
        let answer = self.post(path, body).await;
        self.check(call, answer)?;
        let state = match self.found.dialect {
            Dialect::Vllm => self.until_sleeping(asleep).await,
            _ => self.until_released(asleep).await,
        };
        let state = state.map_err(|e| RunError::Harness(format!("POST {}{path} was answered, then {e}", self.base)));
        self.check(call, state)?;
        self.took(call, t);
        Ok(())
    }

    /// POSTs `path` (with a JSON body, or none) and returns the answer's JSON (null when it has
    /// none). A refused connection or a non-2xx answer stops the run, naming the call.
    async fn post(&self, path: &str, body: Option<Value>) -> Result<Value, RunError> {
        let url = format!("{}{path}", self.base);
        let req = self.http.post(&url);
        let req = match &body {
            Some(b) => req.json(b),
            None => req,
        };
        let resp = req.send().await.map_err(|e| RunError::Harness(format!("POST {url}: {e}")))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            let cut: String = text.chars().take(200).collect();
            return Err(RunError::Harness(format!("POST {url} answered {status}: {cut}")));
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// GETs `path` as JSON; None when it does not answer a JSON object.
    async fn get(&self, path: &str) -> Result<Option<Value>, RunError> {
        let url = format!("{}{path}", self.base);
        let resp = self.http.get(&url).send().await.map_err(|e| RunError::Harness(format!("GET {url}: {e}")))?;
        if !resp.status().is_success() {
            return Ok(None);
        }
        Ok(resp.json::<Value>().await.ok().filter(Value::is_object))
    }

    /// Polls vLLM's `/is_sleeping` until it reads `want`.
    async fn until_sleeping(&self, want: bool) -> Result<(), RunError> {
        self.until("/is_sleeping", "is_sleeping", want, true).await
    }

    /// Polls SGLang's `/get_server_info` until `memory_occupation_released` reads `want`; a server
    /// whose info has no such field answered its call when the call was done.
    async fn until_released(&self, want: bool) -> Result<(), RunError> {
        self.until("/get_server_info", "memory_occupation_released", want, false).await
    }

    /// Polls `path` until its `field` reads `want`, within the timeout. `required`: a field that
    /// is not there is an error (else the call's own answer was its end).
    async fn until(&self, path: &str, field: &str, want: bool, required: bool) -> Result<(), RunError> {
        let t0 = Instant::now();
        loop {
            let v = self.get(path).await?;
            match v.as_ref().and_then(|v| v.get(field)).and_then(Value::as_bool) {
                Some(b) if b == want => return Ok(()),
                Some(_) => {}
                None if !required => return Ok(()),
                None => {
                    return Err(RunError::Harness(format!(
                        "GET {}{path}: no boolean {field} in its answer ({})",
                        self.base,
                        v.map_or("not a JSON object".to_string(), |v| v.to_string())
                    )))
                }
            }
            if t0.elapsed() >= self.timeout {
                return Err(RunError::Harness(format!(
                    "GET {}{path}: {field} did not read {want} within {} s (--request-timeout-s)",
                    self.base,
                    self.timeout.as_secs()
                )));
            }
            tokio::time::sleep(STATE_POLL).await;
        }
    }

    fn took(&mut self, call: &'static str, since: Instant) {
        self.times.entry(call).or_default().push(since.elapsed().as_secs_f64() * 1e3);
    }

    fn lack(&mut self, what: &'static str, why: String) {
        *self.lacking.entry((what, why)).or_insert(0) += 1;
    }

    /// What the run did and could not do, for its end record.
    pub fn record(&self) -> ControlRecord {
        ControlRecord {
            dialect: self.found.dialect.name().to_string(),
            found: self.found.found.clone(),
            calls: self.times.iter().map(|(k, v)| (k.to_string(), CallTimes::of(v))).collect(),
            lacking: self
                .lacking
                .iter()
                .map(|((what, why), n)| format!("{what}: {why}; skipped in {n} sleep phases"))
                .collect(),
            sent: self.sent.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            failed: self.failed.clone(),
        }
    }

    /// One line on the calls sent: `sleep 150 (median 3.1 ms, max 9.0 ms), ...`; a call sent and
    /// not answered as it should have been counts too (`sleep 1 sent, 0 answered`).
    pub fn summary(&self) -> String {
        let r = self.record();
        let calls: Vec<String> = r
            .sent
            .iter()
            .map(|(k, sent)| match r.calls.get(k) {
                Some(t) if t.count == *sent => {
                    format!("{k} {} (median {:.1} ms, max {:.1} ms)", t.count, t.median_ms, t.max_ms)
                }
                Some(t) => format!(
                    "{k} {sent} sent, {} answered (median {:.1} ms, max {:.1} ms)",
                    t.count, t.median_ms, t.max_ms
                ),
                None => format!("{k} {sent} sent, 0 answered"),
            })
            .collect();
        if calls.is_empty() {
            "none".to_string()
        } else {
            calls.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::{decide, Seen};

    #[test]
    fn a_dialect_without_sleep_counts_each_phase_and_says_it_once() {
        let found = decide(&Seen { props: true, ..Seen::default() }, None);
        let mut c = Control::new("http://127.0.0.1:9", "m", found, Duration::from_secs(1)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for _ in 0..3 {
            rt.block_on(c.sleep_phase(&Sleep { level: 2, update_weights: true, reset_prefix_cache: false })).unwrap();
        }
        let r = c.record();
        assert_eq!(r.dialect, "llamacpp");
        assert!(r.calls.is_empty());
        assert_eq!(
            r.lacking,
            vec!["sleep and wake: llama.cpp's server has no sleep or wake over HTTP; skipped in 3 sleep phases"]
        );
        assert_eq!(c.summary(), "none");
    }
}
