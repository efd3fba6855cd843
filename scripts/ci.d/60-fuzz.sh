#!/usr/bin/env bash
# Every libFuzzer target under fuzz/ (codec decoders, .bin v1 weights, msmodelslim C8
# checkpoints, h2o replay traces), built with AddressSanitizer and run for a short fixed
# time each from the checked-in seeds, so that a regression that crashes at once is
# caught. Fails on any crash; the input is left in fuzz/artifacts/<target>/.
#
# Budget: KVC_FUZZ_SECONDS (default 20) per target, 5 targets, plus the instrumented
# release build of fuzz/ (its own target dir, about 2.5 min of CPU). Long runs: by hand,
# scripts/fuzz-all.sh 10000000 (see docs/DEVELOPING.md for the counts run so far).
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/fuzz-all.sh --time "${KVC_FUZZ_SECONDS:-20}"
