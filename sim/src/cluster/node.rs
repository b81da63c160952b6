//! An engine node: its life from (re)start to kill, its messages, and each step of its core.

use super::*;

pub(super) fn build_engine(ns: &NodeSpec, node: usize, role: Role) -> Result<Engine, String> {
    let s = &ns.spec.scenario;
    let mut config = s.engine_config(ns.spec.injections.clone(), ns.seed ^ node as u64);
    config.role = role;
    let engine = match ns.spec.model {
        ModelKind::Hash => {
            let model = plateau_engine::ModelConfig::preset(&s.engine.preset).map_err(|e| e.to_string())?;
            Engine::with_backend(config, Box::new(HashBackend::new(model, ns.spec.injections.pool_release())))
        }
        ModelKind::Cpu => {
            let weights = config.model.load().map_err(|e| e.to_string())?;
            let backend = CpuBackend::new(weights, ns.spec.injections.pool_release()).map_err(|e| e.to_string())?;
            Engine::with_backend(config, Box::new(backend))
        }
    };
    let mut engine = engine.map_err(|e| e.to_string())?;
    engine.set_role(role, node as u32, ns.kv_timeout_ms);
    Ok(engine)
}

/// How often a node that holds transfers wakes with nothing to do: the engine owns no clock, so a
/// held transfer past its timeout is freed at the first tick after its deadline, up to this late.
pub(super) fn held_poll_ms(kv_timeout_ms: u64) -> u64 {
    (kv_timeout_ms / 4).max(1)
}

/// The longest a held transfer may outlive its request: its timeout, the tick that frees it
/// ([`held_poll_ms`]) and 200 ms of network slack for the release that would have come first.
/// Settling waits this long, and a node up through it must hold nothing.
pub(super) fn settle_ms(kv_timeout_ms: u64) -> u64 {
    kv_timeout_ms + held_poll_ms(kv_timeout_ms) + 200
}

/// Sends every message; a send that fails (the network refused it) is lost, like a dropped packet.
pub(super) async fn send_all(ep: &Endpoint, out: Vec<(usize, Msg)>) {
    for (dst, msg) in out {
        let _ = ep.send_to_raw(addr(dst, PORT), TAG, Box::new(msg)).await;
    }
}

/// An engine node's life, from (re)start to kill. Returns only if its endpoint fails.
pub(super) async fn engine_node(world: Shared, ns: Arc<NodeSpec>, idx: usize) {
    let role = lock(&world).nodes[idx].role;
    {
        let mut w = lock(&world);
        // The previous incarnation's memory went with its process.
        drop(w.nodes[idx].engine.take());
        w.nodes[idx].open.clear();
        w.nodes[idx].pulls.clear();
        heap::reset(idx);
        let _tag = heap::enter(idx);
        let engine = build_engine(&ns, idx, role);
        let name = w.nodes[idx].name.clone();
        let now = w.now_ms();
        match engine {
            Ok(e) => {
                let slot = &mut w.nodes[idx];
                slot.engine = Some(e);
                slot.incarnation += 1;
                slot.open.clear();
                slot.pulls.clear();
                slot.regions = Regions::new(
                    ns.regions,
                    ns.max_transfer_bytes,
                    ns.spec.injections.on(plateau_engine::Injection::PdMmapHook),
                );
                slot.sampled_since_iter = None;
                slot.down = Down::Up;
                slot.up_since_ms = now;
                let inc = slot.incarnation;
                w.event(&name, format_args!("start incarnation {inc} as {role:?}"));
            }
            Err(e) => {
                w.violate("node-start", &name, format!("cannot build the engine: {e}"));
                return;
            }
        }
    }
    let Ok(ep) = Endpoint::bind(addr(idx, PORT)).await else { return };
    let ep = Arc::new(ep);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Msg>();
    let receiver = ep.clone();
    madsim::task::spawn(async move {
        while let Ok((payload, _)) = receiver.recv_from_raw(TAG).await {
            let Ok(msg) = payload.downcast::<Msg>() else { continue };
            if tx.send(*msg).is_err() {
                break;
            }
        }
    });
    let mut held_over: Option<Msg> = None;
    loop {
        let mut out = Vec::new();
        let mut transfers = Vec::new();
        let (work_ms, wait_ms) = {
            let mut w = lock(&world);
            let _tag = heap::enter(idx);
            let mut inbox: Vec<Msg> = held_over.take().into_iter().collect();
            while let Ok(m) = rx.try_recv() {
                inbox.push(m);
            }
            for m in inbox {
                handle_engine_msg(&mut w, &ns, idx, m, &mut out, &mut transfers);
            }
            tick(&mut w, &ns, idx, &mut out)
        };
        for (dst, delay_ms, msg) in transfers {
            let ep = ep.clone();
            madsim::task::spawn(async move {
                sleep(Duration::from_millis(delay_ms)).await;
                let _ = ep.send_to_raw(addr(dst, PORT), TAG, Box::new(msg)).await;
            });
        }
        send_all(&ep, out).await;
        if work_ms > 0 {
            sleep(Duration::from_millis(work_ms)).await;
        } else if let Ok(m) = madsim::time::timeout(Duration::from_millis(wait_ms), rx.recv()).await {
            match m {
                Some(m) => held_over = Some(m),
                None => return,
            }
        }
    }
}

pub(super) fn handle_engine_msg(
    w: &mut World,
    ns: &NodeSpec,
    idx: usize,
    m: Msg,
    out: &mut Vec<(usize, Msg)>,
    transfers: &mut Vec<(usize, u64, Msg)>,
) {
    let name = w.nodes[idx].name.clone();
    w.event(&name, format_args!("recv {}", m.brief()));
    let slot = &mut w.nodes[idx];
    let Some(engine) = slot.engine.as_mut() else { return };
    match m {
        Msg::Add(r) => {
            let id = r.id;
            match engine.add_request(r) {
                Ok(()) => {
                    slot.open.insert(id);
                }
                Err(e) => out.push((0, Msg::Rejected(id, e.to_string()))),
            }
        }
        Msg::AddRemote(r, t) => {
            let (id, prefill) = (r.id, t.engine_id as usize);
            match engine.add_remote_request(r, t) {
                Ok(()) => {
                    slot.open.insert(id);
                }
                Err(e) => {
                    out.push((0, Msg::Rejected(id, e.to_string())));
                    out.push((prefill, Msg::Release(id, true)));
                }
            }
        }
        Msg::Abort(id) => {
            engine.abort(id);
        }
        Msg::Pull(order, decode) => {
            let data = engine.export_kv(order.request, order.handle, &order.remote_blocks);
            let tokens = (order.remote_blocks.len() * engine.config().block_size) as u64;
            let ms = ns.cost.transfer_ms(tokens * ns.kv_bytes_per_token, slot.slowdown);
            transfers.push((decode, ms, Msg::KvData(order.request, order.handle, data)));
        }
        Msg::KvData(id, handle, result) => {
            if slot.pulls.get(&id).is_some_and(|p| p.handle == handle && p.queued.is_none()) {
                let p = slot.pulls.remove(&id).expect("looked up");
                if let Some(r) = p.region {
                    slot.regions.release(r);
                }
                engine.pull_done(id, result);
            }
        }
        Msg::Release(id, aborted) => {
            engine.release_transfer(id, aborted);
        }
        Msg::Output(_) | Msg::Rejected(..) => {}
    }
}

/// Tells the core the time, times out pulls, steps, and queues what came out. Returns the step's
/// modelled cost (0: nothing computed) and how long to wait for a message otherwise.
pub(super) fn tick(w: &mut World, ns: &NodeSpec, idx: usize, out: &mut Vec<(usize, Msg)>) -> (u64, u64) {
    let now = w.now_ms();
    let name = w.nodes[idx].name.clone();
    let slot = &mut w.nodes[idx];
    let Some(engine) = slot.engine.as_mut() else { return (0, 1_000) };
    engine.advance_time(now);
    let expired: Vec<RequestId> =
        slot.pulls.iter().filter(|(_, p)| p.since_ms + ns.kv_timeout_ms <= now).map(|(id, _)| *id).collect();
    for id in &expired {
        let p = slot.pulls.remove(id).expect("listed");
        if let Some(r) = p.region {
            slot.regions.release(r);
        }
        engine.pull_done(*id, Err(format!("KV pull timed out after {} ms", ns.kv_timeout_ms)));
    }
    let (prompt_before, generated_before) = engine.tokens_computed();
    let stepped = engine.has_unfinished();
    let result = if stepped { engine.step() } else { Ok(Vec::new()) };
    let outputs = match result {
        Ok(o) => o,
        Err(e) => {
            let detail = format!("step failed: {e}");
            w.violate("engine-error", &name, detail);
            return (0, 1_000);
        }
    };
    let (prompt_after, generated_after) = engine.tokens_computed();
    let mut ended_twice = Vec::new();
    for o in outputs {
        if !slot.open.remove(&o.id) {
            ended_twice.push(o.id);
        }
        out.push((0, Msg::Output(o)));
    }
    let block_bytes = engine.config().block_size as u64 * ns.kv_bytes_per_token;
    for order in engine.take_pull_orders() {
        let bytes = order.remote_blocks.len() as u64 * block_bytes;
        let state = PullState { handle: order.handle, since_ms: now, bytes, region: None, queued: None };
        slot.pulls.insert(order.request, PullState { queued: Some(order), ..state });
    }
    // Pulls go out in request order as regions free up.
    for p in slot.pulls.values_mut().filter(|p| p.queued.is_some()) {
        let Some(r) = slot.regions.acquire(p.bytes) else { break };
        p.region = Some(r);
        let order = p.queued.take().expect("filtered");
        out.push((order.engine_id as usize, Msg::Pull(order, idx)));
    }
    for n in engine.take_notices() {
        let (engine_id, request, aborted) = match n {
            plateau_engine::Notice::Pulled { engine_id, request, .. } => (engine_id, request, false),
            plateau_engine::Notice::Aborted { engine_id, request, .. } => (engine_id, request, true),
        };
        out.push((engine_id as usize, Msg::Release(request, aborted)));
    }
    let held = engine.held_transfers() > 0;
    let pulls = slot.pulls.values().map(|p| p.since_ms + ns.kv_timeout_ms).min();
    for id in ended_twice {
        w.violate("request-ended-twice", &name, format!("request {id} came out of the engine but was not open"));
    }
    for (dst, m) in out.iter() {
        let dst = w.node_name(*dst);
        w.event(&name, format_args!("send {dst} {}", m.brief()));
    }
    let (prefill, decode) = (prompt_after - prompt_before, generated_after - generated_before);
    if stepped && prefill + decode > 0 {
        return (ns.cost.step_ms(prefill, decode), 0);
    }
    let mut wait = if stepped { POLL_MS } else { 1_000 };
    if held {
        wait = wait.min(held_poll_ms(ns.kv_timeout_ms));
    }
    if let Some(deadline) = pulls {
        wait = wait.min(deadline.saturating_sub(now).max(1));
    }
    (0, wait)
}
