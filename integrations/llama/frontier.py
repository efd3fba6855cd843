#!/usr/bin/env python3
"""The quality frontier of kvc_llama_eval runs: for each KV ratio bucket, kvc's row with the
lowest KL (mean of the texts) among the rows whose mean ratio reaches the bucket, and for
each of llama.cpp's own cache types, kvc's best row at that type's ratio or above; a plot
of KL and of PPL against the mean ratio.

usage: frontier.py [--md FILE] [--png FILE] [--buckets 2,3.5,5,8] RESULT.json [...]
A row needs both texts: the texts of one file, or of files named alike but for a text tag
(-textA / -textB, -gpl-3 / -debian-constitution). A mode run in several files keeps one row
per file (settings such as --kvq-sink differ between files). The plot needs matplotlib.
"""
import argparse
import json
import os
import re
import sys

LLAMA_TYPES = ("q8_0", "q8_0-q4_0", "q4_0")


def run_label(path):
    stem = os.path.splitext(os.path.basename(path))[0]
    return re.sub(r"-(textA|textB|gpl-3|debian-constitution)$", "", stem)


def load(paths):
    """{(label, mode): {text: (row, full_row)}}"""
    rows = {}
    for p in paths:
        with open(p) as f:
            res = json.load(f)
        label = run_label(p)
        for t in res["texts"]:
            name = os.path.basename(t["text"])
            full = next((r for r in t["results"] if r["mode"] == "full"), None)
            if full is None:
                continue
            for r in t["results"]:
                if r["mode"] == "full" or r.get("ppl") is None or r.get("kv_ratio_mean") is None:
                    continue
                rows.setdefault((label, r["mode"]), {})[name] = (r, full)
    texts = []  # in the order of the first file
    for v in rows.values():
        texts += [n for n in v if n not in texts]
    out = []
    for (label, mode), per in rows.items():
        if sorted(per) != sorted(texts):
            continue
        first = next(iter(per.values()))[0]
        # a plan by its file's name: "kvq-plan:/x/smollm2-135m-r3.5.json" -> "kvq-plan r3.5"
        shown = re.sub(r"(kvq(?:-native)?-plan):(?:.*/)?(?:smollm2-135m-)?([^/]+?)(?:\.json)?$", r"\1 \2", mode)
        if first.get("kvq_sink"):
            shown += f" sink {first['kvq_sink']}"
        if first.get("kvq_recent"):
            shown += f" recent {first['kvq_recent']}"
            if first.get("kvq_recent_bits"):
                shown += f"@{first['kvq_recent_bits']}b"
        if first.get("kvq_center"):
            shown += " K-center"
        out.append({
            "run": label,
            "mode": mode,
            "shown": shown,
            "ratio": sum(r["kv_ratio_mean"] for r, _ in per.values()) / len(per),
            "kl": sum(r["kl"] for r, _ in per.values()) / len(per),
            "texts": {n: {"ppl": r["ppl"], "dppl": 100.0 * (r["ppl"] / f["ppl"] - 1.0), "kl": r["kl"]}
                      for n, (r, f) in per.items()},
        })
    return texts, out


def cells(row, texts):
    return " | ".join(f"{row['texts'][t]['ppl']:.3f} | {row['texts'][t]['dppl']:+.2f} % | {row['texts'][t]['kl']:.4f}"
                      for t in texts)


def table(texts, rows, buckets):
    head = "| | mode (run) | mean ratio | " + " | ".join(f"{t} PPL | vs full | KL" for t in texts) + " |\n"
    head += "|" + " --- |" * (3 + 3 * len(texts)) + "\n"
    md = "kvc's best row per ratio bucket (lowest KL, mean of the texts, among rows at or above the bucket):\n\n" + head
    for b in buckets:
        at = [r for r in rows if r["ratio"] >= b and r["mode"] not in LLAMA_TYPES]
        if not at:
            md += f"| >= {b:g} | (no row) | | " + " | ".join(" | | " for _ in texts) + " |\n"
            continue
        r = min(at, key=lambda r: r["kl"])
        md += f"| >= {b:g} | {r['shown']} ({r['run']}) | {r['ratio']:.2f} | {cells(r, texts)} |\n"
    md += "\nllama.cpp's cache types against kvc's best row (lowest KL) at the same ratio or above:\n\n" + head
    for q in LLAMA_TYPES:
        for lr in [r for r in rows if r["mode"] == q][:1]:
            kv = [r for r in rows if r["mode"] not in LLAMA_TYPES and r["ratio"] >= lr["ratio"]]
            md += f"| llama.cpp | {q} ({lr['run']}) | {lr['ratio']:.2f} | {cells(lr, texts)} |\n"
            if kv:
                b = min(kv, key=lambda r: r["kl"])
                md += f"| kvc | {b['shown']} ({b['run']}) | {b['ratio']:.2f} | {cells(b, texts)} |\n"
    return md


def family(row):
    mode = row["mode"]
    if mode in LLAMA_TYPES:
        return "llama.cpp " + mode
    if mode.startswith("kvq-kc"):
        return "kvq-kc (K per channel)"
    if " K-center" in row["shown"]:
        return "kvq rows + recent window + K center"
    if " recent " in row["shown"]:
        return "kvq rows + recent window"
    if "+kvq" in mode:
        return "eviction + kvq"
    if mode.startswith("kvq-plan") or mode.startswith("kvq-native-plan"):
        return "kvq-plan"
    if mode.startswith("kvq"):
        return "kvq rows"
    return mode.split("@")[0]


def plot(texts, rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(texts), figsize=(6.0 * (1 + len(texts)), 4.8), squeeze=False)
    fams = sorted({family(r) for r in rows})
    colors = plt.get_cmap("tab20").colors
    markers = "os^Dv<>PXd*hp"
    for i, ax in enumerate(axes[0]):
        for j, fam in enumerate(fams):
            pts = sorted((r["ratio"], r["kl"] if i == 0 else r["texts"][texts[i - 1]]["dppl"])
                         for r in rows if family(r) == fam)
            big = fam.startswith("kvq-kc") or fam.startswith("llama.cpp")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[j % len(markers)],
                    color=colors[(2 * j) % 20 if j < 10 else (2 * j + 1) % 20], markersize=7 if big else 5,
                    linestyle="none", label=fam)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("mean KV ratio vs f16 (every scale and f16 token counted)")
        if i == 0:
            ax.set_yscale("log")
            ax.set_ylabel("KL vs full f16, mean of the texts")
            ax.set_title("KL")
        else:
            ax.set_yscale("symlog", linthresh=1.0)
            ax.set_ylabel("PPL vs full f16, %")
            ax.set_title(texts[i - 1])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--md")
    ap.add_argument("--png")
    ap.add_argument("--buckets", default="2,3.5,5,8")
    ap.add_argument("json", nargs="+")
    a = ap.parse_args()
    buckets = [float(b) for b in a.buckets.split(",")]
    texts, rows = load(a.json)
    if not rows:
        sys.stderr.write("frontier.py: no row has every text\n")
        return 2
    md = table(texts, rows, buckets)
    sys.stdout.write(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    if a.png:
        plot(texts, rows, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
