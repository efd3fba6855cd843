#!/usr/bin/env bash
# kvc-mlp: the NumPy float64 reference reproduces the committed golden fixtures, and the
# weight converter reads .npz / .safetensors checkpoints correctly (a few seconds).
set -euo pipefail
python3 crates/kvc-mlp/tests/reference/mlp_reference.py check crates/kvc-mlp/tests/fixtures
