//! A prefill/decode pair in one process: the router, both engines and the in-process transport.
//!
//! The router sends each request to the prefill engine with max_tokens = 1, forwards its transfer
//! parameters with the original request to the decode engine, runs the transport for the decode
//! side's pull orders, and carries the decode side's notices back to the prefill side. A seeded
//! fraction of forwards "fail" (the decode node died before it got the request): the prefill side
//! must then free the held KV by its timeout.

use plateau_engine::{
    AbortOutcome, Engine, EngineConfig, EngineError, IdleViolation, Metric, MetricKind, ModelConfig, Notice, Request,
    RequestOutput, RequestStage, WeightSource,
};

use super::router::{Route, Router};
use super::transport::InProcessTransport;
use plateau_probes::system::System;

pub struct PdOptions {
    pub regions: usize,
    pub bytes_per_step: usize,
    pub decode_failure_fraction: f64,
    pub leak_on_remap: bool,
    /// `pd-sender-on-abort`: the transport's sender side keeps aborted transfers' state.
    pub sender_kept_on_abort: bool,
    pub seed: u64,
}

pub struct PdPair {
    prefill: Engine,
    decode: Engine,
    transport: InProcessTransport,
    router: Router,
}

fn prefixed(stats: Vec<Metric>, role: &str) -> impl Iterator<Item = Metric> + '_ {
    stats.into_iter().map(move |mut m| {
        m.name = format!("{role}.{}", m.name);
        m
    })
}

impl PdPair {
    pub fn new(prefill: Engine, decode: Engine, o: PdOptions) -> Self {
        PdPair {
            prefill,
            decode,
            transport: InProcessTransport::new(o.regions, o.bytes_per_step, o.leak_on_remap, o.sender_kept_on_abort),
            router: Router::new(o.decode_failure_fraction, o.seed),
        }
    }

    fn route_prefill_outputs(&mut self) -> Result<(), EngineError> {
        for o in self.prefill.step()? {
            match self.router.route(o) {
                Route::Ignore | Route::Drop => {}
                Route::Done(id) => {
                    self.prefill.release_transfer(id, false);
                }
                Route::Forward(orig, t) => {
                    let id = orig.id;
                    if self.decode.add_remote_request(orig, t).is_err() {
                        self.prefill.release_transfer(id, true);
                    }
                }
            }
        }
        Ok(())
    }
}

impl System for PdPair {
    fn add_request(&mut self, r: Request) -> Result<(), EngineError> {
        self.prefill.add_request(Router::prefill_request(&r))?;
        self.router.originals.insert(r.id, r);
        Ok(())
    }

    fn step(&mut self, now_ms: u64) -> Result<Vec<RequestOutput>, EngineError> {
        self.prefill.advance_time(now_ms);
        self.decode.advance_time(now_ms);
        self.route_prefill_outputs()?;
        for order in self.decode.take_pull_orders() {
            self.transport.start(order, &self.prefill, &mut self.decode);
        }
        self.transport.progress(&mut self.decode).map_err(EngineError::backend)?;
        let outputs = self.decode.step()?;
        for n in self.decode.take_notices() {
            match n {
                Notice::Pulled { request, .. } => self.prefill.release_transfer(request, false),
                Notice::Aborted { request, .. } => {
                    self.transport.cancel(request);
                    self.prefill.release_transfer(request, true)
                }
            };
        }
        Ok(outputs)
    }

    fn stage(&self, id: u64) -> Option<RequestStage> {
        self.decode.stage(id).or_else(|| self.prefill.stage(id))
    }

    fn generated(&self, id: u64) -> Vec<(u32, Vec<u32>)> {
        // A request streams from its decode side; its prefill side makes only the first token.
        self.decode.generated(id).into_iter().map(|(i, t)| (i, t.to_vec())).collect()
    }

    fn abort(&mut self, id: u64) -> AbortOutcome {
        if self.decode.stage(id).is_some() {
            return self.decode.abort(id);
        }
        self.router.originals.remove(&id);
        self.prefill.abort(id)
    }

    fn has_unfinished(&self) -> bool {
        self.prefill.has_unfinished() || self.decode.has_unfinished() || self.transport.in_flight() > 0
    }

    fn unsettled(&self) -> usize {
        self.prefill.held_transfers()
    }

    fn settle_ms(&self) -> u64 {
        self.prefill.config().kv_transfer_timeout_ms
    }

    fn stats(&self) -> Vec<Metric> {
        let mut m: Vec<Metric> =
            prefixed(self.prefill.stats(), "prefill").chain(prefixed(self.decode.stats(), "decode")).collect();
        let r = self.transport.regions();
        let count =
            |name: &str, kind, value: usize| Metric { name: name.into(), kind, unit: "count", value: value as u64 };
        m.push(count(
            "decode.registry.transport.regions",
            MetricKind::Bounded { capacity: r.capacity() as u64 },
            r.len(),
        ));
        m.push(count("decode.registry.transport.in_flight", MetricKind::PerRequest, self.transport.in_flight()));
        m.push(Metric {
            name: "decode.engine.transport_region_bytes".into(),
            kind: MetricKind::Gauge,
            unit: "bytes",
            value: r.bytes() as u64,
        });
        m.push(count("router.registry.pending", MetricKind::PerRequest, self.router.originals.len()));
        m
    }

    fn set_epoch(&mut self, epoch: u64) {
        self.prefill.set_epoch(epoch);
        self.decode.set_epoch(epoch);
    }

    fn residues(&self) -> Vec<plateau_probes::system::Residue> {
        let mut out = Vec::new();
        for (role, e) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            out.extend(e.residues().into_iter().map(|r| plateau_probes::system::Residue::from(r).with_role(role)));
        }
        out
    }

    fn check_idle(&self) -> Result<(), Vec<IdleViolation>> {
        let mut v = Vec::new();
        for (role, e) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            if let Err(mut x) = e.check_idle() {
                x.iter_mut().for_each(|i| i.metric = format!("{role}.{}", i.metric));
                v.extend(x);
            }
        }
        for (name, n) in [
            ("decode.registry.transport.in_flight", self.transport.in_flight()),
            ("router.registry.pending", self.router.originals.len()),
        ] {
            if n > 0 {
                v.push(IdleViolation {
                    metric: name.into(),
                    value: n as u64,
                    detail: format!("{name} holds {n} with nothing in flight"),
                });
            }
        }
        if v.is_empty() {
            Ok(())
        } else {
            Err(v)
        }
    }

    fn sleep(&mut self, level: u8) -> Result<(), EngineError> {
        self.prefill.sleep(level)?;
        self.decode.sleep(level)
    }

    fn wake(&mut self) -> Result<(), EngineError> {
        self.prefill.wake()?;
        self.decode.wake()
    }

    fn reset_prefix_cache(&mut self) -> Result<(), EngineError> {
        self.prefill.reset_prefix_cache()?;
        self.decode.reset_prefix_cache()
    }

    fn update_weights(&mut self, source: WeightSource) -> Result<(), EngineError> {
        self.prefill.update_weights(source.clone())?;
        self.decode.update_weights(source)
    }

    fn model_config(&self) -> &ModelConfig {
        self.prefill.model_config()
    }

    fn config(&self) -> &EngineConfig {
        self.prefill.config()
    }

    fn backend_name(&self) -> &'static str {
        self.prefill.backend_name()
    }
}
