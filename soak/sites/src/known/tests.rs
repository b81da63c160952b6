//! Known growth: the file read strictly, and entries accepted only as written.

use plateau_reports::{MetricVerdict, Projection, Site, Status};

use super::{apply, parse, Date, Known};

const ON: Date = Date { year: 2026, month: 12, day: 7 };

fn file(max: &str, until: &str) -> Known {
    let text = format!(
        "[[known]]\nprocess = \"*\"\nsite = 'sites_server\\.py:32'\nmax_per_request = \"{max}\"\nreason = \"upstream #4242\"\nuntil = \"{until}\"\n"
    );
    parse(&text, "k.toml", ON).unwrap()
}

fn site(name: &str, kind: &str, per_request: f64, share: f64) -> Site {
    Site {
        site: Some(name.into()),
        kind: Some(kind.into()),
        per_request: Some(per_request),
        share: Some(share),
        ..Site::default()
    }
}

/// A failing byte gauge growing `per_request`, with its judged sites (none: no share claimed).
fn gauge(name: &str, per_request: f64, sites: Vec<Site>) -> MetricVerdict {
    let explained = (!sites.is_empty()).then(|| sites.iter().filter_map(|s| s.share).sum::<f64>().min(1.0));
    MetricVerdict {
        name: name.into(),
        kind: "gauge".into(),
        unit: "bytes".into(),
        status: Status::Fail,
        reason: "grows without levelling off".into(),
        first_iter: Some(320),
        trend: None,
        capacity: None,
        max_value: None,
        location: None,
        projected: Some(Projection { per_request: Some(per_request), per_million_requests: None, per_day: None }),
        sites,
        needs_iterations: None,
        explained_share: explained,
    }
}

/// What sites_server.py's grow-list showed at its default length: 533 B a request at line 32,
/// 100% of malloc's rise and 95% of the process's pages; anonymous memory with no site listed.
fn grow_list() -> Vec<MetricVerdict> {
    vec![
        gauge("target.malloc.in_use_bytes", 534.0, vec![site("sites_server.py:32 remember", "leak", 533.0, 1.0)]),
        gauge("target.proc.rss", 512.0, vec![site("sites_server.py:32 remember", "leak", 533.0, 0.95)]),
        gauge("target.proc.anon_bytes", 534.0, vec![]),
    ]
}

fn states(entries: &[plateau_reports::KnownEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.state.as_str()).collect()
}

#[test]
fn a_leak_at_or_under_its_known_rate_passes_every_gauge_it_explains() {
    let mut m = grow_list();
    let (entries, lines) = apply::apply(&file("1KiB", "2999-01-01"), &mut m, &|_| None);
    assert!(m.iter().all(|g| g.status == Status::Pass), "{m:#?}");
    assert!(m[0].reason.contains("upstream #4242"), "{}", m[0].reason);
    assert_eq!(states(&entries), ["accepted"]);
    assert!(entries[0].matched.iter().any(|x| x.contains("sites_server.py:32 remember")), "{entries:?}");
    assert!(lines.iter().any(|l| l.contains("target.proc.anon_bytes passes")), "{lines:?}");
}

#[test]
fn a_faster_leak_or_an_expired_entry_fails_and_says_which() {
    let mut m = grow_list();
    let (entries, _) = apply::apply(&file("100B", "2999-01-01"), &mut m, &|_| None);
    assert!(m.iter().all(|g| g.status == Status::Fail));
    assert!(m[0].reason.contains("above known entry 1's 100 B/request"), "{}", m[0].reason);
    assert_eq!(states(&entries), ["exceeded"]);
    let mut m = grow_list();
    let (entries, _) = apply::apply(&file("1KiB", "2000-01-01"), &mut m, &|_| None);
    assert!(m.iter().all(|g| g.status == Status::Fail));
    assert!(m[0].reason.contains("expired: until 2000-01-01"), "{}", m[0].reason);
    assert_eq!(states(&entries), ["expired"]);
    // The day itself still holds: `until` is the last day.
    let mut m = grow_list();
    apply::apply(&file("1KiB", "2026-12-07"), &mut m, &|_| None);
    assert!(m.iter().all(|g| g.status == Status::Pass));
}

#[test]
fn a_second_leak_beside_a_known_one_fails() {
    let mut m = vec![
        gauge(
            "target.malloc.in_use_bytes",
            1133.0,
            vec![
                site("libledger.so!ledger_worker", "leak", 600.0, 0.53),
                site("sites_server.py:32 remember", "leak", 533.0, 0.47),
            ],
        ),
        gauge("target.proc.anon_bytes", 1133.0, vec![]),
    ];
    let (entries, _) = apply::apply(&file("1KiB", "2999-01-01"), &mut m, &|_| None);
    assert!(m.iter().all(|g| g.status == Status::Fail), "{m:#?}");
    assert!(m[0].reason.contains("libledger.so!ledger_worker is in no known entry"), "{}", m[0].reason);
    // The process's anonymous memory grows twice what the known site accounts for.
    assert!(m[1].reason.contains("no entry explains"), "{}", m[1].reason);
    assert_eq!(states(&entries), ["accepted"]);
}

#[test]
fn growth_the_sites_do_not_explain_is_not_accepted_with_the_known_site() {
    let mut m = vec![gauge(
        "target.malloc.in_use_bytes",
        1000.0,
        vec![site("sites_server.py:32 remember", "leak", 533.0, 0.5), site("x.py:1 f", "fill", 10.0, 0.1)],
    )];
    apply::apply(&file("1KiB", "2999-01-01"), &mut m, &|_| None);
    assert_eq!(m[0].status, Status::Fail);
    assert!(m[0].reason.contains("cover 50% of its rise and fills 10%"), "{}", m[0].reason);
    assert!(m[0].reason.contains("account for 533 B/request of its 1000 B/request"), "{}", m[0].reason);
}

/// vLLM 0.24's processes (long prompts): the worker's pages list only malloc's share of its
/// kernel caches (65%), its anonymous memory all of them; the tree's sums list every process's.
#[test]
fn a_process_listing_one_layer_passes_on_the_rate_its_accepted_sites_keep_counted_once() {
    let native = "(native code without symbols, on a thread memray knows no name of)";
    let torch = "torch/_ops.py:865 __call__";
    let text = "[[known]]\nprocess = \"worker\"\nsite = 'torch/_ops'\nmax_per_request = \"16KiB\"\nreason = \"kernels per shape\"\nuntil = \"2999-01-01\"\n\n[[known]]\nprocess = \"*\"\nsite = '^\\(native code'\nmax_per_request = \"256B\"\nreason = \"native\"\nuntil = \"2999-01-01\"\n";
    let k = parse(text, "k.toml", ON).unwrap();
    let mut m = vec![
        gauge(
            "target.worker.malloc.in_use_bytes",
            7445.0,
            vec![site(torch, "leak", 7312.0, 0.98), site(native, "leak", 118.0, 0.02)],
        ),
        gauge("target.worker.proc.anon_bytes", 10996.0, vec![site(torch, "leak", 10996.0, 1.0)]),
        gauge(
            "target.worker.proc.rss",
            10645.0,
            vec![site(torch, "leak", 7312.0, 0.65), site(native, "leak", 118.0, 0.01)],
        ),
        gauge("target.engine_core.malloc.in_use_bytes", 120.0, vec![site(native, "leak", 118.0, 0.97)]),
        gauge("target.proc.anon_bytes", 10996.0, vec![site(torch, "leak", 10996.0, 1.0)]),
        gauge("target.proc.rss", 10937.0, vec![]),
    ];
    // vLLM 0.28's engine core: malloc's free bytes undecided beside the heap's known native growth.
    let mut free = gauge("target.engine_core.malloc.free_bytes", 0.0, vec![site(native, "leak", 118.0, 0.93)]);
    free.status = Status::Inconclusive;
    free.projected = None;
    m.push(free);
    apply::apply(&k, &mut m, &|_| None);
    assert!(m.iter().all(|g| g.status == Status::Pass), "{m:#?}");
    // The tree's sum counts the worker's torch site once (10,996 B), with each process's native
    // code: 11,232 B a request, of which 80% is less than a tree growing 14 KiB a request.
    let mut m = vec![
        gauge("target.worker.proc.anon_bytes", 10996.0, vec![site(torch, "leak", 10996.0, 1.0)]),
        gauge("target.engine_core.malloc.in_use_bytes", 120.0, vec![site(native, "leak", 118.0, 0.97)]),
        gauge("target.proc.anon_bytes", 10996.0, vec![site(torch, "leak", 10996.0, 1.0)]),
        gauge("target.proc.rss", 14336.0, vec![]),
    ];
    apply::apply(&k, &mut m, &|_| None);
    assert_eq!(m[3].status, Status::Fail, "{:#?}", m[3]);
    assert!(m[3].reason.contains("10.9 KiB/request of its 14.0 KiB/request"), "{}", m[3].reason);
}

#[test]
fn an_entry_matches_its_process_by_role_and_one_that_matched_nothing_is_said() {
    let text = "[[known]]\nprocess = \"engine_core\"\nsite = 'scheduler'\nmax_per_request = 100\nreason = \"r\"\nuntil = 2999-01-01\n\n[[known]]\nprocess = \"worker\"\nsite = 'scheduler'\nmax_per_request = \"1KiB\"\nreason = \"r2\"\nuntil = \"2999-01-01\"\n";
    let k = parse(text, "k.toml", ON).unwrap();
    let mut m = vec![gauge(
        "target.engine_core.malloc.in_use_bytes",
        80.0,
        vec![site("vllm/v1/core/sched/scheduler.py:1 f", "leak", 80.0, 0.9)],
    )];
    let (entries, lines) = apply::apply(&k, &mut m, &|_| None);
    assert_eq!(m[0].status, Status::Pass);
    assert_eq!(states(&entries), ["accepted", "unmatched"]);
    assert!(
        lines.iter().any(|l| l.contains("entry 2 of k.toml") && l.contains("matched no growing site")),
        "{lines:?}"
    );
    assert_eq!(apply::process_of("target.engine_core.malloc.in_use_bytes"), "target.engine_core");
    assert_eq!(apply::process_of("target.proc.rss"), "target");
}

#[test]
fn a_bad_file_names_the_file_the_entry_and_each_field() {
    let e = parse("[[known]]\nsite = \"(unclosed\"\n", "k-bad.toml", ON).unwrap_err();
    for want in ["k-bad.toml: entry 1: `site`", "`reason` is required", "`until` is required", "`process` is required"]
    {
        assert!(e.contains(want), "{want:?} not in {e}");
    }
    let cases = [
        (
            "[[known]]\nprocess='*'\nsite='a'\nmax_per_request='1KiB/iteration'\nreason='r'\nuntil='2999-01-01'\n",
            "per request",
        ),
        (
            "[[known]]\nprocess='*'\nsite='a'\nmax_per_request='1KiB'\nreason='r'\nuntil='2999-01-01T00:00:00Z'\n",
            "without a time",
        ),
        ("[[known]]\nprocess='*'\nsite='a'\nmax_per_request='1KiB'\nreason='r'\nuntil='soon'\n", "not a date"),
        (
            "[[known]]\nprocess='*'\nsite='a'\nmax_per_request='1KiB'\nreason='r'\nuntil='2999-01-01'\nowner='me'\n",
            "`owner`",
        ),
        (
            "[[known]]\nprocess='*'\nsite='a'\nmax_per_request='1KiB'\nreason='  '\nuntil='2999-01-01'\n",
            "`reason` is required",
        ),
        ("tolerance = '1B/request'\n", "`tolerance`: not a known-growth setting"),
        ("", "no `[[known]]` entry"),
        ("[[known]\n", "k.toml: "),
    ];
    for (text, want) in cases {
        let e = parse(text, "k.toml", ON).unwrap_err();
        assert!(e.contains(want) && e.contains("k.toml"), "{want:?} not in {e}");
    }
}

/// An undecided gauge of the process (its page tables, stepping up as the leak maps pages) beside
/// its accepted leak is weighed at its whole rise by the rate rule: it passes under a leak of 533 B
/// a request; where it rose faster than the accepted sites keep, it stays undecided and says why;
/// without a rise to weigh (no request count) it stays as it was.
#[test]
fn an_undecided_gauge_beside_known_growth_is_weighed_at_its_whole_rise_by_the_rate_rule() {
    let pte = MetricVerdict {
        status: Status::Inconclusive,
        reason: "2 steps up at 94, 192: not yet significant".into(),
        projected: None,
        first_iter: None,
        ..gauge("target.proc.pte", 0.0, vec![])
    };
    let weigh = |rise: Option<f64>| {
        let mut m = grow_list();
        m.push(pte.clone());
        let (_, lines) = apply::apply(&file("1KiB", "2999-01-01"), &mut m, &|g| {
            (g.name == "target.proc.pte").then_some(rise).flatten()
        });
        (m.pop().unwrap(), lines)
    };
    // 32 KiB over 140 iterations of 20 requests: 11.7 B a request, under 533 / 0.8.
    let (m, lines) = weigh(Some(11.7));
    assert_eq!(m.status, Status::Pass, "{}", m.reason);
    assert!(m.reason.contains("it was undecided as: 2 steps up"), "{}", m.reason);
    assert!(lines.iter().any(|l| l.starts_with("known: target.proc.pte passes: it rises 12 B/request")), "{lines:?}");
    let (m, lines) = weigh(Some(749.0));
    assert_eq!(m.status, Status::Inconclusive, "{}", m.reason);
    assert!(lines.iter().any(|l| l.starts_with("known: target.proc.pte stays undecided")), "{lines:?}");
    assert_eq!(weigh(None).0.status, Status::Inconclusive);
}
