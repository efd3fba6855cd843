"""Reads and writes kvc-mlp's `.bin` v1 weight files (crates/kvc-mlp/src/weights.rs).

Layout (little-endian): a 44-byte header (magic 0x4B56434D, version 1, dtype code u16 (0 fp16,
1 bf16, 2 fp32) + reserved u16, num_layers, num_heads, head_dim, hidden_size (= head_dim *
factor), compression_factor, min_seq_len, weight_count_per_layer, metadata_size_bytes), the
metadata (skipped), then per layer `weight_count_per_layer` blocks of `rows, cols, has_bias`
(u32 each), rows*cols weights row-major [out, in] and `rows` biases when has_bias is 1. Blocks
per layer: compress_tk (3 Linear), compress_tv (3 Linear), then, in 12-block files, the image
MLPs compress_ik, compress_iv (read and dropped here: kvc's clients run the text MLPs).
"""

import struct

import numpy as np

MAGIC = 0x4B56434D
DTYPES = {0: np.float16, 2: np.float32}


def read(path):
    """-> (header dict, params {"k": [per layer {w0,b0,w1,b1,w2,b2}], "v": [...]}) in f32."""
    b = open(path, "rb").read()
    if len(b) < 44:
        raise ValueError(f"{path}: {len(b)} bytes, shorter than the 44-byte header")
    magic, version, dcode, _res = struct.unpack_from("<IIHH", b, 0)
    if magic != MAGIC or version != 1:
        raise ValueError(f"{path}: magic {magic:#x} version {version}: not .bin v1")
    if dcode not in DTYPES:
        raise ValueError(f"{path}: dtype code {dcode}: only fp16 (0) and fp32 (2) are read here")
    nl, nh, hd, hs, fac, msl, wcpl, mds = struct.unpack_from("<8I", b, 12)
    if wcpl not in (6, 12):
        raise ValueError(f"{path}: {wcpl} blocks per layer (6 or 12 expected)")
    dt = np.dtype(DTYPES[dcode]).newbyteorder("<")
    off = 44 + mds
    out = {"k": [], "v": []}
    for _ in range(nl):
        for blk in range(wcpl):
            if off + 12 > len(b):
                raise ValueError(f"{path}: truncated at byte {off}")
            rows, cols, hb = struct.unpack_from("<3I", b, off)
            off += 12
            n = rows * cols
            if off + (n + (rows if hb else 0)) * dt.itemsize > len(b):
                raise ValueError(f"{path}: truncated weight block at byte {off}")
            wgt = np.frombuffer(b, dt, n, off).astype(np.float32).reshape(rows, cols)
            off += n * dt.itemsize
            bias = np.zeros(rows, np.float32)
            if hb == 1:
                bias = np.frombuffer(b, dt, rows, off).astype(np.float32)
                off += rows * dt.itemsize
            if blk < 6:
                kv = "k" if blk < 3 else "v"
                slot = blk % 3
                if slot == 0:
                    out[kv].append({})
                out[kv][-1][f"w{slot}"] = wgt
                out[kv][-1][f"b{slot}"] = bias
    if off != len(b):
        raise ValueError(f"{path}: {len(b) - off} bytes after the last block")
    hdr = dict(dtype_code=dcode, num_layers=nl, num_heads=nh, head_dim=hd, hidden_size=hs,
               compression_factor=fac, min_seq_len=msl, weight_count_per_layer=wcpl)
    return hdr, out


def write(path, params, *, factor, head_dim, num_heads, min_seq_len=1, dtype="f16"):
    """Writes text-only (6 blocks per layer) .bin v1 with biases, fp16 or fp32. Refuses values
    that do not fit f16."""
    code, npdt = {"f16": (0, np.float16), "f32": (2, np.float32)}[dtype]
    nl = len(params["k"])
    parts = [struct.pack("<IIHH8I", MAGIC, 1, code, 0, nl, num_heads, head_dim, head_dim * factor, factor,
                         min_seq_len, 6, 0)]
    for l in range(nl):
        for kv in ("k", "v"):
            p = params[kv][l]
            for s in range(3):
                wgt = np.asarray(p[f"w{s}"], np.float32)
                bias = np.asarray(p[f"b{s}"], np.float32)
                rows, cols = wgt.shape
                want = (head_dim, head_dim * factor if s == 0 else head_dim)
                if (rows, cols) != want or bias.shape != (rows,):
                    raise ValueError(f"layer {l} {kv} Linear {s}: shape {wgt.shape}/{bias.shape}, expected {want}")
                for name, arr in (("weight", wgt), ("bias", bias)):
                    if not np.all(np.isfinite(arr)) or (dtype == "f16" and np.abs(arr).max() > 65504):
                        raise ValueError(f"layer {l} {kv} Linear {s}: {name} not finite in {dtype}")
                parts.append(struct.pack("<3I", rows, cols, 1))
                parts.append(wgt.astype(np.dtype(npdt).newbyteorder("<")).tobytes())
                parts.append(bias.astype(np.dtype(npdt).newbyteorder("<")).tobytes())
    with open(path, "wb") as f:
        for p in parts:
            f.write(p)


def meanpool(num_layers, head_dim, factor, offset=256.0):
    """The mean-pool MLP of integrations/llama/mlp_mode.hpp and scripts/mlp_meanpool_weights.py:
    Linear 1 averages and adds `offset`, Linear 2 is the identity, Linear 3 takes it away."""
    d = head_dim
    w0 = np.tile(np.eye(d, dtype=np.float32) / factor, (1, factor))
    one = {"w0": w0, "b0": np.full(d, offset, np.float32), "w1": np.eye(d, dtype=np.float32),
           "b1": np.zeros(d, np.float32), "w2": np.eye(d, dtype=np.float32), "b2": np.full(d, -offset, np.float32)}
    return {kv: [{k: v.copy() for k, v in one.items()} for _ in range(num_layers)] for kv in ("k", "v")}
