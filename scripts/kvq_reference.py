#!/usr/bin/env python3
"""NumPy float64 reference for kvq (crates/kvc-kvq, docs/formats/kvq.md).

Independent of the Rust code: the seeded randomized Hadamard rotation, the Lloyd-Max
codebooks for the rotated-coordinate law, the Lloyd-Max and uniform row quantizers (codes
chosen in float64, scales rounded to f16 as the format stores them), and decode attention
on the dequantized rows, all in float64.

  kvq_reference.py generate DIR   writes DIR/kvq_reference.json
  kvq_reference.py check DIR      regenerates into a temporary directory and fails unless
                                  the committed DIR/kvq_reference.json is identical

The Rust test crates/kvc-kvq/tests/reference.rs reads the committed fixture and checks
the Rust kernels against it within stated tolerances.
"""
import json
import os
import sys
import tempfile

import numpy as np

M64 = (1 << 64) - 1
DEFAULT_SEED = 0x6B76635F6B767131
GRID = 1 << 15
ITERS = 300


def splitmix64_signs(seed, d):
    st = seed
    out = []
    for _ in range(d):
        st = (st + 0x9E3779B97F4A7C15) & M64
        z = st
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        z ^= z >> 31
        out.append(-1.0 if z >> 63 else 1.0)
    return np.array(out)


def hadamard(d):
    h = np.array([[1.0]])
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


def rotation(d, seed):
    """R = H D / sqrt(d) as a dense float64 matrix."""
    return hadamard(d) * splitmix64_signs(seed, d)[None, :] / np.sqrt(d)


def lloyd_max(bits, d):
    levels = 1 << bits
    smax = min(np.sqrt(d), 9.0)
    step = 2.0 * smax / GRID
    xs = -smax + (np.arange(GRID) + 0.5) * step
    u = np.maximum(1.0 - xs * xs / d, 0.0)
    ws = u ** ((d - 3) // 2) * np.sqrt(u)
    cdf = np.cumsum(np.cbrt(ws))
    targets = (np.arange(levels) + 0.5) / levels * cdf[-1]
    c = xs[np.minimum(np.searchsorted(cdf, targets), GRID - 1)]
    for _ in range(ITERS):
        bounds = 0.5 * (c[:-1] + c[1:])
        cell = np.searchsorted(bounds, xs, side="left")
        sw = np.bincount(cell, weights=ws, minlength=levels)
        sx = np.bincount(cell, weights=ws * xs, minlength=levels)
        c = np.where(sw > 0, sx / np.where(sw > 0, sw, 1.0), c)
    out = c.copy()
    for j in range(levels // 2):
        m = 0.5 * (c[levels - 1 - j] - c[j])
        out[j], out[levels - 1 - j] = -m, m
    # The format's levels are float32.
    return out.astype(np.float32).astype(np.float64)


def f16(x):
    return float(np.float16(x))


def quantize_lm(x, r, levels):
    d = len(x)
    y = r @ x
    norm = np.sqrt(np.dot(y, y))
    if norm == 0.0:
        return np.zeros(d)
    bounds = 0.5 * (levels[:-1] + levels[1:])
    k = np.searchsorted(bounds, y * np.sqrt(d) / norm, side="left")
    c = levels[k]
    s = f16(np.dot(y, c) / np.dot(c, c))
    return r.T @ (s * c)


def quantize_uniform(x, r, bits, group):
    y = r @ x
    top = (1 << bits) - 1
    half = top / 2.0
    out = np.zeros_like(y)
    for g in range(0, len(y), group):
        yg = y[g:g + group]
        s = f16(np.max(np.abs(yg)) / half)
        if s == 0.0:
            continue
        k = np.clip(np.rint(yg / s + half), 0, top)
        out[g:g + group] = s * (k - half)
    return r.T @ out


def attention(q, k, v):
    s = (k @ q) / np.sqrt(len(q))
    p = np.exp(s - s.max())
    return (p / p.sum()) @ v


class Rng:
    """xorshift64, as crates/kvc-kvq/tests/common/mod.rs."""

    def __init__(self, seed):
        self.x = seed

    def next(self):
        x = self.x
        x ^= (x << 13) & M64
        x ^= x >> 7
        x ^= (x << 17) & M64
        self.x = x
        return x

    def unit(self):
        return (self.next() >> 11) / float(1 << 53)

    def gauss(self):
        return sum(self.unit() for _ in range(12)) - 6.0

    def kv_like(self, n, d):
        rows = []
        for _ in range(n):
            rows.append([
                np.float32(self.gauss() * (6.0 if c % 17 == 3 else 1.0) + (0.7 if c % 5 == 0 else 0.0))
                for c in range(d)
            ])
        return np.array(rows, dtype=np.float32).astype(np.float64)


CONFIGS = {
    64: [("lm", 2, 0), ("lm", 3, 0), ("lm", 4, 0), ("lm", 8, 0), ("u", 4, 32), ("u", 3, 16), ("u", 2, 64)],
    128: [("lm", 4, 0), ("u", 4, 32)],
}
ROWS = {64: 6, 128: 3}
TOKENS = {64: 24, 128: 12}


def g9(a):
    """float32 inputs: 9 significant digits give the exact value back."""
    return [g9(v) for v in a] if isinstance(a, list) else float("%.9g" % a)


def g12(a):
    """Floats to 12 significant digits (the fixture stays small; tolerances are far wider)."""
    return [g12(v) for v in a] if isinstance(a, list) else float("%.12g" % a)


def build():
    out = {"format": "kvq-reference", "version": 1, "seed": DEFAULT_SEED, "cases": []}
    for d in (64, 128):
        r = rotation(d, DEFAULT_SEED)
        rng = Rng(77 + d)
        x = rng.kv_like(ROWS[d], d)
        n = TOKENS[d]
        kv = rng.kv_like(2 * n, d)
        kk, vv = kv[:n], kv[n:]
        q = np.array([np.float32(rng.gauss()) for _ in range(d)], dtype=np.float64)
        case = {
            "head_dim": d,
            "signs": splitmix64_signs(DEFAULT_SEED, d).tolist(),
            "rows": g9(x.tolist()),
            "rotated": g12((x @ r.T).tolist()),
            "q": g9(q.tolist()),
            "k": g9(kk.tolist()),
            "v": g9(vv.tolist()),
            "attention_exact": g12(attention(q, kk, vv).tolist()),
            "codebooks": {},
            "configs": [],
        }
        for bits in range(2, 9):
            # float32 values: 9 significant digits are exact.
            case["codebooks"][str(bits)] = [float("%.9g" % v) for v in lloyd_max(bits, d)]
        for method, bits, group in CONFIGS[d]:
            if method == "lm":
                lv = np.array(case["codebooks"][str(bits)])
                deq = lambda m: np.array([quantize_lm(row, r, lv) for row in m])
                name = "lm"
            else:
                deq = lambda m: np.array([quantize_uniform(row, r, bits, group) for row in m])
                name = "u%d" % group
            dk, dv = deq(kk), deq(vv)
            case["configs"].append({
                "method": name,
                "bits": bits,
                "dequantized_rows": g12(deq(x).tolist()),
                "attention_dequantized": g12(attention(q, dk, dv).tolist()),
            })
        out["cases"].append(case)
    return json.dumps(out, indent=None, separators=(",", ":"), sort_keys=True) + "\n"


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("generate", "check"):
        sys.exit(__doc__)
    cmd, d = sys.argv[1], sys.argv[2]
    text = build()
    if cmd == "generate":
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "kvq_reference.json"), "w") as f:
            f.write(text)
        return
    with open(os.path.join(d, "kvq_reference.json")) as f:
        committed = f.read()
    with tempfile.TemporaryDirectory() as t:
        with open(os.path.join(t, "kvq_reference.json"), "w") as f:
            f.write(text)
    if committed != text:
        sys.exit("kvq reference: regenerated fixture differs from %s/kvq_reference.json" % d)
    print("kvq reference: regenerated, identical")


if __name__ == "__main__":
    main()
