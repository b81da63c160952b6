//! Unit tests of the samples reader: the contract example, located errors, limits, the end record.

use super::*;

const HEADER: &str = r#"{"schema":"plateau.samples.v1","scenario":"s","seed":7,"backend":"cpu","metrics":{"a":{"kind":"gauge","unit":"bytes"},"b":{"kind":"bounded","unit":"count","capacity":4}}}"#;

fn parse(text: &str) -> Result<Samples, SamplesError> {
    Samples::parse(text.as_bytes(), Path::new("x.jsonl"))
}

#[test]
fn reads_the_contract_example_and_ignores_unknown_fields() {
    let s = parse(&format!(
        "{HEADER}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":10,\"b\":2,\"zzz\":1}},\"extra\":3}}\n"
    ))
    .unwrap();
    assert_eq!(s.names, vec!["a", "b"]);
    assert_eq!(s.rows[0].values, vec![Some(10.0), Some(2.0)]);
    assert_eq!(s.quiescent_series(0), vec![(1, 10.0)]);
}

#[test]
fn errors_name_line_and_field() {
    assert!(parse("").unwrap_err().to_string().contains("x.jsonl:1: header: the file is empty"));
    let e = parse(&HEADER.replace("v1", "v2")).unwrap_err().to_string();
    assert!(e.contains(":1: schema:") && e.contains("plateau.samples.v2"), "{e}");
    let e = parse(&format!("{HEADER}\n{{\"t\":1,\"iter\":\"x\",\"quiescent\":true,\"values\":{{}}}}\n{{}}\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains(":2: iter: \"x\" is not"), "{e}");
    let e = parse(&format!("{HEADER}\n")).unwrap_err().to_string();
    assert!(e.contains("no samples"), "{e}");
}

#[test]
fn units_other_than_bytes_and_count_are_refused_by_metric() {
    let e = parse(&HEADER.replace(r#""unit":"bytes""#, r#""unit":"KiB""#)).unwrap_err().to_string();
    assert!(e.contains(":1: metrics.a.unit: `KiB`"), "{e}");
}

#[test]
fn time_must_increase() {
    let row = |t: f64| format!("{{\"t\":{t},\"iter\":1,\"quiescent\":true,\"values\":{{}}}}");
    let e = parse(&format!("{HEADER}\n{}\n{}\n{}\n", row(0.5), row(0.7), row(0.7))).unwrap_err().to_string();
    assert!(e.contains("x.jsonl:4: t: 0.7 does not increase"), "{e}");
}

#[test]
fn an_unknown_kind_is_observed_with_a_warning() {
    let s = parse(&format!(
        "{}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":1}}}}\n",
        HEADER.replace(r#""kind":"gauge""#, r#""kind":"histogram""#)
    ))
    .unwrap();
    assert_eq!(s.header.metrics["a"].kind, Kind::Observed);
    assert!(s.warnings[0].contains("metrics.a.kind: `histogram`"), "{:?}", s.warnings);
}

#[test]
fn a_cut_short_last_line_is_tolerated_and_flagged() {
    let s = parse(&format!(
        "{HEADER}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":1}}}}\n{{\"t\":1.0,\"it"
    ))
    .unwrap();
    assert!(s.truncated_tail);
    assert_eq!(s.rows.len(), 1);
}
#[test]
fn the_end_record_is_read_apart_and_nothing_may_follow_it() {
    let end = r#"{"t":9,"iter":1,"quiescent":false,"values":{},"end":{"state":"interrupted","iterations":1}}"#;
    let row = "{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{\"a\":1}}";
    let s = parse(&format!("{HEADER}\n{row}\n{end}\n")).unwrap();
    assert_eq!(s.rows.len(), 1, "the end record is not a sample");
    assert_eq!(s.end.as_ref().map(|e| e.state), Some(EndState::Interrupted));
    assert!(!s.end.unwrap().finished());
    let e = parse(&format!("{HEADER}\n{row}\n{end}\n{}\n", row.replace("0.5", "10"))).unwrap_err().to_string();
    assert!(e.contains("x.jsonl:4: end: a sample after the run's end record (line 3)"), "{e}");
}

#[test]
fn values_past_what_memory_can_be_are_refused_naming_line_and_field() {
    let e = parse(&format!("{HEADER}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":1.7e308}}}}\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.jsonl:2: values.a: "), "{e}");
    let ok = parse(&format!(
        "{HEADER}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":9007199254740992}}}}\n"
    ));
    assert!(ok.is_ok());
    let e = parse(&format!("{HEADER}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":-5}}}}\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.jsonl:2: values.a: -5 is negative, and an amount of bytes cannot be"), "{e}");
}

#[test]
fn a_relation_must_name_a_metric_of_the_header() {
    let e = parse(&HEADER.replace(r#""unit":"bytes"}"#, r#""unit":"bytes","within":"nope"}"#)).unwrap_err().to_string();
    assert!(e.contains(":1: metrics.a: names `nope`"), "{e}");
}

#[test]
fn reads_are_bounded_and_only_regular_files_are_opened() {
    let e = Samples::read(Path::new("/dev/zero")).unwrap_err().to_string();
    assert!(e.starts_with("/dev/zero:0: file: not a regular file"), "{e}");
    let long = format!("{HEADER}\n{}\n", "x".repeat(MAX_LINE_BYTES + 10));
    let e = parse(&long).unwrap_err().to_string();
    assert!(e.contains(":2: line: a line longer than 8 MiB"), "{e}");
}

#[test]
fn a_file_written_by_to_jsonl_reads_back_as_it_was() {
    let end = r#"{"t":3,"iter":2,"quiescent":false,"values":{},"end":{"state":"completed","iterations":2}}"#;
    let s = parse(&format!(
        "{HEADER}\n{{\"t\":1,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":10}}}}\n{{\"t\":2,\"iter\":2,\"quiescent\":false,\"values\":{{\"a\":12,\"b\":3}}}}\n{end}\n"
    ))
    .unwrap();
    assert!(s.end.is_some());
    let again = parse(&s.to_jsonl()).unwrap();
    assert_eq!(again, s);
}
