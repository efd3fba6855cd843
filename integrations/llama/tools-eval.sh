#!/usr/bin/env bash
# kvq measured the way llama.cpp's users measure a cache: llama-perplexity --kl-divergence
# against an f16 base, over both texts, for llama.cpp's own cache types and kvc's (kvq by bits,
# kvq plans), with the K/V bytes llama.cpp reports (every byte it allocated).
#   integrations/llama/tools-eval.sh [OUT_DIR]     (default docs/results/llama-tools-kl)
# Full logs and the f16 base logits go to .cache/llama/tools-eval/ (the base is ~300 MB per
# text); OUT_DIR gets each run's statistics (the log's chunk table, KL/PPL summary and cache
# size lines), summary.json and table.md (tools_kl_table.py).
# Environment: KVC_TOOLS_CTX (default 2048: llama-perplexity scores the second half of each
# chunk), KVC_TOOLS_THREADS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
out="${1:-docs/results/llama-tools-kl}"
ctx="${KVC_TOOLS_CTX:-2048}"
threads="${KVC_TOOLS_THREADS:-$(nproc)}"
work=".cache/llama/tools-eval"
rm -rf "$work"
mkdir -p "$out" "$work"
bin="$(dirname "$LLAMA_PERPLEXITY")"
configs=(
    "q8_0|-ctk q8_0 -ctv q8_0 -fa on"
    "q5_0-q4_0|-ctk q5_0 -ctv q4_0 -fa on"
    "q4_0|-ctk q4_0 -ctv q4_0 -fa on"
    "kvq8|-ctk kvq8 -ctv kvq8"
    "kvq8-kvq4|-ctk kvq8 -ctv kvq4"
    "kvq5|-ctk kvq5 -ctv kvq5"
    "kvq4|-ctk kvq4 -ctv kvq4"
    "kvq3|-ctk kvq3 -ctv kvq3"
    "plan-r3.5-kw3|--kvc-plan data/kvq-plans/smollm2-135m-r3.5-kw3.json"
    "plan-r5-kw3|--kvc-plan data/kvq-plans/smollm2-135m-r5-kw3.json"
)
# the lines of a llama-perplexity log the table and a reader need
keep() { grep -E "llama_kv_cache: size|over [0-9]+ chunks|^ +[0-9]+ +[0-9.]+ ±|Final estimate|Mean|KLD|Same top|RMS Δp|Cor\(" "$1" || true; }
for text in "$TEXT_A" "$TEXT_B"; do
    name="$(basename "$text" .txt)"
    base="$work/$name.f16.kld"
    ppl=("$bin/llama-perplexity" -m "$MODEL" -f "$text" -c "$ctx" -b "$ctx" -t "$threads" -v)
    echo "tools-eval: $name f16 base" >&2
    "${ppl[@]}" --kl-divergence-base "$base" >"$work/$name.f16.log" 2>&1
    keep "$work/$name.f16.log" >"$out/$name.f16.log"
    for c in "${configs[@]}"; do
        label="${c%%|*}"
        read -r -a args <<<"${c#*|}"
        echo "tools-eval: $name $label" >&2
        "${ppl[@]}" "${args[@]}" --kl-divergence-base "$base" --kl-divergence >"$work/$name.$label.log" 2>&1
        keep "$work/$name.$label.log" >"$out/$name.$label.log"
    done
    rm -f "$base"
done
python3 integrations/llama/tools_kl_table.py "$out" | tee "$out/table.md"
