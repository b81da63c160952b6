//! KV transfer throughput for the `tiny` preset's blocks: the in-process path (read the prefill
//! side's blocks, copy through a registered region, write the decode side's blocks) and the TCP
//! path (the same bytes as one framed reply with CRC-32 over loopback).

use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use plateau_engine::{Backend, CpuBackend, ModelConfig, ModelWeights};
use plateau_soak::pd::region::RegionCache;
use plateau_soak::pd::wire::{read_frame, write_frame};

// The harness's allocator, as the `plateau` binary has it.
plateau_probes::install_harness_allocator!();

const BLOCK_SIZE: usize = 16;

fn backend() -> CpuBackend {
    let mut b =
        CpuBackend::new(ModelWeights::seeded(ModelConfig::preset("tiny").unwrap(), 0), Default::default()).unwrap();
    b.allocate_kv(512, BLOCK_SIZE).unwrap();
    b
}

fn transfers(c: &mut Criterion) {
    let (prefill, mut decode) = (backend(), backend());
    let mut regions = RegionCache::new(8, false);
    let mut g = c.benchmark_group("kv_transfer");
    for blocks in [4u32, 16, 64] {
        let ids: Vec<u32> = (0..blocks).collect();
        let bytes = prefill.read_kv(&ids).unwrap().len() * 4;
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::new("in_process", blocks), &ids, |b, ids| {
            b.iter(|| {
                let data = prefill.read_kv(ids).unwrap();
                let raw: Vec<u8> = data.iter().flat_map(|f| f.to_le_bytes()).collect();
                let r = regions.acquire(raw.len()).unwrap().unwrap();
                regions.bytes_mut(r)[..raw.len()].copy_from_slice(&raw);
                let back: Vec<f32> = regions.bytes_mut(r)[..raw.len()]
                    .chunks_exact(4)
                    .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                    .collect();
                regions.release(r);
                decode.write_kv(ids, &back).unwrap();
            })
        });
        // TCP: a server thread answers each request frame with the blocks' bytes as a blob.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let blob: Vec<u8> = prefill.read_kv(&ids).unwrap().iter().flat_map(|f| f.to_le_bytes()).collect();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            s.set_nodelay(true).unwrap();
            let (mut r, mut w) = (BufReader::new(s.try_clone().unwrap()), BufWriter::new(s));
            while let Ok((_, _)) = read_frame::<serde_json::Value>(&mut r) {
                if write_frame(&mut w, &serde_json::json!("Kv"), &blob).is_err() {
                    break;
                }
            }
        });
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        let (mut r, mut w) = (BufReader::new(s.try_clone().unwrap()), BufWriter::new(s));
        g.bench_with_input(BenchmarkId::new("tcp_loopback", blocks), &ids, |b, _| {
            b.iter(|| {
                write_frame(&mut w, &serde_json::json!({"ExportKv": {"blocks": blocks}}), &[]).unwrap();
                let (_, got): (serde_json::Value, Vec<u8>) = read_frame(&mut r).unwrap();
                assert_eq!(got.len(), bytes);
            })
        });
        drop((r, w));
        server.join().unwrap();
    }
    g.finish();
}

criterion_group!(benches, transfers);
criterion_main!(benches);
