#!/usr/bin/env bash
# kvc inside MNN, side by side with MNN's own KV options and with the research fork the
# specification describes (docs/results/mnn-eval.md): both texts, the first 2048 tokens (a
# 513-token prompt, then one token at a time), PPL over positions 514..2048, KL against the
# tree's own uncompressed run, KV bytes held at the end (the buffers' capacity, plus the fork's
# blobs and decoded copies), decode tok/s against the tree's own baseline. Each tree runs the
# two texts as two processes side by side (one thread each); upstream first, then the fork.
#   integrations/mnn/evaluate.sh [OUT_DIR]   (default docs/results)
# Environment: N_TOKENS (2048), PPL_FROM (513), SPEED_ROUNDS (8) and SPEED_STEPS (128), TREES
# (default "main kvq fork": the runs to make; the tables use the others' JSON already in
# OUT_DIR), and fetch-and-build.sh's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/docs/results}"
n="${N_TOKENS:-2048}"
ppl_from="${PPL_FROM:-513}"
mkdir -p "$out"

eval "$("$here/fetch-and-build.sh" | grep -E '^[A-Z_]+=')"

# Both engines get llama.cpp's token ids (MNN's tokenizer.txt splits runs of spaces
# differently): llama-tokenize from the llama.cpp build, when there is one.
tokenize="${LLAMA_TOKENIZE:-${KVC_LLAMA_CACHE:-$repo/.cache/llama}/build-llama/bin/llama-tokenize}"
declare -A ids_arg  # per text: --tokens FILE or --text FILE
for t in A B; do
    text_var="TEXT_$t"
    if [ -x "$tokenize" ]; then
        "$tokenize" -m "$GGUF" -f "${!text_var}" --ids --log-disable >"$out/mnn-eval-text$t.ids"
        ids_arg[$t]="--tokens $out/mnn-eval-text$t.ids"
    else
        echo "evaluate.sh: no llama-tokenize ($tokenize): MNN's own tokenizer makes the ids" >&2
        ids_arg[$t]="--text ${!text_var}"
    fi
done

# The fork's final H2O settings (its exp/h2o_final runs): layers 2.., block 32, sink 16,
# recent 96, lossy ratio 3.5, trigger 384; kvc's defaults are the specification's. A milder
# variants (the same on layers 25.. or 24.. only) hold about what the fork's H2O really holds,
# for a comparison at equal memory. full-again repeats the reference last: the drift of decode
# tok/s over the run.
lib="\"kvc_library\":\"$KVC_LIBRARY\""
# kvq rows as MNN's stored K/V: kvc's plans for this model (data/kvq-plans/: per-layer bits,
# and in the -s4w64 plans an f16 sink of 4, a 64-token 8-bit window and K centers, the
# llama.cpp frontier's rows), and plain k8v8 / k4v4 without protections.
plan() { echo "\"kvc_kvq_plan\":\"$repo/data/kvq-plans/smollm2-135m-$1.json\""; }
fork_final='"kvc_h2o_enable":true,"kvc_h2o_layer_start":2,"kvc_h2o_block_tokens":32,"kvc_h2o_sink_tokens":16,"kvc_h2o_recent_tokens":96,"kvc_h2o_target_lossy_ratio":3.5,"kvc_h2o_trigger_min_tokens":384'
modes=(
    --mode 'full={}'
    --mode 'mnn-k-int8={"attention_mode":9}'
    --mode 'mnn-kv-int8={"attention_mode":10}'
    --mode 'mnn-kv-tq4={"attention_mode":14}'
    --mode 'mnn-kv-tq3={"attention_mode":12}'
    --mode "kvc-h2o={$lib,$fork_final}"
    --mode "kvc-h2o-r5={$lib,${fork_final/3.5/5.0}}"
    --mode "kvc-streaming={$lib,$fork_final,\"kvc_h2o_selection\":\"streaming\"}"
    --mode "kvc-h2o-spec={$lib,\"kvc_h2o_enable\":true}"
    --mode "kvc-h2o-layers25={$lib,${fork_final/\"kvc_h2o_layer_start\":2/\"kvc_h2o_layer_start\":25}}"
    --mode "kvc-h2o-layers24={$lib,${fork_final/\"kvc_h2o_layer_start\":2/\"kvc_h2o_layer_start\":24}}"
    --mode "kvc-kvq-k8v8={$lib,\"kvc_kvq_k_bits\":8,\"kvc_kvq_v_bits\":8}"
    --mode "kvc-kvq-k4v4={$lib,\"kvc_kvq_k_bits\":4,\"kvc_kvq_v_bits\":4}"
    --mode "kvc-kvq-k4v4-s4w64={$lib,$(plan k4v4-s4w64)}"
    --mode "kvc-kvq-r3.73-min4-s4w64={$lib,$(plan r3.73-min4-s4w64)}"
    --mode "kvc-kvq-r5.66-kw3-kc-s4w64={$lib,$(plan r5.66-kw3-kc-s4w64)}"
    --mode "kvc-h2o+kvq={$lib,$fork_final,$(plan k4v4-s4w64)}"
    --mode "kvc-h2o-layers24+kvq={$lib,${fork_final/\"kvc_h2o_layer_start\":2/\"kvc_h2o_layer_start\":24},$(plan k4v4-s4w64)}"
    --mode 'full-again={}'
)
# kvq with MNN's matmuls in float ("memory":"normal": the same Q4_1 weights, no int8
# activations): with "memory":"low" (the model's default) MNN quantizes activations for its
# int4 matmuls, and any change of an attention output, even at 1e-6, flips roundings
# downstream: KL about 0.03 against the full run for every exact attention (docs/mnn.md).
# Without that floor, KL measures the KV rows as llama.cpp's frontier does. kvc-f16 keeps every
# position as an f16 sink row in kvc's cells: an f16 cache with exact attention.
mem='"memory":"normal"'
kvq_modes=(
    --mode "full={$mem}"
    --mode "kvc-f16={$mem,$lib,\"kvc_kvq_k_bits\":8,\"kvc_kvq_v_bits\":8,\"kvc_kvq_sink\":1000000000}"
    --mode "mnn-kv-int8={$mem,\"attention_mode\":10}"
    --mode "kvc-kvq-k8v8={$mem,$lib,\"kvc_kvq_k_bits\":8,\"kvc_kvq_v_bits\":8}"
    --mode "kvc-kvq-k4v4={$mem,$lib,\"kvc_kvq_k_bits\":4,\"kvc_kvq_v_bits\":4}"
    --mode "kvc-kvq-k4v4-s4w64={$mem,$lib,$(plan k4v4-s4w64)}"
    --mode "kvc-kvq-r3.73-min4-s4w64={$mem,$lib,$(plan r3.73-min4-s4w64)}"
    --mode "kvc-kvq-r5.66-kw3-kc-s4w64={$mem,$lib,$(plan r5.66-kw3-kc-s4w64)}"
)
# Decode speed: after the quality runs, SPEED_ROUNDS rounds of SPEED_STEPS decode steps of
# every mode in turn (kvc_mnn_eval --speed-rounds), medians against the tree's own baseline.
speed=(--speed-rounds "${SPEED_ROUNDS:-8}" --speed-steps "${SPEED_STEPS:-128}")
# run_tree NAME EVAL CONFIG MODE...: both texts side by side, JSON per text
run_tree() {
    local name="$1" eval_bin="$2" config="$3" pids=() rc=0 t text_var
    shift 3
    for t in A B; do
        # shellcheck disable=SC2086
        "$eval_bin" --config "$config" ${ids_arg[$t]} --n-tokens "$n" --ppl-from "$ppl_from" --threads 1 \
            "$@" --json "$out/$name-text$t.json" >"$out/$name-text$t.txt" 2>"$out/$name-text$t.err" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    [ "$rc" -eq 0 ] || { cat "$out/$name"-text*.err >&2; exit 1; }
    rm -f "$out/$name"-text*.err
    for t in A B; do collapse_log "$out/$name-text$t.txt"; done
}
# collapse_log FILE: a line repeated more than 20 times with only its numbers changing (the
# fork logs every plan it drops) is kept once, with its count.
collapse_log() {
    awk '{ k = $0; gsub(/[0-9]+/, "#", k); key[NR] = k; line[NR] = $0; n[k]++ }
         END { for (i = 1; i <= NR; i++) { k = key[i]
                   if (n[k] <= 20) print line[i]
                   else if (!(k in shown)) { shown[k] = 1; print line[i] "  [" n[k] " lines like this]" } } }' \
        "$1" >"$1.tmp" && mv "$1.tmp" "$1"
}
trees=" ${TREES:-main kvq fork} "
if [[ "$trees" == *" main "* ]]; then
    run_tree mnn-eval "$EVAL" "$MNN_CONFIG" "${modes[@]}" "${speed[@]}"
fi
if [[ "$trees" == *" kvq "* ]]; then
    run_tree mnn-kvq-eval "$EVAL" "$MNN_CONFIG" "${kvq_modes[@]}"
fi

tables=("$out/mnn-eval-textA.json" "$out/mnn-eval-textB.json")
if [[ "$trees" == *" fork "* ]]; then
    fork_out="$("$here/fetch-and-build.sh" --fork)" || { echo "evaluate.sh: no fork build: $fork_out" >&2; exit 1; }
    fork_eval="$(sed -n 's/^EVAL=//p' <<<"$fork_out")"
    fork_config="$(sed -n 's/^MNN_CONFIG=//p' <<<"$fork_out")"
    # The fork's own keys, its final experiments' values (exp/h2o_final): H2O alone, its
    # lossless codec alone on the two front layers, and both ("full" keeps blobs beside the
    # rows, "store" zeroes encoded rows between steps and restores them).
    fh2o='"kv_h2o_enable":true,"kv_h2o_layer_start":2,"kv_h2o_layer_end":-1,"kv_h2o_block_tokens":32,"kv_h2o_sink_tokens":16,"kv_h2o_recent_tokens":96,"kv_h2o_target_mode":"adaptive","kv_h2o_target_lossy_ratio":3.5,"kv_h2o_ema_alpha":0.9,"kv_h2o_update_interval":16,"kv_h2o_trigger_min_tokens":384'
    fll='"kv_lossless_enable":true,"kv_lossless_front_n":2,"kv_lossless_codec":"gear_delta","kv_lossless_runtime_enable":true,"kv_lossless_block_tokens":128,"kv_lossless_hot_recent_tokens":256,"kv_lossless_hot_sink_tokens":16,"kv_lossless_kept_sample_layers":1,"kv_lossless_kept_sample_token_interval":2,"kv_lossless_predictors_k":"raw,delta_seq,xor_seq,pair_delta","kv_lossless_predictors_v":"raw,delta_seq,xor_seq","kv_lossless_async_threads":2,"kv_lossless_max_queue":256,"kv_lossless_decode_cache_blocks":64'
    fork_modes=(
        --mode 'fork-full={}'
        --mode "fork-h2o={$fh2o}"
        --mode "fork-lossless={$fll,\"kv_lossless_scope\":\"front_n\",\"kv_lossless_runtime_mode\":\"full\",\"kv_lossless_front_sample_token_interval\":1,\"kv_lossless_store_bootstrap_tokens\":128,\"kv_lossless_store_grouped_step_tokens\":128}"
        --mode "fork-combined-full={$fh2o,$fll,\"kv_lossless_scope\":\"front_n_and_h2o_kept\",\"kv_lossless_runtime_mode\":\"full\",\"kv_lossless_front_sample_token_interval\":1,\"kv_lossless_store_bootstrap_tokens\":128,\"kv_lossless_store_grouped_step_tokens\":128}"
        --mode 'fork-full-again={}'
        --mode "fork-combined-store={$fh2o,$fll,\"kv_lossless_scope\":\"front_n_and_h2o_kept\",\"kv_lossless_runtime_mode\":\"store\",\"kv_lossless_front_sample_token_interval\":2,\"kv_lossless_store_disable_front\":true,\"kv_lossless_store_bootstrap_tokens\":16,\"kv_lossless_store_grouped_step_tokens\":384}"
    )
    run_tree mnn-fork-eval "$fork_eval" "$fork_config" "${fork_modes[@]}" "${speed[@]}"
fi
if [ -f "$out/mnn-fork-eval-textA.json" ]; then
    tables+=("$out/mnn-fork-eval-textA.json" "$out/mnn-fork-eval-textB.json")
fi
rm -f "$out"/mnn-eval-text*.ids
python3 "$here/mnn_table.py" --text-a "$(basename "$TEXT_A")" --text-b "$(basename "$TEXT_B")" \
    --kvq "$out/mnn-kvq-eval-textA.json" "$out/mnn-kvq-eval-textB.json" "${tables[@]}" >"$out/mnn-eval.md"
cat "$out/mnn-eval.md"
