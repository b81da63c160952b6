//! The detector against its labelled corpus (`soak/detector/corpus/`, written by `plateau_detector::corpus`):
//! every leak shape must fail on its metric and every clean shape must pass, at 60, 200 and 500
//! iterations and three noise seeds. Prints recall and false alarms per shape; fails below 100%
//! recall or above zero false alarms, and when a file differs from what the generator writes.

use std::collections::BTreeMap;
use std::path::Path;

use plateau_detector::corpus::{cases, csv, Label, LENGTHS};
use plateau_detector::judge;
use plateau_reports::Status;

#[test]
fn recall_is_total_and_false_alarms_are_zero() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let cases = cases();
    let stale: Vec<String> = LENGTHS
        .iter()
        .map(|n| root.join(format!("n{n}.csv")))
        .filter(|p| {
            std::fs::read_to_string(p).ok()
                != Some(csv(&cases, p.file_stem().unwrap().to_str().unwrap()[1..].parse().unwrap()))
        })
        .map(|p| p.display().to_string())
        .collect();
    let mut by_shape: BTreeMap<String, (Label, usize, usize)> = BTreeMap::new();
    let mut wrong = Vec::new();
    for c in &cases {
        let s = c.samples();
        // The one judge: the warm-up and tolerance the case's header records, else the defaults.
        let v = judge(&s).expect("a corpus case reads");
        let m = &v.metrics[0];
        let right = match c.label {
            Label::Leak => m.status == Status::Fail,
            Label::Clean => v.verdict == Status::Pass,
        };
        let shape = format!("{}/n{}", c.name.rsplit_once('/').map_or(c.name.as_str(), |x| x.0), c.n);
        let e = by_shape.entry(shape).or_insert((c.label, 0, 0));
        e.1 += 1;
        if right {
            e.2 += 1;
        } else {
            wrong.push(format!("{} n{}: {:?}: {}", c.name, c.n, m.status, m.reason));
        }
    }
    let (mut leaks, mut caught, mut cleans, mut alarms) = (0, 0, 0, 0);
    println!("{:<36} {:>6} {:>6}", "shape", "cases", "right");
    for (shape, (label, n, ok)) in &by_shape {
        println!("{shape:<36} {n:>6} {ok:>6}");
        match label {
            Label::Leak => (leaks, caught) = (leaks + n, caught + ok),
            Label::Clean => (cleans, alarms) = (cleans + n, alarms + (n - ok)),
        }
    }
    println!(
        "recall {caught}/{leaks} ({:.1}%), false alarms {alarms}/{cleans}",
        100.0 * caught as f64 / leaks.max(1) as f64
    );
    assert!(wrong.is_empty(), "{} cases judged wrong:\n{}", wrong.len(), wrong.join("\n"));
    assert!(
        stale.is_empty(),
        "corpus files differ from the generator (run `cargo run --release -p plateau-detector --example corpus`): {stale:?}"
    );
}
