//! A run's requests as a server received them, iteration by iteration, for a reproduction that
//! runs without plateau (`plateau repro`): the same plan (`plateau_driver::plan`, seeded by the
//! run's seed) and the same bodies ([`crate::client::request_body`]) as the run sent, each with
//! what the client did with it.

use plateau_driver::plan;
use plateau_scenario::workload::Workload;
use plateau_scenario::Scenario;
use serde_json::{json, Value};

use crate::client::{request_body, Action};

/// The model's name in every body: a reproduction puts the server's own in its place.
pub const MODEL: &str = "{model}";

/// Iteration `iter`'s requests in order, each `{"path", "body", "action"}`: `complete` (read to
/// its end), `close_after_chunks` (with `chunks`), `close_before_first_token` (with
/// `after_ms`) or `expect_refusal`.
pub fn iteration(s: &Scenario, workload: &mut Workload, iter: u64, shape: plateau_driver::target::Shape) -> Vec<Value> {
    let mut out = Vec::new();
    for (index, phase) in s.phases.iter().enumerate() {
        for send in plan::phase(workload, index, phase, iter, shape) {
            let action = crate::http_target::client_action(send.action);
            let (path, body) =
                request_body(MODEL, &send.request, matches!(action, Action::ExpectRefusal { as_tokens: true }));
            let mut r = json!({ "path": path, "body": body });
            match action {
                Action::Complete => r["action"] = "complete".into(),
                Action::CloseAfterChunks(k) => {
                    r["action"] = "close_after_chunks".into();
                    r["chunks"] = k.into();
                }
                Action::CloseBeforeFirstToken { after_ms } => {
                    r["action"] = "close_before_first_token".into();
                    r["after_ms"] = after_ms.into();
                }
                Action::ExpectRefusal { .. } => r["action"] = "expect_refusal".into(),
            }
            out.push(r);
        }
    }
    out
}

/// The run's requests for iterations 1 to `iterations`, seeded by `seed`, one list per
/// iteration, given to `each` as they are planned (a long run's are never all in memory).
pub fn each_iteration(
    s: &Scenario,
    seed: u64,
    iterations: u64,
    mut each: impl FnMut(u64, Vec<Value>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let shape = crate::shape_of(s, seed);
    let mut workload = Workload::new(seed);
    for iter in 1..=iterations {
        each(iter, iteration(s, &mut workload, iter, shape))?;
    }
    Ok(())
}
