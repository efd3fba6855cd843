#!/usr/bin/env python3
"""llama-server processes sharing prompt prefixes through kvc's tiers (`--kvc-tier`), measured
with real processes on 127.0.0.1: a `redis-server`, a 3-node Redis Cluster and a shared disk
directory, two llama-server instances on each, and the faults a fleet meets.

    server_tiers.py --server BIN --model GGUF --texts DIR --out DIR
                    [--prefix 2048 --prefix 8192] [--chunk 256] [--codec gear-v2]
                    [--calibration FILE] [--no-cluster] [--no-faults] [--full-disk auto|tmpfs|fsize]

A scenario: instance A answers a prompt (system prompt + a document of --prefix tokens + a
question) cold and publishes its chunks; instance B answers the same document with another
question, restoring the chunks; then B answers that prompt again with `cache_prompt: false`, its
own cold prefill. Time to first token is read from the first streamed token. With a lossless
codec B's restored answer must equal B's cold one token for token.

Faults, each on a document of its own (so nothing is restored from a slot's own cache): Redis
stopped, Redis frozen (SIGSTOP, longer than --kvc-tier-timeout-ms), every chunk in Redis damaged,
every chunk swapped with another (foreign), and a disk tier on a full filesystem (a 1 MiB tmpfs
where mounting is allowed, else a file-size limit, EFBIG). Each must give the cold answer, keep
the server up and show in its /metrics counters.

Then two slots of one server (`-np 2`) restoring at once, and the refusals: a kvq cache serves
without tiers and says why in /props; a tier URL, a tc codec without its calibration and a
chunk size kvc refuses stop the server at start, naming the flag.

Slot files (`--kvc-slot-files CODEC`, each --slot-codec): a server answers a prompt and saves its
slot (`/slots/0?action=save`) as a kv-prefix file; a second server process restores the file
into its slot and answers the same prompt, prefilling only the tokens after the file's last whole
chunk (its `timings.cache_n`). Its answer must equal its own cold answer with a lossless codec.
The file's bytes are set against llama.cpp's own slot file of the same prompt. Faults: a damaged
file and a file of another codec are refused with an error and leave the server answering;
llama.cpp's own slot file still restores; `--kvc-slot-files` without `--slot-save-path` stops the
server at start.

Writes DIR/server-tiers.json and prints one line per scenario. Exit 1 when an answer differs,
a process dies, or a fault is not counted.
"""
import argparse
import concurrent.futures
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_load import free_port  # noqa: E402

SYSTEM = ("<|im_start|>system\nYou are a careful assistant. Answer questions about the document "
          "below in one or two sentences.<|im_end|>\n<|im_start|>user\n")
QUESTIONS = ["What is this document about?", "Who does it apply to?", "Name one obligation it sets.",
             "What does it say about changes?", "Summarise its first part.", "Is anything forbidden?",
             "What happens on a violation?", "Who wrote it?", "What is its purpose?", "List two key terms."]


# ------------------------------------------------------------------------------------------
# Redis: a minimal RESP client (binary values, which redis-cli handles badly)

class Resp:
    def __init__(self, port, timeout=5.0):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.f = self.s.makefile("rb")

    def close(self):
        self.f.close()
        self.s.close()

    def cmd(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        return self._read()

    def _read(self):
        line = self.f.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2]
        if t == b"*":
            return [self._read() for _ in range(int(rest))]
        raise RuntimeError("unexpected RESP reply %r" % line)


def redis_keys(port):
    r = Resp(port)
    try:
        keys, cursor = [], b"0"
        while True:
            cursor, batch = r.cmd("SCAN", cursor, "COUNT", "1000")
            keys += batch
            if cursor == b"0":
                return keys
    finally:
        r.close()


def redis_bytes(port):
    r = Resp(port)
    try:
        return sum(r.cmd("STRLEN", k) for k in redis_keys(port))
    finally:
        r.close()


def start_redis(port, workdir, cluster=False):
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", workdir]
    if cluster:
        args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
    p = subprocess.Popen(args, stdout=open(os.path.join(workdir, f"redis-{port}.log"), "w"), stderr=subprocess.STDOUT)
    for _ in range(100):
        try:
            r = Resp(port)
            r.cmd("PING")
            r.close()
            return p
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server on {port} did not start")


def cluster_port():
    """A free port p whose cluster bus port p + 10000 is free too (Redis needs p <= 55535)."""
    import random
    for _ in range(200):
        p = random.randint(20000, 45000)
        try:
            for q in (p, p + 10000):
                s = socket.socket()
                s.bind(("127.0.0.1", q))
                s.close()
            return p
        except OSError:
            continue
    raise RuntimeError("no free port pair for a Redis Cluster node")


def start_cluster(workdir):
    ports = [cluster_port() for _ in range(3)]
    procs = [start_redis(p, workdir, cluster=True) for p in ports]
    subprocess.run(["redis-cli", "--cluster", "create"] + [f"127.0.0.1:{p}" for p in ports]
                   + ["--cluster-replicas", "0", "--cluster-yes"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60)
    for _ in range(200):
        r = Resp(ports[0])
        info = r.cmd("CLUSTER", "INFO").decode()
        r.close()
        if "cluster_state:ok" in info:
            return ports, procs
        time.sleep(0.05)
    raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")


# ------------------------------------------------------------------------------------------
# llama-server

class Server:
    def __init__(self, name, binary, model, workdir, extra, preexec=None):
        self.name = name
        self.port = free_port()
        self.log = os.path.join(workdir, f"server-{name}.log")
        self.alive_at_stop = None
        slots = os.path.join(workdir, f"slots-{name}")
        os.makedirs(slots, exist_ok=True)
        self.slots = slots
        args = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port), "-c", "8192", "-np", "1",
                "-t", "2", "--metrics", "--no-warmup", "--slot-save-path", slots] + extra
        self.proc = subprocess.Popen(args, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, preexec_fn=preexec)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server {name} exited at start ({self.log})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server {name} did not answer /health ({self.log})")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.alive_at_stop is None:
            self.alive_at_stop = self.alive()
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def post(self, path, body, timeout=900):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)

    def post_status(self, path, body):
        """(HTTP status, JSON body) of a POST, errors included."""
        try:
            return 200, self.post(path, body)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode() or "{}")

    def slot_dir(self):
        return self.slots

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return r.read().decode()

    def erase_slot(self):
        """Empties slot 0, so that a prompt starts from nothing in this process's own cache."""
        self.post("/slots/0?action=erase", {})

    def tokenize(self, text):
        return self.post("/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]

    def metrics(self):
        out = {}
        for line in self.get("/metrics").splitlines():
            if line.startswith("llamacpp:"):
                k, v = line.split(" ", 1)
                out[k[len("llamacpp:"):]] = float(v)
        return out

    def complete(self, tokens, n_predict, cache_prompt=True):
        """Streams a greedy completion; returns (seconds to the first token, tokens, timings)."""
        body = {"prompt": tokens, "n_predict": n_predict, "temperature": 0, "top_k": 1, "stream": True,
                "cache_prompt": cache_prompt, "return_tokens": True, "samplers": ["top_k"]}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.time()
        ttft, out, timings = None, [], {}
        with urllib.request.urlopen(req, timeout=900) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                ev = json.loads(line[6:])
                toks = ev.get("tokens") or []
                if toks and ttft is None:
                    ttft = time.time() - t0
                out += toks
                if ev.get("stop"):
                    timings = ev.get("timings", {})
        return ttft, out, timings


def wait_published(server, before, timeout=120):
    """Waits until the server's kvc worker has written (or skipped, or dropped) one more prompt."""
    deadline = time.time() + timeout
    keys = ("kvc_tier_publishes_total", "kvc_tier_publish_skipped_total", "kvc_tier_publish_dropped_total")
    while time.time() < deadline:
        m = server.metrics()
        if sum(m.get(k, 0) for k in keys) > sum(before.get(k, 0) for k in keys):
            return m
        time.sleep(0.1)
    raise RuntimeError(f"{server.name}: nothing published within {timeout} s")


def delta(after, before, key):
    return after.get(key, 0) - before.get(key, 0)


# ------------------------------------------------------------------------------------------
# the workload

class Workload:
    def __init__(self, args, workdir):
        self.args = args
        self.workdir = workdir
        self.results = []
        self.failures = []
        self.doc_cursor = 0

    def tier_args(self, url):
        a = ["--kvc-tier", url, "--kvc-tier-codec", self.args.codec, "--kvc-tier-chunk", str(self.args.chunk),
             "--kvc-tier-timeout-ms", "300"]
        if self.args.calibration:
            a += ["--kvc-tier-calibration", self.args.calibration]
        return a

    def load_tokens(self, server):
        self.sys = server.tokenize(SYSTEM)
        self.doc = []
        for name in ("gpl-3.txt", "debian-constitution.txt"):
            with open(os.path.join(self.args.texts, name), encoding="utf-8") as f:
                self.doc += server.tokenize(f.read())
        self.questions = [server.tokenize("\n\n" + q + "<|im_end|>\n<|im_start|>assistant\n") for q in QUESTIONS]

    def next_doc(self, n):
        """A document of n tokens that no earlier scenario used (wraps, shifted, when the texts run out)."""
        if self.doc_cursor + n > len(self.doc):
            self.doc_cursor = (self.doc_cursor % 97) + 1
        d = self.doc[self.doc_cursor:self.doc_cursor + n]
        self.doc_cursor += n
        return d

    def fail(self, what):
        print("server_tiers: FAIL: " + what, file=sys.stderr)
        self.failures.append(what)

    def share(self, name, a, b, prefix, qa=0, qb=1, tier=None):
        """A cold and publishing, B restoring, B cold again: one row."""
        doc = self.next_doc(prefix - len(self.sys))
        pa = self.sys + doc + self.questions[qa]
        pb = self.sys + doc + self.questions[qb]
        ma0 = a.metrics()
        ttft_a, toks_a, _ = a.complete(pa, self.args.n_predict)
        ma1 = wait_published(a, ma0)
        rb = redis_bytes(tier) if tier else None
        b.erase_slot()
        mb0 = b.metrics()
        ttft_b, toks_b, tim_b = b.complete(pb, self.args.n_predict)
        mb1 = b.metrics()
        ttft_c, toks_c, tim_c = b.complete(pb, self.args.n_predict, cache_prompt=False)
        mb2 = b.metrics()
        row = {
            "scenario": name, "prompt_tokens": len(pb), "shared_tokens": len(self.sys) + len(doc),
            "a_cold_ttft_s": round(ttft_a, 4),
            "b_restored_ttft_s": round(ttft_b, 4), "b_cold_ttft_s": round(ttft_c, 4),
            "ttft_ratio_cold_over_restored": round(ttft_c / ttft_b, 2),
            "b_prompt_tokens_prefilled": tim_b.get("prompt_n"), "b_cold_prompt_tokens": tim_c.get("prompt_n"),
            "tokens_restored": delta(mb1, mb0, "kvc_tier_tokens_restored_total"),
            "restore_s": round(delta(mb1, mb0, "kvc_tier_restore_seconds_total"), 4),
            "chunks_published": delta(ma1, ma0, "kvc_tier_chunks_published_total"),
            "bytes_published": delta(ma1, ma0, "kvc_tier_bytes_published_total"),
            "raw_f16_bytes_published": delta(ma1, ma0, "kvc_tier_raw_bytes_published_total"),
            "redis_value_bytes": rb,
            "restored_equals_cold": toks_b == toks_c,
            "b_tier_hits": delta(mb1, mb0, "kvc_tier_hits_total"),
            "b_tier_fallbacks": delta(mb2, mb0, "kvc_tier_fallbacks_total"),
        }
        if row["raw_f16_bytes_published"]:
            row["ratio_raw_over_published"] = round(row["raw_f16_bytes_published"] / row["bytes_published"], 3)
        self.results.append(row)
        print(f"server_tiers: {name}: {row['shared_tokens']} shared tokens, restored {row['tokens_restored']:.0f} in "
              f"{row['restore_s'] * 1e3:.0f} ms; TTFT B {ttft_b:.3f} s restored vs {ttft_c:.3f} s cold "
              f"({row['ttft_ratio_cold_over_restored']}x); A cold {ttft_a:.3f} s; same tokens: {row['restored_equals_cold']}")
        if row["tokens_restored"] <= 0:
            self.fail(f"{name}: B restored nothing")
        if self.args.codec in ("gear-v2", "gear-v1", "raw") and toks_b != toks_c:
            self.fail(f"{name}: the restored answer differs from the cold one with a lossless codec")
        return row

    def fault(self, name, a, b, prefix, counter, before_b=None, after_a=None, qa=2, qb=3, publish=True):
        """A publishes a document, `before_b` breaks something, B answers: the cold answer, and the
        fault counted in B's (or A's) metrics."""
        doc = self.next_doc(prefix - len(self.sys))
        pa = self.sys + doc + self.questions[qa]
        pb = self.sys + doc + self.questions[qb]
        ma0 = a.metrics()
        a.complete(pa, self.args.n_predict)
        if publish:
            wait_published(a, ma0)
        ma1 = a.metrics()
        if before_b:
            before_b()
        b.erase_slot()
        mb0 = b.metrics()
        t0 = time.time()
        ttft_b, toks_b, _ = b.complete(pb, self.args.n_predict)
        mb1 = b.metrics()
        if after_a:
            after_a()
        ttft_c, toks_c, _ = b.complete(pb, self.args.n_predict, cache_prompt=False)
        counted = {k: delta(mb1, mb0, k) for k in counter}
        counted_a = {k: delta(ma1, ma0, k) for k in counter}
        row = {"scenario": name, "prompt_tokens": len(pb), "b_ttft_s": round(ttft_b, 4), "b_cold_ttft_s": round(ttft_c, 4),
               "answer_equals_cold": toks_b == toks_c, "counted_b": counted, "counted_a": counted_a,
               "a_alive": a.alive(), "b_alive": b.alive(), "seconds": round(time.time() - t0, 3)}
        self.results.append(row)
        ok = row["answer_equals_cold"] and row["a_alive"] and row["b_alive"] and (
            any(v > 0 for v in counted.values()) or any(v > 0 for v in counted_a.values()))
        print(f"server_tiers: fault {name}: answer equals cold: {row['answer_equals_cold']}; counted B {counted} "
              f"A {counted_a}; TTFT {ttft_b:.3f} s vs cold {ttft_c:.3f} s; {'ok' if ok else 'FAILED'}")
        if not ok:
            self.fail(f"fault {name}: " + json.dumps(row))
        return row


def slot_files(w, args, workdir, servers):
    """Slot files through kvc's codecs: save in one process, restore in another; the faults."""
    n = min(args.prefix or [2048])
    prompt = w.sys + w.next_doc(n - len(w.sys)) + w.questions[6]
    own = Server("slots-own", args.server, args.model, workdir, [])
    servers.append(own)
    own.complete(prompt, 4)
    st, r = own.post_status("/slots/0?action=save", {"filename": "own.bin"})
    own_bytes = r.get("n_written", 0) if st == 200 else 0
    own_tokens = r.get("n_saved", 0) if st == 200 else 0
    own.stop()
    codecs = args.slot_codec or ["gear-v2"]
    files = {}
    for codec in codecs:
        extra = ["--kvc-slot-files", codec, "--kvc-tier-chunk", str(args.chunk)]
        if codec.startswith("tc-"):
            extra += ["--kvc-tier-calibration", args.calibration or ""]
        s1 = Server(f"slots-{codec}-1", args.server, args.model, workdir, extra)
        servers.append(s1)
        _, toks1, _ = s1.complete(prompt, args.n_predict)
        st1, saved = s1.post_status("/slots/0?action=save", {"filename": "slot.bin"})
        s1.stop()
        s2 = Server(f"slots-{codec}-2", args.server, args.model, workdir, extra)
        servers.append(s2)
        src = os.path.join(s1.slot_dir(), "slot.bin")
        files[codec] = (src, extra)
        if st1 == 200:
            shutil.copy(src, os.path.join(s2.slot_dir(), "slot.bin"))
        st2, rest = s2.post_status("/slots/0?action=restore", {"filename": "slot.bin"})
        t0 = time.time()
        ttft_r, toks_r, tim_r = s2.complete(prompt, args.n_predict)
        ttft_c, toks_c, _ = s2.complete(prompt, args.n_predict, cache_prompt=False)
        lossless = codec in ("gear-v2", "gear-v1", "raw")
        row = {"scenario": f"slot file {codec}", "prompt_tokens": len(prompt), "save_status": st1, "restore_status": st2,
               "n_saved": saved.get("n_saved"), "file_bytes": saved.get("n_written"), "llama_file_bytes": own_bytes,
               "save_ms": (saved.get("timings") or {}).get("save_ms"), "n_restored": rest.get("n_restored"),
               "restore_ms": (rest.get("timings") or {}).get("restore_ms"),
               "cache_n_after_restore": tim_r.get("cache_n"), "prefilled_after_restore": tim_r.get("prompt_n"),
               "ttft_restored_s": round(ttft_r, 4), "ttft_cold_s": round(ttft_c, 4),
               "restored_equals_cold": toks_r == toks_c, "same_as_saving_process": toks_r == toks1,
               "seconds": round(time.time() - t0, 3)}
        if own_bytes and own_tokens and row["file_bytes"] and row["n_saved"]:
            # per token held: llama.cpp's file holds every token of the slot, kvc's its whole chunks
            row["llama_bytes_per_token"] = round(own_bytes / own_tokens, 1)
            row["kvc_bytes_per_token"] = round(row["file_bytes"] / row["n_saved"], 1)
            row["llama_over_kvc_bytes"] = round(row["llama_bytes_per_token"] / row["kvc_bytes_per_token"], 3)
        w.results.append(row)
        print(f"server_tiers: slot file {codec}: saved {row['n_saved']} tokens in {row['file_bytes']} B "
              f"({row.get('kvc_bytes_per_token')} B/token; llama.cpp's own file {row.get('llama_bytes_per_token')} B/token, "
              f"{row.get('llama_over_kvc_bytes')}x); restored {row['n_restored']} in "
              f"another process, prefilled {row['prefilled_after_restore']} after it; TTFT {ttft_r:.3f} s vs cold "
              f"{ttft_c:.3f} s; answer equals cold: {row['restored_equals_cold']}")
        whole = len(prompt) // args.chunk * args.chunk
        if st1 != 200 or st2 != 200 or row["n_saved"] != whole or row["n_restored"] != whole:
            w.fail(f"slot file {codec}: " + json.dumps(row))
        elif (row["cache_n_after_restore"] or 0) < whole:
            w.fail(f"slot file {codec}: the restored tokens were not reused: " + json.dumps(row))
        elif lossless and not row["restored_equals_cold"]:
            w.fail(f"slot file {codec}: the restored answer differs from the cold one with a lossless codec")
        s2.stop()

    # faults: a damaged file, a file of another codec, llama.cpp's own file; the server answers on
    codec = codecs[0]
    src, extra = files[codec]
    other = "raw" if codec != "raw" else "gear-v2"
    f = Server("slots-faults", args.server, args.model, workdir, ["--kvc-slot-files", other, "--kvc-tier-chunk", str(args.chunk)])
    servers.append(f)
    good = open(src, "rb").read()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x10
    open(os.path.join(f.slot_dir(), "damaged.bin"), "wb").write(bytes(bad))
    open(os.path.join(f.slot_dir(), "foreign.bin"), "wb").write(good)
    shutil.copy(os.path.join(own.slot_dir(), "own.bin"), os.path.join(f.slot_dir(), "own.bin"))
    for name, want_ok, mention in (("damaged.bin", False, "kvc"), ("foreign.bin", False, "foreign"), ("own.bin", True, None)):
        st, r = f.post_status("/slots/0?action=restore", {"filename": name})
        msg = json.dumps(r)
        _, toks, _ = f.complete(prompt[:64], 4)
        ok = f.alive() and len(toks) > 0 and ((st == 200) if want_ok else (st != 200 and mention in msg))
        w.results.append({"scenario": f"slot file fault {name}", "status": st, "answer": msg[:300], "answered": len(toks),
                          "alive": f.alive()})
        print(f"server_tiers: slot file {name} into a {other} server: HTTP {st}; {msg[:160]}; answered {len(toks)} tokens; "
              f"{'ok' if ok else 'FAILED'}")
        if not ok:
            w.fail(f"slot file fault {name}: HTTP {st} {msg[:300]}")
    r = subprocess.run([args.server, "-m", args.model, "--port", str(free_port()), "-t", "2", "--kvc-slot-files", "gear-v2"],
                       capture_output=True, text=True, timeout=120)
    said = "--slot-save-path" in (r.stdout + r.stderr)
    w.results.append({"scenario": "refused option", "args": ["--kvc-slot-files", "gear-v2"], "exit": r.returncode,
                      "names_the_flag": said})
    print(f"server_tiers: --kvc-slot-files without --slot-save-path: exit {r.returncode}, names --slot-save-path: {said}")
    if r.returncode == 0 or not said:
        w.fail("--kvc-slot-files without --slot-save-path did not stop the server naming --slot-save-path")


def full_filesystem(workdir, how):
    """A directory on a full filesystem: a 1 MiB tmpfs where mounting is allowed (root) and `how`
    is auto or tmpfs, else None (the caller limits the server's file size instead)."""
    d = os.path.join(workdir, "full")
    os.makedirs(d, exist_ok=True)
    if how != "fsize" and os.geteuid() == 0 and shutil.which("mount"):
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d], stderr=subprocess.DEVNULL).returncode == 0:
            return d, "tmpfs of 1 MiB (ENOSPC)"
    return d, None


def file_size_limit():
    # writes past 256 KiB fail with EFBIG (SIGXFSZ ignored, inherited across exec)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--texts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefix", type=int, action="append", help="shared prefix tokens (repeatable; default 2048)")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--codec", default="gear-v2")
    ap.add_argument("--calibration", help="the transform coder's calibration, for --codec tc-<bound>")
    ap.add_argument("--n-predict", type=int, default=24)
    ap.add_argument("--no-cluster", action="store_true")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--slot-codec", action="append",
                    help="slot files through kvc (--kvc-slot-files), per codec (repeatable; default gear-v2)")
    ap.add_argument("--no-slot-files", action="store_true")
    ap.add_argument("--only-slot-files", action="store_true", help="the slot files and their faults, nothing else")
    ap.add_argument("--full-disk", choices=("auto", "tmpfs", "fsize"), default="auto",
                    help="the full disk: a 1 MiB tmpfs where mounting is allowed (auto), or a file-size limit")
    args = ap.parse_args()
    prefixes = args.prefix or [2048]
    os.makedirs(args.out, exist_ok=True)
    for tool in ("redis-server", "redis-cli"):
        if not shutil.which(tool):
            print(f"server_tiers: {tool} not found (apt-get install redis-server)", file=sys.stderr)
            return 2

    workdir = tempfile.mkdtemp(prefix="kvc-server-tiers-")
    procs, servers = [], []
    w = Workload(args, workdir)
    mounted = None
    try:
        if args.only_slot_files:
            t = Server("tokenizer", args.server, args.model, workdir, [])
            servers.append(t)
            w.load_tokens(t)
            t.stop()
            slot_files(w, args, workdir, servers)
            raise SystemExit  # to the report
        # --- one Redis -------------------------------------------------------------------
        rport = free_port()
        redis = start_redis(rport, workdir)
        procs.append(redis)
        url = f"redis://127.0.0.1:{rport}"
        a = Server("a", args.server, args.model, workdir, w.tier_args(url))
        b = Server("b", args.server, args.model, workdir, w.tier_args(url))
        servers += [a, b]
        w.load_tokens(a)
        for n in prefixes:
            w.share(f"redis {n}", a, b, n, tier=rport)

        if not args.no_faults:
            n = min(prefixes)
            ctr = ("kvc_tier_errors_total", "kvc_tier_fallbacks_total", "kvc_tier_corrupt_total", "kvc_tier_foreign_total")

            def stop_redis():
                redis.terminate()
                redis.wait(10)

            w.fault("redis stopped", a, b, n, ctr, before_b=stop_redis)
            redis = start_redis(rport, workdir)
            procs.append(redis)

            def freeze():
                redis.send_signal(signal.SIGSTOP)

            def thaw():
                redis.send_signal(signal.SIGCONT)

            w.fault("redis frozen", a, b, n, ctr, before_b=freeze, after_a=thaw)

            def damage():
                r = Resp(rport)
                for k in redis_keys(rport):
                    size = r.cmd("STRLEN", k)
                    r.cmd("SETRANGE", k, max(0, size // 2), b"\xde\xad\xbe\xef")
                r.close()

            w.fault("chunks damaged", a, b, n, ctr, before_b=damage)

            def swap():
                r = Resp(rport)
                keys = redis_keys(rport)
                vals = [r.cmd("GET", k) for k in keys]
                for k, v in zip(keys, vals[1:] + vals[:1]):
                    r.cmd("SET", k, v)
                r.close()

            w.fault("chunks foreign", a, b, n, ctr, before_b=swap)

        # --- a Redis Cluster ----------------------------------------------------------------
        if not args.no_cluster:
            for s in (a, b):
                s.stop()
            ports, cprocs = start_cluster(workdir)
            procs += cprocs
            curl = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
            a = Server("cluster-a", args.server, args.model, workdir, w.tier_args(curl))
            b = Server("cluster-b", args.server, args.model, workdir, w.tier_args(curl))
            servers += [a, b]
            row = w.share(f"cluster {min(prefixes)}", a, b, min(prefixes))
            row["cluster_value_bytes"] = sum(redis_bytes(p) for p in ports)
            row["cluster_keys_per_node"] = [len(redis_keys(p)) for p in ports]

        # --- a shared directory; a full one -------------------------------------------------------
        for s in (a, b):
            s.stop()
        ddir = os.path.join(workdir, "disk")
        a = Server("disk-a", args.server, args.model, workdir, w.tier_args("disk:" + ddir))
        b = Server("disk-b", args.server, args.model, workdir, w.tier_args("disk:" + ddir))
        servers += [a, b]
        w.share(f"disk {min(prefixes)}", a, b, min(prefixes))
        if not args.no_faults:
            full, how = full_filesystem(workdir, args.full_disk)
            mounted = full if how else None
            pre = None
            if not how:
                how, pre = "file size limit of 256 KiB (EFBIG)", file_size_limit
            d = Server("disk-full", args.server, args.model, workdir, w.tier_args("disk:" + full), preexec=pre)
            servers.append(d)
            # a full disk on the publishing side: D publishes, fails, counts; its answer is a cold one
            w.fault(f"disk full ({how})", d, b, min(prefixes), ("kvc_tier_errors_total", "kvc_tier_publish_dropped_total"),
                    publish=True)

        # --- two slots restoring at once, from the shared directory ----------------------------
        n = min(prefixes)
        docs = [w.sys + w.next_doc(n - len(w.sys)) for _ in range(2)]
        for d in docs:
            m0 = a.metrics()
            a.complete(d + w.questions[4], 8)
            wait_published(a, m0)
        e = Server("two-slots", args.server, args.model, workdir, w.tier_args("disk:" + ddir) + ["-np", "2"])
        servers.append(e)
        m0 = e.metrics()
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            outs = list(ex.map(lambda d: e.complete(d + w.questions[5], 8), docs))
        m1 = e.metrics()
        got = delta(m1, m0, "kvc_tier_tokens_restored_total")
        row = {"scenario": "two slots at once", "tokens_restored": got, "hits": delta(m1, m0, "kvc_tier_hits_total"),
               "answers": [len(o[1]) for o in outs], "alive": e.alive()}
        w.results.append(row)
        print(f"server_tiers: two slots at once: {row['hits']:.0f} restores, {got:.0f} tokens; answers of "
              f"{row['answers']} tokens")
        if row["hits"] < 2 or not all(row["answers"]) or not row["alive"]:
            w.fail("two slots at once: " + json.dumps(row))

        # --- refusals ----------------------------------------------------------------------------
        # a kvq cache: served without tiers, the reason in /props
        k = Server("kvq-refused", args.server, args.model, workdir, w.tier_args("disk:" + ddir) + ["-ctk", "kvq4", "-ctv", "kvq4"])
        servers.append(k)
        props = json.loads(k.get("/props")).get("kvc_tiers") or {}
        _, toks, _ = k.complete(docs[0][:64], 4)
        ok = props.get("enabled") is False and "kvq4" in props.get("reason", "") and len(toks) > 0
        w.results.append({"scenario": "kvq cache refused", "props": props, "answered": len(toks)})
        print(f"server_tiers: a kvq cache: tiers {'off' if props.get('enabled') is False else 'ON'}: "
              f"{props.get('reason')!r}; answered {len(toks)} tokens")
        if not ok:
            w.fail("a kvq cache: not refused with its reason, or no answer: " + json.dumps(props))
        # options kvc refuses stop the server at start, naming the flag
        for bad, flag in ((["--kvc-tier", "foo:bar"], "--kvc-tier"),
                          (["--kvc-tier", "disk:" + ddir, "--kvc-tier-codec", "tc-0.01"], "--kvc-tier-calibration"),
                          (["--kvc-tier", "disk:" + ddir, "--kvc-tier-chunk", "7"], "--kvc-tier-chunk")):
            r = subprocess.run([args.server, "-m", args.model, "--port", str(free_port()), "-t", "2"] + bad,
                               capture_output=True, text=True, timeout=120)
            said = flag in (r.stdout + r.stderr)
            w.results.append({"scenario": "refused option", "args": bad, "exit": r.returncode, "names_the_flag": said})
            print(f"server_tiers: {' '.join(bad)}: exit {r.returncode}, names {flag}: {said}")
            if r.returncode == 0 or not said:
                w.fail(f"{' '.join(bad)}: exit {r.returncode}; the output does not name {flag}")

        # --- slot files through kvc's codecs ------------------------------------------------------
        if not args.no_slot_files:
            slot_files(w, args, workdir, servers)
    except SystemExit:
        pass
    except Exception as e:  # noqa: BLE001 - report and fail
        w.fail(f"{type(e).__name__}: {e}")
    finally:
        for s in servers:
            s.stop()
        alive = {s.name: s.alive_at_stop for s in servers}
        for p in procs:
            try:
                p.send_signal(signal.SIGCONT)
            except OSError:
                pass
            p.terminate()
        if mounted:
            subprocess.run(["umount", mounted], stderr=subprocess.DEVNULL)
        for s in servers:
            if not alive[s.name]:
                w.fail(f"llama-server {s.name} died (log: {s.log})")
    summary = {"codec": args.codec, "chunk_tokens": args.chunk, "rows": w.results, "failures": w.failures,
               "servers_alive_at_end": alive, "logs": workdir}
    with open(os.path.join(args.out, "server-tiers.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if w.failures:
        print(f"server_tiers: {len(w.failures)} failure(s); logs in {workdir}", file=sys.stderr)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
