//! The nightly and CI workflows and the Kubernetes manifest call only what `plateau` has, and the
//! nightly matrix soaks every shipped scenario.

#[path = "support/commands.rs"]
mod commands;

use commands::{check, invocations, load, root, shell_texts};

const FILES: [&str; 4] = [
    ".github/workflows/ci.yml",
    ".github/workflows/nightly-soak.yml",
    "deploy/k8s/sim-sweep-indexed-job.yaml",
    "action.yml",
];

#[test]
fn workflows_parse_and_call_only_what_plateau_has() {
    let exe = env!("CARGO_BIN_EXE_plateau");
    let mut used: Vec<String> = Vec::new();
    for f in FILES {
        let docs = load(&root().join(f));
        assert!(!docs.is_empty(), "{f} is empty");
        for text in shell_texts(&docs) {
            for args in invocations(&text, "plateau") {
                used.push(check(exe, "plateau", &args, f).join(" "));
            }
        }
    }
    for needed in ["run", "history add", "history show", "history check"] {
        assert!(used.iter().any(|u| u == needed), "the workflows never call `plateau {needed}` (they call: {used:?})");
    }
}

#[test]
fn the_nightly_matrix_soaks_every_shipped_scenario() {
    let docs = load(&root().join(".github/workflows/nightly-soak.yml"));
    let listed: Vec<String> = docs[0]["jobs"]["soak"]["strategy"]["matrix"]["scenario"]
        .as_vec()
        .expect("jobs.soak.strategy.matrix.scenario is a list")
        .iter()
        .filter_map(|y| y.as_str().map(String::from))
        .collect();
    let mut shipped: Vec<String> = std::fs::read_dir(root().join("scenarios"))
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            // Scenario files only: not the README, nor topologies/ (deployments, not scenarios).
            (p.extension()? == "toml").then(|| p.file_stem()?.to_str().map(String::from))?
        })
        .collect();
    shipped.sort();
    let mut l = listed.clone();
    l.sort();
    assert_eq!(l, shipped, "the nightly matrix and scenarios/ differ");
}

#[test]
fn command_lines_are_read_from_shell_text() {
    let t = "set -e\n./plateau run ${{ matrix.scenario }} --quiet \\\n  --out runs/x >> \"$GITHUB_STEP_SUMMARY\" && echo done";
    assert_eq!(invocations(t, "plateau"), vec![vec!["run", "X", "--quiet", "--out", "runs/x"]]);
    assert!(invocations("./plateau-sim merge a.json", "plateau").is_empty());
}

#[test]
fn a_path_that_is_not_the_command_is_not_a_call() {
    assert!(invocations("chmod +x ./plateau ./plateau-sim", "plateau-sim").is_empty());
    assert_eq!(
        invocations("sh -c 'exec plateau-sim sweep --shard 1/8'", "plateau-sim"),
        vec![vec!["sweep", "--shard", "1/8"]]
    );
}
