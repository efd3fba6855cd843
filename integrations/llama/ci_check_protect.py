"""Checks of a kvq plan's protections in llama.cpp's real cache (50-llama.sh, issue 34).

Arguments: decode.json prefill.json plan.json, or --shift shift.json plan.json, as 50-llama.sh
passes them.
  decode.json   --prompt 0 (every token decoded alone): full, kvq-native:k4v4, the plan's
                fake-quant twin (kvq-plan: with the same --kvq-* flags) and kvq-native-plan:
  prefill.json  --prompt 256 (one batch, then one token at a time): full, kvq-native-plan:
"""
import json, sys

if sys.argv[1] == "--shift":
    # shift.json: full, streaming (f16), streaming+kvq-native:k4v4, streaming+kvq-native-plan:
    # with positions shifted after every eviction (llama_memory_seq_add: llama.cpp's K-shift,
    # through kvc's kvq cells for the protected cache)
    rows = {r["mode"]: r for r in json.load(open(sys.argv[2]))["texts"][0]["results"]}
    f16, plain = rows["streaming"], rows["streaming+kvq-native:k4v4"]
    prot = rows["streaming+kvq-native-plan:" + sys.argv[3]]
    assert f16["cells_end"] < 512 and prot["cells_end"] == f16["cells_end"], (f16["cells_end"], prot["cells_end"])
    # the protections cost about their own KL (0.008 unshifted) over f16 streaming; plain k4v4
    # costs ten times that
    assert prot["kl"] < f16["kl"] + 0.03 and prot["kl"] - f16["kl"] < 0.5 * (plain["kl"] - f16["kl"]), \
        (prot["kl"], f16["kl"], plain["kl"])
    assert prot["state_round_trip_max_abs_logit_diff"] == 0, prot
    print(f"50-llama: shifted streaming KL: f16 {f16['kl']:.5f} protected {prot['kl']:.5f} plain k4v4 {plain['kl']:.5f}")
    sys.exit(0)

dec = {r["mode"]: r for r in json.load(open(sys.argv[1]))["texts"][0]["results"]}
pre = {r["mode"]: r for r in json.load(open(sys.argv[2]))["texts"][0]["results"]}
plan_path = sys.argv[3]
plan = json.load(open(plan_path))
sink, window, wbits = plan["sink_tokens"], plan["recent_tokens"], plan["recent_bits"]
n_layer, h, d = len(plan["layers"]), plan["n_kv_head"], plan["head_dim"]
native, twin = dec["kvq-native-plan:" + plan_path], dec["kvq-plan:" + plan_path]
plain = dec["kvq-native:k4v4"]
full = dec["full"]
cells = (full["kv_alloc_k_bytes"] + full["kv_alloc_v_bytes"]) / (n_layer * 2 * h * d * 2)
assert cells == int(cells) and cells >= 512, full
cells = int(cells)


def packed(bits):  # one row of d values: f16 scale + codes
    return 2 + d * bits // 8


# the window rows kept past the window for exact rollbacks (llama.cpp's --kvc-rollback)
rollback = int(native["kvc_exact_rollback"]) - 1
assert rollback >= 0, native
# bytes: the main tensors are exactly kvc's rows; beside them, after a decode step, the sink
# (f16), window + rollback + 1 lasting window rows (the one leaving is freed by the next ubatch), one f16
# K center per layer (values and rotated copy, f32 in memory) and 16 bytes of bookkeeping per
# cell; a few KiB of per-sequence and ubatch vectors on top. A scratch left from the prefill
# or window storage that never shrank would be far more.
main = sum(cells * h * (packed(l["k_bits"]) + packed(l["v_bits"])) for l in plan["layers"])
rows = n_layer * 2 * (sink * h * d * 2 + (window + rollback + 1) * h * packed(wbits))
centers = n_layer * (48 + 4 * 2 * h * d)
floor = rows + centers + 16 * cells
for name, r in (("decode", native), ("prefill", pre["kvq-native-plan:" + plan_path])):
    side = r["kvq_cells_side_bytes_end"]
    assert floor <= side < floor + 16384, (name, side, floor)
    ratio = r["kv_ratio_end"]
    want = 512 * n_layer * 2 * h * d * 2 / (512 * main / cells + side)
    assert abs(ratio - want) < 1e-6 * want, (name, ratio, want)
# saved states: llama.cpp saves the rows packed as they are held, the cells' side after them (a
# u64 length and kvc's KVCQCELS bytes, docs/formats/kvq.md "Saved cells"), nothing else: the
# protected state is the plain k4v4 state (same rows, same type-name lengths) plus exactly
# that section. At the end of a decode, `window + rollback` cells hold window rows, the
# sink's f16 rows, one writer with an f16 center per layer's K.
n_cells = native["cells_end"]
section = (12 + 13 + 10 * 2 * n_layer + 4 + 4 + (5 + n_layer * h * d * 2) + 4 + 9 * n_cells
           + n_layer * 2 * (sink * h * d * 2 + (window + rollback) * h * packed(wbits)) + 32)
for name, r in (("decode", native), ("prefill", pre["kvq-native-plan:" + plan_path])):
    assert r["cells_end"] == plain["cells_end"], (r["cells_end"], plain["cells_end"])
    assert r["state_seq_bytes"] == plain["state_seq_bytes"] + 8 + section, \
        (name, r["state_seq_bytes"], plain["state_seq_bytes"], section)
    # and a state loaded back into a cleared cache decodes the next token exactly as before
    assert r["state_round_trip_max_abs_logit_diff"] == 0, r
# quality: the protections make the cache near-lossless: well under half the KL of the same
# rows without them, and the native cache within 20 % KL of its fake-quant twin (same rows,
# same rules; they differ by the twin's f16 rounding of the window's values). Over these 383
# positions a change of arithmetic alone moves the native KL by several percent: on AVX2 the
# flash-attention tile's exponentials, expf or ggml's vector exp, gave 0.00804 and 0.00856
# against the twin's 0.00748 (+7 % and +14 %; AVX-512 0.00826 either way), while
# llama-perplexity's KL over 2048 tokens of both texts moved by at most 2 %
assert native["kl"] < 0.5 * plain["kl"], (native["kl"], plain["kl"])
assert abs(native["kl"] / twin["kl"] - 1) < 0.20, (native["kl"], twin["kl"])
# a batched prefill reads the rows one-token decoding reads: same quality
pn = pre["kvq-native-plan:" + plan_path]
assert abs(pn["kl"] / native["kl"] - 1) < 0.25, (pn["kl"], native["kl"])
print(f"50-llama: protections: KL native {native['kl']:.5f} twin {twin['kl']:.5f} plain k4v4 {plain['kl']:.5f} "
      f"prefill {pn['kl']:.5f}; PPL native/twin {native['ppl'] / twin['ppl']:.4f}; "
      f"side bytes {native['kvq_cells_side_bytes_end']:.0f} (floor {floor}), mean ratio {native['kv_ratio_mean']:.3f}; "
      f"state {native['state_seq_bytes']} bytes (plain k4v4 {plain['state_seq_bytes']} + kvq cells {8 + section})")
