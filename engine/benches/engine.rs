//! Engine benchmarks on the `tiny` preset: decode steps at batch 1, 8 and 32, and one whole
//! iteration of 20 requests with n=2 and 10 new tokens each (the multimodal-repeat shape, text only),
//! the vision path, and a tracked registry's bookkeeping against a bare map.
//!
//! The engine has no allocator of its own, so these run on glibc's malloc, whose mmap and trim
//! thresholds move with the largest block freed earlier in the process: a setup that stops freeing
//! one 2.4 MB buffer turned vision_encode's per-iteration temporaries into brk and page-fault churn
//! (5% of its time in the kernel). To compare two builds, run both with the thresholds held:
//! `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304:glibc.malloc.trim_threshold=33554432`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use plateau_engine::registry::Registries;
use plateau_engine::{Engine, EngineConfig, MetricKind, Request, SamplingParams};

fn request(id: u64, n: u32, max_tokens: u32) -> Request {
    let prompt = plateau_engine::tokenizer::encode(&format!("Question No.{id:08} Conclude this image in 10 words."));
    Request {
        id,
        prompt,
        params: SamplingParams { n, max_tokens, seed: Some(id), ignore_eos: true, ..SamplingParams::default() },
        images: Vec::new(),
    }
}

/// Tops the engine up to `batch` running sequences and steps them past prefill.
fn refill(e: &mut Engine, next: &mut u64, batch: usize) {
    while e.num_in_flight() < batch {
        e.add_request(request(*next, 1, 1_000)).unwrap();
        *next += 1;
    }
    for _ in 0..4 {
        e.step().unwrap();
    }
}

fn decode_steps(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_step");
    for batch in [1usize, 8, 32] {
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, &batch| {
            let mut e = Engine::new(EngineConfig { num_kv_blocks: 2048, ..EngineConfig::default() }).unwrap();
            let mut next = 0u64;
            refill(&mut e, &mut next, batch);
            let mut steps = 0u32;
            b.iter(|| {
                steps += 1;
                if steps % 500 == 0 {
                    for id in next - batch as u64..next {
                        e.abort(id);
                    }
                    e.step().unwrap();
                    refill(&mut e, &mut next, batch);
                }
                e.step().unwrap()
            });
        });
    }
    g.finish();
}

fn iteration(c: &mut Criterion) {
    c.bench_function("iteration_20req_n2_10tok", |b| {
        let mut e = Engine::new(EngineConfig::default()).unwrap();
        let mut next = 0u64;
        b.iter(|| {
            for _ in 0..20 {
                e.add_request(request(next, 2, 10)).unwrap();
                next += 1;
            }
            let mut outs = 0;
            while e.has_unfinished() {
                outs += e.step().unwrap().len();
            }
            assert_eq!(outs, 20);
        });
    });
}

/// The vision encoder on one image as multimodal-repeat sends it (364x280 after resizing: 130
/// embeddings), and the image processing (decode, resize, normalise) in front of it.
fn vision(c: &mut Criterion) {
    use plateau_engine::multimodal::image::{process, ImageInput, ImageLimits};
    use plateau_engine::{Backend, CpuBackend, ModelConfig, ModelWeights};
    let cfg = ModelConfig::preset("tiny-vl").unwrap();
    let factor = cfg.vision.as_ref().unwrap().grid_factor();
    let (w, h) = (1024u32, 768u32);
    let pixels: Vec<u8> = (0..w * h).flat_map(|i| [(i % w) as u8, (i / w) as u8, (i % 251) as u8]).collect();
    let input = ImageInput::Rgb { width: w, height: h, pixels };
    let limits = ImageLimits::default();
    c.bench_function("image_process/1024x768_rgb", |b| b.iter(|| process(&input, &limits, factor).unwrap()));
    let px = process(&input, &limits, factor).unwrap();
    let mut backend = CpuBackend::new(ModelWeights::seeded(cfg, 0), Default::default()).unwrap();
    c.bench_function("vision_encode/364x280", |b| b.iter(|| backend.encode_image(&px).unwrap()));
}

/// The bookkeeping of a tracked registry (length and insertion sites) against a bare `BTreeMap`:
/// 64 entries inserted, then removed. Multiplied by the insertions of an iteration, the difference
/// is what insertion-site tracking costs a run.
fn registry(c: &mut Criterion) {
    let mut g = c.benchmark_group("registry_64_insert_remove");
    g.bench_function("btreemap", |b| {
        let mut m = std::collections::BTreeMap::new();
        b.iter(|| {
            for k in 0..64u64 {
                m.insert(k, k);
            }
            for k in 0..64u64 {
                m.remove(&k);
            }
        });
    });
    g.bench_function("tracked_map", |b| {
        let mut book = Registries::new();
        let mut m = book.map::<u64, u64>("registry.bench", MetricKind::PerRequest);
        b.iter(|| {
            for k in 0..64u64 {
                m.insert(k, k);
            }
            for k in 0..64u64 {
                m.remove(&k);
            }
        });
    });
    g.finish();
}

criterion_group!(benches, decode_steps, iteration, vision, registry);
criterion_main!(benches);
