#!/usr/bin/env python3
"""llama.cpp's own tools on kvc's patched build, checked the way a llama.cpp user would use them
(scripts/ci.d/55-llama-tools.sh; docs/llama-cpp.md, "llama.cpp's tools"):

- llama-bench -ctk kvq4 -ctv kvq4 prints its table with the kvq types;
- llama-perplexity --kl-divergence against an f16 base on a short text: kvq8, kvq4, a kvq plan
  (--kvc-plan) and llama.cpp's q4_0, each KL bounded and ordered (kvq8 < plan < kvq4), and the
  K/V bytes llama.cpp reports equal to kvq's packed rows for every layer;
- llama-server with -ctk kvq4 -ctv kvq4 and with --kvc-plan answers a chat completion; a
  repeated prompt reuses the cache; a slot saved and restored; generation past the context
  with context shift;
- a layer-weighted version-4 plan at 5:1 (issue 50, data/kvq-plans/smollm2-135m-lw5-s4w64.json):
  loads, its tensors hold its rows, and its KL is below q4_0's with 36 % fewer bytes;
- a plan with protections (f16 sink, 8-bit window, K center through kvc's kvq cells): in
  llama-perplexity's batched prefill under half of kvq4's KL; in llama-server two slots at once,
  a cached prefix reused with the same answer (the host prompt cache on), generation past a
  256-token context with repeated context shifts through kvc, a slot saved (kvc's saved cells inside), erased and restored answering as
  before, and an unprotected slot file refused by name;
- same prompt, same answer (issue 52): the default kvq4 cache answers a 700-word prompt the
  same twice, processing it again (a rollback past --kvc-rollback 0 is refused), and with
  --kvc-rollback 64 reusing it; a multi-turn chat with another chat between its turns (with
  and without the host prompt cache) answers as on a fresh server;
- bad input refused with a message: an unknown kvq width, a plan for another model, a saved
  slot whose kvc type name differs from this build's (another build's ids).

Every check can fail; the first failure ends the run with status 1 and says what it saw.

    ci_tools.py --bin-dir DIR --model GGUF --text TEXT --plan PLAN.json --protect-plan PLAN.json
                --frontier-plan PLAN.json --out DIR
"""
import argparse
import http.client as http_client
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request


# ggml's OpenMP workers spin at barriers by default: on 2 cores shared with anything else a
# 2-thread decode can slow down a hundredfold, so the tools run with passive waiting
os.environ.setdefault("OMP_WAIT_POLICY", "passive")


def fail(msg):
    print(f"ci_tools: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, log, timeout=300, expect_ok=True):
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    text = open(log, errors="replace").read()
    if expect_ok and p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}:\n{text[-3000:]}")
    return p.returncode, text


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(port, path, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


class Server:
    """A llama-server on a free loopback port, killed on exit."""

    def __init__(self, binary, args, log):
        self.port = free_port()
        self.log = log
        self.f = open(log, "w")
        self.p = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(self.port)] + args,
                                  stdout=self.f, stderr=subprocess.STDOUT)

    def __enter__(self):
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.p.poll() is not None:
                fail(f"llama-server exited {self.p.returncode}:\n{open(self.log, errors='replace').read()[-3000:]}")
            try:
                if http(self.port, "/health", timeout=5).get("status") == "ok":
                    return self
            except (urllib.error.URLError, ConnectionError, json.JSONDecodeError, OSError):
                pass
            time.sleep(0.2)
        fail("llama-server did not become healthy in 120 s")

    def __exit__(self, *exc):
        self.p.kill()
        self.p.wait()
        self.f.close()

    def chat(self, content, max_tokens=16, **extra):
        body = {"messages": [{"role": "user", "content": content}], "temperature": 0,
                "max_tokens": max_tokens}
        body.update(extra)
        r = http(self.port, "/v1/chat/completions", body)
        text = r["choices"][0]["message"]["content"]
        if not text or not text.strip():
            fail(f"empty answer to {content!r}: {r}")
        return r


def kv_bytes(log_text):
    """The K and V MiB of the last cache llama.cpp reports in a verbose (-v) log (the tools
    create a context to fit memory first, then the real one)."""
    found = re.findall(r"llama_kv_cache: size = +[0-9.]+ MiB .*?K \([^)]+\): +([0-9.]+) MiB, V \([^)]+\): +([0-9.]+) MiB",
                       log_text)
    if not found:
        return 0.0, 0.0
    return float(found[-1][0]), float(found[-1][1])


def mean_kld(text):
    m = re.search(r"Mean +KLD: +([0-9.]+)", text)
    if not m:
        fail(f"no 'Mean KLD' in llama-perplexity's output:\n{text[-2000:]}")
    return float(m.group(1))


def protect_flags(plan_path):
    """A version-3 plan's protections as llama.cpp's --kvc-* flags."""
    p = json.load(open(plan_path))
    flags = ["--kvc-sink", str(p.get("sink_tokens", 0)), "--kvc-window", str(p.get("recent_tokens", 0)),
             "--kvc-window-bits", str(p.get("recent_bits", 8))]
    return flags + ["--kvc-center", "on" if p.get("k_center") else "off"]


# kvq by bits without the protections llama.cpp's kvq types get by default (the opt-out)
PLAIN = ["--kvc-sink", "0", "--kvc-window", "0", "--kvc-center", "off"]


def offload_checks(a, b, ppl, base, cpu, t):
    rpc_bin = b("ggml-rpc-server")
    if not os.path.exists(rpc_bin):
        fail(f"no {rpc_bin}: the llama.cpp build needs GGML_RPC=ON (fetch-and-build.sh sets it)")
    rport = free_port()
    rlog = open(f"{a.out}/rpc-server.log", "w")
    rpc = subprocess.Popen([rpc_bin, "-H", "127.0.0.1", "-p", str(rport), "-t", a.threads], stdout=rlog,
                           stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while True:
            if rpc.poll() is not None:
                fail(f"ggml-rpc-server exited {rpc.returncode}:\n{open(f'{a.out}/rpc-server.log').read()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", rport), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    fail("ggml-rpc-server did not listen in 30 s")
                time.sleep(0.2)
        off = ["--rpc", f"127.0.0.1:{rport}", "-ngl", "99"]
        _, text = run(ppl + ["-ctk", "kvq4", "-ctv", "kvq4"] + off + ["--kl-divergence-base", base, "--kl-divergence"],
                      f"{a.out}/ppl-rpc.log")
        for want in ("kvq cache types keep K and V in host memory", "offloaded 31/31 layers",
                     "kvc kvq cells on 30 layers"):
            if want not in text:
                fail(f"llama-perplexity -ngl 99 --rpc: the log does not say '{want}'")
        got = {"kld": mean_kld(text)}
        got["k_mib"], got["v_mib"] = kv_bytes(text)
        if abs(got["kld"] - cpu["kld"]) > 0.05 * cpu["kld"] + 1e-4:
            fail(f"kvq4 with every layer on the RPC device: KL {got['kld']}, CPU only {cpu['kld']}")
        if (got["k_mib"], got["v_mib"]) != (cpu["k_mib"], cpu["v_mib"]):
            fail(f"kvq4 cache with layers on the RPC device {got}, CPU only {cpu}")
        slots = os.path.join(os.path.abspath(a.out), "slots-rpc")
        shutil.rmtree(slots, ignore_errors=True)
        os.makedirs(slots)
        srv = ["-m", a.model, "-c", "256", "-np", "1", "--context-shift", "--slot-save-path", slots, "-ctk", "kvq4",
               "-ctv", "kvq4", "-v"] + off + t
        with Server(b("llama-server"), srv, f"{a.out}/server-rpc.log") as s:
            r = http(s.port, "/completion", {"prompt": "Once upon a time", "n_predict": 400, "temperature": 0,
                                             "ignore_eos": True})
            shifts = open(s.log, errors="replace").read().count("slot context shift")
            if r.get("tokens_predicted", 0) < 300 or not r.get("content", "").strip() or shifts < 2:
                fail(f"context shift with layers on the RPC device: {r.get('tokens_predicted')} tokens, {shifts} shifts")
            q = "Name three colours."
            first = s.chat(q, max_tokens=16)["choices"][0]["message"]["content"]
            saved = http(s.port, "/slots/0?action=save", {"filename": "rpc.bin"})
            http(s.port, "/slots/0?action=erase", {})
            restored = http(s.port, "/slots/0?action=restore", {"filename": "rpc.bin"})
            if saved.get("n_saved", 0) <= 0 or restored.get("n_restored") != saved["n_saved"]:
                fail(f"slot save {saved} / restore {restored} with layers on the RPC device")
            again = s.chat(q, max_tokens=16)["choices"][0]["message"]["content"]
            if again != first:
                fail(f"the restored slot answered {again!r}, before {first!r} (layers on the RPC device)")
            if "kvc kvq cells:" in open(s.log, errors="replace").read():
                fail("llama-server with layers on the RPC device logged a kvc kvq cells error")
        got.update({"shift_tokens": r["tokens_predicted"], "shifts": shifts, "answer": first[:40]})
        return got
    finally:
        rpc.kill()
        rpc.wait()
        rlog.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--protect-plan", required=True, help="a version-3 plan with sink, window and K center")
    ap.add_argument("--frontier-plan", required=True,
                    help="a version-4 plan past q4_0's ratio (layer weights from kvq-calibrate.py)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", default="2")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    b = lambda name: os.path.join(a.bin_dir, name)
    t = ["-t", a.threads]
    results = {}

    # ---- llama-bench -----------------------------------------------------------------
    # (the default: the protections; the same flags as the other tools turn them off)
    for name, extra in [("bench", []), ("bench-plain", PLAIN)]:
        cmd = [b("llama-bench"), "-m", a.model, "-ctk", "kvq4", "-ctv", "kvq4", "-p", "32", "-n", "8", "-r", "1",
               "-o", "json", "-v"] + extra + t
        with open(f"{a.out}/{name}.log", "w") as log:  # -v's log apart from the JSON on stdout
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, timeout=300)
        text = open(f"{a.out}/{name}.log", errors="replace").read()
        if p.returncode != 0:
            fail(f"{' '.join(cmd)} exited {p.returncode}:\n{text[-3000:]}")
        rows = json.loads(p.stdout)
        if len(rows) != 2 or any(r["type_k"] != "kvq4" or r["type_v"] != "kvq4" or not r["avg_ts"] > 0 for r in rows):
            fail(f"llama-bench rows: {rows}")
        cells_on = "kvc kvq cells on 30 layers: sink 4 f16, window 64 at 8 bits, K center on" in text
        if cells_on != (name == "bench"):
            fail(f"llama-bench {' '.join(extra) or '(no kvc flags)'}: kvq cells {'on' if cells_on else 'off'}")
        results[name + "_tok_s"] = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}
    for args in (["-ctk", "kvq9"], ["-ctk", "kvq4", "-ctv", "kvq4", "--kvc-window-bits", "9"],
                 ["-ctk", "kvq4", "-ctv", "kvq4", "--kvc-center", "maybe"]):
        rc, text = run([b("llama-bench"), "-m", a.model, "-p", "8", "-n", "0", "-r", "1"] + args,
                       f"{a.out}/bench-bad.log", expect_ok=False)
        if rc == 0:
            fail(f"llama-bench took {' '.join(args)}")

    # ---- llama-perplexity --kl-divergence ---------------------------------------------
    ppl = [b("llama-perplexity"), "-m", a.model, "-f", a.text, "-c", "256", "--chunks", "3", "-v"] + t
    base = f"{a.out}/base.kld"
    _, text = run(ppl + ["--kl-divergence-base", base], f"{a.out}/ppl-f16.log")
    f16_k, f16_v = kv_bytes(text)
    kl = {}
    for name, args in [("kvq8", ["-ctk", "kvq8", "-ctv", "kvq8"] + PLAIN),
                       ("kvq4", ["-ctk", "kvq4", "-ctv", "kvq4"] + PLAIN),
                       # what a user gets with no kvc flag: the protections
                       ("default", ["-ctk", "kvq4", "-ctv", "kvq4"]),
                       ("plan", ["--kvc-plan", a.plan]), ("q4_0", ["-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"]),
                       ("protected", ["--kvc-plan", a.protect_plan]),
                       # issue 50: a layer-weighted plan at 5:1 (2048 cells, everything counted)
                       ("frontier", ["--kvc-plan", a.frontier_plan]),
                       # the same protections as flags on kvq by bits
                       ("flags", ["-ctk", "kvq4", "-ctv", "kvq4"] + protect_flags(a.protect_plan))]:
        _, text = run(ppl + args + ["--kl-divergence-base", base, "--kl-divergence"], f"{a.out}/ppl-{name}.log")
        k, v = kv_bytes(text)
        kl[name] = {"kld": mean_kld(text), "k_mib": k, "v_mib": v, "ratio_vs_f16": (f16_k + f16_v) / (k + v)}
    results["kl"] = kl
    # kvq rows hold 2 + head_dim*bits/8 bytes for head_dim values that f16 holds in 2*head_dim:
    # every layer typed as asked makes the whole cache's ratio exactly that (64: 3.76 at 4 bits)
    for name, bits in [("kvq8", 8), ("kvq4", 4)]:
        want = 128 / (2 + 64 * bits / 8)
        if abs(kl[name]["ratio_vs_f16"] - want) > 0.02 * want:
            fail(f"{name}: cache {kl[name]['k_mib']}+{kl[name]['v_mib']} MiB, ratio {kl[name]['ratio_vs_f16']:.3f} vs f16, want {want:.3f}")
    if not 0 < kl["kvq8"]["kld"] < 0.01:
        fail(f"kvq8 KL {kl['kvq8']['kld']} not in (0, 0.01)")
    if not kl["kvq4"]["kld"] < 0.2:
        fail(f"kvq4 KL {kl['kvq4']['kld']} >= 0.2")
    if not kl["kvq8"]["kld"] < kl["plan"]["kld"] < kl["kvq4"]["kld"]:
        fail(f"KL order kvq8 < plan < kvq4 broken: {kl}")
    # the protected k4v4 plan (f16 sink, 8-bit window, K center) in llama-perplexity's batched
    # prefill: its rows are kvq4's, its KL far below (a window the batch did not read would not be)
    if not kl["protected"]["kld"] < 0.5 * kl["kvq4"]["kld"]:
        fail(f"the protected plan's KL {kl['protected']['kld']} is not below half of kvq4's {kl['kvq4']['kld']}")
    if "kvc kvq cells on 30 layers" not in open(f"{a.out}/ppl-protected.log", errors="replace").read():
        fail("llama-perplexity's log does not say the kvq cells are on")
    # the version-4 plan loads, its tensors hold its rows (5.58:1 before the cells' bytes), and
    # with 36 % fewer bytes than q4_0 it has less KL (docs/results/kvq-frontier.md: 0.030 / 0.074
    # at 2048 tokens; here 256)
    fplan = json.load(open(a.frontier_plan))
    # f16 holds 2 x 64 x 2 bytes of K and V per layer, KV head and token; kvq 4 + 8 x (K + V bits)
    want = 256 * len(fplan["layers"]) / sum(4 + 8 * (l["k_bits"] + l["v_bits"]) for l in fplan["layers"])
    if fplan["version"] != 4 or abs(kl["frontier"]["ratio_vs_f16"] - want) > 0.02 * want:
        fail(f"frontier plan: version {fplan['version']}, tensors at {kl['frontier']['ratio_vs_f16']:.3f}:1, want 4 and {want:.3f}")
    if not kl["frontier"]["kld"] < kl["q4_0"]["kld"]:
        fail(f"the 5:1 plan's KL {kl['frontier']['kld']} is not below q4_0's {kl['q4_0']['kld']}")
    # a k4v4 plan's rows are kvq4's: its protections as flags give the same run, bit for bit
    if (kl["flags"]["kld"], kl["flags"]["k_mib"], kl["flags"]["v_mib"]) != \
            (kl["protected"]["kld"], kl["protected"]["k_mib"], kl["protected"]["v_mib"]):
        fail(f"kvq4 with the plan's protections as flags {kl['flags']} differs from the plan {kl['protected']}")
    # the default is the protected cache: bare -ctk kvq4 -ctv kvq4 runs the k4v4-s4w64 plan bit for bit
    if (kl["default"]["kld"], kl["default"]["k_mib"], kl["default"]["v_mib"]) != \
            (kl["protected"]["kld"], kl["protected"]["k_mib"], kl["protected"]["v_mib"]):
        fail(f"bare -ctk kvq4 -ctv kvq4 {kl['default']} is not the protected plan {kl['protected']}")
    # protections without kvq types, or beside a plan that sets its own, are refused; bad values
    # are refused before the model loads, naming the flag and the range
    for name, args, want in [("flags-f16", ["--kvc-sink", "4"], "need kvq cache types"),
                             ("flags-plan", ["--kvc-plan", a.protect_plan, "--kvc-window", "32"],
                              "the plan sets its own sink"),
                             ("flags-sink-abc", ["-ctk", "kvq4", "--kvc-sink", "abc"],
                              "--kvc-sink takes a whole number in 0..1048576, not 'abc'"),
                             ("flags-bits-9", ["-ctk", "kvq4", "--kvc-window-bits", "9"],
                              "--kvc-window-bits 9 is not in 2..8"),
                             ("flags-center", ["-ctk", "kvq4", "--kvc-center", "yes"],
                              "--kvc-center takes on, off or auto, not 'yes'"),
                             ("flags-center-no-sink", ["-ctk", "kvq4", "-ctv", "kvq4", "--kvc-center", "on",
                                                       "--kvc-sink", "0"],
                              "--kvc-center on needs a sink and a window (--kvc-sink 0 was given)")]:
        rc, text = run(ppl + args, f"{a.out}/ppl-{name}.log", expect_ok=False)
        if rc == 0 or want not in text:
            fail(f"llama-perplexity {' '.join(args)}: status {rc}, want a refusal naming '{want}':\n{text[-1500:]}")
        # a bad value is refused once, before the model loads, with no kvc-internal prefix (the
        # first two are refused by the library at context creation, after it)
        if name.startswith(("flags-sink-", "flags-bits-", "flags-center")) and \
                (text.count(want) != 1 or "tensor 0:" in text or "load_model" in text.replace("load_model_from", "")):
            fail(f"llama-perplexity {' '.join(args)}: the refusal is not said once, before the model loads:\n"
                 f"{text[-1500:]}")
    if not 3.3 < kl["plan"]["ratio_vs_f16"] < 3.8:
        fail(f"plan's cache ratio {kl['plan']['ratio_vs_f16']}")

    # ---- the size users see (issue 52): at the default log level, once per context, the
    # cache's type, cells, bytes at capacity with the kvq cells, the ratio to f16 and the
    # protections; /props says the same
    with Server(b("llama-server"), ["-m", a.model, "-c", "2048", "-np", "1", "-ctk", "kvq4", "-ctv", "kvq4"] + t,
                f"{a.out}/server-size.log") as s:
        props = http(s.port, "/props")
    log = open(f"{a.out}/server-size.log", errors="replace").read()
    lines = [l for l in log.splitlines() if "KV cache kvq4_64, 2048 cells:" in l]
    want = "protections: sink 4 (f16), window 64 at 8 bits, K center on"
    if len(lines) != 1 or want not in lines[0] or "at capacity (tensors" not in lines[0]:
        fail(f"llama-server at the default log level: want one size line with the kvq cells and '{want}', got {lines}")
    kv = props.get("kv_cache") or {}
    if kv.get("n_cells") != 2048 or kv.get("bytes") != kv.get("tensor_bytes", 0) + kv.get("cells_bytes", -1) \
            or not kv.get("cells_bytes") or kv.get("protections", {}).get("window") != 64 \
            or kv.get("summary", "") not in lines[0]:
        fail(f"/props kv_cache: {kv}")
    results["size_line"] = lines[0].split("common_init_: ", 1)[-1]

    # ---- offloaded layers on a device whose memory is not the host's (issue 47) ---------
    # llama.cpp's RPC backend: a ggml-rpc-server on the loopback address is a device of its own
    # (its buffers live in another process); -ngl 99 puts every layer's weights and matmuls
    # there. kvq types keep K and V in host memory (as --no-kv-offload), where kvc's kernels
    # and cells read them: the same KL as the CPU-only run, the same cache bytes, and
    # llama-server answers, shifts its context and saves and restores a slot
    results["offload_rpc"] = offload_checks(a, b, ppl, base, kl["default"], t)

    # ---- llama-server -----------------------------------------------------------------
    slots = os.path.join(os.path.abspath(a.out), "slots")
    shutil.rmtree(slots, ignore_errors=True)
    os.makedirs(slots)
    common = ["-m", a.model, "-c", "1024", "-np", "2", "--slot-save-path", slots, "-v"] + t
    q = "Name three colours."
    with Server(b("llama-server"), common + ["-ctk", "kvq4", "-ctv", "kvq4"] + PLAIN,
                f"{a.out}/server-kvq4.log") as s:
        r1 = s.chat(q, id_slot=0)
        r2 = s.chat(q, id_slot=0)
        cached = r2["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        if cached <= 0:
            fail(f"the repeated prompt reused no cached tokens: {r2['usage']}")
        if r1["choices"][0]["message"]["content"] != r2["choices"][0]["message"]["content"]:
            fail("the same prompt at temperature 0 gave two answers from one slot")
        saved = http(s.port, "/slots/0?action=save", {"filename": "slot0.bin"})
        if saved.get("n_saved", 0) <= 0:
            fail(f"slot save: {saved}")
        http(s.port, "/slots/0?action=erase", {})
        restored = http(s.port, "/slots/0?action=restore", {"filename": "slot0.bin"})
        if restored.get("n_restored") != saved["n_saved"]:
            fail(f"slot restore {restored} after save {saved}")
        r3 = s.chat(q, id_slot=0)
        if r3["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) <= 0:
            fail(f"the restored slot was not reused: {r3['usage']}")
        # a saved state names each kvc type after its id: the same id under another name (a
        # build whose kvc ids differ) is refused, not read as rows of another format
        blob = open(os.path.join(slots, "slot0.bin"), "rb").read()
        n_names = blob.count(b"kvq4_64\0")
        if n_names != 60:  # 30 layers, K and V
            fail(f"the slot file names kvq4_64 {n_names} times, want 60 (30 layers x K, V)")
        open(os.path.join(slots, "slot0-renamed.bin"), "wb").write(blob.replace(b"kvq4_64\0", b"kvq5_64\0", 1))
        try:
            bad = http(s.port, "/slots/0?action=restore", {"filename": "slot0-renamed.bin"})
            fail(f"a slot file whose kvc type name differs was restored: {bad}")
        except urllib.error.HTTPError as e:
            if e.code < 400:
                fail(f"restoring a renamed slot file: HTTP {e.code}")
        if "saved by a build with other kvc type ids" not in open(s.log, errors="replace").read():
            fail("llama-server's log does not say why the renamed slot file was refused")
        results["server_kvq4"] = {"answer": r1["choices"][0]["message"]["content"], "cached_tokens": cached,
                                  "slot_saved_tokens": saved["n_saved"],
                                  "slot_file_bytes": os.path.getsize(os.path.join(slots, "slot0.bin"))}
    k4, v4 = kv_bytes(open(f"{a.out}/server-kvq4.log", errors="replace").read())
    if k4 <= 0 or v4 <= 0:
        fail("llama-server's log reports no kvq4 cache size")
    # context shift: a 256-token context, 400 tokens asked for
    with Server(b("llama-server"), ["-m", a.model, "-c", "256", "-np", "1", "--context-shift", "-ctk", "kvq4",
                                    "-ctv", "kvq4"] + PLAIN + t, f"{a.out}/server-shift.log") as s:
        r = http(s.port, "/completion", {"prompt": "Once upon a time", "n_predict": 400, "temperature": 0,
                                         "ignore_eos": True})
        if r.get("tokens_predicted", 0) < 300 or not r.get("content", "").strip():
            fail(f"context shift: {r.get('tokens_predicted')} tokens predicted")
        results["server_shift_tokens"] = r["tokens_predicted"]
    with Server(b("llama-server"), ["-m", a.model, "-c", "1024", "-np", "1", "--kvc-plan", a.plan] + t,
                f"{a.out}/server-plan.log") as s:
        results["server_plan"] = s.chat(q)["choices"][0]["message"]["content"]
    # a protected plan in llama-server: two slots at once (two sequences, each its own sink,
    # window and center), a repeated prompt reusing its cached prefix with the same answer, the
    # host prompt cache on (its default: it saves and loads sequence states); a slot saved,
    # erased and restored answers as before, and a slot file of the unprotected kvq4 cache
    # (the same kvq4_64 rows, no cells) is refused by name
    prot = ["-m", a.model, "-c", "1024", "-np", "2", "--slot-save-path", slots,
            "--context-shift", "--kvc-plan", a.protect_plan, "-v"] + t
    with Server(b("llama-server"), prot, f"{a.out}/server-protected.log") as s:
        import threading
        answers = {}

        def ask(slot, content):
            answers[slot] = s.chat(content, max_tokens=24, id_slot=slot)

        threads = [threading.Thread(target=ask, args=(i, c))
                   for i, c in enumerate([q, "Write one sentence about the sea."])]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if len(answers) != 2:
            fail(f"two concurrent requests on the protected cache gave {len(answers)} answers")
        first = answers[0]["choices"][0]["message"]["content"]
        again = s.chat(q, max_tokens=24, id_slot=0)
        if again["choices"][0]["message"]["content"] != first:
            fail("the same prompt at temperature 0 gave two answers from one protected slot")
        if again["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) <= 0:
            fail(f"the repeated prompt reused no cached tokens on the protected cache: {again['usage']}")
        saved = http(s.port, "/slots/0?action=save", {"filename": "protected.bin"})
        if saved.get("n_saved", 0) <= 0:
            fail(f"protected slot save: {saved}")
        blob = open(os.path.join(slots, "protected.bin"), "rb").read()
        # the sequence-state version says the cache had kvq cells (LLAMA_KVC_STATE_CELLS), so a
        # reader without them refuses the file by its version, not only by the type names
        magic_version = struct.unpack("<II", blob[:8])
        if magic_version != (0x67677371, 0x4b000003):
            fail(f"the protected slot file starts with (magic, version) {magic_version[0]:08x}, {magic_version[1]:08x}; "
                 "want 67677371, 4b000003")
        plain_version = struct.unpack("<II", open(os.path.join(slots, "slot0.bin"), "rb").read(8))[1]
        if plain_version != 3:
            fail(f"the unprotected slot file has version {plain_version:08x}, want 3 (llama.cpp's own)")
        if blob.count(b"kvq4_64+cells\0") != 60 or blob.count(b"KVCQCELS") != 1:
            fail(f"the protected slot file names kvq4_64+cells {blob.count(b'kvq4_64+cells')} times (want 60) and "
                 f"holds {blob.count(b'KVCQCELS')} saved cells (want 1)")
        http(s.port, "/slots/0?action=erase", {})
        restored = http(s.port, "/slots/0?action=restore", {"filename": "protected.bin"})
        if restored.get("n_restored") != saved["n_saved"]:
            fail(f"protected slot restore {restored} after save {saved}")
        after = s.chat(q, max_tokens=24, id_slot=0)
        if after["choices"][0]["message"]["content"] != first:
            fail("the restored protected slot answered differently")
        if after["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) <= 0:
            fail(f"the restored protected slot was not reused: {after['usage']}")
        try:
            bad = http(s.port, "/slots/1?action=restore", {"filename": "slot0.bin"})
            fail(f"an unprotected kvq4 slot file was restored into the protected cache: {bad}")
        except urllib.error.HTTPError as e:
            if e.code < 400:
                fail(f"restoring an unprotected slot file: HTTP {e.code}")
        log = open(s.log, errors="replace").read()
        for want in ("kvc kvq cells on 30 layers", "was saved from a cache without kvq cells; this context's cache has them"):
            if want not in log:
                fail(f"llama-server's log does not say '{want}'")
        if "kvc kvq cells:" in log.replace("kvc kvq cells: a section", ""):
            fail("llama-server's log holds a kvc kvq cells error: " +
                 next(line for line in log.splitlines() if "kvc kvq cells:" in line))
        results["server_protected_slot"] = {"saved_tokens": saved["n_saved"], "file_bytes": len(blob)}
        results["server_protected"] = {str(k): v["choices"][0]["message"]["content"][:40] for k, v in answers.items()}

    # context shift on the protected cache: every shift ropes the cells' K through kvc (sink,
    # window and main rows) and moves their positions; generation goes on past the context
    with Server(b("llama-server"), ["-m", a.model, "-c", "256", "-np", "1", "--context-shift", "--kvc-plan",
                                    a.protect_plan, "-v"] + t, f"{a.out}/server-protected-shift.log") as s:
        r = http(s.port, "/completion", {"prompt": "Once upon a time", "n_predict": 400, "temperature": 0,
                                         "ignore_eos": True})
        shifts = open(s.log, errors="replace").read().count("slot context shift")
        if r.get("tokens_predicted", 0) < 300 or not r.get("content", "").strip() or shifts < 2:
            fail(f"context shift on the protected cache: {r.get('tokens_predicted')} tokens predicted, "
                 f"{shifts} shifts")
        if "kvc kvq cells:" in open(s.log, errors="replace").read():
            fail("the protected context shift logged a kvc kvq cells error")
        results["server_protected_shift"] = {"tokens": r["tokens_predicted"], "shifts": shifts}

    # a streamed completion cancelled midway through its prompt (the client goes away), then the
    # same request again: the cache keeps the prompt's processed part and serves on (issue 47),
    # and the answer equals a fresh server's. The default kvq4 cache (the protections); the
    # prompt in 32-token batches, so that the cancel lands between them
    long_prompt = " ".join(open(a.text, errors="replace").read().split()[:700])
    dflt = ["-m", a.model, "-c", "2048", "-np", "1", "-b", "32", "-ub", "32", "-ctk", "kvq4", "-ctv", "kvq4",
            "-v"] + t
    req = {"prompt": long_prompt, "n_predict": 24, "temperature": 0, "cache_prompt": True}
    with Server(b("llama-server"), dflt, f"{a.out}/server-cancel.log") as s:
        conn = http_client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/completion", json.dumps(dict(req, stream=True)),
                     {"Content-Type": "application/json"})
        time.sleep(1.0)
        conn.sock.close()  # gone before the prompt is through
        conn.close()
        time.sleep(1.0)
        again = http(s.port, "/completion", req)
        log = open(s.log, errors="replace").read()
        if "kvc kvq cells on 30 layers: sink 4 f16, window 64 at 8 bits, K center on" not in log:
            fail("llama-server with -ctk kvq4 -ctv kvq4 does not say the default protections are on")
        if "kvc kvq cells:" in log:
            fail("the cancelled request logged a kvc kvq cells error: " +
                 next(line for line in log.splitlines() if "kvc kvq cells:" in line))
        cancelled_cached = again.get("tokens_cached", 0)
        timings = again.get("timings", {})
    with Server(b("llama-server"), dflt, f"{a.out}/server-cancel-fresh.log") as s:
        fresh = http(s.port, "/completion", req)
    if again["content"] != fresh["content"] or not fresh["content"].strip():
        fail(f"after a cancelled request the answer {again['content']!r} differs from a fresh server's "
             f"{fresh['content']!r}")
    results["server_cancelled"] = {"answer": again["content"][:60], "prompt_cached_after_cancel":
                                   timings.get("cache_n", cancelled_cached), "prompt_n": timings.get("prompt_n")}

    # ---- same prompt, same answer (issue 52) --------------------------------------------
    # the prompt twice at temperature 0 takes the 24 generated positions back: the default
    # kvq4 cache (--kvc-rollback 0) refuses that, and the server processes the prompt again;
    # with --kvc-rollback 64 the cache takes them back exactly and the prompt is reused. Both
    # answer the same twice. No RAM prompt cache, so that the slot's own cells serve.
    rep = ["-m", a.model, "-c", "4096", "-np", "1", "-ctk", "kvq4", "-ctv", "kvq4", "--cache-ram", "0"] + t
    req = {"prompt": long_prompt, "n_predict": 24, "temperature": 0, "cache_prompt": True}
    repeat = {}
    for label, extra, reused in [("default", [], False), ("rollback-64", ["--kvc-rollback", "64"], True)]:
        with Server(b("llama-server"), rep + extra, f"{a.out}/server-repeat-{label}.log") as s:
            first = http(s.port, "/completion", req, timeout=300)
            second = http(s.port, "/completion", req, timeout=300)
            log = open(s.log, errors="replace").read()
        n_again = second.get("timings", {}).get("prompt_n")
        if first["content"] != second["content"] or not first["content"].strip():
            fail(f"llama-server ({label}) answered the same prompt {first['content']!r}, then {second['content']!r}")
        refused = "cannot take positions" in log
        if reused and (n_again is None or n_again > 2 or refused):
            fail(f"llama-server ({label}) did not reuse the cached prompt: {n_again} tokens processed again")
        if not reused and (n_again is None or n_again < 100 or not refused):
            fail(f"llama-server ({label}) reused the prompt past --kvc-rollback ({n_again} tokens processed, "
                 f"refusal logged: {refused})")
        repeat[label] = {"answer": first["content"][:60], "prompt_n_again": n_again}

    # a multi-turn chat on a fresh server, and on servers that serve another chat between its
    # turns (with the RAM prompt cache, which saves and restores the slot's cells, and without,
    # where the slot's cells are taken back to the shared template start or processed again)
    turns = ["What is the GNU General Public License?", "Who publishes it?", "Can I sell copies of the software?"]
    other = "Write a short poem about the sea, the wind and a lighthouse keeper who counts the waves."

    def converse(extra, label, interleave):
        with Server(b("llama-server"), ["-m", a.model, "-c", "4096", "-np", "1", "-ctk", "kvq4", "-ctv", "kvq4"]
                    + extra + t, f"{a.out}/server-chat-{label}.log") as s:
            msgs, answers = [], []
            for q in turns:
                if interleave:
                    s.chat(other, max_tokens=48)
                msgs.append({"role": "user", "content": q})
                r = http(s.port, "/v1/chat/completions", {"messages": msgs, "temperature": 0, "max_tokens": 40},
                         timeout=300)
                answers.append(r["choices"][0]["message"]["content"])
                msgs.append({"role": "assistant", "content": answers[-1]})
            return answers

    fresh_chat = converse([], "fresh", False)
    for label, extra in [("ram-cache", []), ("no-ram-cache", ["--cache-ram", "0"])]:
        got = converse(extra, label, True)
        if got != fresh_chat:
            fail(f"a multi-turn chat with another chat between its turns ({label}) answered {got!r}, "
                 f"a fresh server {fresh_chat!r}")
    results["server_same_prompt"] = dict(repeat, chat_turns=len(turns), chat_last_answer=fresh_chat[-1][:60])

    # ---- bad input: refused with a message ---------------------------------------------
    bad_plan = f"{a.out}/plan-24-layers.json"
    plan = json.load(open(a.plan))
    plan["layers"] = plan["layers"][:24]
    json.dump(plan, open(bad_plan, "w"))
    for name, args, want in [("kvq9", ["-ctk", "kvq9"], "Unsupported cache type: kvq9"),
                             ("plan-24", ["--kvc-plan", bad_plan], "24 layers")]:
        rc, text = run([b("llama-server"), "-m", a.model, "--port", str(free_port()), "--host", "127.0.0.1"] + args + t,
                       f"{a.out}/server-bad-{name}.log", timeout=120, expect_ok=False)
        if rc == 0 or want not in text:
            fail(f"llama-server {' '.join(args)}: status {rc}, want a refusal naming '{want}':\n{text[-1500:]}")

    # ---- llama-cli knows the kvq types ------------------------------------------------
    _, text = run([b("llama-cli"), "--help"], f"{a.out}/cli-help.log")
    if "kvq2 .. kvq8" not in text or "--kvc-plan" not in text:
        fail("llama-cli --help lists no kvq cache types or no --kvc-plan")

    json.dump(results, open(f"{a.out}/tools.json", "w"), indent=1)
    print("ci_tools: " + json.dumps({"kl": {k: round(v["kld"], 4) for k, v in kl.items()},
                                     "ratio": {k: round(v["ratio_vs_f16"], 3) for k, v in kl.items()},
                                     "server": results["server_kvq4"]["answer"][:60]}))


if __name__ == "__main__":
    main()
