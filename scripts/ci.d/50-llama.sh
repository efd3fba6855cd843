#!/usr/bin/env bash
# llama.cpp as kvc's client, short version: fetch and build (cached under .cache/llama), then
# every mode of kvc_llama_eval on a few hundred tokens of both texts (kvc's StreamingLLM and H2O
# policies, flash attention off and on, the state through kvc's codec included), and checks of
# what it reports (dump layer 0 bit-identical to the real KV data, state restore identical,
# eviction really shrinking the cache, kvc-mlp's compressor leaving the cells its schedule says,
# bad input refused with status 2), and the share mode (a prefix restored by other processes
# through kvc's tiers: Redis up, a damaged value, Redis killed, Redis down, the disk tier).
set -euo pipefail
cd "$(dirname "$0")/../.."

t0=$SECONDS
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
echo "50-llama: fetch and build took $((SECONDS - t0)) s"
echo "50-llama: llama.cpp built for $LLAMA_ISA (KVC_LLAMA_ISA=${KVC_LLAMA_ISA:-auto})"

# the flash-attention rounding bound the harness checks with, against a model of the kernel
"$FATTN_TEST"

realkv="${KVC_REALKV_DIR:-../shared/data/realkv}"
[ -f "$realkv/textA.K.f16.json" ] || realkv=data/sample

out=".cache/llama/ci"
rm -rf "$out"
mkdir -p "$out/dump"
t1=$SECONDS
"$EVAL" --model "$MODEL" --text "$TEXT_A" --text "$TEXT_B" \
    --n-tokens 320 --ppl-from 129 --prompt 64 \
    --sink 16 --recent 64 --trigger 128 --interval 16 --ratio 3.5 --kv-ratios 3.5 \
    --dump-tokens 512 --dump-dir "$out/dump" --realkv-dir "$realkv" \
    --json "$out/result.json"
echo "50-llama: evaluation took $((SECONDS - t1)) s"

python3 integrations/llama/ci_check_eval.py "$out/result.json" "$out/dump"

# share mode (issue 23): process 1 prefills 256 tokens and stores them through kvc's tiers as
# 2 chunks of 128, process 2s restore them into fresh contexts and decode 8 more tokens; their
# logits must be bit-identical to process 1's, and a control process 2 that damages one
# restored value must differ. Through a redis-server started here on a free port: with 2
# process 2s at once; with one stored value damaged between the store and the restore
# (checksum: counted, the prefix ends before it, the rest recomputed); with the server killed
# between the store and the restore (counted fallbacks, recomputed, exit 0); then with that
# server gone for the store too; then through the disk tier with the raw codec, and with the
# lossy kvq codec (k4v4: logits differ, a small KL, under f16/3.5 on the wire).
t2=$SECONDS
rport="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
mkdir -p "$out/redis"
redis-server --bind 127.0.0.1 --port "$rport" --save '' --appendonly no --dir "$out/redis" \
    --maxmemory 256mb --maxmemory-policy allkeys-lru >"$out/redis/log.txt" 2>&1 &
rpid=$!
trap 'kill -9 "$rpid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$rport" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
url="redis://127.0.0.1:$rport"
share=(--model "$MODEL" --text "$TEXT_A" --modes share --share-prefix 256 --share-chunk 128 --share-rest 8)
"$EVAL" "${share[@]}" --share-clients 2 --redis "$url" --json "$out/share-redis.json"
redis-cli -p "$rport" flushall >/dev/null
damage="redis-cli -p $rport --scan --pattern 'kvc:*' | head -n1 | xargs -I{} redis-cli -p $rport setrange {} 4000 XXXX >/dev/null"
"$EVAL" "${share[@]}" --redis "$url" --share-between "$damage" --json "$out/share-redis-damaged.json"
redis-cli -p "$rport" flushall >/dev/null
"$EVAL" "${share[@]}" --redis "$url" --share-between "kill -9 $rpid" --json "$out/share-redis-killed.json"
{ wait "$rpid"; } 2>/dev/null || true
"$EVAL" "${share[@]}" --redis "$url" --json "$out/share-redis-down.json"
"$EVAL" "${share[@]}" --share-codec raw --json "$out/share-disk.json"
"$EVAL" "${share[@]}" --share-codec kvq --json "$out/share-disk-kvq.json"
# ... and the transform coder (issue 37) with the checked-in calibration: lossy, far smaller on
# the wire (bounds in ci_check_share.py; its own directory, outside ci_check_quality's record)
mkdir -p "$out/tc"
tccal=data/tc-calibrations/smollm2-135m.kvctc
"$EVAL" "${share[@]}" --share-codec tc-0.016 --share-calibration "$tccal" --json "$out/tc/share-disk-tc.json"
echo "50-llama: share runs took $((SECONDS - t2)) s"
python3 integrations/llama/ci_check_share.py "$out"

# kvc-mlp's compressor in llama.cpp (mlp modes, integrations/llama/mlp_mode.hpp): the older
# cells compressed in groups of 4 through the C API and the state rewritten with fewer cells.
# Weights: KVC_MLP_WEIGHTS_F4 (a .bin v1 file of factor 4 for SmolLM2-135M), else the shipped one
# data/mlp-weights/smollm2-135m-f4.bin (the Rust-trained file), else any there whose header says factor 4, else the mean-pool file the script writes.
mlp_w="${KVC_MLP_WEIGHTS_F4:-}"
if [ -z "$mlp_w" ]; then
    for f in data/mlp-weights/smollm2-135m-f4.bin data/mlp-weights/*.bin; do
        [ -f "$f" ] || continue
        if python3 -c 'import struct,sys; h=open(sys.argv[1],"rb").read(44); sys.exit(0 if len(h)==44 and struct.unpack("<IIHHIIIIIIII",h)[8]==4 else 1)' "$f"; then
            mlp_w="$f"
            break
        fi
    done
fi
python3 scripts/mlp_meanpool_weights.py --layers 30 --heads 3 --head-dim 64 --factor 4 --output "$out/meanpool4.bin"
[ -n "$mlp_w" ] || mlp_w="$out/meanpool4.bin"
echo "50-llama: mlp@4 runs with $mlp_w"
t2=$SECONDS
"$EVAL" --model "$MODEL" --text "$TEXT_A" --text "$TEXT_B" \
    --n-tokens 320 --ppl-from 129 --sink 16 --recent 32 --trigger 128 --interval 16 --ratio 3 \
    --modes full,mlp-meanpool@4,mlp@4,mlp@4+kvq:k8v4 --mlp-weights "$mlp_w" --json "$out/mlp.json"
echo "50-llama: mlp evaluation took $((SECONDS - t2)) s"
python3 integrations/llama/ci_check_mlp.py "$out/mlp.json" "$mlp_w" "$out/meanpool4.bin"

# bad input: status 2 and one line on stderr
set +e
"$EVAL" --model /nonexistent.gguf --text "$TEXT_A" 2>"$out/err.txt"; rc=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --n-tokens 100000 2>"$out/err2.txt"; rc2=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --ratio abc 2>"$out/err3.txt"; rc3=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --kv-ratios 3.5,x 2>"$out/err4.txt"; rc4=$?
echo '{"format": "kvc-kvq-plan", "version": 1, "layers": "not a list"}' >"$out/bad-plan.json"
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes "full,kvq-plan:$out/bad-plan.json" 2>"$out/err5.txt"; rc5=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes kvq:k9v4 --n-tokens 200 --ppl-from 100 2>"$out/err6.txt"; rc6=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes share --share-codec zstd 2>"$out/err7.txt"; rc7=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes share --redis http://127.0.0.1:1 2>"$out/err8.txt"; rc8=$?
# the transform coder without its calibration, with a target the calibration lacks, with a
# damaged calibration file
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes share --share-codec tc-0.032 2>"$out/err21.txt"; rc21=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes share --share-prefix 256 --share-chunk 128 --share-rest 8 \
    --share-codec tc-0.5 --share-calibration data/tc-calibrations/smollm2-135m.kvctc 2>"$out/err22.txt"; rc22=$?
head -c 100000 data/tc-calibrations/smollm2-135m.kvctc >"$out/cut.kvctc"
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes share --share-prefix 256 --share-chunk 128 --share-rest 8 \
    --share-codec tc-0.032 --share-calibration "$out/cut.kvctc" 2>"$out/err23.txt"; rc23=$?
# mlp weights that do not fit: missing, truncated, another model's shape, another factor
python3 scripts/mlp_meanpool_weights.py --layers 24 --heads 3 --head-dim 64 --factor 4 --output "$out/meanpool4-l24.bin" >/dev/null
head -c 1000 "$out/meanpool4.bin" >"$out/meanpool4-cut.bin"
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes mlp@4 --mlp-weights "$out/none.bin" 2>"$out/err9.txt"; rc9=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes mlp@4 --mlp-weights "$out/meanpool4-cut.bin" 2>"$out/err10.txt"; rc10=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes mlp@4 --mlp-weights "$out/meanpool4-l24.bin" 2>"$out/err11.txt"; rc11=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes mlp@5 --mlp-weights "$out/meanpool4.bin" 2>"$out/err12.txt"; rc12=$?
# kvq combined with a mode it does not combine with
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes full,q4_0+kvq:k4v4 2>"$out/err13.txt"; rc13=$?
# K channel groups: no group, and a group kvc refuses (48 is not 16, 32, 64, 128 or 256)
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes full,kvq-kc:k4v4 2>"$out/err14.txt"; rc14=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --modes kvq-kc48:k4v4 --n-tokens 200 --ppl-from 100 2>"$out/err15.txt"; rc15=$?
# a recent window needs V as rows (flash attention) and cells that stay put
"$EVAL" --model "$MODEL" --text "$TEXT_A" --kvq-recent 8 --modes full,kvq:k4v4 2>"$out/err16.txt"; rc16=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --kvq-recent 8 --kvq-fa --modes full,h2o@3+kvq:k4v4 2>"$out/err17.txt"; rc17=$?
"$EVAL" --model "$MODEL" --text "$TEXT_A" --kvq-recent 8 --kvq-fa --kvq-recent-bits 12 2>"$out/err18.txt"; rc18=$?
# a center is the window's mean: no window, no center
"$EVAL" --model "$MODEL" --text "$TEXT_A" --kvq-fa --kvq-center --modes full,kvq:k4v4 2>"$out/err19.txt"; rc19=$?
# ... and coded against it, the attention sink would lose what makes it the sink
"$EVAL" --model "$MODEL" --text "$TEXT_A" --kvq-fa --kvq-recent 8 --kvq-center --modes full,kvq:k4v4 2>"$out/err20.txt"; rc20=$?
set -e
grep -q "24 layers" "$out/err11.txt" || { echo "50-llama: wrong-shape weights: $(cat "$out/err11.txt")" >&2; exit 1; }
grep -q "factor 5" "$out/err12.txt" || { echo "50-llama: factor mismatch: $(cat "$out/err12.txt")" >&2; exit 1; }
for r in "$rc:$out/err.txt" "$rc2:$out/err2.txt" "$rc3:$out/err3.txt" "$rc4:$out/err4.txt" "$rc5:$out/err5.txt" \
         "$rc7:$out/err7.txt" "$rc8:$out/err8.txt" "$rc9:$out/err9.txt" "$rc10:$out/err10.txt" \
         "$rc11:$out/err11.txt" "$rc12:$out/err12.txt" "$rc13:$out/err13.txt" "$rc14:$out/err14.txt" \
         "$rc16:$out/err16.txt" "$rc17:$out/err17.txt" "$rc18:$out/err18.txt" "$rc19:$out/err19.txt" \
         "$rc20:$out/err20.txt" "$rc21:$out/err21.txt" "$rc22:$out/err22.txt" "$rc23:$out/err23.txt"; do
    code="${r%%:*}"; file="${r#*:}"
    if [ "$code" -ne 2 ] || [ "$(wc -l <"$file")" -ne 1 ]; then
        echo "50-llama: bad input gave status $code with: $(cat "$file")" >&2
        exit 1
    fi
done
# a kvq config kvc refuses ends the run with an error naming it, never with garbage output
if [ "$rc6" -eq 0 ] || ! grep -q "k9v4" "$out/err6.txt"; then
    echo "50-llama: kvq:k9v4 gave status $rc6 with: $(cat "$out/err6.txt")" >&2
    exit 1
fi
if [ "$rc15" -eq 0 ] || ! grep -q "group 48" "$out/err15.txt"; then
    echo "50-llama: kvq-kc48:k4v4 gave status $rc15 with: $(cat "$out/err15.txt")" >&2
    exit 1
fi
# kvq with the newest 32 tokens kept in f16 (--kvq-recent): the rows leave the window coded and
# are written back into their cells; 200 tokens leave 168 coded per layer and head, and the
# bytes held at the end are 32 f16 cells plus 168 packed ones
for bits in 16 8; do
    "$EVAL" --model "$MODEL" --text "$TEXT_A" --n-tokens 200 --ppl-from 100 --kvq-fa --kvq-recent 32 \
        --kvq-recent-bits $bits --modes full,kvq:k4v4 --json "$out/kvq-recent-$bits.json" >/dev/null
done
# ... and with --kvq-sink 1 --kvq-center: K rows coded minus the window's mean per layer and KV
# head, one f16 K center per layer and head counted (half an f16 cell), and on this model's K
# (channels with large offsets) a smaller error than the same rows uncentered
"$EVAL" --model "$MODEL" --text "$TEXT_A" --n-tokens 200 --ppl-from 100 --kvq-fa --kvq-recent 32 \
    --kvq-recent-bits 8 --kvq-sink 1 --kvq-center --modes full,kvq:k4v4 --json "$out/kvq-recent-center.json" >/dev/null
python3 integrations/llama/ci_check_kvq_recent.py "$out/kvq-recent-16.json" "$out/kvq-recent-8.json" "$out/kvq-recent-center.json"
# kvq as llama.cpp's real cache (the patch series): the native rows against the fake-quant
# rows of the same configuration on the same attention path (flash attention), the cache
# llama.cpp allocated exactly kvc's packed rows, a plan's per-layer types, the speed table,
# and plans or configs llama.cpp must refuse at context creation
t2=$SECONDS
plan=data/kvq-plans/smollm2-135m-r3.5-kw3.json
"$EVAL" --model "$MODEL" --text "$TEXT_A" --n-tokens 320 --ppl-from 129 --kvq-fa \
    --modes "full,kvq:k4v4,kvq:k8v4,kvq-native:k4v4,kvq-native:k8v4,kvq-native-plan:$plan" \
    --speed-modes "f16,kvq-native:k4v4" --speed-ctx 256 --speed-decode 4 \
    --json "$out/native.json" >"$out/native.txt"
echo "50-llama: kvq-native run took $((SECONDS - t2)) s"
python3 integrations/llama/ci_check_native.py "$out/native.json" "$plan"
# a plan's protections (issue 34) in llama.cpp's real cache through kvc's kvq cells: k4v4 with
# an f16 sink of 4, a 64-token 8-bit window and K centers, decoded one token at a time next to
# its fake-quant twin and plain k4v4, and after a 256-token batched prefill; the bytes beside
# the tensors, the twin within 20 % KL, the prefill reading what decoding reads
prot=data/kvq-plans/smollm2-135m-k4v4-s4w64.json
twin=(--kvq-fa --kvq-sink 4 --kvq-recent 64 --kvq-recent-bits 8 --kvq-center)
"$EVAL" --model "$MODEL" --text "$TEXT_A" --n-tokens 512 --ppl-from 129 "${twin[@]}" \
    --modes "full,kvq-native:k4v4,kvq-plan:$prot,kvq-native-plan:$prot" --json "$out/protect-decode.json" >/dev/null
"$EVAL" --model "$MODEL" --text "$TEXT_A" --n-tokens 512 --ppl-from 129 --prompt 256 \
    --modes "full,kvq-native-plan:$prot" --json "$out/protect-prefill.json" >/dev/null
python3 integrations/llama/ci_check_protect.py "$out/protect-decode.json" "$out/protect-prefill.json" "$prot"
# repeated K-shifts through the cells: streaming eviction (sink 4, half the cells kept, every 32
# tokens from 256) with positions shifted down after each eviction, on f16, plain k4v4 and the
# protected cache; a shift that missed a row format, the centers or the new positions would
# put the protected row far from f16 streaming
"$EVAL" --model "$MODEL" --text "$TEXT_A" --n-tokens 512 --ppl-from 129 --sink 4 --recent 128 --ratio 2 \
    --trigger 256 --interval 32 --modes "full,streaming,streaming+kvq-native:k4v4,streaming+kvq-native-plan:$prot" \
    --json "$out/protect-shift.json" >/dev/null
python3 integrations/llama/ci_check_protect.py --shift "$out/protect-shift.json" "$prot"
echo "50-llama: kvq-native and protection runs took $((SECONDS - t2)) s"
# refused at context creation with llama.cpp's message, status 2: a plan for another model
# (layers, KV heads, head_dim), a plan with an f16 window, a center without a sink, a config
# that is no block format
python3 integrations/llama/ci_bad_plans.py "$plan" "$out"
set +e
for bad in "kvq-native-plan:$out/plan-24-layers.json:24 layers" "kvq-native-plan:$out/plan-4-heads.json:4 KV heads" \
           "kvq-native-plan:$out/plan-d128.json:head_dim 128" "kvq-native-plan:$out/plan-f16-window.json:f16" \
           "kvq-native-plan:$out/plan-center-no-sink.json:k_center needs" \
           "kvq-native-plan:$out/missing.json:cannot read" "kvq-native:k4v4:u32:not lm" \
           "kvq-native:k4v4 --kvq-native-no-fa:requires flash_attn"; do
    spec="${bad%:*}"; want="${bad##*:}"
    mode="${spec%% *}"; extra=""; [ "$spec" != "$mode" ] && extra="${spec#* }"
    # shellcheck disable=SC2086
    "$EVAL" --model "$MODEL" --text "$TEXT_A" --n-tokens 200 --ppl-from 100 --modes "full,$mode" $extra \
        >/dev/null 2>"$out/err-native.txt"
    code=$?
    if [ "$code" -ne 2 ] || ! grep -q "$want" "$out/err-native.txt"; then
        echo "50-llama: $mode gave status $code (want 2, naming '$want'): $(cat "$out/err-native.txt")" >&2
        exit 1
    fi
done
set -e
# quality: every mode's PPL and KL in every output above against the recorded results of
# this instruction set (integrations/llama/ci-expected.json, rule and tolerances there)
python3 integrations/llama/ci_check_quality.py check --isa "$LLAMA_ISA" "$out"
echo "50-llama: passed"
