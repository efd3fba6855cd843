#!/usr/bin/env python3
"""How much SmolLM2's (or any model's) output feels each layer's transform-coder error, measured
in llama.cpp: the layer weights of `kvc tc calibrate --layer-weights` (issue 51, item 3).

    tc-sensitivity.py --eval BIN --model GGUF --kvc BIN --calibration FILE --report JSON
                      --text CALIBRATION_TEXT --out WEIGHTS.json
                      [--target tc-0.128] [--prefix 1792] [--rest 384]

A calibration's bound is the mean over layers of each layer's attention-output error
(`Σ‖o′−o‖²/Σ‖o‖²`, measured on the calibration dump). Layers do not matter equally to the
logits: an error of the same size in one layer moves the next-token distribution several times
more than in another. So, for every layer `l`, a probe calibration (`kvc tc probe`) codes layer
`l` at `--target` and every other layer almost exactly; the llama.cpp client restores a prefix
of the *calibration* text through it (`--modes share`, the same run as
integrations/llama/tc-eval.sh) and reports KL(prefilled || restored) over the next `--rest`
tokens. The layer's sensitivity is `(KL_l - KL_base) / e_l`, with `KL_base` the probe that codes
no layer coarsely and `e_l` the layer's error at `--target` in the calibration's report
(`kvc tc calibrate --json`). A sensitivity below a twentieth of the median (a KL change lost in
the baseline) is raised to it. The weights are the sensitivities to the power `--power` (0.5 by
default), over their mean: a probe measures one error size and the KL does not grow in
proportion with the error, so full weights (power 1) starve the layers the probes found
insensitive into errors far beyond the probed size. The power was chosen on the calibration
text (SmolLM2-135M; the Apache-2.0 license, 1,792 tokens restored, KL over the next 384): at
f16/8.5-8.7 equal weights gave KL 0.0239, power 1 0.0182, power 0.75 0.0202, power 0.5 0.0176;
power 0.33 gave 0.0197 at f16/9.32 where power 0.5 gave 0.0200 at f16/9.94. The evaluation
texts were not used to choose it (docs/results/tc-eval.md has what they give).

The text must be the one the calibration was made from, never an evaluated one. Writes
WEIGHTS.json: `weights` (one per layer, mean 1) and, per layer, the KL, its change and the
error. One engine run per layer plus one: about 25 s each on 2 cores for SmolLM2-135M.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def share_kl(a, cal, work, name):
    out = os.path.join(work, name + ".json")
    cmd = [a.eval, "--model", a.model, "--text", a.text, "--modes", "share",
           "--share-prefix", str(a.prefix), "--share-rest", str(a.rest),
           "--share-codec", "tc-1", "--share-calibration", cal, "--json", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"tc-sensitivity: {' '.join(cmd)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    res = json.load(open(out))["texts"][0]["results"][0]
    if res.get("chunks_stored") != res.get("chunks_in_prefix") or res.get("fallbacks", 0):
        sys.exit(f"tc-sensitivity: {name}: not every chunk was stored and restored: {res.get('detail')}")
    return float(res["kl"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--eval", required=True, help="kvc_llama_eval")
    p.add_argument("--model", required=True)
    p.add_argument("--kvc", required=True, help="the kvc command (cargo build --release -p kvc-cli)")
    p.add_argument("--calibration", required=True)
    p.add_argument("--report", required=True, help="the calibration's kvc tc calibrate --json")
    p.add_argument("--text", required=True, help="the text the calibration was made from")
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="tc-0.128")
    p.add_argument("--prefix", type=int, default=1792)
    p.add_argument("--rest", type=int, default=384)
    p.add_argument("--power", type=float, default=0.5)
    a = p.parse_args()
    if not 0 < a.power <= 1:
        sys.exit(f"tc-sensitivity: --power {a.power}: between 0 (excluded) and 1")

    report = json.load(open(a.report))
    bound = float(a.target[len("tc-"):])
    rows = [t for t in report["targets"] if abs(t["bound"] - bound) <= 1e-6 * bound]
    if not rows:
        sys.exit(f"tc-sensitivity: {a.report} has no target {a.target}")
    errors = [layer["error"] for layer in rows[0]["layers"]]
    with tempfile.TemporaryDirectory(prefix="kvc-tc-sensitivity-") as work:
        def probe(layer):
            f = os.path.join(work, f"probe-{layer}.kvctc")
            subprocess.run([a.kvc, "tc", "probe", a.calibration, "--layer", str(layer),
                            "--target", a.target, "--out", f], check=True, capture_output=True)
            return share_kl(a, f, work, f"probe-{layer}")

        base = probe("base")
        print(f"tc-sensitivity: base KL {base:.5f}", file=sys.stderr)
        kls = []
        for layer, e in enumerate(errors):
            kls.append(probe(layer))
            print(f"tc-sensitivity: layer {layer}: KL {kls[-1]:.5f} (+{kls[-1] - base:.5f}) "
                  f"at error {e:.4f}", file=sys.stderr)
    raw = [(kl - base) / e if e > 0 else 0.0 for kl, e in zip(kls, errors)]
    floor = statistics.median(raw) / 20
    if not floor > 0:
        sys.exit("tc-sensitivity: the median layer moves the KL by nothing: no weights to learn")
    sens = [max(s, floor) for s in raw]
    shrunk = [s ** a.power for s in sens]
    mean = sum(shrunk) / len(shrunk)
    out = {
        "about": "per-layer sensitivity of the KL to the layer's attention-output error "
                 "(integrations/llama/tc-sensitivity.py); weights for kvc tc calibrate --layer-weights",
        "model": os.path.basename(a.model),
        "text": os.path.basename(a.text),
        "calibration": os.path.basename(a.calibration),
        "target": a.target,
        "prefix": a.prefix,
        "rest": a.rest,
        "power": a.power,
        "base_kl": base,
        "layers": [{"layer": i, "kl": kl, "delta_kl": kl - base, "error": e, "sensitivity": s}
                   for i, (kl, e, s) in enumerate(zip(kls, errors, sens))],
        "weights": [s / mean for s in shrunk],
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"tc-sensitivity: {len(sens)} weights, from {min(out['weights']):.2f} to "
          f"{max(out['weights']):.2f}, written to {a.out}")


if __name__ == "__main__":
    main()
