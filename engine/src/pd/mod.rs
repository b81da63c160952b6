//! Prefill/decode disaggregation: the KV connector as a state machine with no I/O.
//!
//! Lifecycle of a disaggregated request:
//! 1. Prefill engine (role `Prefill`): the router adds the request with max_tokens = 1. When its
//!    prompt is computed and its first token sampled, the engine *holds* its KV blocks instead of
//!    freeing them, under a transfer handle, and the request's output carries [`TransferParams`].
//! 2. Decode engine (role `Decode`): `add_remote_request` takes the request and those parameters.
//!    The request waits for remote KV; at the next step the connector allocates local blocks
//!    (prefix-cache hits are not pulled) and emits a [`PullOrder`] for the shell's transport.
//! 3. The transport reads the held blocks from the prefill side (`export_kv`, which refuses a
//!    stale request or a block that is not the request's) and hands the bytes to `pull_done`; the
//!    request then decodes like any other. Each end on the decode side (pulled, aborted, failed)
//!    emits a [`Notice`] that the shell forwards to the prefill side's `release_transfer`.
//! 4. The prefill side frees the blocks and the handle on that notice, or when the transfer
//!    timeout expires (the decode side may have died): `advance_time` is how the shell tells the
//!    core what time it is; the core owns no clock.

use serde::{Deserialize, Serialize};

use crate::block_pool::BlockId;
use crate::request::RequestId;
pub use crate::request::TransferParams;

mod connector;

pub(crate) use connector::KvConnector;

/// What an engine does in a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    #[default]
    Monolithic,
    Prefill,
    Decode,
}

/// A transfer for the shell's transport: remote blocks into local blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullOrder {
    pub request: RequestId,
    pub engine_id: u32,
    pub handle: u64,
    pub remote_blocks: Vec<BlockId>,
    pub local_blocks: Vec<BlockId>,
}

/// A message from the decode side to the prefill side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Notice {
    /// The KV arrived: the prefill side may free it.
    Pulled { engine_id: u32, request: RequestId, handle: u64 },
    /// The request ended on the decode side before or during its pull.
    Aborted { engine_id: u32, request: RequestId, handle: u64 },
}

/// Whether a request's first token, sampled on the prefill side, already ends it: then the router
/// releases the held KV instead of forwarding the request to a decode side.
pub fn ends_at_first_token(p: &crate::request::SamplingParams, first_token: u32) -> bool {
    p.max_tokens == 1
        || (!p.ignore_eos && first_token == crate::tokenizer::EOS)
        || p.stop_token_ids.contains(&first_token)
}

/// Where a request goes once its prefill ended: the routing core every P/D router shares (the
/// soak's in-process and cross-process pairs, the simulated cluster). Each router adds only what
/// it alone does (a seeded dead decode node, a client's abort in flight, timeouts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextHop {
    /// It ended on the prefill side without its KV held (aborted, failed): nothing to do.
    Ended,
    /// Its KV is held and its first token already ends it: release the KV.
    Release,
    /// Its KV is held for a decode side: send the request there with these parameters.
    Decode(TransferParams),
}

/// The next hop of request `output` (from a prefill engine), sent by its client with `original`.
pub fn next_hop(original: &crate::request::SamplingParams, output: &crate::request::RequestOutput) -> NextHop {
    use crate::request::FinishReason;
    match &output.transfer {
        Some(t) if matches!(output.finish(), FinishReason::Stopped | FinishReason::Length) => {
            if ends_at_first_token(original, t.first_token) {
                NextHop::Release
            } else {
                NextHop::Decode(t.clone())
            }
        }
        _ => NextHop::Ended,
    }
}
