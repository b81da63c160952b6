//! The CUDA backend's checks on a GPU machine (run by scripts/gpu-check.sh, one JSON object per
//! check on stdout): parity against the CPU backend, device memory across requests and sleep,
//! decode and prefill throughput beside the machine's bounds. Exit 0 when every check passes,
//! 1 when one fails, 2 without a usable CUDA device.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use plateau_engine::block_pool::BlockId;
use plateau_engine::model::backend::{Backend, ForwardBatch, PoolRelease, SeqChunk};
use plateau_engine::model::cuda::{Category, CudaBackend, DType};
use plateau_engine::{
    CpuBackend, Engine, EngineConfig, EngineError, Injection, Injections, ModelConfig, ModelWeights, Request,
    SamplingParams, WeightSource,
};
use serde_json::json;

#[derive(Parser)]
#[command(about = "CUDA backend checks: parity with the CPU backend, device memory, throughput")]
struct Cli {
    #[command(subcommand)]
    check: Check,
}

#[derive(Subcommand)]
enum Check {
    /// CUDA logits against the CPU backend's on `tiny`: a batched prefill and 64 decode steps.
    /// With --dump, writes the first sequence's tokens and CUDA logits for the transformers check.
    Parity {
        #[arg(long, default_value = "f32")]
        dtype: String,
        #[arg(long)]
        dump: Option<std::path::PathBuf>,
    },
    /// 200 requests then check_idle; device allocator back to idle; sleep 2 frees >= 99%; wake.
    Memory {
        /// Switch on an injection (sleep-keeps-kv must then show as device memory kept).
        #[arg(long)]
        inject: Option<String>,
    },
    /// Decode tokens/s of a preset at the given batch sizes, prefill tokens/s at 2,048 tokens.
    Throughput {
        #[arg(long, default_value = "tinyllama-1.1b")]
        preset: String,
        #[arg(long, default_value = "bf16")]
        dtype: String,
        #[arg(long, default_value = "1,16,64")]
        batches: String,
        /// Context length of each decoding sequence.
        #[arg(long, default_value_t = 512)]
        context: usize,
        /// Under Nsight Compute (`ncu --profile-from-start off`): brackets one step with
        /// cuProfilerStart/Stop, so that only its kernels are profiled: `decode` (the 10th decode
        /// step of each batch size) or `prefill` (the last 2,047-token prefill).
        #[arg(long, value_enum)]
        profile: Option<Profiled>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Profiled {
    Decode,
    Prefill,
}

/// Opens (`on`) or closes the profiler's capture range; a no-op outside a profiler.
fn profiler(on: bool) -> Result<(), String> {
    // SAFETY: the engine's calls left its context current on this thread; the calls take no pointers.
    let r = unsafe {
        if on {
            cudarc::driver::sys::cuProfilerStart()
        } else {
            cudarc::driver::sys::cuProfilerStop()
        }
    };
    if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("cuProfiler{}: {r:?}", if on { "Start" } else { "Stop" }))
    }
}

fn fail(msg: impl std::fmt::Display) -> Result<serde_json::Value, String> {
    Err(msg.to_string())
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let scale = a.iter().map(|x| x.abs() as f64).fold(0.0, f64::max).max(1e-12);
    a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).fold(0.0, f64::max) / scale
}

fn argmax(x: &[f32]) -> u32 {
    x.iter().enumerate().fold((0, f32::NEG_INFINITY), |m, (i, &v)| if v > m.1 { (i, v) } else { m }).0 as u32
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn parity(dtype: DType, dump: Option<std::path::PathBuf>) -> Result<serde_json::Value, String> {
    let weights = ModelWeights::seeded(ModelConfig::preset("tiny").map_err(|e| e.to_string())?, 0);
    let mut cpu = CpuBackend::new(weights.clone(), PoolRelease::Drop).map_err(|e| e.to_string())?;
    let mut gpu = CudaBackend::new(weights, dtype, PoolRelease::Drop).map_err(|e| e.to_string())?;
    let (bs, blocks) = (16usize, 64usize);
    cpu.allocate_kv(blocks, bs).map_err(|e| e.to_string())?;
    gpu.allocate_kv(blocks, bs).map_err(|e| e.to_string())?;
    // Three sequences of different lengths, each with its own blocks.
    let lens = [37usize, 5, 120];
    let tables: Vec<Vec<BlockId>> = (0..3).map(|s| (0..20).map(|b| (s * 20 + b) as BlockId).collect()).collect();
    let mut seqs: Vec<Vec<u32>> =
        lens.iter().enumerate().map(|(s, &n)| (0..n).map(|i| ((i * 31 + s * 7) % 300 + 3) as u32).collect()).collect();
    let prefill = ForwardBatch {
        copies: Vec::new(),
        chunks: (0..3)
            .map(|s| SeqChunk {
                tokens: seqs[s].clone(),
                start_pos: 0,
                block_table: tables[s].clone(),
                want_logits: true,
                embeds: Vec::new(),
            })
            .collect(),
    };
    let (mut worst_prefill, mut worst_decode, mut mismatches) = (0.0f64, 0.0f64, 0usize);
    let (a, b) = (cpu.forward(&prefill).map_err(|e| e.to_string())?, gpu.forward(&prefill).map_err(|e| e.to_string())?);
    let mut dumped = vec![b[0].clone()];
    for s in 0..3 {
        worst_prefill = worst_prefill.max(rel_err(&a[s], &b[s]));
    }
    let mut next: Vec<u32> = a.iter().map(|l| argmax(l)).collect();
    mismatches += a.iter().zip(&b).filter(|(x, y)| argmax(x) != argmax(y)).count();
    for _ in 0..64 {
        let batch = ForwardBatch {
            copies: Vec::new(),
            chunks: (0..3)
                .map(|s| {
                    let pos = seqs[s].len();
                    seqs[s].push(next[s]);
                    SeqChunk {
                        tokens: vec![next[s]],
                        start_pos: pos,
                        block_table: tables[s].clone(),
                        want_logits: true,
                        embeds: Vec::new(),
                    }
                })
                .collect(),
        };
        let (a, b) = (cpu.forward(&batch).map_err(|e| e.to_string())?, gpu.forward(&batch).map_err(|e| e.to_string())?);
        for s in 0..3 {
            worst_decode = worst_decode.max(rel_err(&a[s], &b[s]));
        }
        mismatches += a.iter().zip(&b).filter(|(x, y)| argmax(x) != argmax(y)).count();
        dumped.push(b[0].clone());
        // Both sides follow the CPU's greedy tokens, so the sequences stay identical.
        next = a.iter().map(|l| argmax(l)).collect();
    }
    // KV transfer staging: read blocks on the GPU, compare with the CPU's.
    let kv_err = rel_err(
        &cpu.read_kv(&tables[2][..4]).map_err(|e| e.to_string())?,
        &gpu.read_kv(&tables[2][..4]).map_err(|e| e.to_string())?,
    );
    if let Some(path) = dump {
        let body = json!({"tokens": seqs[0], "prompt_len": lens[0], "logits": dumped});
        std::fs::write(&path, body.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let (limit, greedy_required) = match dtype {
        DType::F32 => (1e-4, true),
        DType::Bf16 => (2e-2, false),
    };
    let pass = worst_prefill < limit && worst_decode < limit && kv_err < limit && (!greedy_required || mismatches == 0);
    let v = json!({"check": "parity", "dtype": dtype.suffix(), "prefill_rel_err": worst_prefill, "decode_rel_err": worst_decode,
        "kv_read_rel_err": kv_err, "greedy_mismatches": mismatches, "limit": limit, "pass": pass});
    if pass {
        Ok(v)
    } else {
        fail(v)
    }
}

fn engine_on_cuda(
    preset: &str,
    dtype: DType,
    injections: Injections,
    blocks: usize,
    batched: usize,
) -> Result<Engine, EngineError> {
    let config = EngineConfig {
        model: WeightSource::Preset { name: preset.into(), seed: 0 },
        num_kv_blocks: blocks,
        max_num_batched_tokens: batched,
        max_num_seqs: 128,
        injections,
        ..EngineConfig::default()
    };
    plateau_engine::model::factory::engine_on("cuda", config, dtype)
}

fn gauge(e: &Engine, name: &str) -> u64 {
    e.stats().iter().find(|m| m.name == name).map_or(0, |m| m.value)
}

fn drain(e: &mut Engine) -> Result<usize, EngineError> {
    let mut n = 0;
    for _ in 0..1_000_000 {
        if !e.has_unfinished() {
            return Ok(n);
        }
        n += e.step()?.len();
    }
    Err(EngineError::backend("did not drain"))
}

fn memory(inject: Option<String>) -> Result<serde_json::Value, String> {
    let mut injections = Injections::none();
    if let Some(name) = &inject {
        injections = injections.with(name.parse::<Injection>()?);
    }
    let mut e = engine_on_cuda("tiny", DType::F32, injections.clone(), 512, 512).map_err(|e| e.to_string())?;
    let cats = |e: &Engine| -> Vec<u64> {
        Category::ALL.iter().map(|c| gauge(e, &format!("gpu.alloc.{}_bytes", c.name()))).collect()
    };
    let idle = cats(&e);
    let mut ended = 0;
    for wave in 0..10u64 {
        for i in 0..20u64 {
            let id = wave * 20 + i;
            let params = SamplingParams {
                n: 1 + (id % 3) as u32,
                max_tokens: 8 + (id % 9) as u32,
                seed: Some(id),
                ..SamplingParams::default()
            };
            let prompt: Vec<u32> = (0..(10 + id % 50)).map(|t| ((t * 13 + id) % 300 + 3) as u32).collect();
            e.add_request(Request { id, prompt, params, images: Vec::new() }).map_err(|e| e.to_string())?;
        }
        e.step().map_err(|e| e.to_string())?;
        e.abort(wave * 20 + 3);
        ended += drain(&mut e).map_err(|e| e.to_string())?;
    }
    let idle_check = e.check_idle().err().map(|v| format!("{v:?}"));
    let after = cats(&e);
    let transient_back = [2usize, 4].iter().all(|&i| after[i] == idle[i]) && after[3] == idle[3];
    let driver_before = gauge(&e, "gpu.driver_used_bytes");
    let held = after[0] + after[1];
    e.sleep(2).map_err(|e| e.to_string())?;
    let asleep = cats(&e);
    let driver_asleep = gauge(&e, "gpu.driver_used_bytes");
    let freed_alloc = 1.0 - (asleep[0] + asleep[1]) as f64 / held.max(1) as f64;
    let freed_driver = driver_before.saturating_sub(driver_asleep) as f64 / held.max(1) as f64;
    e.wake().map_err(|e| e.to_string())?;
    let woke = cats(&e);
    let restored = woke[0] == after[0] && woke[1] == after[1];
    let kept_kv = inject.as_deref() == Some("sleep-keeps-kv");
    let pass = if kept_kv {
        // The injection must show: KV bytes stay on the device across sleep and grow after wake.
        asleep[1] > 0 && woke[1] > after[1]
    } else {
        ended == 200
            && idle_check.is_none()
            && transient_back
            && freed_alloc >= 0.99
            && freed_driver >= 0.99
            && restored
    };
    let v = json!({"check": "memory", "inject": inject, "requests_ended": ended, "check_idle": idle_check.unwrap_or_else(|| "clean".into()),
        "idle_bytes": idle, "after_bytes": after, "asleep_bytes": asleep, "woke_bytes": woke, "freed_by_allocator": freed_alloc,
        "freed_by_driver": freed_driver, "driver_used_before_sleep": driver_before, "driver_used_asleep": driver_asleep, "pass": pass});
    if pass {
        Ok(v)
    } else {
        fail(v)
    }
}

fn throughput(
    preset: &str,
    dtype: DType,
    batches: &[usize],
    context: usize,
    profile: Option<Profiled>,
) -> Result<serde_json::Value, String> {
    let c = ModelConfig::preset(preset).map_err(|e| e.to_string())?;
    let weight_bytes = plateau_engine::model::cuda::backend::weight_bytes(&c, dtype) as f64;
    let kv_token_bytes = (c.kv_bytes_per_token() / 4 * dtype.size()) as f64;
    let max_b = *batches.iter().max().unwrap_or(&1);
    let blocks = max_b * (context + 80).div_ceil(16) + 2048 / 16 + 16;
    let mut e = engine_on_cuda(preset, dtype, Injections::none(), blocks, 2048).map_err(|e| e.to_string())?;
    // Device copy bandwidth: 1 GiB device-to-device, median of 5.
    let bw = copy_bandwidth()?;
    let mut rows = Vec::new();
    let mut id = 0u64;
    for &b in batches {
        for _ in 0..b {
            let prompt: Vec<u32> = (0..context).map(|t| ((t * 7 + id as usize) % 31000 + 3) as u32).collect();
            let params = SamplingParams {
                max_tokens: 48,
                ignore_eos: true,
                temperature: 0.0,
                seed: Some(id),
                ..SamplingParams::default()
            };
            e.add_request(Request { id, prompt, params, images: Vec::new() }).map_err(|e| e.to_string())?;
            id += 1;
        }
        // Prefill everything, then time pure decode steps.
        let mut times = Vec::new();
        for step in 0..10_000 {
            if !e.has_unfinished() {
                break;
            }
            let before = e.tokens_computed().0;
            let profiled = profile == Some(Profiled::Decode) && times.len() == 10;
            if profiled {
                profiler(true)?;
            }
            let t0 = Instant::now();
            e.step().map_err(|e| e.to_string())?;
            let dt = t0.elapsed().as_secs_f64();
            if profiled {
                profiler(false)?;
            }
            if e.tokens_computed().0 == before && step > 0 {
                times.push(dt);
            }
        }
        let step_s = median(times.clone());
        let bound_s = (weight_bytes + b as f64 * (context + 24) as f64 * kv_token_bytes) / bw;
        rows.push(
            json!({"batch": b, "decode_tok_s": b as f64 / step_s, "step_ms": step_s * 1e3, "bound_ms": bound_s * 1e3,
            "ratio_to_bound": step_s / bound_s, "steps_timed": times.len()}),
        );
    }
    // Prefill: one prompt filling the model's 2,048 positions (less the token it samples), one chunk.
    let prompt: Vec<u32> =
        (0..c.max_position_embeddings.min(2048) - 1).map(|t| ((t * 11) % 31000 + 3) as u32).collect();
    let n_prompt = prompt.len() as f64;
    let mut prefill_times = Vec::new();
    for k in 0..4 {
        let params = SamplingParams { max_tokens: 1, seed: Some(k), ..SamplingParams::default() };
        let mut p = prompt.clone();
        p[0] = 3 + k as u32; // no prefix-cache hit
        e.add_request(Request { id: id + k, prompt: p, params, images: Vec::new() }).map_err(|e| e.to_string())?;
        let profiled = profile == Some(Profiled::Prefill) && k == 3;
        if profiled {
            profiler(true)?;
        }
        let t0 = Instant::now();
        drain(&mut e).map_err(|e| e.to_string())?;
        prefill_times.push(t0.elapsed().as_secs_f64());
        if profiled {
            profiler(false)?;
        }
    }
    let prefill_s = median(prefill_times[1..].to_vec());
    let flops = 2.0 * weight_bytes / dtype.size() as f64 * n_prompt;
    let matmul_bound_s = flops / 790e12;
    // Causal attention of the prefill: QK^T and PV, 2 flops a multiply-add, over n(n+1)/2 pairs.
    let (layers, heads, hd) = (c.num_hidden_layers as f64, c.num_attention_heads as f64, c.head_dim as f64);
    let attention_flops = 4.0 * layers * heads * hd * n_prompt * (n_prompt + 1.0) / 2.0;
    // What scripts/gpu-profile.sh sets each kernel's time beside.
    let shape = json!({"weight_bytes": weight_bytes, "kv_token_bytes": kv_token_bytes, "context": context, "vocab": c.vocab_size,
        "dtype_bytes": dtype.size(), "prefill_attention_flops": attention_flops, "prefill_matmul_flops": flops});
    Ok(json!({"check": "throughput", "preset": preset, "dtype": dtype.suffix(), "copy_bandwidth_gb_s": bw / 1e9,
        "decode": rows, "prefill_tokens": n_prompt, "prefill_tok_s": n_prompt / prefill_s, "prefill_ms": prefill_s * 1e3, "prefill_matmul_bound_ms": matmul_bound_s * 1e3,
        "shape": shape,
        "note": "step times include the engine's host work; greedy rows (all of them here) are picked on the device, one token id read back each"}))
}

/// Device-to-device copy bandwidth (bytes/s, read plus write), median of 5 copies of 1 GiB.
fn copy_bandwidth() -> Result<f64, String> {
    let ctx = cudarc::driver::CudaContext::new(0).map_err(|e| e.to_string())?;
    let stream = ctx.default_stream();
    let n = 1usize << 30;
    let a = stream.alloc_zeros::<u8>(n).map_err(|e| e.to_string())?;
    let mut b = stream.alloc_zeros::<u8>(n).map_err(|e| e.to_string())?;
    let mut times = Vec::new();
    for _ in 0..6 {
        // cudarc's default flags disable timing (elapsed_ms then fails with an invalid handle).
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx.new_event(timed).map_err(|e| e.to_string())?;
        let end = ctx.new_event(timed).map_err(|e| e.to_string())?;
        start.record(&stream).map_err(|e| e.to_string())?;
        stream.memcpy_dtod(&a, &mut b).map_err(|e| e.to_string())?;
        end.record(&stream).map_err(|e| e.to_string())?;
        end.synchronize().map_err(|e| e.to_string())?;
        times.push(start.elapsed_ms(&end).map_err(|e| e.to_string())? as f64 / 1e3);
    }
    Ok(2.0 * n as f64 / median(times[1..].to_vec()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = plateau_engine::model::cuda::probe() {
        eprintln!("gpu_check: backend cuda: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.check {
        Check::Parity { dtype, dump } => DType::parse(&dtype).and_then(|d| parity(d, dump)),
        Check::Memory { inject } => memory(inject),
        Check::Throughput { preset, dtype, batches, context, profile } => {
            let parsed: Result<Vec<usize>, String> = batches
                .split(',')
                .map(|b| b.trim().parse::<usize>().map_err(|_| format!("--batches: `{b}`")))
                .collect();
            DType::parse(&dtype).and_then(|d| parsed.and_then(|bs| throughput(&preset, d, &bs, context, profile)))
        }
    };
    match result {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(v) => {
            println!("{v}");
            ExitCode::from(1)
        }
    }
}
