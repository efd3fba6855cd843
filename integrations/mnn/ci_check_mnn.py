#!/usr/bin/env python3
"""CI's kvc-in-MNN check (scripts/ci.d/57-mnn.sh): one short run of kvc_mnn_eval, each
check able to fail.

Modes (a prompt of --ppl-from tokens, then one token at a time up to --n-tokens):
  full       MNN as built, no kvc keys: the reference;
  h2o        kvc's H2O on layers 2.. with the fork's final settings (block 32, sink 16,
             recent 96, lossy ratio 3.5, trigger 384);
  missing    the same keys with a kvc_library that does not exist;
  unknown    a misspelt kvc_* key;
  kvq        kvc's kvq rows as the stored K/V, with --kvq-plan (k4 V4 with an f16 sink of 4,
             a 64-token 8-bit window and K centers: the llama.cpp frontier's rows);
  kvq-keys   that plan with a key it already sets (kvc_kvq_k_bits): refused at load;
  h2o+kvq    both: H2O evicts the kvq cells of layers 2..;
and a second run with MNN's matmuls in float ("memory":"normal"; with the model's "low" MNN
quantizes activations, which puts a KL floor of about 0.03 under any change of attention):
  float      MNN's float cache, the reference;
  kvq-float  the kvq plan.
Checks:
  (token ids: llama.cpp's, from --llama-tokenize, when given: both engines see the same ids;)
  - h2o: the session is kvc's; layers 0-1 hold every token and 2.. fewer, so the tokens
    and bytes held are below full's by at least --min-bytes-ratio; PPL within
    --max-ppl-increase of full and KL at most --max-kl;
  - missing / unknown / kvq-keys: the fallback says why and runs uncompressed: PPL, KL 0,
    tokens and bytes exactly full's;
  - kvq: the session is kvc's kvq; every token held; the bytes (packed rows at capacity and
    everything kvc's cells hold) are below full's f16 bytes (half its fp32 bytes) by at least
    --min-kvq-ratio; PPL within --max-kvq-ppl-increase of full and KL at most --max-kvq-kl;
  - a kvc error mid-run (--fault-shim: a kvc library whose 100th kvc_h2o_end_call fails, on a
    decode step after the prompt): the request ends with MNN's "request stopped by a kvc
    error" naming the call and the message, and the client stops at that position; the same
    for kvq (its 200th kvc_kvq_cells_write fails).
"""
import argparse
import json
import os
import re
import subprocess
import sys

FORK_FINAL = {
    "kvc_h2o_enable": True,
    "kvc_h2o_layer_start": 2,
    "kvc_h2o_block_tokens": 32,
    "kvc_h2o_sink_tokens": 16,
    "kvc_h2o_recent_tokens": 96,
    "kvc_h2o_target_lossy_ratio": 3.5,
    "kvc_h2o_trigger_min_tokens": 384,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--kvc-library", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--gguf")
    ap.add_argument("--llama-tokenize")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-tokens", type=int, default=768)
    ap.add_argument("--ppl-from", type=int, default=385)
    ap.add_argument("--max-ppl-increase", type=float, default=0.10)
    ap.add_argument("--max-kl", type=float, default=0.15)
    ap.add_argument("--min-bytes-ratio", type=float, default=1.35)
    ap.add_argument("--kvq-plan", required=True)
    ap.add_argument("--min-kvq-ratio", type=float, default=2.9)
    ap.add_argument("--max-kvq-ppl-increase", type=float, default=0.03)
    ap.add_argument("--max-kvq-kl", type=float, default=0.05)
    ap.add_argument("--max-kvq-float-kl", type=float, default=0.012)
    ap.add_argument("--fault-shim")
    a = ap.parse_args()

    h2o = dict(FORK_FINAL, kvc_library=a.kvc_library)
    missing = dict(FORK_FINAL, kvc_library=a.out + "/no-such-dir/libkvc.so.0")
    unknown = dict(FORK_FINAL, kvc_library=a.kvc_library, kvc_h2o_sink_token=16)
    kvq = {"kvc_library": a.kvc_library, "kvc_kvq_plan": os.path.abspath(a.kvq_plan)}
    kvq_keys = dict(kvq, kvc_kvq_k_bits=4)
    both = dict(h2o, kvc_kvq_plan=kvq["kvc_kvq_plan"])
    modes = [("full", {}), ("h2o", h2o), ("missing", missing), ("unknown", unknown), ("kvq", kvq),
             ("kvq-keys", kvq_keys), ("h2o+kvq", both)]
    ids_file = None
    if a.llama_tokenize and a.gguf:
        # llama.cpp's ids for both engines (MNN's tokenizer.txt splits runs of spaces
        # differently); how far MNN's own tokenizer agrees is printed, not checked
        tok = subprocess.run([a.llama_tokenize, "-m", a.gguf, "-f", a.text, "--ids", "--log-disable"],
                             capture_output=True, text=True, check=True)
        llama_ids = json.loads(tok.stdout.strip().splitlines()[-1])
        ids_file = a.out + "/llama-ids.txt"
        with open(ids_file, "w") as f:
            f.write(" ".join(map(str, llama_ids)) + "\n")
    source = ["--tokens", ids_file] if ids_file else ["--text", a.text]

    def run_eval(modes, json_out):
        """One kvc_mnn_eval run of `modes` (name, llm_config keys): its results by name."""
        cmd = [a.eval, "--config", a.config, *source, "--n-tokens", str(a.n_tokens),
               "--ppl-from", str(a.ppl_from), "--threads", "1", "--json", json_out]
        for name, cfg in modes:
            cmd += ["--mode", name + "=" + json.dumps(cfg)]
        run = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(run.stdout)
        if run.returncode != 0:
            sys.stderr.write(run.stderr)
            sys.exit("ci_check_mnn: kvc_mnn_eval failed")
        return {m["name"]: m for m in json.load(open(json_out))["modes"]}

    res = run_eval(modes, a.out + "/mnn-check.json")
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    def check_ppl(name, m, bound):
        rel = m["ppl"] / full["ppl"] - 1
        check(rel <= bound, f"{name} PPL {m['ppl']:.4f} within {bound:.0%} of full {full['ppl']:.4f} ({rel:+.2%})")

    if ids_file:
        own = subprocess.run([a.eval, "--config", a.config, "--text", a.text, "--n-tokens", str(a.n_tokens),
                              "--ppl-from", str(a.n_tokens - 1), "--mode", "tokenize={}",
                              "--write-tokens", a.out + "/mnn-ids.txt"], capture_output=True, text=True)
        if own.returncode == 0:
            mnn_ids = [int(x) for x in open(a.out + "/mnn-ids.txt").read().split()]
            agree = next((i for i, (x, y) in enumerate(zip(llama_ids, mnn_ids)) if x != y), len(mnn_ids))
            print(f"info llama.cpp's token ids fed to MNN; MNN's own tokenizer agrees on the first {agree}")
    else:
        print("info no llama-tokenize: MNN's own tokenizer made the ids")

    full, h = res["full"], res["h2o"]
    check(full["compression"] == "off", f"full runs uncompressed ({full['compression']!r})")
    check(h["compression"].startswith("kvc ") and "H2O on layers 2-" in h["compression"],
          f"h2o runs kvc's H2O ({h['compression']!r})")
    check(h["tokens_held"] < full["tokens_held"],
          f"h2o holds fewer tokens: {h['tokens_held']} < {full['tokens_held']}")
    ratio = full["bytes_held"] / h["bytes_held"]
    check(ratio >= a.min_bytes_ratio,
          f"h2o holds {ratio:.3f}x fewer KV bytes than full ({h['bytes_held']} vs {full['bytes_held']}),"
          f" at least {a.min_bytes_ratio}")
    check_ppl("h2o", h, a.max_ppl_increase)
    check(h["kl"] <= a.max_kl, f"h2o KL {h['kl']:.5f} <= {a.max_kl}")
    q = res["kvq"]
    check(q["compression"].startswith("kvc ") and "kvq rows as the stored K/V" in q["compression"],
          f"kvq runs kvc's kvq rows ({q['compression']!r})")
    check(q["tokens_held"] == full["tokens_held"], f"kvq holds every token: {q['tokens_held']}")
    ratio = full["bytes_held"] / 2 / q["bytes_held"]
    check(ratio >= a.min_kvq_ratio,
          f"kvq holds {ratio:.3f}x fewer KV bytes than full's f16 bytes ({q['bytes_held']} vs "
          f"{full['bytes_held'] // 2}), at least {a.min_kvq_ratio}")
    check_ppl("kvq", q, a.max_kvq_ppl_increase)
    check(q["kl"] <= a.max_kvq_kl, f"kvq KL {q['kl']:.5f} <= {a.max_kvq_kl}")
    b = res["h2o+kvq"]
    check("kvq rows as the stored K/V" in b["compression"] and "H2O on layers 2-" in b["compression"],
          f"h2o+kvq runs both ({b['compression']!r})")
    check(b["tokens_held"] == h["tokens_held"] and b["bytes_held"] < min(q["bytes_held"], h["bytes_held"]),
          f"h2o+kvq holds h2o's {h['tokens_held']} tokens ({b['tokens_held']}) in fewer bytes than kvq and h2o "
          f"({b['bytes_held']} vs {q['bytes_held']}, {h['bytes_held']})")
    check_ppl("h2o+kvq", b, a.max_ppl_increase)
    fl = run_eval([("float", {"memory": "normal"}), ("kvq-float", dict(kvq, memory="normal"))],
                  a.out + "/mnn-check-float.json")["kvq-float"]
    check("kvq rows" in fl["compression"] and fl["kl"] <= a.max_kvq_float_kl,
          f"kvq-float KL {fl['kl']:.5f} <= {a.max_kvq_float_kl} against MNN's float run (float matmuls), "
          f"PPL {fl['ppl']:.4f}")
    for name, why in (("missing", "cannot load"), ("unknown", "unknown key 'kvc_h2o_sink_token'"),
                      ("kvq-keys", "kvc_kvq_k_bits comes from the plan")):
        m = res[name]
        check(why in m["compression"] and m["compression"].endswith("running uncompressed"),
              f"{name}: says why and runs uncompressed ({m['compression']!r})")
        same = (m["ppl"] == full["ppl"] and abs(m["kl"]) <= 1e-6 and m["tokens_held"] == full["tokens_held"]
                and m["bytes_held"] == full["bytes_held"])
        check(same, f"{name}: PPL {m['ppl']:.6f}, tokens {m['tokens_held']}, bytes {m['bytes_held']} are full's")
    if a.fault_shim:
        for name, cfg, after, call in (
                ("h2o", dict(FORK_FINAL, kvc_library=a.fault_shim), 100, "kvc_h2o_end_call"),
                ("kvq", dict(kvq, kvc_library=a.fault_shim), 200, "kvc_kvq_cells_write")):
            env = dict(os.environ, KVC_FAULT_REAL=a.kvc_library, KVC_FAULT_AFTER=str(after))
            cmd = [a.eval, "--config", a.config, *source, "--n-tokens", str(a.n_tokens), "--ppl-from",
                   str(a.ppl_from), "--threads", "1", "--mode", "fault=" + json.dumps(cfg)]
            run = subprocess.run(cmd, capture_output=True, text=True, env=env)
            text = run.stdout + run.stderr
            said = f"request stopped by a kvc error: {'' if name == 'h2o' else 'layer '}" in text and \
                f"{call}: KVC_INVALID_STATE: fault injected" in text
            m = re.search(r"forward failed at position (\d+)", text)
            at = int(m.group(1)) if m else -1
            check(run.returncode == 1 and said and at > a.ppl_from - 1,
                  f"{name}: a kvc error mid-run ends the request (exit {run.returncode}, MNN said why: {said}, "
                  f"stopped at position {at}, after the {a.ppl_from}-token prompt)")
    if failures:
        sys.exit(f"ci_check_mnn: {len(failures)} check(s) failed")
    print("ci_check_mnn: every check passed")


if __name__ == "__main__":
    main()
