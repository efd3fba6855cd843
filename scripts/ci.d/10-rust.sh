#!/usr/bin/env bash
# Format, lint and test every Rust crate. Clippy also sees kvc-capi's `test-hooks` code
# (only compiled with that feature, for ffi-tests/). `cargo test` includes the check that
# the checked-in include/kvc.h is what cbindgen generates (kvc-capi/tests/header_current.rs).
# The API docs build without a warning (broken or private intra-doc links, bad HTML, ...).
set -euo pipefail
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked --features kvc-capi/test-hooks -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --locked
