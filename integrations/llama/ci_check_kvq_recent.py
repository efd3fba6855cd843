"""Checks of kvq with the newest tokens kept in a recent window, plain and centered (50-llama.sh).

Arguments: as 50-llama.sh passes them ($out/kvq-recent-16.json $out/kvq-recent-8.json $out/kvq-recent-center.json).
"""
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
