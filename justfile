# Everyday commands. Each recipe is a plain cargo command.

default: test

build:
    cargo build --release --workspace

# The README's test command: tests, then the harness's selftest.
test:
    cargo test --workspace --release && RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR=target/madsim cargo test --release -p plateau-sim && cargo run --release -p plateau-soak -- selftest --quick

fmt:
    cargo fmt --all

lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --release --all-targets --features plateau-engine/bench,plateau-soak/bench -- -D warnings

bench:
    cargo bench --workspace --features plateau-engine/bench,plateau-soak/bench
    RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR=$PWD/target/madsim cargo bench -p plateau-sim --features bench

# A soak run: just soak scenarios/mixed.toml --duration 10m
soak SCENARIO *ARGS:
    cargo run --release -p plateau-soak -- run {{SCENARIO}} {{ARGS}}

selftest:
    cargo run --release -p plateau-soak -- selftest

# The nightly job: every shipped scenario at full length, then the full selftest.
nightly:
    for s in n-sampling aborts rl-rollout prefill-only mixed multimodal-repeat pd-transfer; do cargo run --release -p plateau-soak -- run $s --until-decided || exit $?; done
    cargo run --release -p plateau-soak -- selftest

# The simulation (its own cfg and target folder): just sim sweep --seeds 0..1000 --faults heavy
sim *ARGS:
    RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR=target/madsim cargo run --release -p plateau-sim -- {{ARGS}}

sim-test:
    RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR=target/madsim cargo test --release -p plateau-sim

# The CUDA checks: build here, then run scripts/gpu-check.sh OUT_DIR on the GPU machine with gpu-bin/.
gpu-bin:
    scripts/build-gpu-bin.sh

generate *ARGS:
    cargo run --release -p plateau-engine --example generate -- {{ARGS}}

# A run's report.html in headless Chromium at desktop and phone widths: just report-check runs/<run>/report.html
report-check REPORT:
    bash scripts/report-check.sh {{REPORT}}
