//! Prefill/decode disaggregation through the connector, with the transport done by hand.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use plateau_engine::{Engine, FinishReason, Injection, Injections, Notice, Request, RequestStage, Role};

fn pair(inject: Option<Injection>) -> (Engine, Engine) {
    let mk = |role, id| {
        engine_with(|c| {
            c.role = role;
            c.engine_id = id;
            c.kv_transfer_timeout_ms = 100;
            if let Some(i) = inject {
                c.injections = Injections::none().with(i);
            }
        })
    };
    (mk(Role::Prefill, 1), mk(Role::Decode, 2))
}

/// Runs requests through the pair; `abort_at` aborts a request on the decode side at a stage;
/// `drop` never forwards a request to the decode side (a decode node that died).
struct Run {
    outputs: BTreeMap<u64, plateau_engine::RequestOutput>,
}

fn run(p: &mut Engine, d: &mut Engine, reqs: Vec<Request>, abort_at: &[(u64, RequestStage)], drop: &[u64]) -> Run {
    let originals: BTreeMap<u64, Request> = reqs.iter().map(|r| (r.id, r.clone())).collect();
    for mut r in reqs {
        r.params.max_tokens = 1;
        p.add_request(r).unwrap();
    }
    let mut outputs = BTreeMap::new();
    let mut now = 0;
    for _ in 0..2000 {
        now += 10;
        p.advance_time(now);
        for o in p.step().unwrap() {
            let t = o.transfer.clone().expect("prefill output carries transfer params");
            if drop.contains(&o.id) {
                continue;
            }
            d.add_remote_request(originals[&o.id].clone(), t).unwrap();
        }
        for &(id, stage) in abort_at {
            if stage != RequestStage::PullingKv && d.stage(id) == Some(stage) {
                d.abort(id);
            }
        }
        for order in d.take_pull_orders() {
            let data = p.export_kv(order.request, order.handle, &order.remote_blocks);
            // Aborts during the pull: the data arrives for a request that is gone.
            if abort_at.contains(&(order.request, RequestStage::PullingKv)) {
                assert_eq!(d.stage(order.request), Some(RequestStage::PullingKv));
                d.abort(order.request);
            }
            d.pull_done(order.request, data);
        }
        for o in d.step().unwrap() {
            outputs.insert(o.id, o);
        }
        for n in d.take_notices() {
            match n {
                Notice::Pulled { request, .. } => assert!(p.release_transfer(request, false)),
                Notice::Aborted { request, .. } => {
                    p.release_transfer(request, true);
                }
            }
        }
        if !p.has_unfinished() && !d.has_unfinished() && p.held_transfers() == 0 {
            break;
        }
    }
    Run { outputs }
}

fn greedy(id: u64, len: usize, max_tokens: u32) -> Request {
    let mut r = req(id, prompt(id, len), 1, max_tokens, id);
    r.params.temperature = 0.0;
    r
}

type Tokens = BTreeMap<u64, Vec<u32>>;

/// The same requests through a monolithic engine and through a P/D pair: (monolithic, pair, the
/// pair's engines).
fn mono_and_pd(reqs: Vec<Request>) -> (Tokens, Tokens, Engine, Engine) {
    let mut mono = engine_with(|_| {});
    for r in reqs.clone() {
        mono.add_request(r).unwrap();
    }
    let want = drain(&mut mono, 500).into_iter().map(|o| (o.id, o.seqs[0].tokens.clone())).collect();
    let (mut p, mut d) = pair(None);
    let got = run(&mut p, &mut d, reqs, &[], &[]);
    let got = got.outputs.into_iter().map(|(id, o)| (id, o.seqs[0].tokens.clone())).collect();
    (want, got, p, d)
}

#[test]
fn pd_outputs_equal_the_monolithic_engine() {
    let (want, got, p, d) = mono_and_pd((0..6).map(|i| greedy(i, 9 + i as usize * 5, 12)).collect());
    assert_eq!(got, want);
    assert_eq!(p.check_idle(), Ok(()));
    assert_eq!(d.check_idle(), Ok(()));
}

#[test]
fn sampled_outputs_equal_the_monolithic_engine_too() {
    let (want, got, _, _) = mono_and_pd((0..4).map(|i| req(i, prompt(i, 20), 1, 10, 50 + i)).collect());
    assert_eq!(got, want);
}

#[test]
fn aborts_before_during_and_after_the_pull_and_a_dead_decode_side_leave_both_idle() {
    let (mut p, mut d) = pair(None);
    let reqs: Vec<Request> = (0..4).map(|i| greedy(i, 30, 12)).collect();
    let r = run(
        &mut p,
        &mut d,
        reqs,
        &[(0, RequestStage::AwaitingKv), (1, RequestStage::PullingKv), (2, RequestStage::Decode)],
        &[3],
    );
    for id in 0..3 {
        assert_eq!(r.outputs[&id].finish(), FinishReason::Aborted, "request {id}");
    }
    assert!(!r.outputs.contains_key(&3), "request 3 never reached the decode side");
    assert_eq!(p.held_transfers(), 0, "request 3's blocks were freed by the timeout");
    assert_eq!(p.check_idle(), Ok(()));
    assert_eq!(d.check_idle(), Ok(()));
}

#[test]
fn stale_requests_and_foreign_blocks_are_refused() {
    let (mut p, mut d) = pair(None);
    let r = greedy(7, 20, 4);
    let mut first = r.clone();
    first.params.max_tokens = 1;
    p.add_request(first).unwrap();
    let out = drain(&mut p, 100).remove(0);
    let t = out.transfer.unwrap();
    assert!(p.export_kv(7, t.handle + 1, &t.block_ids).unwrap_err().contains("stale transfer"));
    assert!(p.export_kv(7, t.handle, &[t.block_ids[0] + 100]).unwrap_err().contains("is not one of request 7"));
    // A pull that fails ends the request with an error on the decode side and frees both sides.
    d.add_remote_request(r, t.clone()).unwrap();
    d.step().unwrap();
    let order = d.take_pull_orders().remove(0);
    d.pull_done(order.request, Err("peer closed the connection mid-transfer".into()));
    let outs = drain(&mut d, 100);
    assert_eq!(outs[0].finish(), FinishReason::Error);
    for n in d.take_notices() {
        if let Notice::Aborted { request, .. } = n {
            p.release_transfer(request, true);
        }
    }
    assert_eq!(p.check_idle(), Ok(()));
    assert_eq!(d.check_idle(), Ok(()));
    // Parameters that do not match the prompt.
    let mut bad = t;
    bad.num_tokens += 3;
    let e = d.add_remote_request(greedy(8, 20, 4), bad).unwrap_err().to_string();
    assert!(e.contains("request 7"), "{e}");
}

#[test]
fn pd_injections_leave_registries_behind() {
    for (inj, metric) in [(Injection::PdPrefillHold, "registry.pd.held"), (Injection::PdHandles, "registry.pd.handles")]
    {
        let (mut p, mut d) = pair(Some(inj));
        let reqs: Vec<Request> = (0..3).map(|i| greedy(i, 30, 12)).collect();
        run(&mut p, &mut d, reqs, &[(0, RequestStage::AwaitingKv)], &[]);
        let v = p.check_idle().unwrap_err();
        assert!(v.iter().any(|v| v.metric == metric), "{inj}: {v:?}");
        assert_eq!(d.check_idle(), Ok(()));
    }
}

#[test]
fn pulls_past_the_in_flight_limit_wait_for_their_kv_and_all_finish() {
    let (mut p, _) = pair(None);
    let mut d = engine_with(|c| {
        c.role = Role::Decode;
        c.engine_id = 2;
        c.kv_transfer_timeout_ms = 100;
        c.max_pulls_in_flight = 1;
    });
    let reqs: Vec<Request> = (0..3).map(|i| greedy(i, 20, 4)).collect();
    let originals: BTreeMap<u64, Request> = reqs.iter().map(|r| (r.id, r.clone())).collect();
    for mut r in reqs {
        r.params.max_tokens = 1;
        p.add_request(r).unwrap();
    }
    for o in drain(&mut p, 50) {
        d.add_remote_request(originals[&o.id].clone(), o.transfer.clone().unwrap()).unwrap();
    }
    let mut finished = Vec::new();
    for _ in 0..50 {
        d.step().unwrap().into_iter().for_each(|o| finished.push(o.finish()));
        let orders = d.take_pull_orders();
        assert!(orders.len() <= 1, "{} pulls started at once past a limit of 1", orders.len());
        let pulling: Vec<u64> = (0..3).filter(|&id| d.stage(id) == Some(RequestStage::PullingKv)).collect();
        assert!(pulling.len() <= 1, "pulling at once: {pulling:?}");
        if let Some(first) = orders.first() {
            let waiting = (0..3).filter(|&id| d.stage(id) == Some(RequestStage::AwaitingKv)).count();
            assert_eq!(waiting, 2 - first.request as usize, "the rest await their KV in arrival order");
        }
        for order in orders {
            let data = p.export_kv(order.request, order.handle, &order.remote_blocks);
            d.pull_done(order.request, data);
        }
        for n in d.take_notices() {
            if let Notice::Pulled { request, .. } = n {
                assert!(p.release_transfer(request, false));
            }
        }
        if !d.has_unfinished() {
            break;
        }
    }
    assert_eq!(finished.len(), 3);
    assert!(finished.iter().all(|f| *f != FinishReason::Aborted && *f != FinishReason::Error), "{finished:?}");
    assert_eq!(d.check_idle(), Ok(()));
}
