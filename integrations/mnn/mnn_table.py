#!/usr/bin/env python3
"""One markdown table per text from kvc_mnn_eval JSON files (integrations/mnn/evaluate.sh).

Ratios are against f16 bytes per value, as in llama.cpp: MNN keeps a float KV cache in fp32 on
x86, so a float mode's f16 bytes are half its bytes held; a quantized mode (attention_mode % 8
!= 0, or kvc's kvq rows: kvc_kvq_* keys) is counted as held. Every ratio divides the reference's f16 bytes (the same buffer
capacity rule, so MNN's growth slack counts on both sides) by the mode's.
"""
import argparse
import json
import re


def repo_relative(text):
    """Plan paths as the repository names them (the evaluation passes absolute ones)."""
    return re.sub(r"/[^\s\"]*/(data/kvq-plans/)", r"\1", text)


def kl(mode):
    """KL as stored, with the float rounding of an identical run (about -1e-9) shown as 0."""
    return 0.0 if abs(mode["kl"]) < 1e-6 else mode["kl"]


def speed(mode):
    """Decode tok/s: the median of the interleaved rounds when the run had them."""
    r = sorted(mode.get("round_tok_s") or [])
    if not r:
        return mode["tok_s"]
    h = len(r) // 2
    return r[h] if len(r) % 2 else (r[h - 1] + r[h]) / 2


def is_float(mode):
    cfg = json.loads(mode["config"] or "{}")
    if any(k.startswith("kvc_kvq_") for k in cfg) and mode["compression"].startswith("kvc "):
        return False
    return cfg.get("attention_mode", cfg.get("quant_qkv", 8)) % 8 == 0


def shown(mode):
    cfg = json.loads(mode["config"] or "{}")
    cfg.pop("kvc_library", None)
    return repo_relative(json.dumps(cfg, separators=(",", ":")))


def table(path, name, tree="upstream MNN"):
    """PPL, KL and speed against the run's first mode; ratios against the f16 bytes of its
    mode named "full" (MNN's float cache), or of the first mode."""
    run = json.load(open(path))
    modes = run["modes"]
    ref = modes[0]
    full = next((m for m in modes if m["name"] == "full"), ref)
    ref_f16 = full["bytes_held"] / 2
    against = "full" if ref is full else ref["name"]
    rows = [f"### {name}, {tree}: {run['n_tokens']} tokens, PPL over positions {run['ppl_from'] + 1}.."
            f"{run['n_tokens']}, {run['threads']} decode thread" +
            ("" if ref is full else f"; PPL, KL and speed against {against}"), "",
            f"| mode | PPL | vs {against} | KL | KV bytes held | ratio vs f16 | tokens held | decode tok/s | vs {against} |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in modes:
        f16 = m["bytes_held"] / 2 if is_float(m) else m["bytes_held"]
        rows.append(
            f"| {m['name']} | {m['ppl']:.3f} | {m['ppl'] / ref['ppl'] - 1:+.1%} | {kl(m):.4f} | "
            f"{m['bytes_held']:,} | {ref_f16 / f16:.2f} | {m['tokens_held']:,} | {speed(m):.1f} | "
            f"{speed(m) / speed(ref):.2f}x |")
    rows.append("")
    if modes[0].get("round_tok_s"):
        rows.append(f"Decode tok/s: the median of {len(modes[0]['round_tok_s'])} rounds with every mode in turn "
                    "(the order rotating by round), after the quality pass.")
        rows.append("")
    rows.append("Modes (kvc_library left out): " + "; ".join(
        f"{m['name']}: `{shown(m)}` ({repo_relative(m['compression'])})" for m in modes))
    return "\n".join(rows)


def side_by_side(upstream, fork, name):
    """kvc-in-MNN against the fork on the fork's H2O settings, each against its own tree."""
    up = {m["name"]: m for m in json.load(open(upstream))["modes"]}
    fk = {m["name"]: m for m in json.load(open(fork))["modes"]}
    rows = [f"### {name}: kvc in upstream MNN against the fork, each against its own uncompressed run", "",
            "| mode | ratio vs f16 | PPL vs own full | KL vs own full | decode vs own full |",
            "|---|---:|---:|---:|---:|"]
    for label, runs, names in (("upstream", up, ("kvc-h2o", "kvc-h2o-layers25", "kvc-h2o-layers24", "kvc-h2o+kvq",
                                                "kvc-h2o-layers24+kvq", "full-again")),
                               ("fork", fk, ("fork-h2o", "fork-lossless", "fork-combined-full",
                                             "fork-combined-store", "fork-full-again"))):
        ref = runs["full" if label == "upstream" else "fork-full"]
        for n in names:
            if n not in runs:
                continue
            m = runs[n]
            f16 = m["bytes_held"] / 2 if is_float(m) else m["bytes_held"]
            rows.append(f"| {n} | {ref['bytes_held'] / 2 / f16:.2f} | {m['ppl'] / ref['ppl'] - 1:+.1%} | "
                        f"{kl(m):.4f} | {speed(m) / speed(ref):.2f}x |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--text-a", default="text A")
    ap.add_argument("--text-b", default="text B")
    ap.add_argument("--kvq", nargs=2, metavar=("A", "B"),
                    help="the kvq runs with float matmuls (full first), text A and B")
    ap.add_argument("runs", nargs="+", help="upstream A, upstream B[, fork A, fork B]")
    args = ap.parse_args()
    if len(args.runs) not in (2, 4):
        ap.error("give 2 or 4 JSON files")
    names = (args.text_a, args.text_b)
    print("# kvc in MNN, beside MNN's own KV options" + (" and the research fork" if len(args.runs) == 4 else ""))
    print()
    print("Written by `integrations/mnn/evaluate.sh` (SmolLM2-135M-Instruct Q4_1, llama.cpp's token ids, "
          "a prompt then one token at a time); what the numbers mean: `docs/mnn.md`.")
    print()
    for i in range(2):
        if len(args.runs) == 4:
            print(side_by_side(args.runs[i], args.runs[2 + i], names[i]))
            print()
        print(table(args.runs[i], names[i]))
        print()
        if args.kvq:
            print(table(args.kvq[i], names[i], "kvq with MNN's matmuls in float (\"memory\":\"normal\", no KL floor; one pass, not interleaved)"))
            print()
        if len(args.runs) == 4:
            print(table(args.runs[2 + i], names[i], "the fork"))
            print()


if __name__ == "__main__":
    main()
