#!/usr/bin/env bash
# Builds and runs the gear-v2 decode fuzz target with libFuzzer on the stable toolchain
# (--target keeps the coverage flags off build scripts; RUSTC_BOOTSTRAP=1 for the sanitizer-coverage flags cargo-fuzz would pass).
# Usage: fuzz/run.sh [libFuzzer args...], e.g. fuzz/run.sh -runs=10000000
set -euo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
cargo build --release --target x86_64-unknown-linux-gnu --bin gear_v2_decode
mkdir -p corpus/gear_v2_decode
cp ../crates/kvc-codec/tests/golden/*.kvg2 corpus/gear_v2_decode/ 2>/dev/null || true
exec target/x86_64-unknown-linux-gnu/release/gear_v2_decode corpus/gear_v2_decode "$@"
