//! A backend that samples rows where the engine's plan lets it (as the CUDA backend does on the
//! device: a greedy row's argmax, a row's seeded draw with the uniform the engine took before the
//! pass) gives the engine the same tokens as one that returns every row: greedy requests, sampled
//! ones with top-k and top-p, and n > 1 forks (whose first row must come back) in one batch.

use std::sync::{Arc, Mutex};

use plateau_engine::model::backend::{Backend, BackendMemory, BlockId, ForwardBatch, Logits, RowSampling};
use plateau_engine::model::config::ModelConfig;
use plateau_engine::model::cpu::CpuBackend;
use plateau_engine::model::error::Result;
use plateau_engine::model::weights::ModelWeights;
use plateau_engine::sampler::{argmax, sample_drawn};
use plateau_engine::{Engine, RequestOutput, SamplingParams};

use crate::common::{config, drain, prompt, req};

/// The CPU backend, sampling by the plan on its side; counts (argmax, draw, row) answers.
struct SamplingBackend {
    cpu: CpuBackend,
    answers: Arc<Mutex<[usize; 3]>>,
}

impl Backend for SamplingBackend {
    fn name(&self) -> &'static str {
        "cpu-argmax"
    }
    fn config(&self) -> &ModelConfig {
        self.cpu.config()
    }
    fn allocate_kv(&mut self, num_blocks: usize, block_size: usize) -> Result<()> {
        self.cpu.allocate_kv(num_blocks, block_size)
    }
    fn release_kv(&mut self) {
        self.cpu.release_kv()
    }
    fn load_weights(&mut self, weights: ModelWeights) -> Result<()> {
        self.cpu.load_weights(weights)
    }
    fn release_weights(&mut self) {
        self.cpu.release_weights()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<Vec<f32>>> {
        self.cpu.forward(batch)
    }
    fn forward_sampled(&mut self, batch: &ForwardBatch, sampling: &[RowSampling]) -> Result<Vec<Logits>> {
        assert_eq!(sampling.len(), batch.chunks.len(), "one plan per chunk");
        let wanting = batch.chunks.iter().zip(sampling).filter(|(c, _)| c.want_logits && !c.tokens.is_empty());
        let rows = self.cpu.forward(batch)?;
        let mut answers = self.answers.lock().unwrap();
        Ok(rows
            .into_iter()
            .zip(wanting)
            .map(|(row, (_, plan))| match plan {
                RowSampling::Greedy => {
                    answers[0] += 1;
                    Logits::Token(argmax(&row))
                }
                RowSampling::Draw(d) => {
                    answers[1] += 1;
                    // The temperature the draw was planned from (1 / (1 / t) is t again in f32).
                    let temperature = (1.0 / d.inv_temperature) as f32;
                    let params = SamplingParams { temperature, top_k: d.top_k, top_p: d.top_p, ..Default::default() };
                    Logits::Token(sample_drawn(&row, &params, d.u))
                }
                RowSampling::Row => {
                    answers[2] += 1;
                    Logits::Row(row)
                }
            })
            .collect())
    }
    fn read_kv(&self, blocks: &[BlockId]) -> Result<Vec<f32>> {
        self.cpu.read_kv(blocks)
    }
    fn write_kv(&mut self, blocks: &[BlockId], data: &[f32]) -> Result<()> {
        self.cpu.write_kv(blocks, data)
    }
    fn encode_image(&mut self, pixels: &plateau_engine::model::vision::PixelTensor) -> Result<Vec<f32>> {
        self.cpu.encode_image(pixels)
    }
    fn memory(&self) -> BackendMemory {
        self.cpu.memory()
    }
}

fn run(engine: &mut Engine) -> Vec<RequestOutput> {
    for i in 0..6u64 {
        let mut r = req(i, prompt(i, 5 + i as usize * 3), if i % 3 == 0 { 2 } else { 1 }, 8, 40 + i);
        // Even ids greedy (one of them n = 2), odd ones sampled (one of them n = 2), some with
        // top-k and top-p.
        let (temperature, top_k, top_p) = if i % 2 == 0 { (0.0, 0, 1.0) } else { (0.8, (i as u32 - 1) * 10, 0.9) };
        r.params = SamplingParams { temperature, top_k, top_p, ..r.params };
        engine.add_request(r).unwrap();
    }
    let mut outs = drain(engine, 400);
    outs.sort_by_key(|o| o.id);
    outs
}

#[test]
fn rows_sampled_by_the_plan_give_the_same_tokens_as_rows_sampled_by_the_engine() {
    let c = config();
    let mut plain = Engine::new(c.clone()).unwrap();
    let answers = Arc::new(Mutex::new([0; 3]));
    let cpu = CpuBackend::new(c.model.load().unwrap(), c.injections.pool_release()).unwrap();
    let mut sampling = Engine::with_backend(c, Box::new(SamplingBackend { cpu, answers: answers.clone() })).unwrap();
    let (a, b) = (run(&mut plain), run(&mut sampling));
    assert_eq!(a.len(), 6);
    assert_eq!(a, b);
    // Every kind of answer was given: the test compared something of each.
    let [argmaxes, draws, rows] = *answers.lock().unwrap();
    assert!(argmaxes > 0 && draws > 0 && rows > 0, "argmaxes {argmaxes}, draws {draws}, rows {rows}");
}
