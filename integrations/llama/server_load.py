#!/usr/bin/env python3
"""llama-server under load on the loopback address, per cache type (issue 35's goal):
`llama-server -np 4` answers N concurrent requests at temperature 0; nothing may crash and no
answer may be empty; an answer agrees when its first 16 tokens equal those of the same request
served alone (one request at a time, same server). Batching changes the order of float sums,
so f16 disagrees too: compare each type's agreement with f16's, measured the same way.

    server_load.py --server BIN --model GGUF --out DIR [--requests 64] [--parallel 4]
                   [--cache f16 --cache "kvq4" --cache "plan:FILE" ...]

Writes DIR/server-load.json and prints one line per cache type. Exit 1 on a crash, an empty
answer or a failed request.
"""
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

TOPICS = ["the sea", "a library", "winter", "a bicycle", "coffee", "the moon", "a violin", "rain",
          "a garden", "trains", "bread", "a lighthouse", "chess", "mountains", "a clock", "bees"]
STYLES = ["Write one sentence about {}.", "Describe {} in a few words.",
          "Tell me a fact about {}.", "What do people like about {}?"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(port, path, body, timeout=300):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def ask(port, prompt, n):
    body = {"prompt": f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n", "n_predict": n,
            "temperature": 0, "cache_prompt": False, "return_tokens": True}
    r = post(port, "/completion", body)
    return r.get("tokens", []), r.get("content", "")


def run_cache(a, label, args):
    port = free_port()
    log = open(os.path.join(a.out, f"server-load-{label.replace('/', '_').replace(':', '_')}.log"), "w")
    cmd = [a.server, "-m", a.model, "--host", "127.0.0.1", "--port", str(port), "-np", str(a.parallel),
           "-c", str(a.parallel * 512), "-t", str(a.threads)] + args
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while True:
            if p.poll() is not None:
                raise SystemExit(f"server_load: {label}: llama-server exited {p.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if json.loads(r.read().decode()).get("status") == "ok":
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"server_load: {label}: not healthy in 120 s")
            time.sleep(0.2)
        prompts = [STYLES[i % len(STYLES)].format(TOPICS[(i // len(STYLES)) % len(TOPICS)]) for i in range(a.requests)]
        t0 = time.time()
        alone = [ask(port, q, a.tokens) for q in prompts]
        t_alone = time.time() - t0
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.requests) as ex:
            loaded = list(ex.map(lambda q: ask(port, q, a.tokens), prompts))
        t_loaded = time.time() - t0
        if p.poll() is not None:
            raise SystemExit(f"server_load: {label}: llama-server died under load ({p.returncode})")
    finally:
        p.kill()
        p.wait()
        log.close()
    empty = sum(1 for toks, text in alone + loaded if not toks or not text.strip())
    agree = sum(1 for (ta, _), (tl, _) in zip(alone, loaded) if ta[:16] == tl[:16])
    return {"cache": label, "args": args, "requests": a.requests, "parallel": a.parallel,
            "tokens": a.tokens, "empty_answers": empty, "agree_first16": agree,
            "agree_rate": agree / a.requests, "seconds_alone": round(t_alone, 2),
            "seconds_loaded": round(t_loaded, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", action="append", default=[])
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    caches = a.cache or ["f16", "kvq4"]
    rows = []
    for c in caches:
        if c.startswith("plan:"):
            args = ["--kvc-plan", c[5:]]
        elif c == "f16":
            args = []
        else:
            args = ["-ctk", c, "-ctv", c]
        r = run_cache(a, c, args)
        rows.append(r)
        print(f"server_load: {c}: {r['agree_first16']}/{r['requests']} agree on the first 16 tokens, "
              f"{r['empty_answers']} empty, {r['seconds_loaded']} s loaded vs {r['seconds_alone']} s one at a time")
    json.dump(rows, open(os.path.join(a.out, "server-load.json"), "w"), indent=1)
    if any(r["empty_answers"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
