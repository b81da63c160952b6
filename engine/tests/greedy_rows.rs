//! A backend that answers greedy rows with their argmax alone (as the CUDA backend picks it on
//! the device) gives the engine the same tokens as one that returns every row: greedy requests,
//! sampled ones and n > 1 forks side by side in one batch.

use std::sync::{Arc, Mutex};

use plateau_engine::model::backend::{Backend, BackendMemory, BlockId, ForwardBatch, Logits};
use plateau_engine::model::config::ModelConfig;
use plateau_engine::model::cpu::CpuBackend;
use plateau_engine::model::error::Result;
use plateau_engine::model::weights::ModelWeights;
use plateau_engine::sampler::argmax;
use plateau_engine::{Engine, RequestOutput, SamplingParams};

use crate::common::{config, drain, prompt, req};

/// The CPU backend, answering greedy rows with their argmax; counts (argmax, row) answers.
struct ArgmaxRows {
    cpu: CpuBackend,
    answers: Arc<Mutex<(usize, usize)>>,
}

impl Backend for ArgmaxRows {
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
    fn forward_sampled(&mut self, batch: &ForwardBatch, greedy: &[bool]) -> Result<Vec<Logits>> {
        assert_eq!(greedy.len(), batch.chunks.len(), "one flag per chunk");
        let wanting = batch.chunks.iter().zip(greedy).filter(|(c, _)| c.want_logits && !c.tokens.is_empty());
        let rows = self.cpu.forward(batch)?;
        let mut answers = self.answers.lock().unwrap();
        Ok(rows
            .into_iter()
            .zip(wanting)
            .map(|(row, (_, &g))| {
                if g {
                    answers.0 += 1;
                    Logits::Argmax(argmax(&row))
                } else {
                    answers.1 += 1;
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
        // Even ids greedy (one of them n = 2), odd ones sampled at temperature 1.
        r.params = SamplingParams { temperature: if i % 2 == 0 { 0.0 } else { 1.0 }, ..r.params };
        engine.add_request(r).unwrap();
    }
    let mut outs = drain(engine, 400);
    outs.sort_by_key(|o| o.id);
    outs
}

#[test]
fn greedy_rows_answered_by_their_argmax_give_the_same_tokens() {
    let c = config();
    let mut plain = Engine::new(c.clone()).unwrap();
    let answers = Arc::new(Mutex::new((0, 0)));
    let cpu = CpuBackend::new(c.model.load().unwrap(), c.injections.pool_release()).unwrap();
    let mut picking = Engine::with_backend(c, Box::new(ArgmaxRows { cpu, answers: answers.clone() })).unwrap();
    let (a, b) = (run(&mut plain), run(&mut picking));
    assert_eq!(a.len(), 6);
    assert_eq!(a, b);
    let (argmaxes, rows) = *answers.lock().unwrap();
    // Both kinds of answer were given: the test compared something.
    assert!(argmaxes > 0 && rows > 0, "argmax answers {argmaxes}, rows {rows}");
}
