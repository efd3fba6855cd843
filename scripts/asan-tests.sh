#!/usr/bin/env bash
# The test suites of the crates with unsafe code under AddressSanitizer (LeakSanitizer
# included), on the stable toolchain: RUSTC_BOOTSTRAP=1 unlocks -Zsanitizer=address, and
# the explicit --target keeps the flag off build scripts and proc macros (-Zbuild-std is
# not needed: the standard library stays uninstrumented, every kvc crate and Rust
# dependency is instrumented). C code built by cc (zstd) is not instrumented; the C/C++
# tests in ffi-tests/ cover the C side under ASan (scripts/ci.d/30-ffi.sh).
#
#   scripts/asan-tests.sh                 every crate in all=(...) below
#   scripts/asan-tests.sh kvc-codec ...   only these crates
#
# all=(...) is every crate with `unsafe` in its src/ (kvc-store-async has none of its own
# but runs kvc-cache's paged memory and the codecs' SIMD on every path); kvc-layering's
# tests/unsafe_code.rs fails, in CI, when a crate gains `unsafe` and is not listed here.
# Its own target dir (target/asan): the instrumented build does not disturb the normal one.
# Not a CI step as a whole: the instrumented build of every dependency takes far longer
# than a step's budget on 2 cores (see docs/DEVELOPING.md, Sanitizers, for measured times).
set -euo pipefail
cd "$(dirname "$0")/.."
all=(kvc-codec kvc-h2o kvc-int8 kvc-kvq kvc-mlp kvc-mlp-train kvc-cache kvc-transform-coder kvc-store-async kvc-capi kvc-cli kvc-test-alloc)
crates=("$@")
[ ${#crates[@]} -gt 0 ] || crates=("${all[@]}")
host="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Zsanitizer=address -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/asan}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1}"
pkgs=()
for c in "${crates[@]}"; do pkgs+=(-p "$c"); done
# --lib --tests: unit and integration tests (doc tests would need rustdoc flags too).
cargo test --locked --target "$host" "${pkgs[@]}" --lib --tests
echo "asan-tests: ${crates[*]} clean under AddressSanitizer"
