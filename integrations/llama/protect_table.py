#!/usr/bin/env python3
"""The tables of integrations/llama/protect-eval.sh: per text, llama-perplexity's mean KL
against the f16 base, PPL(Q)/PPL(base) and the ratio to f16 of the bytes held; and the decode
speed medians.

    protect_table.py DIR     (markdown on stdout, DIR/summary.json)

Bytes: llama.cpp's own cache types as llama.cpp reports them (the KV size line); a kvq plan
with protections as llama.cpp's tensors (its rows for every cell, the same size line) plus what
kvc's kvq cells hold beside them while decoding one sequence at that context, itemized in
docs/formats/kvq.md ("Cells"; the same formula as `kvc quant inspect --context`, checked by
50-llama against llama.cpp's report within 16 KiB).
"""
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tools_kl_table import parse  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# a label names a plan when data/kvq-plans/smollm2-135m-<label>.json exists
PLANS = {label: f"data/kvq-plans/smollm2-135m-{label}.json"
         for label in ["k4v4-s4w64", "r3.73-min4-s4w64", "r5.66-kw3-kc-s4w64", "lw3.5-s4w64", "lw4.2-s4w64",
                       "lw5-s4w64", "lw6-s4w64"]}
ORDER = ["q8_0", "q5_0-q4_0", "q4_0", "kvq4", "k4v4-s4w64", "r3.73-min4-s4w64", "lw3.5-s4w64", "lw4.2-s4w64",
         "r5.66-kw3-kc-s4w64", "lw5-s4w64", "lw6-s4w64", "kvq2"]


def packed(d, bits):
    return 2 + d * bits // 8


def side_bytes(plan, n_cells):
    """Bytes kvc's kvq cells hold beside the tensors for one sequence while decoding."""
    h, d, n_layer = plan["n_kv_head"], plan["head_dim"], len(plan["layers"])
    window = (plan["recent_tokens"] + 1) * h * packed(d, plan["recent_bits"]) if plan.get("recent_bits") else 0
    per_tensor = plan["sink_tokens"] * h * d * 2 + window
    centers = 48 + 8 * h * d if plan.get("k_center") else 0
    return n_layer * (2 * per_tensor + centers) + 16 * n_cells


def main(d):
    rows = {}
    for path in sorted(glob.glob(os.path.join(d, "*.log"))):
        name = os.path.basename(path)[:-4]
        text, label = name.split(".", 1)
        rows.setdefault(text, {})[label] = parse(path)
    summary = {"texts": {}, "speed": {}}
    out = []
    for text, r in rows.items():
        f16 = r.get("f16", {})
        full_mib = f16.get("k_mib", 0) + f16.get("v_mib", 0)
        n_ctx = next((x.get("n_ctx") for x in r.values() if x.get("n_ctx")), None)
        out.append(f"### {text} (n_ctx {n_ctx}, {f16.get('chunks', '?')} chunks, f16 PPL {f16.get('ppl_f16', float('nan')):.4f})\n")
        out.append("| cache | bytes held (MiB) | ratio to f16 | KL | ± | PPL(Q)/PPL(f16) | same top % |")
        out.append("|---|---|---|---|---|---|---|")
        summary["texts"][text] = {}
        for label in ORDER:
            x = r.get(label)
            if not x or "kld" not in x:
                continue
            mib = x["k_mib"] + x["v_mib"]
            if label in PLANS:
                # exact: the plan's rows for every cell (the size line rounds to 0.01 MiB) and
                # the cells' bytes beside them
                plan = json.load(open(os.path.join(ROOT, PLANS[label])))
                h, hd = plan["n_kv_head"], plan["head_dim"]
                rows = n_ctx * sum(h * (packed(hd, l["k_bits"]) + packed(hd, l["v_bits"])) for l in plan["layers"])
                mib = (rows + side_bytes(plan, n_ctx)) / 1048576
                full_mib = n_ctx * len(plan["layers"]) * 2 * h * hd * 2 / 1048576
            ratio = full_mib / mib if mib else float("nan")
            out.append(f"| {label} | {mib:.3f} | {ratio:.3f} | {x['kld']:.5f} | {x['kld_pm']:.5f} | "
                       f"{x['ppl_ratio']:.4f} | {x.get('same_top', float('nan')):.2f} |")
            summary["texts"][text][label] = dict(x, held_mib=mib, ratio=ratio)
        out.append("")
    speed = {}
    for path in sorted(glob.glob(os.path.join(d, "speed-*.json"))):
        for s in json.load(open(path)).get("speed", []):
            if s["threads"] == 1:
                # each round of --speed-repeats (interleaved with the other modes), else the row
                speed.setdefault((s["mode"], s["n_ctx"]), []).extend(s.get("tok_s_runs") or [s["tok_s"]])
    if speed:
        ctxs = sorted({c for _, c in speed})
        modes = list(dict.fromkeys(m for m, _ in speed))
        out.append(f"### decode speed, one thread (tok/s, median of {max(len(v) for v in speed.values())} interleaved rounds)\n")
        out.append("| cache | " + " | ".join(f"{c} cells" for c in ctxs) + " |")
        out.append("|---|" + "---|" * len(ctxs))
        for m in modes:
            vals = [speed.get((m, c)) for c in ctxs]
            out.append(f"| {m.replace('data/kvq-plans/smollm2-135m-', '')} | " +
                       " | ".join(f"{statistics.median(v):.1f}" if v else "-" for v in vals) + " |")
            summary["speed"][m] = {str(c): v for c, v in zip(ctxs, vals)}
    json.dump(summary, open(os.path.join(d, "summary.json"), "w"), indent=1)
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
