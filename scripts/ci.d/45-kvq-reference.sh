#!/usr/bin/env bash
# kvc-quant kvq: the NumPy float64 reference (rotation, Lloyd-Max codebooks, quantizers,
# attention) regenerates the committed fixture byte for byte (a few seconds); the Rust test
# tests/reference.rs (run by 10-rust.sh) checks the kernels against that fixture.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/kvq_reference.py check crates/kvc-quant/tests/fixtures
