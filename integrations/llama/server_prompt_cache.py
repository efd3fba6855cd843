#!/usr/bin/env python3
"""llama-server's host prompt cache (`--cache-ram`) through kvc's codecs (`--kvc-prompt-cache`),
against llama.cpp's own cache of raw states at the same budget (issue 51, item 2).

    server_prompt_cache.py --server BIN --model GGUF --texts DIR --out DIR
                           [--cache-ram MIB] [--prompts N] [--prompt-tokens T]
                           [--codec raw-states --codec gear-v2 --codec kvq-k4v4 --codec tc-0.008 ...]
                           [--calibration FILE] [--n-probs K]

For each codec a fresh server (`-np 1`, `--cache-ram MIB`, `-b` and `-ub` the chunk size;
`raw-states` is llama.cpp's own cache)
answers N distinct prompts of T tokens (a document slice and a question), one after another, so
each new prompt moves the previous one out of the slot into the host cache. Then it answers
them again, newest first: a prompt the cache still holds is restored (the response's
`timings.cache_n` counts its tokens), the first one it lost is prefilled, and so is every older
one. "Held" is how many of the N - 1 prompts that left the slot came back from the cache.

The second pass asks each document with another question, so the restored part is the
document and the question is prefilled. Quality: every restored answer is compared with a cold
prefill of the same prompt (asked again with `cache_prompt: false`): the top --n-probs
probabilities of its first token (`n_probs`, before sampling) give KL(cold || restored) over the
cold top tokens. That cold prefill places its cells elsewhere in the cache than the restore
did, and llama.cpp's CPU flash attention sums f16 V in f16 in cell order, so even llama.cpp's own
lossless cache shows a KL here: `raw-states` is that floor. Exactness is checked first, on
each fresh server, where the cold and the restored prompt take the same cells: a cold answer,
then the same prompt after its document went through the cache; a lossless codec (and
llama.cpp's own cache) must give the same answer and distribution.

Writes DIR/server-prompt-cache.json and prints one line per codec. Exit 1 when a lossless codec
restores a different answer or distribution, a server dies, or a codec holds fewer prompts
than llama.cpp's own cache.
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_tiers import SYSTEM, Server  # noqa: E402

LOSSLESS = ("raw-states", "raw", "gear-v1", "gear-v2")


def probs_of(resp):
    """{token id: probability} of the first generated position."""
    cp = resp.get("completion_probabilities") or []
    if not cp:
        raise RuntimeError("the response has no completion_probabilities")
    return {int(t["id"]): math.exp(float(t["logprob"])) for t in cp[0]["top_logprobs"]}


def kl(p, q):
    """KL(p || q) over p's tokens; q's missing tokens get the smallest probability q shows."""
    floor = min(q.values()) if q else 1e-12
    return sum(pi * math.log(pi / max(q.get(t, floor), 1e-12)) for t, pi in p.items() if pi > 0)


def run_codec(args, codec, workdir, doc, sys_toks, questions):
    extra = ["--cache-ram", str(args.cache_ram), "-b", str(args.chunk), "-ub", str(args.chunk)]
    if codec != "raw-states":
        extra += ["--kvc-prompt-cache", codec, "--kvc-tier-chunk", str(args.chunk)]
        if codec.startswith("tc-"):
            extra += ["--kvc-tier-calibration", args.calibration]
    srv = Server(codec, args.server, args.model, workdir, extra)
    try:
        n = args.prompts
        # documents end on a chunk boundary, and every server prefills in batches of one chunk, so
        # that a restored document is followed by the very batches a cold prefill runs
        body_len = (args.prompt_tokens - len(questions[0])) // args.chunk * args.chunk - len(sys_toks)
        docs = [sys_toks + doc[i * body_len:(i + 1) * body_len] for i in range(n)]

        def ask(p, cache_prompt=True):
            return srv.post("/completion", {"prompt": p, "n_predict": args.n_predict, "temperature": 0, "top_k": 1,
                                            "samplers": ["top_k"], "cache_prompt": cache_prompt,
                                            "n_probs": args.n_probs, "post_sampling_probs": False,
                                            "return_tokens": True})

        # exactness, on the fresh server: a cold answer, then the same prompt after its document went
        # through the cache (the slot took another document meanwhile); a lossless codec (and
        # llama.cpp's own cache) gives the cold answer and distribution exactly
        x = docs[-1]
        cold = ask(docs[0] + questions[1], cache_prompt=False)
        ask(docs[0] + questions[0])
        ask(x + questions[0])
        warm = ask(docs[0] + questions[1])
        exact = {"cached_tokens": warm["timings"].get("cache_n", 0), "kl": kl(probs_of(cold), probs_of(warm)),
                 "answer_equal": cold["tokens"] == warm["tokens"]}

        # pass 1: each document with the first question, cold; pass 2, newest first: each with the
        # second question, its document restored when the cache still holds it; pass 3: the held
        # ones again with cache_prompt off, each a cold prefill of the very prompt of pass 2
        first = [ask(d + questions[0]) for d in docs]
        second = {}
        for i in reversed(range(n)):
            second[i] = ask(docs[i] + questions[1])
        rows = []
        held = 0
        for i in range(n - 1):  # the last document never left the slot
            r2 = second[i]
            cached = r2["timings"].get("cache_n", 0)
            hit = cached >= len(docs[i]) // 2
            held += hit
            row = {"prompt": i, "cached_tokens": cached, "hit": hit,
                   "prompt_ms_cold": first[i]["timings"]["prompt_ms"], "prompt_ms_second": r2["timings"]["prompt_ms"]}
            if hit:
                r3 = ask(docs[i] + questions[1], cache_prompt=False)
                row["kl_first_position"] = kl(probs_of(r3), probs_of(r2))
                row["answer_equal"] = r3["tokens"] == r2["tokens"]
            rows.append(row)
        m = srv.metrics()
        hits = [r for r in rows if r["hit"]]
        out = {
            "codec": codec, "cache_ram_mib": args.cache_ram, "prompts": n,
            "held": held, "alive": srv.alive(), "exactness_probe": exact, "prompt_tokens": len(docs[0]) + len(questions[1]),
            "mean_kl_first_position": (sum(r["kl_first_position"] for r in hits) / len(hits)) if hits else None,
            "max_kl_first_position": max((r["kl_first_position"] for r in hits), default=None),
            "answers_equal": sum(1 for r in hits if r["answer_equal"]),
            "mean_prompt_ms_cold": sum(r["prompt_ms_cold"] for r in rows) / len(rows),
            "mean_prompt_ms_restored": (sum(r["prompt_ms_second"] for r in hits) / len(hits)) if hits else None,
            "held_bytes": m.get("kvc_prompt_cache_held_bytes"), "held_chunks": m.get("kvc_prompt_cache_held_chunks"),
            "bytes_published": m.get("kvc_prompt_cache_bytes_published_total"),
            "raw_bytes_published": m.get("kvc_prompt_cache_raw_bytes_published_total"),
            "rows": rows,
        }
        return out
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--texts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache-ram", type=int, default=96, help="MiB (default 96)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--codec", action="append")
    ap.add_argument("--calibration", default="data/tc-calibrations/smollm2-135m.kvctc")
    ap.add_argument("--n-probs", type=int, default=1000)
    ap.add_argument("--n-predict", type=int, default=16)
    args = ap.parse_args()
    codecs = args.codec or ["raw-states", "gear-v2", "kvq-k4v4", "tc-0.008"]
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="kvc-prompt-cache-")
    failures, results = [], []
    try:
        probe = Server("tokenizer", args.server, args.model, workdir, ["--cache-ram", "0"])
        try:
            sys_toks = probe.tokenize(SYSTEM)
            doc = []
            for name in ("gpl-3.txt", "debian-constitution.txt"):
                with open(os.path.join(args.texts, name), encoding="utf-8") as f:
                    doc += probe.tokenize(f.read())
            questions = [probe.tokenize("\n\n" + q + "<|im_end|>\n<|im_start|>assistant\n")
                         for q in ("What is this part about?", "Who does this part apply to?")]
        finally:
            probe.stop()
        need = args.prompts * args.prompt_tokens
        if need > len(doc):
            print(f"server_prompt_cache: {args.prompts} prompts of {args.prompt_tokens} tokens need {need} document "
                  f"tokens; the texts have {len(doc)}", file=sys.stderr)
            return 2
        base_held = None
        for c in codecs:
            r = run_codec(args, c, workdir, doc, sys_toks, questions)
            results.append(r)
            ratio = (r["raw_bytes_published"] / r["bytes_published"]) if r.get("bytes_published") else None
            print(f"server_prompt_cache: {c}: held {r['held']} of {r['prompts'] - 1} prompts in {args.cache_ram} MiB; "
                  f"KL at the first position mean {r['mean_kl_first_position']}, max {r['max_kl_first_position']}; "
                  f"answers equal {r['answers_equal']}/{r['held']}; prefill {r['mean_prompt_ms_cold']:.0f} ms cold, "
                  f"{(r['mean_prompt_ms_restored'] or 0):.0f} ms restored" + (f"; f16/coded {ratio:.2f}" if ratio else ""))
            if not r["alive"]:
                failures.append(f"{c}: the server died")
            if c == "raw-states":
                base_held = r["held"]
            elif base_held is not None and r["held"] < base_held:
                failures.append(f"{c}: held {r['held']} prompts, fewer than llama.cpp's own cache ({base_held})")
            ex = r["exactness_probe"]
            print(f"server_prompt_cache: {c}: exactness probe: {ex['cached_tokens']} tokens from the cache, KL {ex['kl']:.3g}, "
                  f"answer equal {ex['answer_equal']}")
            if ex["cached_tokens"] < r["prompt_tokens"] // 2:
                failures.append(f"{c}: the exactness probe's document did not come from the cache")
            elif c in LOSSLESS and (not ex["answer_equal"] or ex["kl"] != 0):
                failures.append(f"{c}: a lossless codec restored another answer or distribution than a cold prefill")
    except Exception as e:  # noqa: BLE001 - report and fail
        failures.append(f"{type(e).__name__}: {e}")
    with open(os.path.join(args.out, "server-prompt-cache.json"), "w") as f:
        json.dump({"results": results, "failures": failures}, f, indent=1)
    for x in failures:
        print("server_prompt_cache: FAIL: " + x, file=sys.stderr)
    if failures:
        print(f"server_prompt_cache: logs in {workdir}", file=sys.stderr)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
