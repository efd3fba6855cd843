#!/usr/bin/env python3
"""NumPy float64 reference of the learned KV compressor, and the golden fixtures it makes.

    mlp_reference.py generate DIR   write the fixtures into DIR
    mlp_reference.py check DIR      regenerate into a temp dir and compare with DIR; also
                                    test the converter on .npz and .safetensors inputs

The reference follows PyTorch's KVCacheLinearDecoupleCompressor / InfiniLM's
kv_compression.cpp: per segment (image prefix, then text) of L tokens, S' = L // factor
groups of `factor` consecutive tokens are flattened to factor*D and pushed through
Linear-ReLU-Linear-ReLU-Linear; the L % factor remaining tokens follow unchanged; with
S' < min_seq_len the segment is unchanged; no image MLPs -> image prefix unchanged; no text
MLPs -> nothing changes.

Fixture files per case NAME: NAME.bin (weights, written by the converter's writer),
NAME.json (shape, dtypes, options, expected length), NAME.k.raw / NAME.v.raw (input
[H, S, D] in the KV dtype), NAME.L<layer>.{k,v}.f64 (expected [H, S_new, D], float64).
"""

import importlib.util
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
_spec = importlib.util.spec_from_file_location(
    "convert", os.path.join(ROOT, "scripts", "convert_kv_compressor_pth_to_bin.py")
)
convert = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert)

PREFIXES = ["compress_tk", "compress_tv", "compress_ik", "compress_iv"]


# ---------------------------------------------------------------- the reference itself


def mlp(x, blocks):
    """x: [N, D*factor] float64; blocks: 3 x (W [out, in], b [out] or None)."""
    for i, (w, b) in enumerate(blocks):
        x = x @ w.T.astype(np.float64)
        if b is not None:
            x = x + b.astype(np.float64)
        if i < 2:
            x = np.maximum(x, 0.0)
    return x


def compress_segment(x, blocks, factor, min_seq_len):
    """x: [H, L, D] float64 -> [H, L_new, D]."""
    h, length, d = x.shape
    groups = length // factor
    if blocks is None or groups == 0 or groups < min_seq_len:
        return x
    grouped = x[:, : groups * factor, :].reshape(h * groups, factor * d)
    out = mlp(grouped, blocks).reshape(h, groups, d)
    return np.concatenate([out, x[:, groups * factor :, :]], axis=1)


def compress(k, v, layer_mlps, factor, min_seq_len, image_kv_len):
    """k, v: [H, S, D] float64; layer_mlps: {prefix: blocks}. Returns (k_new, v_new)."""
    tk, tv = layer_mlps.get("compress_tk"), layer_mlps.get("compress_tv")
    ik, iv = layer_mlps.get("compress_ik"), layer_mlps.get("compress_iv")
    if tk is None or tv is None:
        return k, v
    if ik is None or iv is None:
        ik = iv = None
    n = image_kv_len
    out = []
    for x, img, txt in ((k, ik, tk), (v, iv, tv)):
        parts = []
        if n > 0:
            parts.append(compress_segment(x[:, :n], img, factor, min_seq_len))
        parts.append(compress_segment(x[:, n:], txt, factor, min_seq_len))
        out.append(np.concatenate(parts, axis=1))
    return out[0], out[1]


# ---------------------------------------------------------------- dtypes


def round_to(a, dtype):
    """Round float64 values to `dtype` (f32, f16, bf16) and return them as float64."""
    if dtype == "f32":
        return a.astype(np.float32).astype(np.float64)
    if dtype == "f16":
        return a.astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        return convert.from_bf16_bits(convert.to_bf16_bits(a.astype(np.float32))).astype(np.float64)
    raise ValueError(dtype)


def raw_bytes(a, dtype):
    if dtype == "f32":
        return a.astype("<f4").tobytes()
    if dtype == "f16":
        return a.astype("<f2").tobytes()
    return convert.to_bf16_bits(a.astype(np.float32)).astype("<u2").tobytes()


WEIGHT_DTYPE = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}

# name, heads, seq, head_dim, factor, min_seq_len, image_kv_len, kv dtype, weight dtype,
# bias ("on", "off", "mixed"), weights per layer, layers
CASES = [
    ("f32_text_bias", 2, 23, 8, 3, 2, 0, "f32", "f32", "on", 12, 2),
    ("f32_text_nobias_exact", 3, 20, 8, 5, 2, 0, "f32", "f32", "off", 12, 1),
    ("f32_image_prefix", 2, 37, 8, 4, 1, 13, "f32", "f32", "mixed", 12, 2),
    ("f32_textonly_image_copied", 2, 30, 8, 3, 2, 10, "f32", "f16", "on", 6, 1),
    ("f32_min_seq_len", 2, 41, 8, 4, 3, 9, "f32", "bf16", "on", 12, 1),
    ("f32_short_unchanged", 2, 7, 8, 4, 2, 0, "f32", "f32", "on", 12, 1),
    ("f16_text", 3, 40, 16, 5, 2, 0, "f16", "f16", "off", 12, 2),
    ("f16_image_f32_weights", 2, 29, 8, 2, 2, 11, "f16", "f32", "on", 12, 1),
    ("bf16_text_remainder", 2, 37, 8, 4, 2, 0, "bf16", "bf16", "on", 12, 2),
    ("bf16_image_mixed_bias", 2, 33, 16, 3, 2, 6, "bf16", "f16", "mixed", 12, 1),
]


def make_case(out_dir, case, seed):
    name, h, s, d, factor, min_seq, img, kv_dt, w_dt, bias, wc, nl = case
    rng = np.random.default_rng(seed)
    layers_np = []  # per layer: [(W, b)] in file order, rounded to the weight dtype (float64)
    for _layer in range(nl):
        blocks = []
        for i in range(wc):
            cols = d * factor if i % 3 == 0 else d
            w = round_to(rng.normal(0.0, 1.0 / np.sqrt(cols), size=(d, cols)), w_dt)
            has_b = bias == "on" or (bias == "mixed" and rng.random() < 0.5)
            b = round_to(rng.normal(0.0, 0.1, size=(d,)), w_dt) if has_b else None
            blocks.append((w, b))
        layers_np.append(blocks)
    convert.write_bin(
        os.path.join(out_dir, name + ".bin"), layers_np, WEIGHT_DTYPE[w_dt],
        min_seq_len=min_seq, num_heads=h,
    )
    k = round_to(rng.normal(0.0, 1.0, size=(h, s, d)), kv_dt)
    v = round_to(rng.normal(0.0, 1.0, size=(h, s, d)), kv_dt)
    with open(os.path.join(out_dir, name + ".k.raw"), "wb") as f:
        f.write(raw_bytes(k, kv_dt))
    with open(os.path.join(out_dir, name + ".v.raw"), "wb") as f:
        f.write(raw_bytes(v, kv_dt))
    s_new = None
    for li, blocks in enumerate(layers_np):
        mlps = {PREFIXES[p]: blocks[3 * p : 3 * p + 3] for p in range(wc // 3)}
        ko, vo = compress(k, v, mlps, factor, min_seq, img)
        s_new = ko.shape[1]
        for tag, a in (("k", ko), ("v", vo)):
            with open(os.path.join(out_dir, f"{name}.L{li}.{tag}.f64"), "wb") as f:
                f.write(np.ascontiguousarray(a, dtype="<f8").tobytes())
    meta = {
        "heads": h, "seq_len": s, "head_dim": d, "factor": factor, "min_seq_len": min_seq,
        "image_kv_len": img, "kv_dtype": kv_dt, "weight_dtype": w_dt, "bias": bias,
        "weights_per_layer": wc, "layers": nl, "expected_len": s_new,
    }
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")


def generate(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for i, case in enumerate(CASES):
        make_case(out_dir, case, 1000 + i)


# ---------------------------------------------------------------- self-checks


def check_reference_semantics():
    """Small hand-checkable properties of the reference itself."""
    rng = np.random.default_rng(7)
    d, f = 4, 2
    eye_first = [(np.hstack([np.eye(d), np.zeros((d, d))]), None), (np.eye(d), None), (np.eye(d), None)]
    x = np.abs(rng.normal(size=(1, 7, d)))  # ReLU passes positives
    out, _ = compress(x, x, {"compress_tk": eye_first, "compress_tv": eye_first}, f, 2, 0)
    # Picks the first token of each pair, then the one remaining token.
    assert np.array_equal(out[0], np.vstack([x[0, 0], x[0, 2], x[0, 4], x[0, 6]])), out
    out, _ = compress(x, x, {"compress_tk": eye_first, "compress_tv": eye_first}, f, 4, 0)
    assert out.shape[1] == 7  # 3 groups < min_seq_len 4: unchanged
    out, _ = compress(x, x, {"compress_ik": eye_first, "compress_iv": eye_first}, f, 1, 0)
    assert out is x  # no text MLPs: nothing compressed


def check_converter(tmp):
    """The converter reads .npz and .safetensors (f32 and bf16) and writes what write_bin does."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    d, f = 4, 3
    state = {}
    layers = []
    for layer in range(2):
        blocks = []
        for p in PREFIXES:
            for slot in (0, 3, 6):
                cols = d * f if slot == 0 else d
                w = rng.normal(size=(d, cols)).astype(np.float32)
                b = rng.normal(size=(d,)).astype(np.float32)
                state[f"compressor.{p}.{layer}.{slot}.weight"] = w
                state[f"compressor.{p}.{layer}.{slot}.bias"] = b
                blocks.append((w, b))
        layers.append(blocks)
    for dtype in ("fp32", "fp16", "bf16"):
        want = os.path.join(tmp, f"want_{dtype}.bin")
        convert.write_bin(want, layers, dtype)
        for ext in ("npz", "safetensors"):
            src = os.path.join(tmp, "ckpt." + ext)
            if ext == "npz":
                np.savez(src, **state)
            else:
                save_file(state, src)
            got = os.path.join(tmp, f"got_{dtype}_{ext}.bin")
            rc = convert.main(["--input", src, "--output", got, "--dtype", dtype])
            assert rc == 0, (dtype, ext)
            assert open(got, "rb").read() == open(want, "rb").read(), (dtype, ext)
    # A bf16 safetensors file (numpy cannot hold bf16): read through the fallback parser.
    import json as _json
    import struct as _struct

    w = layers[0][0][0]
    bits = convert.to_bf16_bits(w)
    hdr = _json.dumps({"t": {"dtype": "BF16", "shape": list(w.shape), "data_offsets": [0, bits.nbytes]}}).encode()
    path = os.path.join(tmp, "bf16.safetensors")
    with open(path, "wb") as fh:
        fh.write(_struct.pack("<Q", len(hdr)) + hdr + bits.astype("<u2").tobytes())
    back = convert.load_safetensors(path)["t"]
    assert np.array_equal(back, convert.from_bf16_bits(bits).reshape(w.shape))
    # Text-only: only compress_tk/compress_tv present -> 6 weights per layer.
    text = {k: v for k, v in state.items() if "compress_t" in k}
    np.savez(os.path.join(tmp, "text.npz"), **text)
    out = os.path.join(tmp, "text.bin")
    assert convert.main(["--input", os.path.join(tmp, "text.npz"), "--output", out]) == 0
    hdr = open(out, "rb").read(44)
    assert _struct.unpack("<IIHHIIIIIIII", hdr)[10] == 6
    # Image MLPs alone would be misread as text: refused.
    img = {k: v for k, v in state.items() if "compress_i" in k}
    np.savez(os.path.join(tmp, "img.npz"), **img)
    assert convert.main(["--input", os.path.join(tmp, "img.npz"), "--output", out]) == 2
    # A missing block is refused.
    broken = dict(state)
    del broken["compressor.compress_tv.1.3.weight"]
    np.savez(os.path.join(tmp, "broken.npz"), **broken)
    assert convert.main(["--input", os.path.join(tmp, "broken.npz"), "--output", out]) == 2


def check(fixture_dir):
    check_reference_semantics()
    with tempfile.TemporaryDirectory() as tmp:
        check_converter(tmp)
        gen = os.path.join(tmp, "fixtures")
        generate(gen)
        names = sorted(os.listdir(gen))
        committed = sorted(n for n in os.listdir(fixture_dir) if not n.startswith("."))
        assert names == committed, f"fixture set differs: {set(names) ^ set(committed)}"
        for n in names:
            a = open(os.path.join(gen, n), "rb").read()
            b = open(os.path.join(fixture_dir, n), "rb").read()
            if n.endswith(".f64"):
                x, y = np.frombuffer(a, "<f8"), np.frombuffer(b, "<f8")
                assert x.shape == y.shape and np.allclose(x, y, rtol=1e-12, atol=1e-12), n
            else:
                assert a == b, f"{n} differs from a fresh generation"
    print(f"mlp reference: converter ok, {len(CASES)} fixture cases reproduce")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("generate", "check"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "generate":
        generate(sys.argv[2])
    else:
        check(sys.argv[2])
