#!/usr/bin/env python3
"""The tables of docs/results/infinilm-eval.md from evaluate.sh's JSON.

usage: infinilm_table.py DIR   (DIR holds textA.json, textB.json, speed.json, check-equal.jsonl)

Per mode: PPL and KL on both texts (against InfiniLM's uncompressed run, whose PPL is the first
row), the rows the cache holds at the end and on average over the decode steps (text A) and that
average against the uncompressed cache's, the bytes the static cache allocates for K and V (at
its full capacity, the run's length), that against the uncompressed cache's f32 bytes and
against the same rows in f16, and the decode speed with the modes interleaved.
"""
import json
import os
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    d = sys.argv[1]
    a, b = load(os.path.join(d, "textA.json")), load(os.path.join(d, "textB.json"))
    speed_path = os.path.join(d, "speed.json")
    speed = {m["name"]: m for m in load(speed_path)["modes"]} if os.path.exists(speed_path) else {}
    mb = {m["name"]: m for m in b["modes"]}
    fa, fb = a["modes"][0], b["modes"][0]
    f16_row = a["bytes_per_token"] // 2  # the same rows in f16
    if a.get("dtype", "f32") != "f32":
        sys.exit("infinilm_table.py: the runs are not of an f32 model")
    print(f"Text A: the first {a['n_tokens']} ids of the GPL-3, text B: of the Debian constitution; "
          f"a {a['prompt']}-token prefill, then one token at a time; PPL and KL over the "
          f"{a['n_tokens'] - a['prompt']} next-token predictions after the prompt; "
          f"{a['threads']} OpenMP thread per run.\n")
    print("| mode | PPL A | KL A | PPL B | KL B | rows held A (end / mean) | rows vs full (mean) "
          "| K+V allocated | vs f32 | vs f16 rows | decode tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in a["modes"]:
        n = m["name"]
        mbn = mb.get(n, {})
        alloc = m["kv_bytes_allocated"]
        tok_s = speed.get(n, {}).get("decode_tok_s_interleaved")
        tok = f"{tok_s:.2f}" if tok_s else "-"
        dppl_a = 100 * (m["ppl"] / fa["ppl"] - 1)
        dppl_b = 100 * (mbn["ppl"] / fb["ppl"] - 1)
        print(f"| {n} | {m['ppl']:.3f} ({dppl_a:+.1f} %) | {m['kl']:.4f} | {mbn['ppl']:.3f} ({dppl_b:+.1f} %) "
              f"| {mbn['kl']:.4f} | {m['tokens_held']} / {m['mean_tokens_held']:.0f} "
              f"| {fa['mean_tokens_held'] / m['mean_tokens_held']:.2f}x | {alloc / 1e6:.2f} MB "
              f"| {fa['kv_bytes_allocated'] / alloc:.2f}x | {fa['kv_bytes_allocated'] / 2 / alloc:.2f}x | {tok} |")
    print(f"\nf16 rows: {f16_row} bytes a token (the uncompressed rows in f16, what llama.cpp and MNN's "
          "comparisons use); the uncompressed cache is f32.")
    eq_path = os.path.join(d, "check-equal.jsonl")
    if os.path.exists(eq_path):
        print("\n| weights | compressed rows | largest difference | relative | equal within 1e-5 |")
        print("|---|---|---|---|---|")
        with open(eq_path) as f:
            for line in f:
                e = json.loads(line)
                c = e["check"]
                print(f"| {e['weights']} | {c['prompt']} -> {c['compressed_len']} | {c['max_abs_diff']:.2e} "
                      f"(of {c['max_abs']:.1f}) | {c['relative']:.2e} | {'yes' if c['equal'] else 'no'} |")


if __name__ == "__main__":
    main()
