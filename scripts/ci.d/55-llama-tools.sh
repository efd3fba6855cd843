#!/usr/bin/env bash
# llama.cpp's own tools on kvc's patched build (issue 35): llama-bench, llama-perplexity
# (--kl-divergence against an f16 base: kvq8, kvq4, a kvq plan, q4_0, each KL bounded and
# ordered, the cache bytes llama.cpp reports equal to kvq's packed rows), llama-server (a chat
# completion with -ctk kvq4 -ctv kvq4 and with --kvc-plan, prompt-cache reuse, a slot saved
# and restored, context shift) and llama-cli's help; bad input refused; then kvc_arch_test on
# small random-weight GGUFs of other architectures (llama at head 128 and GQA 1/16, qwen2,
# qwen3, gemma3 with sliding-window layers at head 256 and 128, phi3 at head 96): attention
# within a bound derived from each type's row error, rows and bytes as asked, the state round
# trip, refusals (integrations/llama/testmodels/, docs/llama-cpp.md); every command on the
# first page of docs/llama-cpp.md, as written (integrations/llama/ci_docs.py); kvq-calibrate.py on a
# short text, its version-4 plan loaded by llama-perplexity (issue 50). The build is
# fetch-and-build.sh's, cached with the rest of .cache/llama (50-llama.sh built it).
set -euo pipefail
cd "$(dirname "$0")/../.."

t0=$SECONDS
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
echo "55-llama-tools: fetch and build took $((SECONDS - t0)) s"
out=".cache/llama/ci-tools"
rm -rf "$out"
mkdir -p "$out"
t1=$SECONDS
python3 integrations/llama/ci_tools.py --bin-dir "$(dirname "$LLAMA_SERVER")" --model "$MODEL" --text "$TEXT_A" \
    --plan data/kvq-plans/smollm2-135m-r3.5-kw3.json --protect-plan data/kvq-plans/smollm2-135m-k4v4-s4w64.json \
    --frontier-plan data/kvq-plans/smollm2-135m-lw5-s4w64.json \
    --out "$out"
echo "55-llama-tools: the tools' checks took $((SECONDS - t1)) s"
# issue 50's one command, small: a layer-weighted plan from the GGUF and a text (dump, one
# llama-perplexity probe per layer, the weighted allocation), then loaded by llama-perplexity
t4=$SECONDS
python3 integrations/llama/kvq-calibrate.py --model "$MODEL" --text "$TEXT_A" --held-ratio 4 --context 512 \
    --dump-tokens 256 --probe-ctx 128 --probe-chunks 2 --threads 2 --eval "$EVAL" --perplexity "$LLAMA_PERPLEXITY" \
    --kvc target/debug/kvc --work "$out/calibrate" --out "$out/calibrated.json" >"$out/calibrate.log" 2>&1 \
    || { cat "$out/calibrate.log" >&2; echo "55-llama-tools: kvq-calibrate.py failed" >&2; exit 1; }
python3 - "$out/calibrated.json" "$out/calibrate.log" <<'EOF'
import json, re, sys
p = json.load(open(sys.argv[1]))
w = p["calibration"]["layer_weights"]
held = re.search(r"bytes per token, ratio ([0-9.]+) vs f16", open(sys.argv[2]).read())
protections = (p["sink_tokens"], p["recent_tokens"], p["recent_bits"], p["k_center"])
if not (p["version"] == 4 and len(w) == len(p["layers"]) == 30 and all(x > 0 for x in w)
        and abs(sum(w) / len(w) - 1) < 1e-9 and protections == (4, 64, 8, True) and held
        and float(held.group(1)) >= 4.0):
    sys.exit(f"55-llama-tools: kvq-calibrate.py did not write a version-4 plan with 30 weights and the "
             f"protections at >= 4:1 held: {p} {held and held.group(0)}")
EOF
"$LLAMA_PERPLEXITY" -m "$MODEL" -f "$TEXT_A" -c 256 --chunks 1 -t 2 --kvc-plan "$out/calibrated.json" -v \
    >"$out/ppl-calibrated.log" 2>&1 && grep -q "kvc kvq cells on 30 layers" "$out/ppl-calibrated.log" \
    || { tail -n 20 "$out/ppl-calibrated.log" >&2; echo "55-llama-tools: llama-perplexity did not run the calibrated plan" >&2; exit 1; }
echo "55-llama-tools: kvq-calibrate.py and its plan took $((SECONDS - t4)) s"
# the first page of docs/llama-cpp.md, every command as written on the test model (build
# commands checked against fetch-and-build.sh and the patched tree); first the check's own
# negative test: a synthetic page naming a flag that does not exist must fail on that line
t3=$SECONDS
docs=(--bin-dir "$(dirname "$LLAMA_SERVER")" --model "$MODEL" --text "$TEXT_A" --llama-src "$LLAMA_SRC")
python3 integrations/llama/ci_docs.py --self-test "${docs[@]}" --out "$out/docs-self-test"
python3 integrations/llama/ci_docs.py "${docs[@]}" --out "$out/docs"
echo "55-llama-tools: the first page of docs/llama-cpp.md took $((SECONDS - t3)) s"
t2=$SECONDS
python3 integrations/llama/testmodels/run.py "$out/models" --bin "$ARCH_TEST" >"$out/arch.txt" 2>&1 \
    || { cat "$out/arch.txt" >&2; echo "55-llama-tools: kvc_arch_test failed" >&2; exit 1; }
tail -n 14 "$out/arch.txt"
echo "55-llama-tools: the architecture suite took $((SECONDS - t2)) s"
echo "55-llama-tools: passed"
