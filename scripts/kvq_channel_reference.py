#!/usr/bin/env python3
"""NumPy reference for kvq channel groups (K per channel over token groups, KIVI;
crates/kvc-kvq/src/channel_group.rs, docs/formats/kvq.md "Channel groups").

Independent of the Rust code and written from the document alone: per channel the minimum
rounded down to an f16, the step (max - min) / (2^b - 1) rounded up to an f16, codes
round-half-away-from-zero and clamped, packed LSB-first, the block bytes, the decoded rows
(min + code * step) and, in float64, the scores q . row of the decoded rows. The document
fixes every quantizer operation in f32, so the reference does those in NumPy float32
(correctly rounded, as Rust's f32) and everything else in float64; the blocks and the
decoded rows are therefore bit-exact, not approximate.

  kvq_channel_reference.py generate DIR   writes DIR/kvq_channel_reference.json
  kvq_channel_reference.py check DIR      regenerates and fails unless the committed
                                          DIR/kvq_channel_reference.json is identical

The Rust test crates/kvc-kvq/tests/channel_reference.rs reads the committed fixture and
checks the codec's blocks and decoded rows bit for bit and its scores within f32 rounding.
"""
import json
import os
import sys

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# data/sample: llama.cpp K of SmolLM2-135M, [4 layers][512 tokens][3 KV heads][64] f16.
SAMPLE_K = os.path.join(ROOT, "data", "sample", "textA.K.f16.bin")


class Lcg:
    """64-bit LCG (Knuth's MMIX constants); uniform float32 in [-1, 1)."""

    def __init__(self, seed):
        self.s = seed & ((1 << 64) - 1)

    def uniform(self):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) & ((1 << 64) - 1)
        return (self.s >> 40) / float(1 << 24) * 2.0 - 1.0


def synthetic(d, g, seed):
    """Rows with outlier channels (as post-RoPE K has), one far from zero, one constant."""
    rng = Lcg(seed)
    x = np.zeros((g, d), dtype=np.float32)
    for t in range(g):
        for c in range(d):
            gain = 40.0 if c % 17 == 3 else 1.0 + (c % 5)
            v = gain * rng.uniform()
            if c == 9:
                v += 700.0
            if c == 11:
                v = -0.3
            x[t, c] = np.float32(v)
    return x


def edges(d, g):
    """Ties at half a step (round half away from zero), f16's extremes, subnormals."""
    x = np.zeros((g, d), dtype=np.float32)
    for t in range(g):
        x[t, 0] = [0.0, 3.0, 0.5, 1.5, 2.5][t % 5]  # 2 bits: step 1, ties 0.5, 1.5, 2.5
        x[t, 1] = 65504.0 if t % 2 else -65504.0
        x[t, 2] = (t - g / 2) * 2.0 ** -20  # below f16's normal range
        x[t, 3] = -1e-9 * (t + 1)  # rounds to -0 in f16: the minimum goes one below
        x[t, 4] = 1.0 + t * 2.0 ** -12  # finer than an f16 step at 1
        x[t, 5] = -7.25  # constant: step 0, code 0
        for c in range(6, d):
            x[t, c] = np.float32((((t * 31 + c * 7) % 23) - 11) / 8.0)
    return x


def sample_k(d, g, layer, head, start):
    """Tokens start .. start + g of one KV head of the sample (head_dim 64)."""
    k = np.fromfile(SAMPLE_K, dtype="<f2").reshape(4, 512, 3, 64)
    assert d == 64
    return k[layer, start:start + g, head, :].astype(np.float32)


def f16_down(a):
    """The largest f16 not above the float32 a."""
    h = np.float16(a)
    if np.float32(h) > a:
        h = np.nextafter(h, np.float16(-np.inf))
    return h


def f16_up(a):
    """The smallest f16 not below the float32 a."""
    h = np.float16(a)
    if np.float32(h) < a:
        h = np.nextafter(h, np.float16(np.inf))
    return h


def quantize(x, bits):
    """x: float32 (g, d) -> (block bytes, codes (g, d), steps f16 (d,), minimums f16 (d,))."""
    g, d = x.shape
    levels = np.float32((1 << bits) - 1)
    steps = np.zeros(d, dtype=np.float16)
    mins = np.zeros(d, dtype=np.float16)
    codes = np.zeros((g, d), dtype=np.int64)
    for c in range(d):
        col = x[:, c]
        m = f16_down(col.min())
        s = f16_up(np.float32(np.float32(col.max() - np.float32(m)) / levels))
        mins[c], steps[c] = m, s
        if np.float32(s) > 0:
            v = ((col - np.float32(m)) / np.float32(s)).astype(np.float64)  # f32 ops
            codes[:, c] = np.clip(np.floor(v + 0.5), 0, (1 << bits) - 1)  # v >= 0: away
    out = bytearray(steps.astype("<f2").tobytes() + mins.astype("<f2").tobytes())
    for t in range(g):
        row = bytearray(d * bits // 8)
        for i in range(d):
            for j in range(bits):
                bit = i * bits + j
                row[bit // 8] |= ((int(codes[t, i]) >> j) & 1) << (bit % 8)
        out += row
    return bytes(out), codes, steps, mins


def decode(codes, steps, mins):
    """min + code * step, one f32 multiply then one f32 add."""
    return np.float32(mins.astype(np.float32)) + codes.astype(np.float32) * steps.astype(np.float32)


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def g9(a):
    """float32 values: 9 significant digits give the exact value back."""
    return [float("%.9g" % v) for v in a]


def g12(a):
    return [float("%.12g" % v) for v in a]


def cases():
    yield "synthetic", 2, 64, 16, synthetic(64, 16, 1)
    yield "synthetic", 3, 64, 16, synthetic(64, 16, 2)
    yield "synthetic", 4, 64, 32, synthetic(64, 32, 3)
    yield "synthetic", 5, 128, 16, synthetic(128, 16, 4)
    yield "synthetic", 8, 64, 16, synthetic(64, 16, 5)
    yield "synthetic", 6, 256, 16, synthetic(256, 16, 6)
    yield "edges", 2, 64, 16, edges(64, 16)
    yield "edges", 7, 64, 16, edges(64, 16)
    yield "sample-K layer 2 head 1", 4, 64, 32, sample_k(64, 32, 2, 1, 40)
    yield "sample-K layer 0 head 0", 2, 64, 16, sample_k(64, 16, 0, 0, 200)


def build():
    out = {"format": "kvq-channel-reference", "version": 1, "cases": []}
    for i, (name, bits, d, g, x) in enumerate(cases()):
        assert np.all(np.isfinite(x)) and np.all(np.abs(x) <= 65504.0)
        block, codes, steps, mins = quantize(x, bits)
        assert len(block) == 4 * d + g * d * bits // 8
        y = decode(codes, steps, mins)
        rng = Lcg(1000 + i)
        q = np.array([rng.uniform() for _ in range(d)], dtype=np.float32)
        scores = y.astype(np.float64) @ q.astype(np.float64)
        out["cases"].append({
            "name": name,
            "bits": bits,
            "head_dim": d,
            "group": g,
            "rows": g9(x.reshape(-1)),
            "block": block.hex(),
            # the decoded rows: the first two as values (to read a failure), all of them as
            # FNV-1a 64 of their little-endian f32 bytes (bit-exact, and keeps the file small)
            "decoded_rows_0_1": g9(y[:2].reshape(-1)),
            "decoded_fnv1a64": "%016x" % fnv1a64(y.astype("<f4").tobytes()),
            "q": g9(q),
            "scores": g12(scores),
        })
    return json.dumps(out, indent=None, separators=(",", ":"), sort_keys=True) + "\n"


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("generate", "check"):
        sys.exit(__doc__)
    cmd, d = sys.argv[1], sys.argv[2]
    text = build()
    path = os.path.join(d, "kvq_channel_reference.json")
    if cmd == "generate":
        os.makedirs(d, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return
    with open(path) as f:
        committed = f.read()
    if committed != text:
        sys.exit("kvq channel reference: regenerated fixture differs from %s" % path)
    print("kvq channel reference: regenerated, identical")


if __name__ == "__main__":
    main()
