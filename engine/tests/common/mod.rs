#![allow(dead_code)]
use plateau_engine::{Engine, EngineConfig, Injection, Injections, Request, RequestOutput, SamplingParams};

pub fn config() -> EngineConfig {
    EngineConfig { num_kv_blocks: 128, block_size: 4, max_num_batched_tokens: 64, ..EngineConfig::default() }
}

pub fn engine_with(f: impl FnOnce(&mut EngineConfig)) -> Engine {
    let mut c = config();
    f(&mut c);
    Engine::new(c).expect("engine")
}

pub fn injected(i: Injection) -> Engine {
    engine_with(|c| c.injections = Injections::none().with(i))
}

pub fn prompt(i: u64, len: usize) -> Vec<u32> {
    (0..len as u64).map(|j| 3 + ((i * 31 + j * 7) % 250) as u32).collect()
}

pub fn req(id: u64, prompt: Vec<u32>, n: u32, max_tokens: u32, seed: u64) -> Request {
    Request {
        id,
        prompt,
        params: SamplingParams { n, max_tokens, seed: Some(seed), ignore_eos: true, ..SamplingParams::default() },
        images: Vec::new(),
    }
}

/// Steps until nothing is in flight; panics if that takes more than `max_steps`.
pub fn drain(e: &mut Engine, max_steps: usize) -> Vec<RequestOutput> {
    let mut outs = Vec::new();
    for _ in 0..max_steps {
        outs.extend(e.step().expect("step"));
        if !e.has_unfinished() {
            return outs;
        }
    }
    panic!("engine did not drain in {max_steps} steps");
}
