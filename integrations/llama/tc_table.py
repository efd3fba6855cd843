"""The Markdown tables of tc-eval.sh's runs: one per text, a row per codec.

    tc_table.py OUT_DIR

Reads OUT_DIR/<text>-<codec>.json (kvc_llama_eval --modes share --json) and prints, per
text: bytes per token on the wire and f16 over them, KL and PPL of the tokens after the
prefix against the prefilling process, restore and prefill seconds (and CPU seconds) of the
same run, and the encode cost at store time per 1,000 tokens: the wall seconds of storing the
same chunks into a memory tier (encode and checksum, no I/O; kvc's rayon pool, 2 threads
here) next to the prefill's CPU seconds per 1,000 tokens.
"""
import glob
import json
import os
import sys


def main(out):
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        try:
            r = json.load(open(path))["texts"][0]["results"][0]
        except (OSError, ValueError, KeyError, IndexError):
            continue
        if r.get("mode") != "share":
            continue
        text = os.path.basename(path)[: -len(r["codec"]) - 6]
        rows.setdefault(text, []).append(r)
    order = lambda r: (not r["lossless"], -r["wire_bytes_per_token"])
    for text, rs in rows.items():
        rs.sort(key=order)
        n = rs[0]["rest_tokens"]
        print(f"\n**{text}** ({rs[0]['prefix_tokens']}-token prefix, {n} tokens after it)\n")
        print("| codec | B/token | f16 / stored | KL | PPL restored | PPL prefilled | ΔPPL | prefill s (CPU) | "
              "restore s (CPU) | prefill / restore | encode s / 1k tokens | prefill CPU s / 1k tokens |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rs:
            p2, p1 = r.get("ppl_restored_max"), r.get("ppl_prefilled")
            dp = f"{100 * (p2 / p1 - 1):+.2f} %" if p1 and p2 else "-"
            enc_k = 1000 * r["memory_tier_encode_s"] / r["prefix_tokens"]
            pre_k = 1000 * r["prefill_cpu_s"] / r["prefix_tokens"]
            print(f"| {r['codec']} | {r['wire_bytes_per_token']:,.0f} | {r['wire_ratio_vs_f16']:.2f} | "
                  f"{r['kl']:.4f} | {p2 if p2 is None else f'{p2:.4f}'} | {p1 if p1 is None else f'{p1:.4f}'} | "
                  f"{dp} | {r['prefill_s']:.2f} ({r['prefill_cpu_s']:.2f}) | "
                  f"{r['restore_s']:.3f} ({r['restore_cpu_s']:.3f}) | {r['prefill_over_restore']:.0f}x | "
                  f"{enc_k:.3f} | {pre_k:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".cache/tc-eval")
