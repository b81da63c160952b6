//! Writes the labelled detector corpus (see `plateau_detector::corpus`) into `soak/detector/corpus/`, one CSV
//! file per run length: `cargo run --release -p plateau-detector --example corpus`. Run it after a
//! deliberate change to the generator or to the detector's resolution; `soak/detector/tests/corpus.rs`
//! checks that the files match. `-- --jsonl DIR` also writes every case as a samples file, for
//! `plateau analyze DIR/leak/linear-1x/s1-n200.jsonl`.

use std::path::{Path, PathBuf};

use plateau_detector::corpus::{cases, csv, LENGTHS};

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    std::fs::create_dir_all(&root)?;
    let cases = cases();
    for n in LENGTHS {
        std::fs::write(root.join(format!("n{n}.csv")), csv(&cases, n))?;
    }
    println!("wrote {} cases into {}", cases.len(), root.display());
    let args: Vec<String> = std::env::args().collect();
    if let Some(dir) = args.iter().position(|a| a == "--jsonl").and_then(|i| args.get(i + 1)) {
        for c in &cases {
            let path = PathBuf::from(dir).join(format!("{}-n{}.jsonl", c.name, c.n));
            std::fs::create_dir_all(path.parent().expect("a file in a folder"))?;
            std::fs::write(&path, c.jsonl())?;
        }
        println!("wrote {} samples files into {dir}", cases.len());
    }
    Ok(())
}
