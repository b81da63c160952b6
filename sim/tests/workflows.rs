//! The nightly workflow and the Kubernetes Indexed Job call only what `plateau-sim` has: a
//! sharded sweep and the merge of its shards. In the ordinary build (the simulation build leaves
//! YAML out).
#![cfg(not(madsim))]

#[path = "../../soak/tests/support/commands.rs"]
mod commands;

use commands::{check, invocations, load, root, shell_texts};

#[test]
fn the_sharded_sweep_and_its_merge_exist_as_called() {
    let exe = env!("CARGO_BIN_EXE_plateau-sim");
    for (f, needs_index) in
        [(".github/workflows/nightly-soak.yml", false), ("deploy/k8s/sim-sweep-indexed-job.yaml", true)]
    {
        let docs = load(&root().join(f));
        let mut used = Vec::new();
        for text in shell_texts(&docs) {
            if needs_index && text.contains("plateau-sim sweep") {
                assert!(
                    text.contains("--shard") && text.contains("JOB_COMPLETION_INDEX"),
                    "{f}: the sweep is not sharded by JOB_COMPLETION_INDEX"
                );
            }
            for args in invocations(&text, "plateau-sim") {
                used.push(check(exe, "plateau-sim", &args, f).join(" "));
            }
        }
        assert!(used.iter().any(|u| u == "sweep"), "{f} runs no sweep: {used:?}");
    }
}
