//! Generate text with the engine: `cargo run -p plateau-engine --example generate -- --prompt "..."`.
//! Prints each sequence's token ids and text. Same seed, same output.

use std::process::ExitCode;

use clap::Parser;
use plateau_engine::{tokenizer, Engine, EngineConfig, Request, SamplingParams, WeightSource};

#[derive(Parser)]
#[command(about = "Generate with the plateau engine (CPU backend)")]
struct Args {
    /// Prompt text (byte-level tokens).
    #[arg(long)]
    prompt: String,
    /// Sequences per prompt.
    #[arg(long, default_value_t = 1)]
    n: u32,
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Seed of the request's sampling RNGs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    top_k: u32,
    /// Model preset (tiny, small, tinyllama-1.1b).
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Load weights from a Hugging Face Llama directory instead of a preset.
    #[arg(long)]
    weights: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let model = match a.weights {
        Some(dir) => WeightSource::Dir(dir),
        None => WeightSource::Preset { name: a.preset, seed: 0 },
    };
    let run = || -> Result<(), plateau_engine::EngineError> {
        let mut engine = Engine::new(EngineConfig { model, ..EngineConfig::default() })?;
        let params = SamplingParams {
            n: a.n,
            max_tokens: a.max_tokens,
            seed: Some(a.seed),
            temperature: a.temperature,
            top_p: a.top_p,
            top_k: a.top_k,
            ..SamplingParams::default()
        };
        engine.add_request(Request { id: 0, prompt: tokenizer::encode(&a.prompt), params, images: Vec::new() })?;
        for _ in 0..100_000 {
            for out in engine.step()? {
                for s in &out.seqs {
                    println!("seq {} ({:?}): {:?}", s.index, s.finish, s.tokens);
                    println!("seq {} text: {:?}", s.index, tokenizer::decode(&s.tokens));
                }
            }
            if !engine.has_unfinished() {
                return Ok(());
            }
        }
        unreachable!("a request of at most max_tokens tokens ends in bounded steps")
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("generate: {e}");
            ExitCode::from(2)
        }
    }
}
