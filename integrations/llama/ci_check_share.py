"""Checks of the share mode's runs: Redis up, damaged, killed, down; the disk tier raw and kvq (50-llama.sh).

Arguments: as 50-llama.sh passes them ($out).
"""
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
assert kvq["logits_identical"] is False and 0.0 < kvq["kl"], kvq  # bounds: ci_check_quality.py
assert kvq["wire_ratio_vs_f16"] > 3.5, kvq
assert 0.0 < kvq["restore_rel_rms_k"] < 0.12 and 0.0 < kvq["restore_rel_rms_v"] < 0.12, kvq
assert kvq["control_caught"] is True, kvq
# disk tier, the transform coder tc-0.016 with the checked-in calibration (lossy): every chunk
# restored, small KL, at least f16/5 on the wire with every blob byte counted (6.5 at a
# 2048-token prefix: docs/results/tc-eval.md; 128-token chunks and the 4 raw sink tokens cost
# some of that here: 5.77), the damaged control caught
tc = json.load(open(f"{d}/tc/share-disk-tc.json"))["texts"][0]["results"][0]
assert tc["codec"] == "tc-0.016" and tc["lossless"] is False, tc
assert tc["chunks_stored"] == 2 and tc["fallbacks"] == 0 and tc["restored_tokens_min"] == 256, tc
assert tc["state_round_trip"] is True and tc["control_caught"] is True, tc
assert tc["logits_identical"] is False and 0.0 < tc["kl"] < 0.1, tc  # 8 tokens: noisy (0.035 here, AVX-512 and AVX2)
assert tc["wire_ratio_vs_f16"] > 5.0, tc
assert 0.8 < tc["ppl_restored_max"] / tc["ppl_prefilled"] < 1.25, tc
print(f"50-llama: share: tc-0.016 {tc['wire_ratio_vs_f16']:.3f}:1 vs f16, KL {tc['kl']:.4f}, "
      f"PPL {tc['ppl_restored_max']:.3f} vs {tc['ppl_prefilled']:.3f} over {tc['ppl_rows']:.0f} tokens")
print(f"50-llama: share: kvq k4v4 {kvq['wire_ratio_vs_f16']:.3f}:1 vs f16, KL {kvq['kl']:.4f}")
print(f"50-llama: share: redis {up['wire_ratio_vs_f16']:.3f}:1 vs f16, restore {up['restore_s']:.3f} s vs "
      f"prefill {up['prefill_s']:.3f} s; damaged value: {bad['client_detail'][0]['restored_tokens']} tokens restored; "
      f"killed: {killed['fallbacks']:.0f} fallbacks; down: {down['fallbacks']:.0f}; disk raw ok")
