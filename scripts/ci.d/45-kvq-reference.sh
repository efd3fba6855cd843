#!/usr/bin/env bash
# kvc-kvq: the NumPy float64 reference (rotation, Lloyd-Max codebooks, quantizers,
# attention) regenerates the committed fixture byte for byte (a few seconds); the Rust test
# tests/reference.rs (run by 10-rust.sh) checks the kernels against that fixture. The same
# for channel groups (K per channel over token groups, docs/formats/kvq.md): the reference
# written from the document regenerates its fixture byte for byte (under a second), and
# tests/channel_reference.rs checks the codec's blocks and decoded rows bit for bit.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/kvq_reference.py check crates/kvc-kvq/tests/fixtures
python3 scripts/kvq_channel_reference.py check crates/kvc-kvq/tests/fixtures
