#!/usr/bin/env python3
"""Table (markdown) and plot (PPL against KV memory ratio) of kvc_llama_eval JSON files.

usage: report.py [--md FILE] [--png FILE] RESULT.json [RESULT.json ...]
The plot needs matplotlib (integrations/llama/evaluate.sh installs it in a venv).
"""
import argparse
import json
import os
import sys


def rows_of(paths):
    """(text, its full row, row, file) for every row; several files of one text (runs of the
    same settings, e.g. evaluate-mlp.sh's baselines and trained rows) share one full row, and
    a second full row of a text is left out when its PPL is the first's (else both stay)."""
    out = []
    full_ppl = {}
    for p in paths:
        with open(p) as f:
            res = json.load(f)
        for t in res["texts"]:
            name = os.path.basename(t["text"])
            full = next((r for r in t["results"] if r["mode"] == "full"), None)
            for r in t["results"]:
                if r["mode"] == "full":
                    if full_ppl.get(name) == r.get("ppl"):
                        continue
                    full_ppl.setdefault(name, r.get("ppl"))
                out.append((name, full, r, res))
    order = list(dict.fromkeys(n for n, _, _, _ in out))
    out.sort(key=lambda x: order.index(x[0]))  # rows of one text together (a stable sort)
    return out


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def table(rows):
    lines = [
        "| text | mode | PPL | vs full | KL | tok/s | KV bytes held (end) | KV ratio end | mean ratio | peak cells | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, full, r, _ in rows:
        if r["mode"] in ("state", "dump", "probe"):
            continue
        d = None
        if full and r.get("ppl") is not None and full.get("ppl"):
            d = 100.0 * (r["ppl"] / full["ppl"] - 1.0)
        lines.append(
            f"| {name} | {r['mode']} | {fmt(r.get('ppl'), '.3f')} | "
            f"{'-' if d is None else format(d, '+.1f') + ' %'} | {fmt(r.get('kl'), '.4f')} | "
            f"{fmt(r.get('tokens_per_s'), '.1f')} | {int(r.get('kv_held_bytes_end') or 0):,} | "
            f"{fmt(r.get('kv_ratio_end'), '.2f')} | {fmt(r.get('kv_ratio_mean'), '.2f')} | "
            f"{r.get('cells_peak', '-')} | {r.get('detail', '')} |"
        )
    states = [(n, r) for n, _, r, _ in rows if r["mode"] == "state"]
    if states:
        lines += ["", "| text | state bytes | kvc codec ratio (whole state) | K/V streams ratio | encode MB/s | decode MB/s | restored logits |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for n, r in states:
            lines.append(
                f"| {n} | {r['state_bytes']:,} | {r['codec_state_ratio']:.3f} | {r['codec_kv_ratio']:.3f} | "
                f"{r['codec_encode_mb_s']:.0f} | {r['codec_decode_mb_s']:.0f} | "
                f"{'identical' if r['codec_logits_differing'] == 0 else 'DIFFER'} |"
            )
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    texts = sorted({n for n, _, _, _ in rows})
    fig, axes = plt.subplots(1, len(texts), figsize=(6.5 * len(texts), 4.8), squeeze=False)
    markers = {"full": "o", "streaming": "s", "kvc-streaming": "^", "h2o": "D", "h2o-fa": "d",
               "c8": "P", "c8-h2o": "X", "q8_0": "v", "q4_0": "<"}
    for ax, text in zip(axes[0], texts):
        fams = {}
        for n, _, r, _ in rows:
            if n != text or r.get("ppl") is None or r.get("kv_ratio_end") is None:
                continue
            fam = r["mode"].split("@")[0]
            fams.setdefault(fam, []).append((r["kv_ratio_end"], r["ppl"]))
        for fam, pts in sorted(fams.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers.get(fam, "o"),
                    linestyle="-" if len(pts) > 1 else "none", label=fam)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("KV memory ratio vs full f16 cache (end of run, whole model)")
        ax.set_ylabel("perplexity (positions 513..2047)")
        ax.set_title(text)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--md")
    ap.add_argument("--png")
    ap.add_argument("json", nargs="+")
    a = ap.parse_args()
    rows = rows_of(a.json)
    md = table(rows)
    sys.stdout.write(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    if a.png:
        plot(rows, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
