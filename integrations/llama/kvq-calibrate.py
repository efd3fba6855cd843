#!/usr/bin/env python3
"""A calibrated kvq plan for your own model, in one command: a GGUF and a text file in, a plan
that llama.cpp's `--kvc-plan` reads out (issue 50).

    integrations/llama/kvq-calibrate.py --model MODEL.gguf --text CALIBRATION.txt \\
        --held-ratio 5 --context 2048 --out plan.json

What it runs (all from this repository: kvc's llama.cpp build and the `kvc` command):

1. **Dump.** `kvc_llama_eval --modes dump` runs the model on the first `--dump-tokens` tokens
   of the text and writes each layer's K, V and Q.
2. **Layer-local errors.** `kvc quant plan --json` measures, per layer and per width 2..8, the
   attention-output error of kvq's packed rows (K coded against the window's center, as the
   cells code it).
3. **Probes in the engine.** One `llama-perplexity --kl-divergence` run per layer on the same
   text, with a plan that codes that layer at 2 bits (K and V) and every other layer at 8, the
   protections on, against an f16 base; plus one run with every layer at 8. A layer's
   sensitivity is `(KL_l - KL_8) / (k_weight * K_err_l(2) + V_err_l(2))`: how much the model's
   output moves per unit of that layer's local error. Sensitivities below a twentieth of the
   median (a change lost in the run's noise) are raised to it; the weights are the
   sensitivities to the power `--power` (0.5), over their mean, as the transform coder's
   probes weigh layers (integrations/llama/tc-sensitivity.py says why a power below 1).
4. **Plan.** `kvc quant plan --layer-weights` allocates bits per layer minimizing the weighted
   errors within the budget, and writes the protections (f16 sink, 8-bit window, K center) into
   the plan (version 4, with the weights in its calibration record).

The budget: `--budget R` is the ratio of the quantized rows alone (as `kvc quant plan`); with
`--held-ratio R --context N` the script finds the rows' budget so that everything the cache
holds at N cells of one sequence (llama.cpp's tensors and kvc's cells beside them, as
`kvc quant inspect --context` counts it) is R times smaller than f16. That count gives every layer
N cells; a sliding-window model's window layers hold fewer (llama.cpp's iSWA cache), so for it
the ratio llama.cpp reports is lower: size such a model with `--budget` and read the ratio from
llama.cpp's "KV cache ... at capacity" line (frontier-model.sh does).

Cost: one model run for the dump, about 10 s of `kvc`, and layers + 2 perplexity runs of
`--probe-ctx x --probe-chunks` tokens. SmolLM2-135M (30 layers) on 2 cores: about 4 minutes at
the defaults (docs/results/kvq-frontier.md has the measured time). Use a text that is not the
one you evaluate on.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd, what):
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_WAIT_POLICY": "passive"})
    if r.returncode != 0:
        sys.exit(f"kvq-calibrate: {what} failed ({' '.join(cmd)}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout + r.stderr


def tools(a):
    """kvc_llama_eval, llama-perplexity and kvc: given, or from this repository's build."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not (a.eval and a.perplexity):
        out = run([os.path.join(root, "integrations/llama/fetch-and-build.sh")], "fetch-and-build.sh")
        env = dict(l.split("=", 1) for l in out.splitlines() if "=" in l and l.split("=", 1)[0].isupper())
        a.eval = a.eval or env.get("EVAL")
        a.perplexity = a.perplexity or env.get("LLAMA_PERPLEXITY")
    if not a.kvc:
        a.kvc = os.path.join(root, "target/release/kvc")
        if not os.path.exists(a.kvc):
            run(["cargo", "build", "-q", "--release", "-p", "kvc-cli", "--manifest-path",
                 os.path.join(root, "Cargo.toml")], "cargo build -p kvc-cli")
    for name in ("eval", "perplexity", "kvc"):
        if not (getattr(a, name) and os.path.exists(getattr(a, name))):
            sys.exit(f"kvq-calibrate: no {name} binary (give --{name})")


def mean_kl(out):
    for line in out.splitlines():
        if "Mean    KLD" in line:
            return float(line.split()[2])
    sys.exit("kvq-calibrate: llama-perplexity printed no KL:\n" + out[-2000:])


def protections(a):
    return ["--sink", str(a.sink), "--recent", str(a.recent), "--recent-bits", str(a.recent_bits), "--k-center"]


def probe_layers(a, work, base_plan, k2, v2, weights_path, made_with):
    """One llama-perplexity run per layer, and one with every layer at 8 bits: the weights."""
    n_layer = len(base_plan["layers"])
    probe = {k: v for k, v in base_plan.items() if k != "calibration"}
    probe["version"] = 3
    ppl = [a.perplexity, "-m", a.model, "-f", a.text, "-c", str(a.probe_ctx), "-b", str(a.probe_ctx),
           "-t", str(a.threads), "--chunks", str(a.probe_chunks)]
    kld = os.path.join(work, "f16.kld")
    run(ppl + ["--kl-divergence-base", kld], "the f16 base (llama-perplexity)")

    def probe_kl(layers, name):
        path = os.path.join(work, f"probe-{name}.json")
        json.dump({**probe, "layers": [{"k_bits": k, "v_bits": v} for k, v in layers]}, open(path, "w"))
        return mean_kl(run(ppl + ["--kvc-plan", path, "--kl-divergence-base", kld, "--kl-divergence"],
                           f"probe {name} (llama-perplexity)"))

    kl8 = probe_kl([(8, 8)] * n_layer, "all-8")
    kls = []
    for l in range(n_layer):
        layers = [(8, 8)] * n_layer
        layers[l] = (2, 2)
        kls.append(probe_kl(layers, f"layer-{l}"))
        print(f"kvq-calibrate: layer {l}: KL {kls[-1]:.5f} (every layer at 8 bits: {kl8:.5f})", file=sys.stderr)
    os.remove(kld)
    sensitivity = [max(kl - kl8, 0.0) / (a.k_weight * k2[l] + v2[l]) if (a.k_weight * k2[l] + v2[l]) > 0 else 0.0
                   for l, kl in enumerate(kls)]
    floor = statistics.median(sensitivity) / 20
    if not floor > 0:
        sys.exit("kvq-calibrate: the probes moved the KL in too few layers to weigh them; "
                 "use a longer text (--probe-ctx/--probe-chunks)")
    raised = [max(s, floor) for s in sensitivity]
    w = [s ** a.power for s in raised]
    mean = sum(w) / n_layer
    json.dump({
        "about": "per-layer sensitivity of the KL to the layer's kvq error (integrations/llama/kvq-calibrate.py)",
        "model": os.path.basename(a.model), "text": os.path.basename(a.text),
        "kl_all_8": kl8,
        "layers": [{"layer": l, "kl": kls[l], "k_err_2": k2[l], "v_err_2": v2[l], "sensitivity": sensitivity[l]}
                   for l in range(n_layer)],
        "weights": [x / mean for x in w],
        "made_with": made_with,
    }, open(weights_path, "w"), indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the model (GGUF)")
    p.add_argument("--text", required=True, help="calibration text (not an evaluation text)")
    p.add_argument("--out", required=True, help="the plan to write (JSON)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--budget", type=float, help="ratio to f16 of the quantized rows alone")
    g.add_argument("--held-ratio", type=float, help="ratio to f16 of everything held at --context cells")
    p.add_argument("--context", type=int, default=2048, help="cells for --held-ratio (default 2048)")
    p.add_argument("--k-weight", type=float, default=1.0, help="K errors against V errors (default 1)")
    p.add_argument("--power", type=float, default=0.5, help="weights = sensitivities ** power (default 0.5)")
    p.add_argument("--sink", type=int, default=4)
    p.add_argument("--recent", type=int, default=64)
    p.add_argument("--recent-bits", type=int, default=8)
    p.add_argument("--dump-tokens", type=int, default=1024)
    p.add_argument("--probe-ctx", type=int, default=1024, help="llama-perplexity -c for the probes")
    p.add_argument("--probe-chunks", type=int, default=2, help="llama-perplexity --chunks for the probes")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--work", help="keep the dump, probes and weights here (default: a temporary folder)")
    p.add_argument("--eval", help="kvc_llama_eval (default: from integrations/llama/fetch-and-build.sh)")
    p.add_argument("--perplexity", help="llama-perplexity (default: likewise)")
    p.add_argument("--kvc", help="the kvc command (default: target/release/kvc, built if missing)")
    a = p.parse_args()
    for what, x in (("--power", a.power), ("--k-weight", a.k_weight)):
        if not x > 0:
            sys.exit(f"kvq-calibrate: {what} must be > 0")
    t0 = time.time()
    tools(a)
    tmp = None
    if a.work:
        os.makedirs(a.work, exist_ok=True)
        work = a.work
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kvq-calibrate-")
        work = tmp.name
    dump = os.path.join(work, "dump")
    os.makedirs(dump, exist_ok=True)

    # 1. the dump (kept in --work; a second budget reuses it)
    sidecar = os.path.join(dump, "textA.Q.f32.json")
    same = os.path.exists(sidecar) and os.path.exists(os.path.join(work, "dump-of.json")) and \
        json.load(open(os.path.join(work, "dump-of.json"))) == [os.path.abspath(a.model), os.path.abspath(a.text),
                                                                 a.dump_tokens]
    if same:
        print(f"kvq-calibrate: reusing the dump in {dump}", file=sys.stderr)
    else:
        run([a.eval, "--model", a.model, "--text", a.text, "--modes", "dump", "--dump-tokens", str(a.dump_tokens),
             "--n-tokens", str(min(320, a.dump_tokens)), "--ppl-from", str(min(129, a.dump_tokens // 2)),
             "--threads", str(a.threads), "--dump-dir", dump], "the dump (kvc_llama_eval --modes dump)")
        json.dump([os.path.abspath(a.model), os.path.abspath(a.text), a.dump_tokens],
                  open(os.path.join(work, "dump-of.json"), "w"))
    t_dump = time.time() - t0

    # 2. layer-local errors, and the unweighted plan with the protections (its layout and bytes)
    center = ["--k-center-from", str(a.sink), "--k-center-tokens", str(a.recent)]
    sens_json = os.path.join(work, "sensitivity.json")
    plain = os.path.join(work, "plan-unweighted.json")
    budget = a.budget or min(a.held_ratio, 7.0)  # a first budget kvq rows can reach
    run([a.kvc, "quant", "plan", "--budget", str(budget), "--dump", dump, "--k-weight", str(a.k_weight),
         *center, *protections(a), "--json", sens_json, "--out", plain], "kvc quant plan")
    if a.held_ratio:
        # everything held = the rows' bytes per token + what the cells hold beside them
        out = run([a.kvc, "quant", "inspect", plain, "--context", str(a.context)], "kvc quant inspect")
        f16 = main = held = None
        for line in out.splitlines():
            if "whole model:" in line:
                # "whole model: 4056 bytes per token (f16: 23040), ..."
                main = float(line.split("whole model: ")[1].split(" bytes per token")[0])
                f16 = float(line.split("(f16: ")[1].split(")")[0])
            if "bytes beside the cells" in line:
                # "..., decoding: 911880 bytes beside the cells (...), 4517.3 bytes per token, ratio ..."
                held = float(line.split(" bytes per token, ratio")[0].split(", ")[-1])
        if f16 is None or main is None or held is None:
            sys.exit("kvq-calibrate: could not read kvc quant inspect's bytes:\n" + out)
        # what the cells hold per token beside the main rows, whatever the rows' bits
        rows = f16 / a.held_ratio - (held - main)
        if rows <= 0:
            sys.exit(f"kvq-calibrate: at {a.context} cells the protections alone hold more than f16/{a.held_ratio}")
        budget = f16 / rows
    sens = json.load(open(sens_json))
    base_plan = sens["plan"]
    n_layer = len(base_plan["layers"])
    k2 = [row[0] for row in sens["sensitivity"]["k"]]
    v2 = [row[0] for row in sens["sensitivity"]["v"]]
    t_sens = time.time() - t0

    # 3. probes: every layer at 8 bits, then each layer at 2 (kept in --work, and reused when
    # they were made with the same model, text and settings)
    weights_path = os.path.join(work, "layer-weights.json")
    made_with = {"model": os.path.abspath(a.model), "text": os.path.abspath(a.text), "probe_ctx": a.probe_ctx,
                 "probe_chunks": a.probe_chunks, "power": a.power, "k_weight": a.k_weight, "sink": a.sink,
                 "recent": a.recent, "recent_bits": a.recent_bits, "dump_tokens": a.dump_tokens}
    old = json.load(open(weights_path)) if os.path.exists(weights_path) else {}
    if old.get("made_with") == made_with:
        print(f"kvq-calibrate: reusing the probes' weights in {weights_path}", file=sys.stderr)
    else:
        probe_layers(a, work, base_plan, k2, v2, weights_path, made_with)
    t_probe = time.time() - t0

    # 4. the weighted plan
    budget = math.ceil(budget * 1e6) / 1e6  # rounded up: the rows never take more than asked
    out = run([a.kvc, "quant", "plan", "--budget", f"{budget:.6f}", "--dump", dump, "--k-weight", str(a.k_weight),
               *center, *protections(a), "--layer-weights", weights_path, "--out", a.out], "kvc quant plan")
    held = ""
    if a.held_ratio:
        ins = run([a.kvc, "quant", "inspect", a.out, "--context", str(a.context)], "kvc quant inspect")
        held = next((l.strip() for l in ins.splitlines() if "bytes beside the cells" in l), "")
    total = time.time() - t0
    print(out.rstrip())
    if held:
        print("  " + held)
    print(f"kvq-calibrate: {a.out} in {total:.0f} s (dump {t_dump:.0f} s, errors {t_sens - t_dump:.0f} s, "
          f"{n_layer + 2} probes {t_probe - t_sens:.0f} s, plan {total - t_probe:.0f} s); weights in {weights_path}"
          + ("" if a.work else " (temporary; --work keeps them)"))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
