"""Checks of kvq as llama.cpp's real cache (kvq-native modes, a plan, the speed table) (50-llama.sh).

Arguments: as 50-llama.sh passes them ($out/native.json $plan).
"""
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
    assert r["kl"] > 0 and r["ppl"] > 1, r  # bounds: ci_check_quality.py
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
