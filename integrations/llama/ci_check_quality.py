"""50-llama's quality bounds: each mode's PPL and KL against the recorded results.

    ci_check_quality.py check  --isa "$LLAMA_ISA" OUT_DIR [--expected FILE]
    ci_check_quality.py record --isa "$LLAMA_ISA" OUT_DIR [--expected FILE]

OUT_DIR is 50-llama's output directory (.cache/llama/ci): every JSON file in it whose
`texts[].results[]` rows carry a finite `kl` (and mostly a `ppl`) is read, and each row is
named `file / text / mode`. FILE defaults to integrations/llama/ci-expected.json, which holds
the recorded `ppl` and `kl` of every such row per instruction set (the key: `avx512` when
`$LLAMA_ISA` names AVX512F, else `avx2`) and the rule, in its `tolerance` object:

- KL is always bounded: |kl - recorded| <= max(kl_rel x recorded, kl_abs_floor);
- PPL is bounded, |ppl / recorded - 1| <= ppl_rel, for `full` (nothing random in it) and
  for every mode whose recorded PPL is more than ppl_signal (relative) from its text's
  recorded full PPL: a change that is large against the spread of PPL over kvq rotation
  seeds at 320 tokens (5 %, docs/results/kvq-native.md). Smaller changes are a draw of
  the quantization noise, so their PPL is printed, not bounded (their KL is);
- every recorded row must be present, and every row present must be recorded;
- an instruction set without a record of its own is checked against `fallback_isa`'s
  record with the `fallback` tolerances (wider: the arithmetic differs).

`record` writes the current results as the record of this instruction set (keeping the
others and the tolerances): run it after a deliberate change of what the modes compute,
on a machine of that instruction set, and commit the file with the reason.
"""

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_EXPECTED = os.path.join(HERE, "ci-expected.json")


def isa_key(isa_name):
    return "avx512" if "AVX512F" in isa_name.upper() else "avx2"


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def rows_of(out_dir):
    """{file: {text: {mode: {"ppl": x or None, "kl": y}}}} of every row with a finite kl."""
    found = {}
    for name in sorted(os.listdir(out_dir)):
        if not name.endswith(".json"):
            continue
        try:
            res = json.load(open(os.path.join(out_dir, name)))
        except (OSError, ValueError):
            continue
        if not isinstance(res, dict) or not isinstance(res.get("texts"), list):
            continue
        for t in res["texts"]:
            text = os.path.basename(str(t.get("text", "")))
            for r in t.get("results", []):
                ppl, kl = r.get("ppl"), r.get("kl")
                if not finite(kl):
                    continue
                modes = found.setdefault(name, {}).setdefault(text, {})
                if r["mode"] in modes:
                    sys.exit(f"ci_check_quality: {name} / {text}: mode {r['mode']} twice")
                # rows without a perplexity (the share mode: logits of a few decoded tokens)
                # are bounded on KL alone
                modes[r["mode"]] = {"ppl": ppl if finite(ppl) else None, "kl": kl}
    if not found:
        sys.exit(f"ci_check_quality: no result rows with ppl and kl in {out_dir}")
    return found


def check(expected, isa_name, got):
    key = isa_key(isa_name)
    tol = dict(expected["tolerance"])
    record = expected["isa"].get(key)
    if record is None:
        fb = expected["tolerance"]["fallback_isa"]
        record = expected["isa"].get(fb)
        if record is None:
            return [f"no record for {key} nor the fallback {fb}"], []
        tol.update(expected["tolerance"]["fallback"])
        print(f"ci_check_quality: no {key} record; checking against {fb}'s with the fallback "
              f"tolerances (KL {tol['kl_rel']:.0%}, PPL {tol['ppl_rel']:.0%})")
    rec_rows = record["rows"]
    fails, notes = [], []
    for f in sorted(set(rec_rows) | set(got)):
        for text in sorted(set(rec_rows.get(f, {})) | set(got.get(f, {}))):
            rec_modes, got_modes = rec_rows.get(f, {}).get(text, {}), got.get(f, {}).get(text, {})
            full_rec = rec_modes.get("full", {}).get("ppl")
            for mode in sorted(set(rec_modes) | set(got_modes)):
                where = f"{f} / {text} / {mode}"
                if mode not in got_modes:
                    fails.append(f"{where}: recorded, but not in this run")
                    continue
                if mode not in rec_modes:
                    fails.append(f"{where}: not recorded for {key} (record it: ci_check_quality.py record)")
                    continue
                g, r = got_modes[mode], rec_modes[mode]
                kl_bound = max(tol["kl_rel"] * r["kl"], tol["kl_abs_floor"])
                if abs(g["kl"] - r["kl"]) > kl_bound:
                    fails.append(f"{where}: KL {g['kl']:.6g}, recorded {r['kl']:.6g} (bound +-{kl_bound:.3g})")
                if r["ppl"] is None or g["ppl"] is None:
                    if (r["ppl"] is None) != (g["ppl"] is None):
                        fails.append(f"{where}: PPL {g['ppl']}, recorded {r['ppl']}")
                    continue
                signal = full_rec is not None and abs(r["ppl"] / full_rec - 1) > tol["ppl_signal"]
                if mode == "full" or signal:
                    if abs(g["ppl"] / r["ppl"] - 1) > tol["ppl_rel"]:
                        fails.append(f"{where}: PPL {g['ppl']:.6g}, recorded {r['ppl']:.6g} "
                                     f"(bound +-{tol['ppl_rel']:.0%})")
                else:
                    notes.append(f"{f.removesuffix('.json')}/{text.split('.')[0]}/{mode} {g['ppl'] / r['ppl'] - 1:+.1%}")
    return fails, notes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("check", "record"))
    ap.add_argument("out_dir")
    ap.add_argument("--isa", required=True, help="llama.cpp's instruction set ($LLAMA_ISA)")
    ap.add_argument("--expected", default=DEFAULT_EXPECTED)
    a = ap.parse_args()
    got = rows_of(a.out_dir)
    expected = json.load(open(a.expected))
    if a.command == "record":
        expected["isa"][isa_key(a.isa)] = {"llama_isa": a.isa, "rows": got}
        with open(a.expected, "w") as f:
            json.dump(expected, f, indent=1, sort_keys=False)
            f.write("\n")
        n = sum(len(m) for t in got.values() for m in t.values())
        print(f"ci_check_quality: recorded {n} rows as {isa_key(a.isa)} ({a.isa}) in {a.expected}")
        return 0
    fails, notes = check(expected, a.isa, got)
    if notes:
        print(f"ci_check_quality: PPL not bounded (recorded change from full within "
              f"{expected['tolerance']['ppl_signal']:.0%}), this run against the record: " + ", ".join(notes))
    for f in fails:
        print(f"ci_check_quality: FAIL {f}", file=sys.stderr)
    if fails:
        print(f"ci_check_quality: {len(fails)} rows outside the recorded bounds ({a.expected})",
              file=sys.stderr)
        return 1
    n = sum(len(m) for t in got.values() for m in t.values())
    print(f"ci_check_quality: {n} rows within the recorded bounds ({isa_key(a.isa)}, {a.isa})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
