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

python3 - "$out/result.json" "$out/dump" <<'PY'
import json, math, os, sys
res = json.load(open(sys.argv[1]))
dump = sys.argv[2]
assert len(res["texts"]) == 2, "two texts"
for t in res["texts"]:
    rows = {r["mode"]: r for r in t["results"]}
    for m in ("full", "streaming", "kvc-streaming@3.5", "h2o@3.5", "h2o-fa@3.5", "c8", "c8-h2o@3.5", "q8_0",
              "q4_0", "q8_0-q4_0", "kvq:k4v4", "kvq:k4v2", "kvq-kc32:k4v4", "probe", "state", "dump"):
        assert m in rows, f"{t['text']}: no {m} row"
    full = rows["full"]
    assert 1.0 < full["ppl"] < 1000.0, full
    assert full["kv_ratio_end"] == 1.0, full
    st = rows["streaming"]
    assert st["kv_ratio_end"] > 2.0 and st["cells_verified"] == st["cells_end"], st
    assert st["kl"] > 0.0 and math.isfinite(st["ppl"]), st
    # kvc's policies through the C API: plans made and applied (none dropped), the cache really
    # shrunk to the calibrated budget, every bit of attention mapped to a held cell
    for m in ("kvc-streaming@3.5", "h2o@3.5", "h2o-fa@3.5"):
        k = rows[m]
        assert k["kvc_plans_made"] > 0 and k["kvc_plans_applied"] == k["evictions"] > 0, k
        assert k["kvc_plans_dropped"] == 0 and k["tokens_evicted"] > 0, k
        assert k["cells_end"] == k["cells_verified"] <= k["budget_cells"], k
        assert k["kv_ratio_end"] > 3.0 and k["attention_unmapped_max"] < 1e-3, k
        assert k["kl"] > 0.0 and math.isfinite(k["ppl"]), k
    fa = rows["h2o-fa@3.5"]
    # the recompute matches llama.cpp's flash attention within the rounding bound derived from
    # the kernel's f16 arithmetic (fattn_bound.hpp), on any x86-64 build; and each deliberate
    # mistake (wrong KV head, missing cell, scale 25 % off) fell outside that bound in every call
    n = fa["fattn_checked_calls"]
    assert n > 0 and fa["fattn_err_over_bound"] <= 1.0, fa
    assert fa["fattn_control_cell_caught"] == n and fa["fattn_control_scale_caught"] == n, fa
    assert fa["fattn_control_head_caught"] == fa["fattn_control_head_calls"] == n, fa
    # flash on recomputes the same attention: the two h2o runs stay close
    assert abs(fa["ppl"] / rows["h2o@3.5"]["ppl"] - 1.0) < 0.05, (fa, rows["h2o@3.5"])
    # C8 through kvc_quant: every K/V row round-tripped (all of them: 2 x n_layer x 320 x 192
    # values), error finite and bounded, the result differs from full but stays usable, memory
    # counted as int8 + scales
    for m in ("c8", "c8-h2o@3.5"):
        c = rows[m]
        for kv in ("k", "v"):
            assert c[f"c8_{kv}_values"] == 30 * 320 * 192, c
            assert 0.0 < c[f"c8_{kv}_rel_rms_err"] < 0.5 and math.isfinite(c[f"c8_{kv}_max_abs_err"]), c
        assert c["kl"] > 0.0 and c["ppl"] < 2.0 * full["ppl"], c
    assert 1.9 < rows["c8"]["kv_ratio_end"] < 2.0, rows["c8"]
    ch = rows["c8-h2o@3.5"]
    assert ch["kv_ratio_end"] > 3.0 and ch["kvc_plans_applied"] == ch["evictions"] > 0 and ch["kvc_plans_dropped"] == 0, ch
    for q in ("q8_0", "q4_0", "q8_0-q4_0"):
        assert rows[q]["kv_ratio_end"] > 1.8 and rows[q]["kl"] > 0.0, rows[q]
    # kvq through kvc_kvq: every K/V row packed and unpacked (30 layers x 320 tokens x 3 KV
    # heads each), the bytes held exactly the packed rows' (f16 cell 23040 B / kvq cell), the
    # error finite and bounded, the run usable
    f16_cell = 30 * 2 * 192 * 2
    for m in ("kvq:k4v4", "kvq:k4v2"):
        k = rows[m]
        for kv in ("k", "v"):
            assert k[f"kvq_{kv}_rows"] == 30 * 320 * 3, k
            assert 0.0 < k[f"kvq_{kv}_rel_rms_err"] < 0.5 and math.isfinite(k[f"kvq_{kv}_max_abs_err"]), k
            assert k[f"kvq_{kv}_packed_bytes"] == k[f"kvq_{kv}_rows"] * k[f"kvq_{kv}_bits_per_value"] * 64 / 8, k
        assert k["kvq_sink"] == 0 and abs(k["kv_ratio_end"] / (f16_cell / k["kvq_cell_bytes"]) - 1) < 1e-8, k
        assert k["kl"] > 0.0 and math.isfinite(k["ppl"]) and k["ppl"] < 4.0 * full["ppl"], k
    assert abs(rows["kvq:k4v4"]["kvq_cell_bytes"] - 30 * 2 * 3 * (2 + 64 * 4 / 8)) < 1e-9, rows["kvq:k4v4"]
    assert rows["kvq:k4v2"]["kv_ratio_end"] > rows["kvq:k4v4"]["kv_ratio_end"], "k4v2 holds fewer bytes than k4v4"
    # K per channel over groups of 32 tokens (KIVI), V as kvq k4v4 rows: 320 tokens are 10 whole
    # groups, so every K row was coded in a block (1280 B: 64 f16 steps, 64 f16 minimums, 32 rows
    # of 32 code bytes) and the bytes held at the end are exactly the blocks plus V's rows
    kc = rows["kvq-kc32:k4v4"]
    assert kc["kvq_k_rows"] == 30 * 320 * 3 and kc["kvq_v_rows"] == 30 * 320 * 3, kc
    assert kc["kvq_k_block_bytes"] == 4 * 64 + 32 * 64 * 4 // 8 and kc["kvq_k_group"] == 32, kc
    assert kc["kvq_k_packed_bytes"] == 30 * 3 * 10 * 1280, kc
    held = 30 * 3 * 10 * 1280 + 320 * 30 * 3 * (2 + 64 * 4 // 8)
    assert abs(kc["kv_ratio_end"] - 320 * f16_cell / held) < 1e-9 * kc["kv_ratio_end"], (kc, held)
    for kv in ("k", "v"):
        assert 0.0 < kc[f"kvq_{kv}_rel_rms_err"] < 0.5 and math.isfinite(kc[f"kvq_{kv}_max_abs_err"]), kc
    # per-channel K follows this model's outlier channels: its K error is well under the
    # per-row rotated codes' at 4 bits (0.039 against 0.091 on 320 tokens of text A)
    assert kc["kvq_k_rel_rms_err"] < 0.7 * rows["kvq:k4v4"]["kvq_k_rel_rms_err"], (kc, rows["kvq:k4v4"])
    assert kc["kl"] > 0.0 and math.isfinite(kc["ppl"]) and kc["ppl"] < 4.0 * full["ppl"], kc
    assert rows["q8_0"]["kl"] < rows["q4_0"]["kl"], "q8_0 should be closer to f16 than q4_0"
    assert rows["probe"]["ppl_identical_to_full"] is True, rows["probe"]
    s = rows["state"]
    assert s["logits_differing"] == 0 and s["state_round_trip_identical"] and s["truncated_state_rejected"], s
    # the state through kvc's codec: byte-exact, same logits, damage refused, smaller
    assert s["codec_round_trip_identical"] and s["codec_logits_differing"] == 0, s
    assert s["codec_truncated_refused"] and s["codec_damaged_header_refused"], s
    assert 1.0 < s["codec_state_ratio"] < 4.0 and s["codec_packed_bytes"] < s["state_bytes"], s
    d = rows["dump"]
    assert d["f16_of_callback_f32_mismatches"] == 0, d
    # the dumped post-RoPE Q reproduces layer 0's attention (kq_soft_max-0) of the last ubatch:
    # f32 softmax rounding is below 1e-4 here (measured 2e-7); a wrong head, token or layer
    # order of Q gives about 0.1
    assert d["q_attention_max_err"] < 1e-3, d
p = res["probe"]
assert p["kq_calls"] > 0 and p["rows_calls"] > 0 and p["set_rows_calls"] > 0 and p["set_rows_reads_hooked_tensor"], p
a = {r["mode"]: r for r in res["texts"][0]["results"]}["dump"]
for k in ("realkv_K_f16", "realkv_V_f16", "realkv_K_bf16", "realkv_V_bf16"):
    c = a[k]
    # layer 0 must be bit-identical (it proves the read-out and the format); deeper layers
    # are bit-identical only on the instruction set the reference was made with (an AVX2
    # build differs in the attention arithmetic from layer 1 on)
    assert c is not None and c["values"] > 0 and c["layer0_mismatches"] == 0, (k, c)
    print(f"50-llama: dump vs realkv {k}: {c['layers_differing']} of {c['layers']} layers differ "
          f"(first {c['first_differing_layer']}), {c['mismatches']} of {c['values']} values")
for tag in ("textA", "textB"):
    for f in ("K.f16", "V.f16", "K.bf16", "V.bf16", "K.f32", "V.f32", "Q.f32"):
        meta = json.load(open(os.path.join(dump, f"{tag}.{f}.json")))
        n = 4 if f.endswith("f32") else 2
        for x in meta["shape"]:
            n *= x
        assert os.path.getsize(os.path.join(dump, meta["file"])) == n, (tag, f)
print("50-llama: result checks passed")
PY

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
echo "50-llama: share runs took $((SECONDS - t2)) s"
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
def row(name):
    return json.load(open(f"{d}/{name}.json"))["texts"][0]["results"][0]
up, bad, killed, down, disk = (row(f"share-{n}") for n in ("redis", "redis-damaged", "redis-killed", "redis-down", "disk"))
for r in (up, bad, killed, down, disk):
    assert r["mode"] == "share" and r["prefix_tokens"] == 256 and r["chunks_in_prefix"] == 2, r
    assert r["logits_identical"] is True and r["logits_differing"] == 0 and r["kl"] == 0.0, r
    assert r["state_round_trip"] is True, r
# Redis up: both chunks stored, both clients restored all 256 tokens without a fallback, the
# wire smaller than f16 (gear-v2 is lossless), the damaged control caught
assert up["tier"] == "redis" and up["clients"] == 2 and len(up["client_detail"]) == 2, up
assert up["chunks_stored"] == 2 and up["fallbacks"] == 0 and up["restored_tokens_min"] == 256, up
assert up["bytes_stored"] > 0 and up["wire_ratio_vs_f16"] > 1.05, up
assert up["control_caught"] is True and up["control_logits_differing"] > 0, up
assert all(c["hits"] == 2 and c["restored_tokens"] == 256 for c in up["client_detail"]), up
# one value damaged: caught by its checksum, counted, never restored; the rest recomputed
c = bad["client_detail"][0]
assert bad["chunks_stored"] == 2 and c["corrupt"] == 1 and bad["fallbacks"] >= 1, bad
assert c["restored_tokens"] in (0, 128) and c["recompute_s"] > 0, bad
# Redis killed after the store: every lookup fails, counted, recomputed, exit 0
c = killed["client_detail"][0]
assert killed["chunks_stored"] == 2 and killed["fallbacks"] > 0 and c["errors"] > 0, killed
assert killed["restored_tokens_min"] == 0 and killed["control_caught"] is None and c["recompute_s"] > 0, killed
# Redis down for the store too: nothing stored, failures counted
assert down["chunks_stored"] == 0 and down["store_failures"] > 0 and down["fallbacks"] > 0, down
assert down["restored_tokens_min"] == 0, down
# disk tier, raw codec: f16 bytes plus the blob headers and checksums
assert disk["tier"] == "disk" and disk["chunks_stored"] == 2 and disk["fallbacks"] == 0, disk
assert disk["restored_tokens_min"] == 256 and disk["control_caught"] is True, disk
assert 0.98 < disk["wire_ratio_vs_f16"] < 1.0, disk
# disk tier, kvq k4v4 (lossy): every chunk restored, logits not identical (expected) but
# close, under f16/3.5 bytes per token with every blob byte counted
kvq = row("share-disk-kvq")
assert kvq["lossless"] is False and kvq["chunks_stored"] == 2 and kvq["fallbacks"] == 0, kvq
assert kvq["restored_tokens_min"] == 256 and kvq["state_round_trip"] is True, kvq
assert kvq["logits_identical"] is False and 0.0 < kvq["kl"] < 0.2, kvq
assert kvq["wire_ratio_vs_f16"] > 3.5, kvq
assert 0.0 < kvq["restore_rel_rms_k"] < 0.12 and 0.0 < kvq["restore_rel_rms_v"] < 0.12, kvq
assert kvq["control_caught"] is True, kvq
print(f"50-llama: share: kvq k4v4 {kvq['wire_ratio_vs_f16']:.3f}:1 vs f16, KL {kvq['kl']:.4f}")
print(f"50-llama: share: redis {up['wire_ratio_vs_f16']:.3f}:1 vs f16, restore {up['restore_s']:.3f} s vs "
      f"prefill {up['prefill_s']:.3f} s; damaged value: {bad['client_detail'][0]['restored_tokens']} tokens restored; "
      f"killed: {killed['fallbacks']:.0f} fallbacks; down: {down['fallbacks']:.0f}; disk raw ok")
PY

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
python3 - "$out/mlp.json" "$mlp_w" "$out/meanpool4.bin" <<'PY'
import json, math, struct, sys
res = json.load(open(sys.argv[1]))
weights_file, meanpool_file = sys.argv[2], sys.argv[3]
min_seq_len = struct.unpack("<IIHHIIIIIIII", open(weights_file, "rb").read(44))[9]
n, ppl_from, sink, recent, trigger, interval, ratio, factor = 320, 129, 16, 32, 128, 16, 3.0, 4


def schedule(min_groups):
    """The mlp modes' schedule, restated: cells at the end, groups compressed (in all, and in
    the first rewrite), mean KV ratio."""
    held = comp = groups = first = 0
    ratios = []
    for i in range(n):
        if i >= trigger and (i - trigger) % interval == 0:
            tgt = math.ceil(i / ratio)
            if held > tgt:
                avail = held - recent - (min(sink, held) + comp)
                g = min(avail // factor if avail > 0 else 0, max((held - tgt + factor - 2) // (factor - 1), min_groups))
                if g >= min_groups:
                    held -= g * (factor - 1)
                    comp += g
                    groups += g
                    first = first or g
        held += 1
        if i + 1 < n and i + 1 >= ppl_from:
            ratios.append((i + 1) / held)
    return held, groups, first, sum(ratios) / len(ratios)


for t in res["texts"]:
    rows = {r["mode"]: r for r in t["results"]}
    full = rows["full"]
    for m, mg in (("mlp-meanpool@4", 1), ("mlp@4", max(1, min_seq_len))):
        r = rows[m]
        cells, groups, _, mean_ratio = schedule(mg)
        # the cache really holds the cells the schedule leaves (llama.cpp's own count), fewer
        # than the tokens seen, and the ratios are those of that many f16 cells
        assert r["cells_end"] == r["cells_verified"] == cells < n, (m, r, cells)
        assert r["mlp_groups"] == groups > 0 and r["mlp_tokens_compressed"] == 4 * groups, (m, r, groups)
        assert abs(r["kv_ratio_end"] - n / cells) < 1e-9, (m, r)
        assert abs(r["kv_ratio_mean"] - mean_ratio) < 1e-6 and mean_ratio > 2.0, (m, r, mean_ratio)
        assert r["mlp_writer_checked"] and r["mlp_factor"] == 4, (m, r)
        assert math.isfinite(r["ppl"]) and r["ppl"] < 3.0 * full["ppl"] and r["kl"] > 0.0, (m, r)
    # mlp combined with kvq (every held cell, compressed ones re-quantized, a kvq k8v4 cell):
    # the same schedule, and the mean ratio the product of the schedule's and kvq's own, the
    # latter from docs/formats/kvq.md's row sizes (lm: one f16 scale + d * b / 8 code bytes)
    r = rows["mlp@4+kvq:k8v4"]
    cells, groups, _, mean_ratio = schedule(max(1, min_seq_len))
    kvq_ratio = (2 * 64 * 2) / ((2 + 64 * 8 // 8) + (2 + 64 * 4 // 8))
    assert r["kvq_cell_bytes"] == 30 * 3 * (66 + 34), r
    assert r["cells_end"] == r["cells_verified"] == cells and r["mlp_groups"] == groups, (r, cells, groups)
    assert abs(r["kv_ratio_mean"] - mean_ratio * kvq_ratio) < 1e-6 * mean_ratio * kvq_ratio, (r, mean_ratio, kvq_ratio)
    assert r["mlp_kvq_requantized_rows"] == 2 * 3 * 30 * groups, r
    assert 0.0 < r["mlp_kvq_requant_k_rel_rms_err"] < 0.05 and 0.0 < r["mlp_kvq_requant_v_rel_rms_err"] < 0.2, r
    assert math.isfinite(r["ppl"]) and r["ppl"] < 3.0 * full["ppl"] and r["kl"] > 0.0, r
    print(f"50-llama: {t['text']}: mlp@4 PPL {rows['mlp@4']['ppl']:.3f} at {rows['mlp@4']['kv_ratio_mean']:.3f}, "
          f"mlp@4+kvq:k8v4 PPL {r['ppl']:.3f} at {r['kv_ratio_mean']:.3f} (= {mean_ratio:.3f} x {kvq_ratio:.3f})")
    mp = rows["mlp-meanpool@4"]
    # the generated mean-pool weights compute each group's mean within f16 rounding: every K
    # and V value of the first rewrite checked (layers x K/V x groups x KV heads x head_dim)
    assert mp["meanpool_values_checked"] == 30 * 2 * schedule(1)[2] * 3 * 64, mp
    assert mp["meanpool_err_over_tolerance"] <= 1.0, mp
    if weights_file == meanpool_file:
        # the script's file and the harness's generated weights are the same compressor
        assert rows["mlp@4"]["ppl"] == mp["ppl"] and rows["mlp@4"]["kl"] == mp["kl"], (rows["mlp@4"], mp)
print("50-llama: mlp checks passed")
PY

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
         "$rc20:$out/err20.txt"; do
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
python3 - "$out/kvq-recent-16.json" "$out/kvq-recent-8.json" "$out/kvq-recent-center.json" <<'PY'
import json, math, sys
rows = [{x["mode"]: x for x in json.load(open(f))["texts"][0]["results"]}["kvq:k4v4"] for f in sys.argv[1:]]
f16_cell, kvq_cell, k8_cell = 30 * 2 * 192 * 2, 30 * 2 * 3 * (2 + 64 * 4 // 8), 30 * 2 * 3 * (2 + 64)
for r, window, sink, centers in zip(rows, (f16_cell, k8_cell, k8_cell), (0, 0, 1), (0, 0, f16_cell // 2)):
    coded = 200 - sink - 32
    assert r["kvq_recent"] == 32 and r["kvq_sink"] == sink, r
    assert r["kvq_k_rows"] == r["kvq_v_rows"] == coded * 30 * 3, r
    assert r["kvq_center"] == (centers > 0), r
    assert r["kvq_recent_cell_bytes"] == window, r
    assert r["kv_held_bytes_end"] == sink * f16_cell + 32 * window + coded * kvq_cell + centers, r
    assert 0.0 < r["kvq_k_rel_rms_err"] < 0.5 and 0.0 < r["kl"] and math.isfinite(r["ppl"]), r
    print(f"50-llama: kvq:k4v4 --kvq-recent 32, window cell {window} B, centers {centers} B: ratio {r['kv_ratio_end']:.3f}, "
          f"K err {r['kvq_k_rel_rms_err']:.4f}, KL {r['kl']:.4f} at 200 tokens")
assert rows[2]["kvq_k_rel_rms_err"] < 0.95 * rows[1]["kvq_k_rel_rms_err"], (rows[2]["kvq_k_rel_rms_err"], rows[1]["kvq_k_rel_rms_err"])
PY
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
python3 - "$out/native.json" "$plan" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
plan = json.load(open(sys.argv[2]))
rows = {r["mode"]: r for r in res["texts"][0]["results"]}
full = rows["full"]
f16_alloc = full["kv_alloc_k_bytes"] + full["kv_alloc_v_bytes"]
cells = f16_alloc / (30 * 2 * 3 * 64 * 2)
assert cells == int(cells) and cells >= 320, full
def packed(bits):  # bytes of one row of 64 values: f16 scale + codes
    return 2 + 64 * bits // 8
for m, kb, vb in (("kvq-native:k4v4", 4, 4), ("kvq-native:k8v4", 8, 4)):
    r = rows[m]
    # llama.cpp really holds kvc's packed rows: K and V bytes as allocated, not computed
    assert r["kv_alloc_k_bytes"] == cells * 30 * 3 * packed(kb), r
    assert r["kv_alloc_v_bytes"] == cells * 30 * 3 * packed(vb), r
    assert r["cells_end"] == r["cells_verified"] == 320, r
    assert r["state_seq_bytes"] < full["state_seq_bytes"] / 2, (r, full)
    assert r["kl"] > 0 and r["ppl"] > 1, r
p = rows["kvq-native-plan:" + sys.argv[2]]
want_k = sum(cells * 3 * packed(l["k_bits"]) for l in plan["layers"])
want_v = sum(cells * 3 * packed(l["v_bits"]) for l in plan["layers"])
assert p["kv_alloc_k_bytes"] == want_k and p["kv_alloc_v_bytes"] == want_v, (p, want_k, want_v)
assert f16_alloc / (p["kv_alloc_k_bytes"] + p["kv_alloc_v_bytes"]) >= 3.5, p
# native decoding is right: 8-bit K on llama.cpp's own kvq cache stays next to the full f16
# run (a wrong kernel, basis or stride would not: KL is the sharp test, 0.0135-0.0138 on both
# kernel generations, PPL the loose one). At 320 tokens k8v4's PPL is one draw of the
# quantization noise: -1.0 % against full with the per-row kernels, +2.2 % with the GQA block
# kernels, whose sums differ in the last bits (docs/results/kvq-native.md, gqa-ppl320-*.json;
# +1.0 % / +0.7 % at 2048 tokens), so the PPL bound is 5 %, the 320-token spread of
# rotation seeds measured there. The native-against-fake comparison is
# printed, not asserted: at 320 tokens two runs of the same quantizer differ by realization
# (other rotation seeds of kvq:k4v4 spread PPL by 5 % and KL by 20 %; the fake rows' f16 flash
# attention moved k8v4 by 2-3 % on both builds); docs/results/kvq-native.md compares them at
# 2048 tokens on both texts
n = rows["kvq-native:k8v4"]
assert abs(n["ppl"] / full["ppl"] - 1) < 0.05 and 0 < n["kl"] < 0.03, (n, full["ppl"])
msg = []
for c in ("k8v4", "k4v4"):
    nn, ff = rows["kvq-native:" + c], rows["kvq:" + c]
    msg.append(f"{c} PPL {nn['ppl'] / ff['ppl']:.4f} KL {nn['kl'] / ff['kl']:.3f}")
print("50-llama: native/fake (not asserted): " + "; ".join(msg))
speed = {(s["mode"], s["threads"]): s for s in res["speed"]}
assert ("f16", 1) in speed and ("kvq-native:k4v4", 1) in speed, res["speed"]
assert all(s["tok_s"] > 0 for s in res["speed"]), res["speed"]
assert speed[("kvq-native:k4v4", 1)]["kv_alloc_bytes"] < speed[("f16", 1)]["kv_alloc_bytes"] / 3.5, res["speed"]
print("50-llama: kvq-native checks passed")
PY
# refused at context creation with llama.cpp's message, status 2: a plan for another model
# (layers, KV heads, head_dim), a plan with f16 sink tokens, a config that is no block format
python3 - "$plan" "$out" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p.pop("calibration", None)
p["version"] = 1
def write(name, **kw):
    q = dict(p, **kw)
    json.dump(q, open(f"{sys.argv[2]}/{name}.json", "w"))
write("plan-24-layers", layers=p["layers"][:24])
write("plan-4-heads", n_kv_head=4)
write("plan-d128", head_dim=128)
write("plan-sinks", sink_tokens=16)
PY
set +e
for bad in "kvq-native-plan:$out/plan-24-layers.json:24 layers" "kvq-native-plan:$out/plan-4-heads.json:4 KV heads" \
           "kvq-native-plan:$out/plan-d128.json:head_dim 128" "kvq-native-plan:$out/plan-sinks.json:sink" \
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
echo "50-llama: passed"
