//! The router and the clients on node 0: placement, the next hop of each request, outcomes,
//! aborts, timeouts and disconnects.

use super::*;

/// The router node: takes engine nodes' replies and decides each request's next hop.
pub(super) async fn router_node(world: Shared) {
    let Ok(ep) = Endpoint::bind(addr(0, PORT)).await else { return };
    while let Ok((payload, _)) = ep.recv_from_raw(TAG).await {
        let Ok(msg) = payload.downcast::<Msg>() else { continue };
        let out = {
            let mut w = lock(&world);
            w.event("router", format_args!("recv {}", msg.brief()));
            route(&mut w, *msg)
        };
        send_all(&ep, out).await;
    }
}

pub(super) fn conclude(w: &mut World, id: RequestId, outcome: Outcome) {
    let Some(p) = w.router.pending.remove(&id) else { return };
    w.event("router", format_args!("outcome {id} client={} {outcome:?}", p.client));
    if w.router.outcomes.insert(id, outcome).is_some() {
        w.violate("client-saw-two-outcomes", "router", format!("request {id} got a second outcome"));
    }
}

pub(super) fn pick(w: &mut World, phase: Phase) -> usize {
    let (list, k) = match phase {
        Phase::Prefill => (&w.prefill, 0),
        Phase::Decode => (&w.decode, 1),
        Phase::Mono => (&w.mono, 2),
    };
    let node = list[w.router.next[k] % list.len()];
    w.router.next[k] += 1;
    node
}

pub(super) fn route(w: &mut World, m: Msg) -> Vec<(usize, Msg)> {
    let mut out = Vec::new();
    match m {
        Msg::Output(o) => {
            let id = o.id;
            let Some(p) = w.router.pending.get(&id) else {
                // A late reply to a request that timed out: free its held KV at once.
                if let Some(t) = o.transfer {
                    out.push((t.engine_id as usize, Msg::Release(id, true)));
                }
                return out;
            };
            let finish = o.finish();
            let prefill = o.transfer.as_ref().map(|t| t.engine_id as usize);
            match (p.phase, next_hop(&p.original.params, &o), prefill) {
                (Phase::Prefill, NextHop::Release | NextHop::Decode(_), Some(prefill)) if p.abort_requested => {
                    out.push((prefill, Msg::Release(id, true)));
                    conclude(w, id, Outcome::Aborted);
                }
                (Phase::Prefill, NextHop::Release, Some(prefill)) => {
                    out.push((prefill, Msg::Release(id, false)));
                    conclude(w, id, Outcome::Finished(finish));
                }
                (Phase::Prefill, NextHop::Decode(t), _) => {
                    let original = p.original.clone();
                    let decode = pick(w, Phase::Decode);
                    let p = w.router.pending.get_mut(&id).expect("looked up above");
                    p.phase = Phase::Decode;
                    p.node = decode;
                    out.push((decode, Msg::AddRemote(original, t)));
                }
                _ => {
                    let t = o.transfer;
                    if let Some(t) = t {
                        out.push((t.engine_id as usize, Msg::Release(id, true)));
                    }
                    let outcome = match finish {
                        FinishReason::Aborted => Outcome::Aborted,
                        FinishReason::Error => Outcome::Failed(o.error.unwrap_or_else(|| "engine error".into())),
                        f => Outcome::Finished(f),
                    };
                    conclude(w, id, outcome);
                }
            }
        }
        Msg::Rejected(id, why) => conclude(w, id, Outcome::Failed(format!("rejected: {why}"))),
        _ => {}
    }
    for (dst, m) in &out {
        let dst = w.node_name(*dst);
        w.event("router", format_args!("send {dst} {}", m.brief()));
    }
    out
}

/// Client side, on the router node: sends requests, aborts some, fails those past their timeout.
pub(super) async fn client(world: Shared, ns: Arc<NodeSpec>, plans: Vec<IterationPlan>) {
    let Ok(ep) = Endpoint::bind(addr(0, CLIENT_PORT)).await else { return };
    let timeout_ms = ns.spec.sim.request_timeout_ms;
    for (iter, plan) in plans.iter().enumerate() {
        let start = lock(&world).now_ms();
        // Timed actions: (time, order, request index, is_abort).
        let mut actions: Vec<(u64, usize, bool)> = Vec::new();
        for (k, p) in plan.requests.iter().enumerate() {
            actions.push((start + p.at_ms, k, false));
            if let Some(d) = p.abort_after_ms {
                actions.push((start + p.at_ms + d, k, true));
            }
        }
        actions.sort_by_key(|a| (a.0, a.2, a.1));
        let mut next = 0;
        loop {
            let now = lock(&world).now_ms();
            let mut out = Vec::new();
            {
                let mut w = lock(&world);
                while next < actions.len() && actions[next].0 <= now {
                    let (_, k, is_abort) = actions[next];
                    next += 1;
                    let p = &plan.requests[k];
                    if is_abort {
                        if let Some(pending) = w.router.pending.get_mut(&p.request.id) {
                            pending.abort_requested = true;
                            out.push((pending.node, Msg::Abort(p.request.id)));
                        }
                    } else {
                        out.push(submit(&mut w, p.request.clone(), p.client, now + timeout_ms));
                    }
                }
                expire(&mut w, now, &mut out);
                for (dst, m) in &out {
                    let dst = w.node_name(*dst);
                    w.event("client", format_args!("send {dst} {}", m.brief()));
                }
            }
            for (dst, m) in out {
                let _ = ep.send_to_raw(addr(dst, PORT), TAG, Box::new(m)).await;
            }
            if next == actions.len() && lock(&world).router.pending.is_empty() {
                break;
            }
            let until_next = actions.get(next).map_or(POLL_MS, |a| a.0.saturating_sub(now).clamp(1, POLL_MS));
            sleep(Duration::from_millis(until_next)).await;
        }
        let since = settle(&world, node::settle_ms(ns.kv_timeout_ms)).await;
        quiescent_point(&world, &ns, iter as u64 + 1, &plan.sleeps, since);
    }
}

pub(super) fn submit(w: &mut World, r: Request, client: u32, deadline_ms: u64) -> (usize, Msg) {
    let id = r.id;
    w.router.submitted.insert(id);
    let disaggregate = r.params.n == 1 && r.images.is_empty() && !w.prefill.is_empty();
    let phase = if disaggregate || w.mono.is_empty() { Phase::Prefill } else { Phase::Mono };
    let node = pick(w, phase);
    let msg = if phase == Phase::Prefill {
        let mut first = r.clone();
        first.params.max_tokens = 1;
        Msg::Add(first)
    } else {
        Msg::Add(r.clone())
    };
    w.router.pending.insert(id, Pending { original: r, client, phase, node, deadline_ms, abort_requested: false });
    (node, msg)
}

/// Fails every request past its deadline, and asks its node to abort it.
pub(super) fn expire(w: &mut World, now: u64, out: &mut Vec<(usize, Msg)>) {
    let late: Vec<(RequestId, usize, Phase)> =
        w.router.pending.iter().filter(|(_, p)| p.deadline_ms <= now).map(|(id, p)| (*id, p.node, p.phase)).collect();
    for (id, node, phase) in late {
        out.push((node, Msg::Abort(id)));
        conclude(w, id, Outcome::Failed(format!("timed out in {phase:?} on {}", w.node_name(node))));
    }
}

/// A client goes away: everything it has in flight is aborted.
pub(super) fn disconnect(w: &mut World, client: u32) -> Vec<(usize, Msg)> {
    let mut out = Vec::new();
    for (id, p) in w.router.pending.iter_mut().filter(|(_, p)| p.client == client) {
        p.abort_requested = true;
        out.push((p.node, Msg::Abort(*id)));
    }
    out
}
