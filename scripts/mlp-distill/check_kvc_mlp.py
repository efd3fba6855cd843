"""Checks that the JAX compressor (smollm.compress_span) computes what kvc-mlp computes.

  python3 scripts/mlp-distill/check_kvc_mlp.py --weights FILE.bin --dump /tmp/calib/textA \
      --kvc target/release/kvc [--layers 0,7,29] [--tokens 96]

For each layer: the dump's first --tokens post-RoPE K and V rows (all KV heads) are written
as raw f32 [H, S, D] and compressed by `kvc mlp compress --min-seq-len 1` (kvc-mlp's own
grouping from token 0, the remainder kept); the same rows go through compress_span from 0.
Reports the largest |difference| relative to the largest |output| and fails above --tol.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import binv1
import smollm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--kvc", required=True, help="the kvc binary (cargo build -p kvc-cli --release)")
    ap.add_argument("--layers", default="0,7,15,29")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    smollm.jax_setup()
    import jax.numpy as jnp

    hdr, p = binv1.read(a.weights)
    F = hdr["compression_factor"]
    S = a.tokens
    G = S // F
    side = json.load(open(f"{a.dump}.K.f32.json"))
    L, T, H, D = side["shape"]
    K = np.fromfile(f"{a.dump}.K.f32.bin", "<f4").reshape(L, T, H, D)
    V = np.fromfile(f"{a.dump}.V.f32.bin", "<f4").reshape(L, T, H, D)
    worst = 0.0
    with tempfile.TemporaryDirectory() as td:
        for l in [int(x) for x in a.layers.split(",")]:
            k = np.ascontiguousarray(K[l, :S].transpose(1, 0, 2))  # [H, S, D]
            v = np.ascontiguousarray(V[l, :S].transpose(1, 0, 2))
            fk, fv, ok, ov = (os.path.join(td, n) for n in ("k", "v", "ok", "ov"))
            k.tofile(fk)
            v.tofile(fv)
            r = subprocess.run([a.kvc, "mlp", "compress", "--weights", a.weights, "--layer", str(l), "--dtype", "f32",
                                "--heads", str(H), "--seq", str(S), "--head-dim", str(D), "--min-seq-len", "1",
                                "--k", fk, "--v", fv, "--out-k", ok, "--out-v", ov], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"kvc mlp compress failed: {r.stderr}")
            n_new = G + S - G * F
            rk = np.fromfile(ok, "<f4").reshape(H, n_new, D)[:, :G]
            rv = np.fromfile(ov, "<f4").reshape(H, n_new, D)[:, :G]
            for name, x, ref, prm in (("K", K, rk, p["k"][l]), ("V", V, rv, p["v"][l])):
                pj = {n: jnp.asarray(t) for n, t in prm.items()}
                mine = np.asarray(smollm.compress_span(pj, jnp.asarray(x[l, :S][None]), 0, G, F))[0]  # [G, H, D]
                mine = mine.transpose(1, 0, 2)
                rel = float(np.abs(mine - ref).max() / np.abs(ref).max())
                worst = max(worst, rel)
                print(f"layer {l} {name}: {G} groups x {H} heads, max |jax - kvc-mlp| / max |kvc-mlp| = {rel:.2e}")
    print(f"worst {worst:.2e} (bound {a.tol:g})")
    if worst > a.tol:
        sys.exit("FAIL")


if __name__ == "__main__":
    main()
