#!/usr/bin/env python3
"""Writes msmodelslim C8 checkpoints with the Python `safetensors` package, for
kvc-int8's tests (crates/kvc-int8/tests/fixtures/c8/<case>/).

Each case directory holds quant_model_description.json, the .safetensors weight file and
expected.json (the values the file must read back as, in float64 text, exact for the
stored dtype). Deterministic: re-running it gives byte-identical files (CI checks that).

usage: make_c8_fixtures.py [OUT_DIR]   (default: the fixtures directory in the repo)
"""
import json
import os
import sys

import numpy as np
import safetensors
from safetensors import serialize


def spec(st_dtype, shape, raw, keep):
    """One tensor for safetensors.serialize, across package versions."""
    if hasattr(safetensors, "TensorSpec"):  # 0.7+: a pointer into a live buffer
        buf = np.frombuffer(raw, dtype=np.uint8).copy()
        keep.append(buf)
        return safetensors.TensorSpec(dtype=st_dtype, shape=shape, data_ptr=buf.ctypes.data, data_len=len(raw))
    return {"dtype": st_dtype, "shape": shape, "data": raw}


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns, round to nearest even."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def encode(vals, dtype):
    """Returns (safetensors dtype name, raw little-endian bytes, values as stored)."""
    if dtype == "f16":
        a = np.asarray(vals, dtype="<f2")
        return "float16", a.tobytes(), a.astype(np.float64)
    if dtype == "bf16":
        bits = bf16_bits(vals).astype("<u2")
        return "bfloat16", bits.tobytes(), bf16_value(bits).astype(np.float64)
    a = np.asarray(vals, dtype="<f4")
    return "float32", a.tobytes(), a.astype(np.float64)


def write_case(out, name, *, dtype, layers, channels, names, desc_key, symmetric, extra, seed, shape2d=False):
    rng = np.random.default_rng(seed)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    tensors = {}
    expected = {"dtype": dtype, "channels": channels, "symmetric": symmetric, "layers": {}}
    keep = []
    desc = {"model_quant_type": "W8A8", desc_key: "C8"}
    for layer in layers:
        exp = {}
        for proj in ("k_proj", "v_proj"):
            scale = rng.uniform(1e-3, 0.2, channels).astype(np.float32)
            if symmetric:
                offset = np.zeros(channels, dtype=np.float32)
            else:
                offset = rng.integers(-128, 128, channels).astype(np.float32)
            for kind, vals in (("kv_cache_scale", scale), ("kv_cache_offset", offset)):
                tname = names.format(i=layer) + f"{proj}.{kind}"
                st_dtype, raw, stored = encode(vals, dtype)
                keep.append(raw)
                shape = [channels, 1] if shape2d else [channels]
                tensors[tname] = spec(st_dtype, shape, raw, keep)
                desc[tname] = "W8A8"
                exp[f"{proj}.{kind}"] = [float(x) for x in stored]
        expected["layers"][str(layer)] = exp
    for tname, (st_dtype, shape, raw) in extra.items():
        tensors[tname] = spec(st_dtype, shape, raw, keep)
        desc[tname] = "FLOAT"
    payload = serialize(tensors, None)
    with open(os.path.join(d, "quant_model_weight.safetensors"), "wb") as f:
        f.write(payload)
    with open(os.path.join(d, "quant_model_description.json"), "w") as f:
        json.dump(desc, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "crates", "kvc-int8", "tests", "fixtures", "c8")
    norm = np.arange(8, dtype="<f4").tobytes()
    write_case(out, "llama_f16_sym", dtype="f16", layers=[0, 1, 2], channels=192,
               names="model.layers.{i}.self_attn.", desc_key="kv_cache_type", symmetric=True,
               extra={"model.layers.0.input_layernorm.weight": ("float32", [8], norm)}, seed=1)
    write_case(out, "chatglm_bf16_asym", dtype="bf16", layers=[1, 0], channels=256,
               names="transformer.encoder.layers.{i}.self_attention.query_key_value.",
               desc_key="kv_quant_type", symmetric=False, extra={}, seed=2)
    write_case(out, "qwen_f32_asym_2d", dtype="f32", layers=[0, 3], channels=128,
               names="model.layers.{i}.self_attn.", desc_key="kv_cache_type", symmetric=False,
               extra={"lm_head.weight": ("float32", [2], np.ones(2, dtype="<f4").tobytes())},
               seed=3, shape2d=True)


if __name__ == "__main__":
    main()
