#!/usr/bin/env bash
# The full llama.cpp evaluation of kvc (issue 8), one command:
#   integrations/llama/evaluate.sh [OUT_DIR]          (default docs/results)
# Both texts, the first 2048 tokens decoded one at a time, PPL over positions 513..2047, KL
# against the full f16 cache, tokens/s and KV memory held, for: full, streaming (the local
# sink+window baseline), kvc-streaming / h2o / h2o-fa / c8-h2o at whole-model KV ratios 3.5 and 8, c8,
# llama.cpp q8_0 / q4_0, and the state round trip through kvc's codec. The two texts run as
# two processes side by side (one decode thread each). Writes OUT_DIR/llama-eval-text{A,B}.json
# and .txt, then OUT_DIR/llama-eval.md (the table) and OUT_DIR/llama-ppl-vs-kv.png (matplotlib,
# installed with pip into .cache/llama/venv when missing). Takes about an hour on 2 cores.
# Environment: KVC_EVAL_TOKENS (2048), KVC_EVAL_RATIOS (3.5,8), KVC_EVAL_MODES.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-docs/results}"
mkdir -p "$out"
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
n="${KVC_EVAL_TOKENS:-2048}"
ratios="${KVC_EVAL_RATIOS:-3.5,8}"
modes="${KVC_EVAL_MODES:-full,streaming,kvc-streaming,h2o,h2o-fa,c8,c8-h2o,q8_0,q4_0,state}"
ppl_from=513
[ "$n" -gt 1024 ] || ppl_from=$((n / 4))

pids=()
for t in A B; do
    text_var="TEXT_$t"
    "$EVAL" --model "$MODEL" --text "${!text_var}" --n-tokens "$n" --ppl-from "$ppl_from" \
        --modes "$modes" --kv-ratios "$ratios" --json "$out/llama-eval-text$t.json" \
        >"$out/llama-eval-text$t.txt" 2>"$out/llama-eval-text$t.err" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$out"/llama-eval-textA.txt "$out"/llama-eval-textB.txt
[ "$rc" -eq 0 ] || { cat "$out"/llama-eval-text*.err >&2; exit 1; }
rm -f "$out"/llama-eval-text*.err

py=python3
if ! python3 -c 'import matplotlib' 2>/dev/null; then
    venv=.cache/llama/venv
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -c 'import matplotlib' 2>/dev/null || "$venv/bin/pip" install --quiet matplotlib
    py="$venv/bin/python"
fi
"$py" integrations/llama/report.py --md "$out/llama-eval.md" --png "$out/llama-ppl-vs-kv.png" \
    "$out/llama-eval-textA.json" "$out/llama-eval-textB.json"
