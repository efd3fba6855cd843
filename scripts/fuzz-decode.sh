#!/usr/bin/env bash
# Fuzz the gear-v1 decoder with libFuzzer + AddressSanitizer on the stable toolchain
# (RUSTC_BOOTSTRAP=1 unlocks the sanitizer flags cargo-fuzz would pass on nightly).
# usage: scripts/fuzz-decode.sh [RUNS] [extra libFuzzer args...]   (default 10000000 runs)
# Not a CI step: it takes minutes. The corpus starts from blobs of the embedded sample.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
runs="${1:-10000000}"
shift || true
target="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Zsanitizer=address -Cdebug-assertions -Coverflow-checks"
cargo build --release --target "$target" --bin gear_v1_decode
mkdir -p corpus/gear_v1_decode artifacts
exec "target/$target/release/gear_v1_decode" corpus/gear_v1_decode seeds/gear_v1_decode \
    -runs="$runs" -max_len=4096 -artifact_prefix=artifacts/ -print_final_stats=1 "$@"
