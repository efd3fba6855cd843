#!/usr/bin/env bash
# kvc inside MNN (issue 36): MNN's LLM engine built from an MNN source with kvc's patch series
# (only libMNN, libMNN_Express and libllm), SmolLM2-135M-Instruct converted with MNN's own
# gguf2mnn.py (no torch), and one short kvc_mnn_eval run checked by ci_check_mnn.py: kvc's H2O
# holds fewer KV bytes within a PPL bound of MNN's uncompressed run, a missing kvc or a bad key
# falls back to exactly that run, a kvc error mid-run (a library that fails on purpose) ends the
# request with the error; kvc's gear-v1 writes the fork's lossless encoder's bytes.
# Cached under .cache/mnn. Without an MNN source
# (MNN_SOURCE_DIR, or the upstream tarball in ../shared/engines/) the step prints why and skips.
set -euo pipefail
cd "$(dirname "$0")/../.."

t0=$SECONDS
rc=0
build_out="$(integrations/mnn/fetch-and-build.sh)" || rc=$?
if [ "$rc" -eq 3 ]; then
    echo "57-mnn: skipped: $build_out"
    exit 0
fi
[ "$rc" -eq 0 ] || { echo "57-mnn: fetch-and-build.sh failed ($rc)" >&2; exit 1; }
eval "$(grep -E '^[A-Z_]+=' <<<"$build_out")"
echo "57-mnn: fetch and build took $((SECONDS - t0)) s"
out=".cache/mnn/ci"
rm -rf "$out"
mkdir -p "$out"
tokenize=".cache/llama/build-llama/bin/llama-tokenize"
extra=()
[ -x "$tokenize" ] && extra=(--llama-tokenize "$tokenize" --gguf "$GGUF")
t1=$SECONDS
python3 integrations/mnn/ci_check_mnn.py --eval "$EVAL" --config "$MNN_CONFIG" --kvc-library "$KVC_LIBRARY" \
    --text "$TEXT_A" --out "$out" --fault-shim "$FAULT_SHIM" \
    --kvq-plan data/kvq-plans/smollm2-135m-k4v4-s4w64.json "${extra[@]}"
echo "57-mnn: the kvc-in-MNN check took $((SECONDS - t1)) s"

# kvc's gear-v1 against the fork's own lossless encoder, cut out of the fork's source at run
# time: the same bytes on real KV blocks (integrations/mnn/gear_vs_fork/check.sh)
t2=$SECONDS
rc=0
fork_src="$(integrations/mnn/fetch-and-build.sh --fork --source-only)" || rc=$?
if [ "$rc" -eq 3 ]; then
    echo "57-mnn: gear-v1 against the fork's encoder skipped: $fork_src"
else
    [ "$rc" -eq 0 ] || { echo "57-mnn: the fork's source: fetch-and-build.sh failed ($rc)" >&2; exit 1; }
    FORK_TREE="$(sed -n 's/^MNN_SRC=//p' <<<"$fork_src")" BUILD_DIR=.cache/mnn/gear-vs-fork \
        KVC_LIB="$KVC_LIBRARY" integrations/mnn/gear_vs_fork/check.sh >"$out/gear-vs-fork.txt" 2>&1 \
        || { cat "$out/gear-vs-fork.txt" >&2; echo "57-mnn: gear-v1 differs from the fork's encoder" >&2; exit 1; }
    grep -E '^(==|summary|frames|decodes)' "$out/gear-vs-fork.txt"
    echo "57-mnn: gear-v1 against the fork's encoder took $((SECONDS - t2)) s"
fi
echo "57-mnn: passed"
