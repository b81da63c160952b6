//! The README's figures are the binary's: the sentence that quotes a default n-sampling run's
//! resolution (seed 1) says what that run's verdict says today. `scripts/readme-figures.sh
//! --write` puts the binary's figures into README.md.

use crate::common;
use common::plateau;

/// A figure as the README writes it: whole bytes from 10 up, one decimal below.
fn bytes(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

#[test]
fn the_readme_quotes_the_resolution_the_binary_gives() {
    let d = common::tmp("docs", "readme");
    let o = plateau(&[
        "run",
        "n-sampling",
        "--seed",
        "1",
        "--quiet",
        "--no-replay",
        "--out",
        d.join("run").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("run/verdict.json")).unwrap()).unwrap();
    let heap = v["metrics"].as_array().unwrap().iter().find(|m| m["name"] == "jemalloc.allocated").unwrap();
    let t = &heap["trend"];
    let f = |k: &str| bytes(t[k].as_f64().unwrap_or_else(|| panic!("{k}: {t}")));
    let sentence = format!(
        "resolves {} bytes per iteration of heap, {} bytes per request, of which its noise alone resolves {} bytes per iteration and the default tolerance (`1B/request`, {:.0} requests an iteration) accepts {}.",
        f("resolution_per_iter"),
        f("resolution_per_request"),
        f("noise_resolution_per_iter"),
        v["requests_per_iter"].as_f64().unwrap(),
        f("tolerance_per_iter"),
    );
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let flat = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&sentence),
        "README.md does not say what the binary says (scripts/readme-figures.sh --write puts it there):\n  {sentence}"
    );
}
