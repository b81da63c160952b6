//! The CUDA backend against the CPU backend. These need a CUDA device, so they are ignored by
//! default (CI has none) and say so; on a GPU machine `cargo test -p plateau-engine --test engine
//! cuda:: -- --ignored` runs them, and there a missing device fails them with the reason.
//! scripts/gpu-check.sh runs the full checks (parity, memory, soaks, throughput) on the H200.
//! Only with the engine's `cuda` feature (on by default).
#![cfg(feature = "cuda")]

use plateau_engine::model::backend::{Backend, ForwardBatch, PoolRelease, SeqChunk};
use plateau_engine::model::cuda::{probe, CudaBackend, DType};
use plateau_engine::{CpuBackend, EngineConfig, ModelConfig, ModelWeights, Request, SamplingParams};

/// Asked for with --ignored: a missing device is a failure with its reason.
fn device() {
    match probe() {
        Ok(info) => eprintln!("CUDA device: {} ({:?})", info.name, info.compute_capability),
        Err(why) => panic!("these tests need a CUDA device: {why}"),
    }
}

#[test]
#[ignore = "needs a CUDA device: run with --ignored on a GPU machine"]
fn cuda_logits_match_the_cpu_backend() {
    device();
    let w = ModelWeights::seeded(ModelConfig::preset("tiny").unwrap(), 3);
    let mut cpu = CpuBackend::new(w.clone(), PoolRelease::Drop).unwrap();
    let mut gpu = CudaBackend::new(w, DType::F32, PoolRelease::Drop).unwrap();
    cpu.allocate_kv(16, 16).unwrap();
    gpu.allocate_kv(16, 16).unwrap();
    let batch = ForwardBatch {
        copies: Vec::new(),
        chunks: vec![SeqChunk {
            tokens: (3..40).collect(),
            start_pos: 0,
            block_table: vec![0, 1, 2],
            want_logits: true,
            embeds: Vec::new(),
        }],
    };
    let (a, b) = (cpu.forward(&batch).unwrap(), gpu.forward(&batch).unwrap());
    let scale = a[0].iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = a[0].iter().zip(&b[0]).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
    assert!(err < 1e-4, "relative error {err}");
}

#[test]
#[ignore = "needs a CUDA device: run with --ignored on a GPU machine"]
fn an_engine_on_cuda_serves_and_ends_idle() {
    device();
    let mut e = plateau_engine::model::factory::engine_on("cuda", EngineConfig::default(), DType::F32).unwrap();
    for id in 0..8 {
        let params = SamplingParams { n: 2, max_tokens: 6, seed: Some(id), ..SamplingParams::default() };
        e.add_request(Request { id, prompt: vec![1, 40, 41, 42], params, images: Vec::new() }).unwrap();
    }
    while e.has_unfinished() {
        e.step().unwrap();
    }
    e.check_idle().unwrap();
}
