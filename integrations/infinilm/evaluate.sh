#!/usr/bin/env bash
# kvc inside InfiniLM's C++ engine, beside InfiniLM's own KV compressor
# (docs/results/infinilm-eval.md): both texts, the first N_TOKENS token ids (a PROMPT-token
# prefill, then one token at a time), PPL over the ids after the prompt, KL against InfiniLM's
# own uncompressed run, the bytes the static cache holds for K and V, decode tok/s. The two
# texts run as two processes side by side (one OpenMP thread each); then one decode-speed run
# with the modes interleaved (text A).
#   integrations/infinilm/evaluate.sh [OUT_DIR]   (default docs/results/infinilm-eval)
# Environment: N_TOKENS (1024), PROMPT (512), SPEED_ROUNDS (6), SPEED_STEPS (32), and
# fetch-and-build.sh's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/docs/results/infinilm-eval}"
n="${N_TOKENS:-1024}"
prompt="${PROMPT:-512}"
mkdir -p "$out"

eval "$("$here/fetch-and-build.sh" | grep -E '^[A-Z_]+=')"
export LD_LIBRARY_PATH="$INFINILM_BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

w="$MLP_WEIGHTS"
# InfiniLM's own compressor on the distilled factor-4 file: as its Python generate() ran it
# (positions restart at the compressed length) and with true positions. kvc's compressor on
# the shipped files, with the sink and recent window they were trained with (16, 64). kvc's H2O
# in InfiniLM's attention at the specification's settings but a 64-token recent window and a
# 256-token trigger (the continuation is 512 tokens). kvq rows: plain k8v8, the protected 4-bit
# rows (f16 sink 4, 64 rows of 8 bits, K centers), k3v2 with the same protections (4.1x the f16
# rows at 1024 tokens), and the 4-bit rows with H2O.
h2o='h2o=3.5,h2o_recent=64,h2o_trigger=256'
modes=(
    --mode full=full
    --mode "infinilm-shipped@4=backend=infinilm,weights=$w/smollm2-135m-distill-f4.bin,positions=restart"
    --mode "infinilm@4=backend=infinilm,weights=$w/smollm2-135m-distill-f4.bin"
    --mode "kvc-mlp@2=backend=kvc,weights=$w/smollm2-135m-f2.bin,sink=16,recent=64"
    --mode "kvc-mlp@4=backend=kvc,weights=$w/smollm2-135m-distill-f4.bin,sink=16,recent=64"
    --mode "kvc-mlp@5=backend=kvc,weights=$w/smollm2-135m-distill-f5.bin,sink=16,recent=64"
    --mode "kvc-h2o=$h2o"
    --mode "kvc-streaming=${h2o/h2o=/streaming=}"
    --mode kvq-k8v8=kvq=k8v8
    --mode kvq-k4v4-s4w64=kvq=k4v4-s4w64
    --mode kvq-k3v2-s4w64=kvq=k3v2-s4w64
    --mode "kvq-k4v4-s4w64+h2o=kvq=k4v4-s4w64,$h2o"
)
common=(--model "$MODEL" --n-tokens "$n" --prompt "$prompt" --threads 1 --kvc-library "$KVC_LIBRARY")

"$EVAL" "${common[@]}" --tokens "$TOKENS_A" "${modes[@]}" --json "$out/textA.json" 2>"$out/textA.log" &
pid_a=$!
"$EVAL" "${common[@]}" --tokens "$TOKENS_B" "${modes[@]}" --json "$out/textB.json" 2>"$out/textB.log" &
pid_b=$!
wait "$pid_a"
wait "$pid_b"
cat "$out/textA.log" "$out/textB.log" >&2

# Decode speed, the modes interleaved, one thread, nothing else running: one mode of each kind
# (every mode holds its own copy of the model, 0.65 GB in f32).
speed_modes=(
    --mode full=full
    --mode "infinilm@4=backend=infinilm,weights=$w/smollm2-135m-distill-f4.bin"
    --mode "kvc-mlp@4=backend=kvc,weights=$w/smollm2-135m-distill-f4.bin,sink=16,recent=64"
    --mode "kvc-h2o=$h2o"
    --mode kvq-k8v8=kvq=k8v8
    --mode kvq-k4v4-s4w64=kvq=k4v4-s4w64
    --mode "kvq-k4v4-s4w64+h2o=kvq=k4v4-s4w64,$h2o"
)
"$EVAL" "${common[@]}" --tokens "$TOKENS_A" "${speed_modes[@]}" --speed-rounds "${SPEED_ROUNDS:-6}" \
    --speed-steps "${SPEED_STEPS:-32}" --speed-only --json "$out/speed.json" 2>"$out/speed.log"
grep "interleaved" "$out/speed.log" >&2

# The two compressors on the same cache: every shipped file, a 512-token prompt.
for f in smollm2-135m-f2 smollm2-135m-f4 smollm2-135m-f5 smollm2-135m-distill-f4 smollm2-135m-distill-f5; do
    printf '{"weights": "%s", "check": ' "$f"
    "$EVAL" "${common[@]}" --tokens "$TOKENS_A" --check-equal "$w/$f.bin" --bound 1e-5 | tr -d '\n'
    echo "}"
done >"$out/check-equal.jsonl"
cat "$out/check-equal.jsonl" >&2
