//! The engine core: a synchronous, deterministic state machine.
//!
//! `add_request` (admission) -> `step()` repeated until `has_unfinished()` is false; `abort` at any
//! point; `sleep`/`wake` between batches; `stats()` and `check_idle()` for the harness. A step is
//! schedule (the scheduler decides what runs) -> run (the model runner encodes images and computes
//! the batch) -> process (the output processor samples, applies stop rules and ends sequences and
//! requests). It owns no thread, clock or global RNG: every random draw comes from a sequence's
//! RNG seeded from its request's seed, and every container is ordered.

use crate::admission::{self, Limits};
use crate::config::EngineConfig;
use crate::encoder_cache::EncoderCache;
use crate::error::Result;
use crate::kv_manager::KvManager;
use crate::metrics::{self, Counters, IdleViolation, Sources};
use crate::model::backend::{Backend, Logits, RowSampling};
use crate::model::config::ModelConfig;
use crate::model_runner::ModelRunner;
use crate::output::{Ctx, OutputProcessor};
use crate::pd::{KvConnector, Role};
use crate::registry::{Metric, Registries};
use crate::request::{AbortOutcome, FinishReason, Request, RequestId, RequestOutput};
use crate::scheduler::{Chunk, SchedCtx, Scheduler, SchedulerOutput};
use crate::store::{ReqState, RequestStore};

mod lifecycle;
mod transfer;

pub struct Engine {
    config: EngineConfig,
    model: ModelConfig,
    max_model_len: usize,
    book: Registries,
    store: RequestStore,
    scheduler: Scheduler,
    kv: KvManager,
    encoder: EncoderCache,
    runner: ModelRunner,
    output: OutputProcessor,
    conn: KvConnector,
    counters: Counters,
    asleep: Option<u8>,
}

impl Engine {
    /// An engine on the CPU backend (other backends: `model::factory::engine_on`).
    pub fn new(config: EngineConfig) -> Result<Engine> {
        let backend = crate::model::cpu::CpuBackend::new(config.model.load()?, config.injections.pool_release())?;
        Engine::with_backend(config, Box::new(backend))
    }

    /// An engine on a given backend (holding the weights of `config.model`).
    pub fn with_backend(config: EngineConfig, mut backend: Box<dyn Backend>) -> Result<Engine> {
        let model = backend.config().clone();
        let max_model_len = config.check(model.max_position_embeddings)?;
        backend.allocate_kv(config.num_kv_blocks, config.block_size)?;
        // Registration order is the order `stats()` lists the registries in.
        let mut book = Registries::new();
        let c = &config;
        let kv = KvManager::new(c.num_kv_blocks, c.block_size, c.enable_prefix_caching, &mut book);
        let encoder = EncoderCache::new(c.encoder_cache_tokens, c.encoder_cache_entries, &mut book);
        let conn = KvConnector::new(
            c.role,
            c.engine_id,
            c.kv_transfer_timeout_ms,
            c.max_pulls_in_flight,
            c.injections.clone(),
            &mut book,
        );
        let store = RequestStore::new(&mut book);
        let scheduler =
            Scheduler::new(c.max_num_batched_tokens, c.max_num_seqs, c.max_encoder_tokens_per_step, &mut book);
        let output = OutputProcessor::new(c.injections.clone(), max_model_len, &mut book);
        let runner = ModelRunner::new(backend);
        let counters = Counters::default();
        Ok(Engine {
            config,
            model,
            max_model_len,
            book,
            store,
            scheduler,
            kv,
            encoder,
            runner,
            output,
            conn,
            counters,
            asleep: None,
        })
    }

    /// Makes this engine one side of a prefill/decode pair (before any request is added).
    pub fn set_role(&mut self, role: Role, engine_id: u32, kv_transfer_timeout_ms: u64) {
        assert_eq!(self.counters.requests_added, 0, "role set after requests were added");
        (self.config.role, self.config.engine_id, self.config.kv_transfer_timeout_ms) =
            (role, engine_id, kv_transfer_timeout_ms);
        self.conn.set_role(role, engine_id, kv_transfer_timeout_ms);
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.model
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    pub fn backend_name(&self) -> &'static str {
        self.runner.backend().name()
    }

    fn limits(&self) -> Limits<'_> {
        Limits { config: &self.config, model: &self.model, max_model_len: self.max_model_len }
    }

    /// Whether `id` is taken: a request in flight, or one whose KV this prefill side still holds.
    fn id_in_use(&self, id: RequestId) -> bool {
        self.store.requests.contains_key(&id) || self.conn.holds(id)
    }

    /// Adds a request to the waiting queue. A rejected request changes nothing.
    pub fn add_request(&mut self, r: Request) -> Result<()> {
        let state = admission::State { asleep: self.asleep, id_in_use: self.id_in_use(r.id) };
        admission::validate(&self.limits(), state, &r)?;
        let (prompt, images) = admission::expand_images(&self.limits(), &r)?;
        let seed = admission::request_seed(self.config.seed, &r);
        let sid = self.store.new_seq(r.id, 0, prompt.clone(), seed);
        self.store.requests.insert(r.id, ReqState::new(r.params, seed, prompt, sid, images));
        self.scheduler.add(sid);
        self.counters.requests_added += 1;
        Ok(())
    }

    /// True while any sequence is waiting or running (the harness drains until this is false).
    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_work() || self.output.has_pending() || self.conn.num_waiting_for_kv() > 0
    }

    /// Requests in flight (added, not yet finished).
    pub fn num_in_flight(&self) -> usize {
        self.scheduler.num_queued() + self.conn.num_waiting_for_kv()
    }

    /// Prompt tokens computed and tokens generated so far: what a shell's cost model charges a
    /// step for (the difference across it), without building `stats()`.
    pub fn tokens_computed(&self) -> (u64, u64) {
        (self.counters.prompt_tokens_computed, self.counters.tokens_generated)
    }

    /// One engine step: schedule, run, process. Returns the requests that ended.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>> {
        self.output.take_finished_ids();
        if self.asleep.is_none() && self.conn.num_waiting_for_kv() > 0 {
            self.start_pulls();
        }
        if self.asleep.is_none() && self.scheduler.has_work() {
            self.counters.steps += 1;
            let sched = self.schedule();
            self.run_encodes(&sched);
            // A sequence that ended while the step was scheduled or encoded computes nothing.
            let chunks: Vec<Chunk> = sched.chunks.into_iter().filter(|c| self.store.is_live(c.seq)).collect();
            if !chunks.is_empty() {
                let batch = ModelRunner::build_batch(&chunks, sched.copies, &self.store, &self.kv, &self.encoder);
                self.counters.block_copies += batch.copies.len() as u64;
                let sampling = ModelRunner::plan_sampling(&chunks, &mut self.store);
                let logits = self.runner.forward(&batch, &sampling)?;
                self.process(&chunks, logits, &sampling);
            }
            self.sync_queues();
        }
        Ok(self.output.drain())
    }

    /// The scheduler's decisions for this step; a sequence it finds can never be served ends at
    /// once, with its error.
    fn schedule(&mut self) -> SchedulerOutput {
        let held_may_free = self.conn.held_may_free();
        let (output, conn, counters) = (&mut self.output, &mut self.conn, &mut self.counters);
        let mut cx = SchedCtx { store: &mut self.store, kv: &mut self.kv, encoder: &mut self.encoder, held_may_free };
        let out = self.scheduler.schedule(&mut cx, &mut |cx, sid, why| {
            let rid = cx.store.seq(sid).request;
            cx.store.set_error(rid, why);
            let mut ctx =
                Ctx { store: cx.store, kv: cx.kv, encoder: cx.encoder, conn: &mut *conn, counters: &mut *counters };
            output.finish_seq(&mut ctx, sid, FinishReason::Error);
        });
        self.counters.preemptions += out.preemptions;
        self.counters.prefix_cache_hit_tokens += out.prefix_hit_tokens;
        self.counters.encoder_cache_hits += out.encoder_cache_hits;
        out
    }

    /// Runs the step's encode jobs into their reserved encoder cache entries. A failure drops the
    /// entry and ends every request that held it, with the encoder's error.
    fn run_encodes(&mut self, sched: &SchedulerOutput) {
        for job in &sched.encode {
            match self.runner.encode(job) {
                Ok(embeds) => {
                    self.encoder.fill(job.hash, embeds);
                    self.counters.encoder_runs += 1;
                }
                Err(e) => {
                    for rid in self.encoder.cancel(job.hash) {
                        let (output, mut cx) = self.parts();
                        output.fail_request(&mut cx, rid, format!("vision encoder: {e}"));
                    }
                }
            }
        }
    }

    /// The output processor's share of a step; then image references no longer needed go back.
    fn process(&mut self, chunks: &[Chunk], logits: Vec<Logits>, sampling: &[RowSampling]) {
        let (output, mut cx) = self.parts();
        output.apply(&mut cx, chunks, logits, sampling);
        let mut touched: Vec<RequestId> =
            chunks.iter().filter_map(|c| cx.store.seqs.get(&c.seq).map(|s| s.request)).collect();
        touched.dedup();
        for r in touched {
            output.release_images_if_done(&mut cx, r);
        }
    }

    /// The output processor and what it works on, borrowed together.
    fn parts(&mut self) -> (&mut OutputProcessor, Ctx<'_>) {
        let cx = Ctx {
            store: &mut self.store,
            kv: &mut self.kv,
            encoder: &mut self.encoder,
            conn: &mut self.conn,
            counters: &mut self.counters,
        };
        (&mut self.output, cx)
    }

    /// Sequences that ended leave the scheduler's queues; forked ones join the running queue.
    fn sync_queues(&mut self) {
        let (ended, started) = self.output.take_changes();
        for sid in started {
            self.scheduler.add_running(sid);
        }
        for sid in ended {
            self.scheduler.remove(sid);
        }
    }

    /// Aborts a request at whatever stage it is. Its output, with finish reason aborted, comes out
    /// of the next `step()`.
    pub fn abort(&mut self, id: RequestId) -> AbortOutcome {
        let (output, mut cx) = self.parts();
        let outcome = output.abort(&mut cx, id);
        self.sync_queues();
        outcome
    }

    pub fn kv_counts(&self) -> crate::block_pool::PoolCounts {
        self.kv.counts()
    }

    /// The iteration (or any epoch) the shell is in: registry entries inserted from now on are
    /// stamped with it, so entries left behind tell how old they are.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.book.set_epoch(epoch);
        self.output.set_epoch(epoch);
    }

    /// Every registry entry still there, by the source line that inserted it and its oldest
    /// epoch: where a residue came from.
    pub fn residues(&self) -> Vec<crate::registry::Residue> {
        self.book.residues()
    }

    fn sources(&self) -> Sources<'_> {
        Sources {
            book: &self.book,
            kv: &self.kv,
            encoder: &self.encoder,
            backend: self.runner.backend(),
            counters: &self.counters,
        }
    }

    /// Every registry, the KV pool by state, the backend's memory and the counters.
    pub fn stats(&self) -> Vec<Metric> {
        metrics::stats(&self.sources())
    }

    /// The engine's idle self-check (see `metrics`). Call it when nothing is in flight.
    pub fn check_idle(&self) -> std::result::Result<(), Vec<IdleViolation>> {
        metrics::check_idle(&self.sources())
    }
}
