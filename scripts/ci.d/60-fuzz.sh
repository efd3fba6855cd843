#!/usr/bin/env bash
# Every libFuzzer target under fuzz/ (codec decoders, .bin v1 weights, msmodelslim C8
# checkpoints, h2o replay traces, kvq plans and packed rows, the kvq block tile kernels,
# K channel-group blocks (kvq_channel), kvq packed cache files (kvq_file), kv-chunk tier
# blobs, kv-prefix files (prefix_file), the transform coder's calibration files and
# sections (tc_calibration, tc_section), saved kvq cells (kvq_cells_state), and the
# llama.cpp state container parser in C++), built with AddressSanitizer
# and run for a short fixed time each from the checked-in seeds, so that a regression
# that crashes at once is caught. Fails on any crash; the input is left in
# fuzz/artifacts/<target>/.
#
# Budget: KVC_FUZZ_SECONDS (default 20) per target, 16 targets, plus the instrumented
# release build of fuzz/ (its own target dir; since kvc-capi pulls kvc-store-tiers it also
# compiles redis and blake3) and one clang++ compile of fuzz/cpp/llama_state_fuzz.cpp. Long runs: by hand,
# scripts/fuzz-all.sh 10000000 (see docs/DEVELOPING.md for the counts run so far).
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/fuzz-all.sh --time "${KVC_FUZZ_SECONDS:-20}"
