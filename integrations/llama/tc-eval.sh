#!/usr/bin/env bash
# The transform coder's rate/quality curve against the tiers' other codecs (issue 37;
# docs/results/tc-eval.md), one command:
#   integrations/llama/tc-eval.sh [OUT_DIR] [kvc_llama_eval options]
# For each text (the GNU GPL v3 and the Debian constitution) and each codec, one share-mode
# run through the disk tier: process 1 prefills a 2048-token prefix and stores it in 8 chunks
# of 256 tokens, a process 2 restores it and decodes the next 256 tokens one at a time; KL and
# PPL of those 256 tokens against process 1's (which prefilled), bytes per token on the wire
# (every blob byte), restore against prefill (same run), store (encode) time. Codecs: raw,
# gear-v2, kvq-k4v4, kvq-k8v4 and the transform coder's targets with the checked-in
# SmolLM2-135M calibration (data/tc-calibrations/). Writes OUT_DIR/<text>-<codec>.json
# (default .cache/tc-eval) and prints the Markdown table (integrations/llama/tc_table.py).
# Environment: KVC_TC_CODECS (space-separated codecs), KVC_TC_CALIBRATION (file),
# KVC_SHARE_PREFIX (2048), KVC_SHARE_REST (256). About 40 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-.cache/tc-eval}"
shift || true
mkdir -p "$out"
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
cal="${KVC_TC_CALIBRATION:-data/tc-calibrations/smollm2-135m.kvctc}"
codecs="${KVC_TC_CODECS:-raw gear-v2 kvq-k4v4 kvq-k8v4 tc-0.008 tc-0.016 tc-0.032 tc-0.048 tc-0.064 tc-0.096 tc-0.128}"
prefix="${KVC_SHARE_PREFIX:-2048}"
rest="${KVC_SHARE_REST:-256}"
for text in "$TEXT_A" "$TEXT_B"; do
    name="$(basename "$text" .txt)"
    for c in $codecs; do
        extra=()
        [[ $c == tc-* ]] && extra=(--share-calibration "$cal")
        "$EVAL" --model "$MODEL" --text "$text" --modes share --share-prefix "$prefix" --share-rest "$rest" \
            --share-codec "$c" "${extra[@]}" "$@" --json "$out/$name-$c.json" >"$out/$name-$c.txt"
        echo "tc-eval: $name $c: $(grep -m1 '^share' "$out/$name-$c.txt" | sed 's/  */ /g' | cut -d' ' -f9-)" >&2
    done
done
python3 integrations/llama/tc_table.py "$out"
