#!/usr/bin/env bash
# kvc-int8's msmodelslim C8 fixtures are written by the Python `safetensors` package:
# regenerate them and check the committed copies are byte-identical (the Rust tests in
# 10-rust.sh read the committed copies back).
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 scripts/make_c8_fixtures.py "$tmp"
diff -r "$tmp" crates/kvc-int8/tests/fixtures/c8
echo "c8 fixtures: regenerated, identical"
