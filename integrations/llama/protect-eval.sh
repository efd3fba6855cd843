#!/usr/bin/env bash
# kvq plans with their protections (f16 sink, 8-bit window, K centers) as llama.cpp's real cache,
# measured the way llama.cpp's users measure a cache: llama-perplexity --kl-divergence against
# an f16 base, next to llama.cpp's own cache types and plain kvq4 in the same run,
#   - at 2048 tokens on both texts (3 chunks each, the second half of each chunk scored);
#   - at 8192 tokens on a long text: the GNU Bash Reference Manual (Debian's bash-doc,
#     /usr/share/info/bash.info, node markers and menu lines removed), 2 chunks.
# and decode speed at 2k, 8k and 32k cells (kvc_llama_eval --speed-modes: the cache filled by
# batched prefill, one thread, KVC_PROTECT_SPEED_REPEATS interleaved rounds, medians in table.md).
#   integrations/llama/protect-eval.sh [OUT_DIR]     (default docs/results/kvq-protected)
# Logs and the f16 base logits go to .cache/llama/protect-eval/ (the 8k base is ~800 MB).
# Environment: KVC_PROTECT_THREADS (default: nproc), KVC_PROTECT_REPEATS (default 3),
# KVC_PROTECT_PARTS (default "2k 8k speed"), KVC_PROTECT_SPEED_CTX (default 2048,8192,32768;
# the run writes speed-<ctx list>.json with each round; the table takes medians over rounds),
# KVC_PROTECT_SPEED_REPEATS (default 5), KVC_PROTECT_SET (protected, default; or frontier:
# issue 50's layer-weighted plans, see below), KVC_PROTECT_SKIP (labels not to run).
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
out="${1:-docs/results/kvq-protected}"
threads="${KVC_PROTECT_THREADS:-$(nproc)}"
repeats="${KVC_PROTECT_REPEATS:-3}"
speed_ctx="${KVC_PROTECT_SPEED_CTX:-2048,8192,32768}"
speed_repeats="${KVC_PROTECT_SPEED_REPEATS:-5}"
parts="${KVC_PROTECT_PARTS:-2k 8k speed}"
work=".cache/llama/protect-eval"
mkdir -p "$out" "$work"
bin="$(dirname "$LLAMA_PERPLEXITY")"
P=data/kvq-plans/smollm2-135m
configs=(
    "q8_0|-ctk q8_0 -ctv q8_0 -fa on"
    "q5_0-q4_0|-ctk q5_0 -ctv q4_0 -fa on"
    "q4_0|-ctk q4_0 -ctv q4_0 -fa on"
    "kvq4|-ctk kvq4 -ctv kvq4 --kvc-sink 0 --kvc-window 0 --kvc-center off"
    "k4v4-s4w64|--kvc-plan $P-k4v4-s4w64.json"
    "r3.73-min4-s4w64|--kvc-plan $P-r3.73-min4-s4w64.json"
    "r5.66-kw3-kc-s4w64|--kvc-plan $P-r5.66-kw3-kc-s4w64.json"
)
# KVC_PROTECT_SET=frontier: issue 50's frontier (docs/results/kvq-frontier.md): the plans whose
# layers are weighed by the probes of integrations/llama/kvq-calibrate.py, next to the plans
# before them, llama.cpp's own types and the most compact kvq rows (kvq2, no protections)
if [ "${KVC_PROTECT_SET:-protected}" = frontier ]; then
    configs=(
        "${configs[@]:0:3}"
        "k4v4-s4w64|--kvc-plan $P-k4v4-s4w64.json"
        "lw3.5-s4w64|--kvc-plan $P-lw3.5-s4w64.json"
        "lw4.2-s4w64|--kvc-plan $P-lw4.2-s4w64.json"
        "r5.66-kw3-kc-s4w64|--kvc-plan $P-r5.66-kw3-kc-s4w64.json"
        "lw5-s4w64|--kvc-plan $P-lw5-s4w64.json"
        "lw6-s4w64|--kvc-plan $P-lw6-s4w64.json"
        "kvq2|-ctk kvq2 -ctv kvq2 --kvc-sink 0 --kvc-window 0 --kvc-center off"
    )
fi
keep() { grep -aE "llama_kv_cache: size|kvc kvq cells|over [0-9]+ chunks|^ +[0-9]+ +[0-9.]+ ±|Final estimate|Mean|KLD|Same top|RMS Δp|Cor\(" "$1" || true; }
run_text() {  # name text ctx chunks
    local name="$1" text="$2" ctx="$3" chunks="$4"
    local base="$work/$name.f16.kld"
    local ppl=("$bin/llama-perplexity" -m "$MODEL" -f "$text" -c "$ctx" -b "$ctx" -t "$threads" --chunks "$chunks" -v)
    echo "protect-eval: $name f16 base" >&2
    OMP_WAIT_POLICY=passive "${ppl[@]}" --kl-divergence-base "$base" >"$work/$name.f16.log" 2>&1
    keep "$work/$name.f16.log" >"$out/$name.f16.log"
    for c in "${configs[@]}"; do
        local label="${c%%|*}"
        [[ " ${KVC_PROTECT_SKIP:-} " == *" $label "* ]] && continue
        read -r -a args <<<"${c#*|}"
        echo "protect-eval: $name $label" >&2
        OMP_WAIT_POLICY=passive "${ppl[@]}" "${args[@]}" --kl-divergence-base "$base" --kl-divergence \
            >"$work/$name.$label.log" 2>&1
        keep "$work/$name.$label.log" >"$out/$name.$label.log"
    done
    rm -f "$base"
}
if [[ " $parts " == *" 2k "* ]]; then
    run_text gpl-3-2k "$TEXT_A" 2048 3
    run_text debian-constitution-2k "$TEXT_B" 2048 3
fi
if [[ " $parts " == *" 8k "* ]]; then
    long="$(dirname "$TEXT_A")/bash-reference.txt"
    if [ ! -f "$long" ]; then
        dl="$(mktemp -d)"
        (cd "$dl" && apt-get download bash-doc >/dev/null 2>&1)
        dpkg-deb -x "$dl"/bash-doc_*.deb "$dl/x"
        gzip -dc "$dl/x/usr/share/info/bash.info.gz" | tr -d '\037\177' \
            | grep -v -e '^File: bash.info' -e '^\* ' >"$long.tmp"
        mv "$long.tmp" "$long"
        rm -rf "$dl"
    fi
    run_text bash-reference-8k "$long" 8192 2
fi
if [[ " $parts " == *" speed "* ]]; then
    modes="f16,q8_0,q4_0,kvq-native:k4v4,kvq-native-plan:$P-k4v4-s4w64.json,kvq-native-plan:$P-r3.73-min4-s4w64.json"
    if [ "${KVC_PROTECT_SET:-protected}" = frontier ]; then
        modes="f16,q8_0,q4_0,kvq-native-plan:$P-k4v4-s4w64.json,kvq-native-plan:$P-lw3.5-s4w64.json"
        modes+=",kvq-native-plan:$P-lw5-s4w64.json,kvq-native-plan:$P-lw6-s4w64.json"
    fi
    # every mode's cache filled once (batched prefill on 2 threads), then $speed_repeats timed
    # rounds of 31 one-token steps, the modes interleaved; one thread's rows go to the table
    echo "protect-eval: speed, $speed_repeats interleaved rounds" >&2
    OMP_WAIT_POLICY=passive "$EVAL" --model "$MODEL" --text "$TEXT_A" --modes full --n-tokens 64 --ppl-from 32 \
        --threads 2 --speed-modes "$modes" --speed-ctx "$speed_ctx" --speed-decode 32 --speed-repeats "$speed_repeats" \
        --json "$work/speed-${speed_ctx//,/-}.json" >"$work/speed-${speed_ctx//,/-}.txt" 2>&1
    cp "$work/speed-${speed_ctx//,/-}.json" "$out/"
fi
python3 integrations/llama/protect_table.py "$out" | tee "$out/table.md"
