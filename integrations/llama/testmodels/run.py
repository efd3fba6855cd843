#!/usr/bin/env python3
"""Make the random-weight test models and run kvc_arch_test over models x cache types.

Usage: run.py OUT_DIR [--bin PATH] [--types f16,q8_0,...] [--kvq-bits 2,4,8] [--only MODEL,...]
              [--prefill N] [--decode N] [--threads T] [--json FILE]

For each model of make_models.py: f16, q8_0, q4_0 and, for each kvq bit width asked, the kvq
type of the model's head size ("kvq<bits>_<head>") and the head-size-agnostic name ("kvq<bits>")
where this llama.cpp build has them (a name the build does not know is reported "no type", not a
failure: the test looks types up by name), and kvq4 with kvc's kvq cells (--protect: sink,
window, K center; both caches of a sliding-window model) against plain kvq4, before and after a
context shift, and (models without a sliding window) rollbacks of 1 to 500 positions against a
fresh context. Sliding-window models also run q8_0 and kvq4 past the size of their sliding-window
cache (its cells reused). Then the refusals: a kvq type of another head size,
a missing model and an unknown type name must each exit with status 2.

Prints a table (one row per run) and exits 0 only if every run that should pass passed and
every refusal was a refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_models  # noqa: E402


def run_test(binary: str, args: list[str], timeout: float) -> tuple[int, dict | None, str]:
    # ggml's OpenMP workers spin between graph splits by default, and the test's callback splits
    # the graph at every attention and cache write: passive waiting frees the cores meanwhile
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "passive")
    try:
        p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return 124, None, f"timed out after {timeout:.0f} s"
    out = None
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            try:
                out = json.loads(line)
            except json.JSONDecodeError:
                pass
    err = p.stderr.strip().splitlines()
    return p.returncode, out, (err[-1] if err else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--bin", default=os.environ.get("KVC_ARCH_TEST", "kvc_arch_test"))
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--kvq-bits", default="2,4,8")
    ap.add_argument("--only", default="")
    ap.add_argument("--prefill", type=int, default=96)
    ap.add_argument("--decode", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", default="", help="write every run's JSON here (a list)")
    a = ap.parse_args()

    t0 = time.time()
    only = [n for n in a.only.split(",") if n]
    specs = [s for s in make_models.SPECS if not only or s.name in only]
    if only and len(specs) != len(only):
        ap.error(f"unknown model in --only; known: {', '.join(s.name for s in make_models.SPECS)}")
    os.makedirs(a.out_dir, exist_ok=True)
    for s in specs:
        make_models.write_model(s, os.path.join(a.out_dir, s.name + ".gguf"))
    t_models = time.time() - t0

    common = ["--prefill", str(a.prefill), "--decode", str(a.decode), "--threads", str(a.threads)]
    rows, results, bad = [], [], 0
    bits = [int(b) for b in a.kvq_bits.split(",") if b]
    for s in specs:
        path = os.path.join(a.out_dir, s.name + ".gguf")
        types = [t for t in a.types.split(",") if t]
        for b in bits:
            types += [f"kvq{b}_{s.head_k}", f"kvq{b}"]
        runs = [(t, common, t) for t in types]
        if s.swa:
            # past the sliding-window cache's cells (window + ubatch, padded to 256: 256 here):
            # 224 + 48 tokens reuse its cells, and every cell the mask leaves live must still
            # hold the right row
            long = ["--prefill", "224", "--decode", "48", "--threads", str(a.threads)]
            runs += [(t, long, f"{t} (224+48)") for t in ("q8_0", f"kvq4_{s.head_k}")]
        for t, args_t, label in runs:
            rc, j, err = run_test(a.bin, ["--model", path, "--type", t] + args_t, a.timeout)
            if j is not None:
                results.append(j)
                L = j["layers"]
                mx = lambda k: max((l[k] for l in L if l[k] is not None), default=float("nan"))  # noqa: E731
                mn = lambda k: min((l[k] for l in L if l[k] is not None), default=float("nan"))  # noqa: E731
                ok = rc == 0 and j["pass"]
                # grouped-query attention over kvq K and V (2..16 query heads per KV head, head
                # sizes up to 256, 256 included) takes the CPU kernel's grouped path in every
                # attention op, and one query head per KV head never does
                kvq_kv = all(l["type_k"].startswith("kvq") and l["type_v"].startswith("kvq") for l in L)
                g = j["n_head"] // max(1, j["n_head_kv"])
                want_grouped = kvq_kv and 1 < g <= 16 and max(j["head_k"], j["head_v"]) <= 256
                grouped_ok = j["fattn_ops"] > 0 and (j["fattn_grouped"] == (j["fattn_ops"] if want_grouped else 0))
                if not grouped_ok:
                    ok = False
                    j["failures"].append(f"grouped-query path in {j['fattn_grouped']} of {j['fattn_ops']} attention ops "
                                         f"(want {'all' if want_grouped else 'none'})")
                elif want_grouped:
                    j["failures"].insert(0, f"grouped-query path: {j['fattn_grouped']}/{j['fattn_ops']} ops")
                bad += not ok
                api = j["cache_bytes_api"]
                rows.append([s.name, label, "pass" if ok else "FAIL",
                             f"{j['kl_vs_f16_run']:.2e}",
                             f"{mx('row_rel_err_k'):.4f}/{mx('row_rel_err_v'):.4f}",
                             f"{mx('attn_rel_err'):.4f}",
                             f"{mx('bound_excess'):.3f}",
                             f"{mx('kernel_excess'):.1e}",
                             f"{mn('ctrl_wrong_head'):.1f}/{mn('ctrl_wrong_head_size'):.1f}",
                             f"{j['layer_bytes_k']}/{j['f16_bytes_k']}",
                             "yes" if api is not None else "no (null)",
                             "identical" if j["state_logits_bit_identical"]
                             else ("same rows, other cells" if j["checks"]["state"] else j["state"][:80]),
                             ("fallback: " + "/".join(sorted({l["type_k"] + "," + l["type_v"] for l in L})) + "; "
                              if j.get("type_fallback") else "") + "; ".join(j["failures"])[:200]])
            elif rc == 2 and "unknown cache type name" in err:
                rows.append([s.name, label, "no type", "", "", "", "", "", "", "", "", "", "this build has no type of that name"])
            else:
                bad += 1
                what = f"signal {-rc}" if rc < 0 else f"exit {rc}"
                rows.append([s.name, label, "FAIL", "", "", "", "", "", "", "", "", "", f"{what}: {err}"[:300]])
        # kvc's kvq cells (f16 sink 4, 8-bit window 32, K center) on kvq4, every cache of the
        # model through them (both of a sliding-window model's): below plain kvq4's KL before and
        # after a context shift (K roped through the cells), the state round trip, bytes beside,
        # batches stopped by the abort callback, or by a kvc call failing inside the graph, then
        # decoded on with a fresh context's logits
        # (a sliding-window model also past its sliding-window cache's cells, reused as a ring)
        prot_runs = [(common, "kvq4 + cells")]
        if s.swa:
            prot_runs.append((["--prefill", "224", "--decode", "48", "--threads", str(a.threads)], "kvq4 + cells (224+48)"))
        for args_p, label in prot_runs if s.head_k in (64, 128, 256) and s.head_k == s.head_v else []:
            rc, j, err = run_test(a.bin, ["--model", path, "--type", "kvq4", "--protect", "4,32,8,1"] + args_p, a.timeout)
            ok = rc == 0 and j is not None and j["pass"]
            bad += not ok
            note = (f"KL plain {j['kl_plain']:.2e} protected {j['kl_protected']:.2e}; after a shift "
                    f"{j['kl_plain_after_shift']:.2e} / {j['kl_protected_after_shift']:.2e}; bytes "
                    f"{j['kv_bytes_plain']} / {j['kv_bytes_protected']} (stated {j['kv_bytes_stated_protected']}); interrupted batches: "
                    f"{j['aborted_batches']}; failed kvc write / read: {j['kvc_write_fault']} / "
                    f"{j['kvc_read_fault']}; rollbacks: {j['rollbacks']} ({j['rollbacks_tried']}); "
                    + "; ".join(j["failures"])) if j else err
            rows.append([s.name, label, "pass" if ok else "FAIL",
                         f"{j['kl_protected']:.2e}" if j else "", "", "", "", "", "", "", "",
                         j["state"][:80] if j else "", note[:400]])
        # a kvq type of another head size must be refused (exit 2) with llama.cpp's reason
        other = 64 if s.head_k != 64 else 128
        t = f"kvq4_{other}"
        rc, j, err = run_test(a.bin, ["--model", path, "--type", t] + common, a.timeout)
        ok = rc == 2 and j is None and ("head size" in err or "unknown cache type name" in err)
        bad += not ok
        rows.append([s.name, t, "refused" if ok else "FAIL", "", "", "", "", "", "", "", "", "", err[:200]])

    # bad input: a missing model, an unknown type name
    for args, label in ((["--model", os.path.join(a.out_dir, "no-such-model.gguf"), "--type", "f16"], "missing model"),
                        (["--model", os.path.join(a.out_dir, specs[0].name + ".gguf"), "--type", "no_such_type"],
                         "unknown type")):
        rc, j, err = run_test(a.bin, args, a.timeout)
        ok = rc == 2 and j is None and err != ""
        bad += not ok
        rows.append(["(bad input)", label, "refused" if ok else "FAIL", "", "", "", "", "", "", "", "", "", err[:200]])

    head = ["model", "type", "result", "KL vs f16", "row err K/V", "attn rel err", "bound exc", "kernel exc",
            "ctrl head/size", "K bytes/f16", "bytes API", "state", "notes"]
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    widths[-1] = min(widths[-1], 120)
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print(f"\n{len(rows)} rows, {bad} failed; models made in {t_models:.1f} s, all in {time.time() - t0:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
