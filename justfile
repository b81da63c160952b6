# Everyday commands. Each recipe is a plain cargo command.

default: test

build:
    cargo build --release --workspace

test:
    cargo test --workspace --release

fmt:
    cargo fmt --all

lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --release --all-targets -- -D warnings

bench:
    cargo bench --workspace

generate *ARGS:
    cargo run --release -p plateau-engine --example generate -- {{ARGS}}
