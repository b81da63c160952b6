//! The CUDA backend against the CPU backend, when a CUDA device is here. Without one (CI) each test
//! prints why it is skipped and passes; scripts/gpu-check.sh runs the full checks on a GPU machine.

use std::io::Write;

use plateau_engine::model::backend::{Backend, ForwardBatch, SeqChunk};
use plateau_engine::model::cuda::{probe, CudaBackend, DType};
use plateau_engine::{CpuBackend, EngineConfig, Injections, ModelConfig, ModelWeights, Request, SamplingParams};

fn device() -> bool {
    match probe() {
        Ok(info) => {
            eprintln!("CUDA device: {} ({:?})", info.name, info.compute_capability);
            true
        }
        Err(why) => {
            // Straight to the stream, past the test harness's capture: CI's log shows the reason.
            let _ = writeln!(std::io::stderr(), "CUDA test skipped: {why}");
            false
        }
    }
}

#[test]
fn cuda_logits_match_the_cpu_backend() {
    if !device() {
        return;
    }
    let w = ModelWeights::seeded(ModelConfig::preset("tiny").unwrap(), 3);
    let mut cpu = CpuBackend::new(w.clone(), Injections::none()).unwrap();
    let mut gpu = CudaBackend::new(w, DType::F32, Injections::none()).unwrap();
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
fn an_engine_on_cuda_serves_and_ends_idle() {
    if !device() {
        return;
    }
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
