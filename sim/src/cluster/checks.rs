//! The checker: settling, quiescent points (samples, overdue transfers, sleep phases) and the
//! checks after the drain.

use super::*;

/// Waits until no engine node that is up has work, held KV or pulls, at most `limit_ms`.
/// Returns when it started.
pub(super) async fn settle(world: &Shared, limit_ms: u64) -> u64 {
    let start = lock(world).now_ms();
    loop {
        let (busy, now) = {
            let w = lock(world);
            (w.nodes.iter().skip(1).any(|n| n.down == Down::Up && n.busy()), w.now_ms())
        };
        if !busy || now >= start + limit_ms {
            return start;
        }
        sleep(Duration::from_millis(POLL_MS)).await;
    }
}

pub(super) fn mapped_detail(mapped: u64, registered: u64) -> String {
    format!(
        "the kernel's view holds {mapped} bytes of transport mappings, the registration cache accounts for {registered}: {} bytes mapped outside any registry",
        mapped.saturating_sub(registered)
    )
}

/// The transport's figures, in the soak's names, and the limit of the cache's bytes (the bound the
/// samples declare for the two byte gauges: see `regions.rs`).
pub(super) fn transport_metrics(r: &Regions, pulls: usize) -> [Metric; 5] {
    let m = |name: &str, kind, unit, value: u64| Metric { name: name.into(), kind, unit, value };
    [
        m(
            "registry.transport.regions",
            MetricKind::Bounded { capacity: r.capacity() as u64 },
            "count",
            r.registered() as u64,
        ),
        m("registry.transport.in_flight", MetricKind::PerRequest, "count", pulls as u64),
        m("engine.transport_region_bytes", MetricKind::Gauge, "bytes", r.registered_bytes()),
        m("proc.anon_transport_bytes", MetricKind::Gauge, "bytes", r.mapped_bytes()),
        m(crate::regions::LIMIT_METRIC, MetricKind::Gauge, "bytes", r.limit_bytes()),
    ]
}

/// Samples every idle node's registries, then runs the iteration's sleep phases on them. A node
/// that was up through the whole settling (from `since`, longer than the KV timeout) and still
/// holds transfers kept them past their timeout.
pub(super) fn quiescent_point(world: &Shared, ns: &NodeSpec, iter: u64, sleeps: &[(u8, bool)], since: u64) {
    let mut w = lock(world);
    let t = w.now_ms() as f64 / 1000.0;
    let settled_fully = w.now_ms() >= since + node::settle_ms(ns.kv_timeout_ms);
    let overdue: Vec<(String, usize)> = w
        .nodes
        .iter()
        .skip(1)
        .filter(|n| settled_fully && n.down == Down::Up && n.up_since_ms <= since)
        .filter_map(|n| n.engine.as_ref().map(|e| (n.name.clone(), e.held_transfers())))
        .filter(|(_, held)| *held > 0)
        .collect();
    for (name, held) in overdue {
        let detail = format!(
            "{held} transfers still hold KV after {} ms of settling (timeout {} ms)",
            node::settle_ms(ns.kv_timeout_ms),
            ns.kv_timeout_ms
        );
        w.violate("transfer-outlived-timeout", &name, detail);
    }
    let mut values = BTreeMap::new();
    let mut log = Vec::new();
    let mut mismatched = Vec::new();
    for (k, slot) in w.nodes.iter_mut().enumerate().skip(1) {
        if slot.down != Down::Up || slot.busy() {
            continue;
        }
        let Some(e) = slot.engine.as_mut() else { continue };
        // A restarted engine warms up again (its caches and tables fill anew): its gauges are
        // left out until it has been sampled for as long as the run's own warm-up.
        let since = *slot.sampled_since_iter.get_or_insert(iter);
        let warming = slot.incarnation > 1 && iter < since + crate::report::gauge_warmup_iterations();
        let heap_bytes = Metric {
            name: "heap.allocated".into(),
            kind: MetricKind::Gauge,
            unit: "bytes",
            value: heap::live_bytes(k),
        };
        for m in e.stats().into_iter().chain(transport_metrics(&slot.regions, slot.pulls.len())).chain([heap_bytes]) {
            if warming && m.kind == MetricKind::Gauge {
                continue;
            }
            values.insert(format!("{}.{}", slot.name, m.name), m);
        }
        if slot.regions.mapped_bytes() != slot.regions.registered_bytes() {
            mismatched.push((slot.name.clone(), slot.regions.mapped_bytes(), slot.regions.registered_bytes()));
        }
        for &(level, update) in sleeps {
            let r = e.sleep(level).and_then(|()| {
                if update {
                    let name = ns.spec.scenario.engine.preset.clone();
                    e.update_weights(WeightSource::Preset { name, seed: ns.spec.scenario.engine.weights_seed + iter })?;
                }
                e.wake()
            });
            log.push((slot.name.clone(), level, r.map_err(|e| e.to_string())));
        }
    }
    // The requests the router was sent so far: the count the soak's tolerance is per request of.
    let sent = Metric {
        name: crate::report::REQUESTS_METRIC.into(),
        kind: MetricKind::Counter,
        unit: "count",
        value: w.router.submitted.len() as u64,
    };
    values.insert(sent.name.clone(), sent);
    w.samples.push((iter, t, values));
    for (name, mapped, registered) in mismatched {
        w.violate("mapped-outside-registries", &name, mapped_detail(mapped, registered));
    }
    for (name, level, r) in log {
        match r {
            Ok(()) => w.event(&name, format_args!("sleep level {level} and wake at iteration {iter}")),
            Err(e) => w.violate("sleep-wake", &name, format!("sleep level {level} / wake failed: {e}")),
        }
    }
}

/// After the workload and healing: every node drains, then must be idle and clean.
pub(super) fn final_checks(w: &mut World, ns: &NodeSpec) {
    let missing: Vec<RequestId> =
        w.router.submitted.iter().filter(|id| !w.router.outcomes.contains_key(id)).copied().collect();
    for id in missing {
        w.violate("request-without-outcome", "router", format!("request {id} was sent and never ended for its client"));
    }
    let mut found = Vec::new();
    for slot in w.nodes.iter().skip(1) {
        let Some(e) = slot.engine.as_ref() else { continue };
        if e.held_transfers() > 0 {
            found.push((
                "transfer-outlived-timeout",
                slot.name.clone(),
                format!(
                    "{} transfers still hold KV {} ms after the last request ended (timeout {} ms)",
                    e.held_transfers(),
                    node::settle_ms(ns.kv_timeout_ms),
                    ns.kv_timeout_ms
                ),
            ));
        }
        if slot.regions.mapped_bytes() != slot.regions.registered_bytes() {
            found.push((
                "mapped-outside-registries",
                slot.name.clone(),
                mapped_detail(slot.regions.mapped_bytes(), slot.regions.registered_bytes()),
            ));
        }
        if !slot.pulls.is_empty() {
            found.push((
                "transfer-outlived-timeout",
                slot.name.clone(),
                format!("{} pulls never ended", slot.pulls.len()),
            ));
        }
        if e.has_unfinished() {
            found.push((
                "node-never-idle",
                slot.name.clone(),
                format!("{} requests still in flight", e.num_in_flight()),
            ));
        }
        if let Some(id) = slot.open.iter().next() {
            found.push((
                "request-never-ended",
                slot.name.clone(),
                format!("request {id} (and {} more) was added and never came out", slot.open.len() - 1),
            ));
        }
        if let Err(v) = e.check_idle() {
            for i in v {
                found.push(("idle-after-drain", slot.name.clone(), format!("{}: {}", i.metric, i.detail)));
            }
        }
    }
    for (inv, node, detail) in found {
        w.violate(inv, &node, detail);
    }
}
