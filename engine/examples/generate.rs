//! Generate text with the engine: `cargo run -p plateau-engine --example generate -- --prompt "..."`.
//! Prints each sequence's token ids and text. Same seed, same output.

use std::process::ExitCode;

use clap::Parser;
use plateau_engine::{tokenizer, EngineConfig, Request, SamplingParams, WeightSource};

#[derive(Parser)]
#[command(about = "Generate with the plateau engine on the CPU or a CUDA device; or save a preset's seeded weights")]
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
    /// Seed of the preset's weights.
    #[arg(long, default_value_t = 0)]
    weights_seed: u64,
    /// cpu, cuda (exit 2 without a usable device) or auto (cuda when usable).
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Element type on the cuda backend: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Write the model's weights as a Hugging Face directory (config.json, model.safetensors) and
    /// exit: transformers loads exactly the weights the engine runs.
    #[arg(long)]
    save_weights: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let model = match a.weights {
        Some(dir) => WeightSource::Dir(dir),
        None => WeightSource::Preset { name: a.preset, seed: a.weights_seed },
    };
    let dtype = match plateau_engine::model::dtype::DType::parse(&a.dtype) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("generate: --dtype: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(dir) = &a.save_weights {
        return match model.load().and_then(|w| w.save_dir(dir)) {
            Ok(()) => {
                println!("saved the weights to {}", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("generate: {e}");
                ExitCode::from(2)
            }
        };
    }
    if let Err(e) = plateau_engine::model::factory::resolve(&a.backend) {
        eprintln!("generate: {e}");
        return ExitCode::from(2);
    }
    let run = || -> Result<(), plateau_engine::EngineError> {
        let config = EngineConfig { model, ..EngineConfig::default() };
        let mut engine = plateau_engine::model::factory::engine_on(&a.backend, config, dtype)?;
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
