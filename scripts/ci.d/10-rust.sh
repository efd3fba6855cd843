#!/usr/bin/env bash
# Format, lint and test every Rust crate.
set -euo pipefail
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
