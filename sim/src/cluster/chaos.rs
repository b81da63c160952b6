//! Applying the fault plan to the madsim cluster, and healing it.

use super::*;

pub(super) fn apply_fault(w: &mut World, f: &Fault, ids: &[madsim::task::NodeId]) -> Vec<(usize, Msg)> {
    let h = Handle::current();
    let net = NetSim::current();
    w.event("faults", format_args!("{f:?}"));
    match *f {
        Fault::Kill(n) => {
            h.kill(ids[n]);
            w.nodes[n].down = Down::Killed;
        }
        Fault::Restart(n) => {
            // `init` runs again and builds a fresh engine.
            w.nodes[n].down = Down::Up;
            h.restart(ids[n]);
        }
        Fault::Pause(n) => {
            h.pause(ids[n]);
            w.nodes[n].down = Down::Paused;
        }
        Fault::Resume(n) => {
            h.resume(ids[n]);
            w.nodes[n].down = Down::Up;
            w.nodes[n].up_since_ms = w.now_ms();
        }
        Fault::ClogNode(n) => net.clog_node(ids[n]),
        Fault::UnclogNode(n) => net.unclog_node(ids[n]),
        Fault::ClogLink(a, b) => net.clog_link(ids[a], ids[b]),
        Fault::UnclogLink(a, b) => net.unclog_link(ids[a], ids[b]),
        Fault::PacketLoss(permille) => net.update_config(|c| c.packet_loss_rate = f64::from(permille) / 1000.0),
        Fault::Latency(range) => net.update_config(|c| {
            let (lo, hi) = range.unwrap_or((1, 10));
            c.send_latency = Duration::from_millis(lo)..Duration::from_millis(hi);
        }),
        Fault::SlowTransfers(n, factor) => w.nodes[n].slowdown = factor,
        Fault::Disconnect(c) => return disconnect(w, c),
    }
    Vec::new()
}

pub(super) async fn fault_task(world: Shared, plan: FaultPlan, ids: Vec<madsim::task::NodeId>) {
    let Ok(ep) = Endpoint::bind(addr(0, CLIENT_PORT + 1)).await else { return };
    for ev in plan.events {
        let now = lock(&world).now_ms();
        if ev.at_ms > now {
            sleep(Duration::from_millis(ev.at_ms - now)).await;
        }
        let out = {
            let mut w = lock(&world);
            if w.done {
                return;
            }
            let out = apply_fault(&mut w, &ev.fault, &ids);
            if ev.fault.is_end() {
                if let Some(k) = w.owed.iter().position(|f| *f == ev.fault) {
                    w.owed.remove(k);
                }
            } else if let Some(end) = ev.fault.undo() {
                w.owed.push(end);
            }
            out
        };
        send_all(&ep, out).await;
    }
}
