#!/usr/bin/env bash
# llama-perplexity's KL against kvc_llama_eval's on the same tokens and positions: chunk 1 of
# llama-perplexity at -c 2048 scores targets 1025..2047 of each text (no BOS: SmolLM2's GGUF
# sets add_bos_token false, and neither program adds one) after a batched prefill; the client
# decodes the same 2048 tokens one at a time and scores the same targets (--ppl-from 1025).
# The agreement is judged against the spread of kvq's KL over rotation seeds (the client's
# fake-quant rows kvq:k4v4:s<seed>, same quantizer, other Hadamard seed).
#   integrations/llama/tools-vs-client.sh [OUT_DIR]    (default docs/results/llama-tools-kl)
# Needs tools-eval.sh's logs in OUT_DIR (their chunk 1 rows).
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
out="${1:-docs/results/llama-tools-kl}"
threads="${KVC_TOOLS_THREADS:-$(nproc)}"
plan=data/kvq-plans/smollm2-135m-r3.5-kw3.json
modes="full,kvq-native:k4v4,kvq-native-plan:$plan,kvq:k4v4,kvq:k4v4:s1,kvq:k4v4:s2,kvq:k4v4:s3,kvq:k4v4:s4,kvq:k4v4:s5"
for text in "$TEXT_A" "$TEXT_B"; do
    name="$(basename "$text" .txt)"
    echo "tools-vs-client: $name" >&2
    "$EVAL" --model "$MODEL" --text "$text" --n-tokens 2048 --ppl-from 1025 --kvq-fa --threads "$threads" \
        --modes "$modes" --json "$out/client-$name.json" >"$out/client-$name.txt"
done
python3 integrations/llama/tools_kl_table.py --vs-client "$out"
