#!/usr/bin/env bash
# kvc inside InfiniLM (issue 49): InfiniCore's CPU backend and InfiniLM's C++ engine built with
# kvc's patch series (integrations/infinilm/fetch-and-build.sh, cached under .cache/infinilm),
# SmolLM2-135M-Instruct converted into a Hugging Face folder (convert-model.py, no torch), and
# short kvc_infinilm_eval runs checked by ci_check_infinilm.py: kvc's compressor against
# InfiniLM's own, H2O and kvq rows in InfiniLM's static cache, refusals and kvc errors mid-run.
# Without InfiniLM sources (INFINICORE_SOURCE_DIR, INFINILM_SOURCE_DIR and SPDLOG_SOURCE_DIR, or
# the tarballs in ../shared/engines/) the step prints why and skips.
set -euo pipefail
cd "$(dirname "$0")/../.."

t0=$SECONDS
rc=0
build_out="$(integrations/infinilm/fetch-and-build.sh)" || rc=$?
if [ "$rc" -eq 3 ]; then
    echo "58-infinilm: skipped: $build_out"
    exit 0
fi
[ "$rc" -eq 0 ] || { echo "58-infinilm: fetch-and-build.sh failed ($rc)" >&2; exit 1; }
eval "$(grep -E '^[A-Z_]+=' <<<"$build_out")"
echo "58-infinilm: fetch and build took $((SECONDS - t0)) s"
export LD_LIBRARY_PATH="$INFINILM_BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
out=".cache/infinilm/ci"
rm -rf "$out"
t1=$SECONDS
python3 integrations/infinilm/ci_check_infinilm.py --eval "$EVAL" --model "$MODEL" --tokens "$TOKENS_A" \
    --kvc-library "$KVC_LIBRARY" --fault-shim "$FAULT_SHIM" \
    --weights "$MLP_WEIGHTS/smollm2-135m-distill-f4.bin" --out "$out"
echo "58-infinilm: the kvc-in-InfiniLM check took $((SECONDS - t1)) s"
echo "58-infinilm: passed"
