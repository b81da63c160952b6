//! Names the detector's rules: the SHA-256 of its source files (tests and the corpus excluded:
//! they judge nothing), given to the crate as `PLATEAU_DETECTOR_SOURCE_SHA256`. A verdict records
//! it, so a verdict judged by other rules is known as such.

use sha2::{Digest, Sha256};

fn main() {
    println!("cargo:rerun-if-changed=src");
    let mut files: Vec<std::path::PathBuf> = match std::fs::read_dir("src") {
        Ok(dir) => dir.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) => {
            println!("cargo:warning=src: {e}");
            Vec::new()
        }
    };
    files.retain(|p| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        name.ends_with(".rs") && !name.contains("tests") && name != "corpus.rs"
    });
    files.sort();
    let mut hash = Sha256::new();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        hash.update(name.as_bytes());
        hash.update([0u8]);
        match std::fs::read(f) {
            Ok(bytes) => hash.update(&bytes),
            Err(e) => println!("cargo:warning={}: {e}", f.display()),
        }
    }
    println!("cargo:rustc-env=PLATEAU_DETECTOR_SOURCE_SHA256={:x}", hash.finalize());
}
