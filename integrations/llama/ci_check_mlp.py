"""Checks of the mlp modes against their schedule, restated here (50-llama.sh).

Arguments: as 50-llama.sh passes them ($out/mlp.json $mlp_w $out/meanpool4.bin).
"""
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
        assert math.isfinite(r["ppl"]) and r["kl"] > 0.0, (m, r)  # bounds: ci_check_quality.py
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
    assert math.isfinite(r["ppl"]) and r["kl"] > 0.0, r  # bounds: ci_check_quality.py
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
