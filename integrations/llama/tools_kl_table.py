#!/usr/bin/env python3
"""The table of integrations/llama/tools-eval.sh's runs: per text and cache, llama-perplexity's
mean KL against the f16 base, PPL(Q)/PPL(base), same-top-token rate, and the K+V bytes
llama.cpp reported for the cache it allocated, as a ratio against f16.

    tools_kl_table.py DIR                (markdown on stdout, DIR/summary.json)
    tools_kl_table.py --vs-client DIR    (tools-vs-client.sh: llama-perplexity's chunk 1 against
                                          kvc_llama_eval on the same targets, DIR/vs-client.json)
"""
import glob
import json
import os
import re
import sys


def last(pattern, text):
    found = re.findall(pattern, text)
    return found[-1] if found else None


def parse(path):
    t = open(path, errors="replace").read()
    kv = last(r"llama_kv_cache: size = +[0-9.]+ MiB .*?K \(([^)]+)\): +([0-9.]+) MiB, V \(([^)]+)\): +([0-9.]+) MiB", t)
    row = {"k_type": kv[0], "k_mib": float(kv[1]), "v_type": kv[2], "v_mib": float(kv[3])} if kv else {}
    for key, pat in [("kld", r"Mean +KLD: +([0-9.]+) ± +([0-9.]+)"),
                     ("ppl_ratio", r"Mean PPL\(Q\)/PPL\(base\) +: +([0-9.]+) ± +([0-9.]+)"),
                     ("same_top", r"Same top p: +([0-9.]+) ± +([0-9.]+) %"),
                     ("ppl", r"Mean PPL\(Q\) +: +([0-9.]+) ± +([0-9.]+)"),
                     ("ppl_f16", r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")]:
        m = last(pat, t)
        if m:
            row[key] = float(m[0])
            row[key + "_pm"] = float(m[1])
    chunks = last(r"over (\d+) chunks, n_ctx=(\d+)", t)
    if chunks:
        row["chunks"], row["n_ctx"] = int(chunks[0]), int(chunks[1])
    return row


def chunk1_kl(path):
    """KL of llama-perplexity's first chunk alone (its per-chunk rows are running means)."""
    for line in open(path, errors="replace"):
        m = re.match(r"^ +1 +([0-9.]+) ± +[0-9.]+ +-?[0-9.]+ ± +[0-9.]+ +([0-9.]+) ± +([0-9.]+)", line)
        if m:
            return float(m.group(2)), float(m.group(3)), float(m.group(1))
    return None


def vs_client(d):
    import statistics
    rows = {}
    print("| text | cache | llama-perplexity chunk 1: KL, PPL | client, same targets: KL, PPL | client fake-quant k4v4 KL over 6 rotation seeds (min .. max, sd) |")
    print("|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(d, "client-*.json"))):
        text = os.path.basename(path)[len("client-"):-len(".json")]
        res = {r["mode"]: r for r in json.load(open(path))["texts"][0]["results"]}
        seeds = [r["kl"] for m, r in res.items() if m == "kvq:k4v4" or m.startswith("kvq:k4v4:s")]
        spread = {"min": min(seeds), "max": max(seeds), "sd": statistics.stdev(seeds), "n": len(seeds)}
        for label, mode in [("kvq4", "kvq-native:k4v4"), ("plan-r3.5-kw3", next(m for m in res if m.startswith("kvq-native-plan:")))]:
            tool = chunk1_kl(os.path.join(d, f"{text}.{label}.log"))
            rows.setdefault(text, {})[label] = {"tool_chunk1_kl": tool[0] if tool else None,
                                                "tool_chunk1_kl_pm": tool[1] if tool else None,
                                                "tool_chunk1_ppl": tool[2] if tool else None,
                                                "client_kl": res[mode]["kl"], "client_ppl": res[mode]["ppl"],
                                                "client_n_scored": res[mode].get("n_scored")}
            spread_txt = f"{spread['min']:.4f} .. {spread['max']:.4f}, sd {spread['sd']:.4f}" if label == "kvq4" else "(k4v4 only)"
            print(f"| {text} | {label} | {tool[0]:.4f} ± {tool[1]:.4f}, {tool[2]:.4f} | {res[mode]['kl']:.4f}, "
                  f"{res[mode]['ppl']:.4f} | {spread_txt} |")
        rows[text]["k4v4_seed_spread"] = spread
    json.dump(rows, open(os.path.join(d, "vs-client.json"), "w"), indent=1, sort_keys=True)


def main():
    if sys.argv[1] == "--vs-client":
        vs_client(sys.argv[2])
        return
    d = sys.argv[1]
    texts = {}
    for path in sorted(glob.glob(os.path.join(d, "*.log"))):
        if os.path.basename(path).startswith("client-"):
            continue
        text, label = os.path.basename(path)[:-4].split(".", 1)
        texts.setdefault(text, {})[label] = parse(path)
    json.dump(texts, open(os.path.join(d, "summary.json"), "w"), indent=1, sort_keys=True)
    for text, rows in texts.items():
        f16 = rows.get("f16", {})
        base = f16.get("k_mib", 0) + f16.get("v_mib", 0)
        print(f"\n### {text} ({f16.get('chunks', '?')} chunks of {f16.get('n_ctx', '?')} tokens, "
              f"f16 PPL {f16.get('ppl_f16', float('nan')):.4f})\n")
        print("| cache | K / V type (a plan's: layer 0's) | K+V bytes vs f16 | mean KL | PPL(Q)/PPL(f16) | same top token |")
        print("|---|---|---|---|---|---|")
        order = sorted((r for r in rows.items() if r[0] != "f16"), key=lambda r: -(r[1].get("k_mib", 0) + r[1].get("v_mib", 0)))
        for label, r in order:
            held = r.get("k_mib", 0) + r.get("v_mib", 0)
            ratio = f"1/{base / held:.2f}" if held else "?"
            print(f"| {label} | {r.get('k_type', '?')} / {r.get('v_type', '?')} | {ratio} | "
                  f"{r.get('kld', float('nan')):.4f} ± {r.get('kld_pm', float('nan')):.4f} | "
                  f"{r.get('ppl_ratio', float('nan')):.4f} ± {r.get('ppl_ratio_pm', float('nan')):.4f} | "
                  f"{r.get('same_top', float('nan')):.2f} % |")


if __name__ == "__main__":
    main()
