//! Random scenario files, as a careless or hostile user might write them, run for two iterations:
//! every one ends with exit 1 (growth: a registry left over is decided at once), 2 (a clear input
//! error) or 4 (too short to judge); never 0 (two iterations judge no gauge, so nothing passes),
//! 3 (the harness failing), a panic, or the process killed for memory or time.

use std::process::Command;

use proptest::prelude::*;

/// A field of a scenario and a value that may or may not suit it.
fn field() -> impl Strategy<Value = (String, String, String)> {
    let section = prop_oneof![Just("engine"), Just("soak"), Just("phase")];
    let key = prop_oneof![
        Just("requests"),
        Just("prompt_tokens"),
        Just("shared_prefix_tokens"),
        Just("max_tokens"),
        Just("n"),
        Just("invalid"),
        Just("temperature"),
        Just("top_p"),
        Just("prompt"),
        Just("num_kv_blocks"),
        Just("block_size"),
        Just("max_num_seqs"),
        Just("max_num_batched_tokens"),
        Just("max_model_len"),
        Just("iterations"),
        Just("warmup_iterations"),
        Just("tolerance"),
        Just("preset"),
        Just("bogus"),
    ];
    let value = prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("4000000000".to_string()),
        Just("18446744073709551615".to_string()),
        Just("1e300".to_string()),
        Just("nan".to_string()),
        Just("\"{i:0999999999}\"".to_string()),
        Just("\"64B/hour\"".to_string()),
        Just("\"tiny-vl\"".to_string()),
        Just("true".to_string()),
        Just("[1, 2]".to_string()),
        (1u32..300).prop_map(|v| v.to_string()),
        (0.0f64..2.0).prop_map(|v| format!("{v:.3}")),
    ];
    (section, key, value).prop_map(|(s, k, v)| (s.to_string(), k.to_string(), v))
}

/// A small valid scenario with `fields` overridden, each in its section.
fn scenario(fields: &[(String, String, String)]) -> String {
    let mut sections: Vec<(String, Vec<String>)> = vec![
        ("engine".into(), vec!["preset = \"tiny\"".into(), "num_kv_blocks = 64".into()]),
        ("soak".into(), vec!["iterations = 2".into(), "warmup_iterations = 1".into()]),
        (
            "phase".into(),
            vec![
                "kind = \"batch\"".into(),
                "requests = 3".into(),
                "prompt = \"Q{i:04}: hi\"".into(),
                "max_tokens = 4".into(),
            ],
        ),
    ];
    for (s, k, v) in fields {
        let lines = &mut sections.iter_mut().find(|x| &x.0 == s).expect("a known section").1;
        lines.retain(|l| !l.starts_with(&format!("{k} ")));
        lines.push(format!("{k} = {v}"));
    }
    let mut text = String::from("name = \"random\"\ndescription = \"a random scenario\"\n");
    for (s, lines) in sections {
        text.push_str(&if s == "phase" { "\n[[phase]]\n".to_string() } else { format!("\n[{s}]\n") });
        for l in lines {
            text.push_str(&l);
            text.push('\n');
        }
    }
    text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn any_scenario_file_ends_with_a_verdict_or_a_clear_error(fields in prop::collection::vec(field(), 0..4)) {
        let dir = std::env::temp_dir().join(format!("plateau-random-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("random.toml");
        let text = scenario(&fields);
        std::fs::write(&file, &text).unwrap();
        let o = Command::new("timeout")
            .args(["60", env!("CARGO_BIN_EXE_plateau"), "run"])
            .arg(&file)
            .args(["--iterations", "2", "--quiet", "--out"])
            .arg(dir.join("out"))
            .output()
            .unwrap();
        let code = o.status.code();
        let err = String::from_utf8_lossy(&o.stderr);
        prop_assert!(matches!(code, Some(1 | 2 | 4)), "exit {code:?} for\n{text}\n{err}");
        if code == Some(2) {
            prop_assert!(err.starts_with("plateau: ") && !err.contains("panicked"), "{err}");
        }
    }
}
