#!/usr/bin/env python3
"""Convert a KV-cache compressor checkpoint to the `.bin` v1 weight file kvc and InfiniLM load.

Input: a PyTorch `.pth` (needs torch; the state dict may sit under `model_state_dict`,
`state_dict` or `compressor`, and keys may carry prefixes such as `module.`), a
`.safetensors` file or a `.npz` archive (neither needs torch). Keys look like
`<prefix>.<layer>.<slot>.weight` / `.bias`, e.g. `compress_tk.0.3.weight` for the second
Linear of layer 0's text-K MLP (slots 0, 3, 6 are the Linear layers of
`Linear, ReLU, Dropout, Linear, ReLU, Dropout, Linear`).

Output layout (little-endian): 44-byte header `<IIHHIIIIIIII` (magic 0x4B56434D, version 1,
dtype code, reserved 0, num_layers, num_heads, head_dim, hidden_size, compression_factor,
min_seq_len, weight_count_per_layer, metadata_size_bytes), then per layer, per prefix in
`--prefix-order`, per slot in `--slot-order`: `rows, cols, has_bias` (3 x u32), the
`rows * cols` weights row-major `[out, in]`, and `rows` biases if has_bias.
"""

import argparse
import re
import struct
import sys

import numpy as np

MAGIC = 0x4B56434D
VERSION = 1
DTYPE_CODES = {"fp16": 0, "bf16": 1, "fp32": 2}
DEFAULT_PREFIXES = "compress_tk,compress_tv,compress_ik,compress_iv"
DEFAULT_SLOTS = "0,3,6"
HEADER_FMT = "<IIHHIIIIIIII"


class ConvertError(Exception):
    """A checkpoint that cannot be converted; the message says why."""


def to_bf16_bits(a):
    """float array -> uint16 bf16 payload, round to nearest even (like torch)."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    nan = np.isnan(f)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def from_bf16_bits(bits):
    """uint16 bf16 payload -> float32 array."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def encode(a, dtype):
    """Little-endian bytes of `a` in `dtype` (fp16, bf16 or fp32)."""
    a = np.asarray(a)
    if dtype == "fp32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "fp16":
        return np.ascontiguousarray(a, dtype="<f2").tobytes()
    if dtype == "bf16":
        if a.dtype == np.uint16:  # already a bf16 payload
            return np.ascontiguousarray(a, dtype="<u2").tobytes()
        return to_bf16_bits(a).astype("<u2").tobytes()
    raise ConvertError(f"unknown dtype {dtype!r}")


def _unwrap(obj):
    """Find the compressor state dict inside a loaded checkpoint object."""
    for key in ("model_state_dict", "state_dict", "compressor"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            return _unwrap(obj[key])
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        return obj.state_dict()
    if not isinstance(obj, dict):
        raise ConvertError("checkpoint is not a state dict")
    return obj


def _to_numpy(t):
    if isinstance(t, np.ndarray):
        return t
    # torch tensor: bf16 has no numpy dtype, keep it exact through float32.
    t = t.detach().cpu()
    if str(t.dtype) == "torch.bfloat16":
        import torch

        t = t.to(torch.float32)
    return t.numpy()


def load_state_dict(path):
    """{key: numpy array} from a .pth, .safetensors or .npz file."""
    if path.endswith(".npz"):
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    if path.endswith(".safetensors"):
        return load_safetensors(path)
    try:
        import torch
    except ImportError as e:
        raise ConvertError("reading .pth needs torch; convert to .safetensors or .npz") from e
    obj = torch.load(path, map_location="cpu", weights_only=False)
    sd = _unwrap(obj)
    return {k: _to_numpy(v) for k, v in sd.items() if hasattr(v, "shape")}


def load_safetensors(path):
    """{key: numpy array} from a .safetensors file; BF16 tensors come back as float32."""
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except (TypeError, ValueError):
        pass  # numpy has no bfloat16: read the (simple) container ourselves
    import json

    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ConvertError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ConvertError(f"{path}: header length {n} exceeds the file")
    meta = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    kinds = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}
    out = {}
    for key, info in meta.items():
        if key == "__metadata__":
            continue
        if info["dtype"] not in kinds:
            raise ConvertError(f"{path}: tensor {key} has unsupported dtype {info['dtype']}")
        lo, hi = info["data_offsets"]
        if not 0 <= lo <= hi <= len(body):
            raise ConvertError(f"{path}: tensor {key} lies outside the file")
        a = np.frombuffer(body[lo:hi], dtype=kinds[info["dtype"]])
        if info["dtype"] == "BF16":
            a = from_bf16_bits(a)
        out[key] = a.reshape(info["shape"])
    return out


KEY_RE = re.compile(r"(?:^|\.)(compress_[a-z]+)\.(\d+)\.(\d+)\.(weight|bias)$")


def collect(state, prefixes, slots):
    """{(prefix, layer, slot): (weight, bias|None)} for the prefixes and slots asked for."""
    found = {}
    for key, val in state.items():
        m = KEY_RE.search(key)
        if not m:
            continue
        prefix, layer, slot, kind = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if prefix not in prefixes or slot not in slots:
            continue
        entry = found.setdefault((prefix, layer, slot), [None, None])
        entry[0 if kind == "weight" else 1] = np.asarray(val)
    return found


def build_layers(state, prefixes, slots):
    """[[ (weight, bias|None) for prefix for slot ] for layer]; checks completeness."""
    found = collect(state, prefixes, slots)
    if not found:
        raise ConvertError(f"no weights with prefixes {prefixes} and slots {slots}")
    present = {p for (p, _, _) in found}
    order = [p for p in prefixes if p in present]
    if order != prefixes[: len(order)]:
        raise ConvertError(
            f"prefixes present {order} are not the first ones of {prefixes}: the loader would "
            "take them for others"
        )
    num_layers = max(layer for (_, layer, _) in found) + 1
    layers = []
    for layer in range(num_layers):
        blocks = []
        for p in order:
            for s in slots:
                w, b = found.get((p, layer, s), (None, None))
                if w is None:
                    raise ConvertError(f"missing {p}.{layer}.{s}.weight")
                if w.ndim != 2:
                    raise ConvertError(f"{p}.{layer}.{s}.weight has shape {w.shape}, not 2-D")
                if b is not None and b.shape != (w.shape[0],):
                    raise ConvertError(f"{p}.{layer}.{s}.bias has shape {b.shape}")
                blocks.append((w, b))
        layers.append(blocks)
    return layers, order


def write_bin(path, layers, dtype, min_seq_len=2, num_heads=0, factor=None, metadata=b""):
    """Write layers ([[ (weight[out,in], bias|None) ]]) as a .bin v1 file; returns the header."""
    if not layers or not layers[0]:
        raise ConvertError("nothing to write")
    count = len(layers[0])
    if count not in (6, 12) or any(len(blocks) != count for blocks in layers):
        raise ConvertError(f"{count} weights per layer; the format needs 12 or 6 in every layer")
    first = layers[0][0][0]
    head_dim = first.shape[0]
    hidden = first.shape[1]
    if factor is None:
        if hidden % head_dim:
            raise ConvertError(f"first Linear {first.shape}: input is not a multiple of head_dim")
        factor = hidden // head_dim
    for li, blocks in enumerate(layers):
        for i, (w, _) in enumerate(blocks):
            want = (head_dim, head_dim * factor) if i % 3 == 0 else (head_dim, head_dim)
            if tuple(w.shape) != want:
                raise ConvertError(f"layer {li} weight {i}: shape {w.shape}, expected {want}")
    header = struct.pack(
        HEADER_FMT,
        MAGIC,
        VERSION,
        DTYPE_CODES[dtype],
        0,
        len(layers),
        num_heads,
        head_dim,
        hidden,
        factor,
        min_seq_len,
        count,
        len(metadata),
    )
    with open(path, "wb") as f:
        f.write(header)
        f.write(metadata)
        for blocks in layers:
            for w, b in blocks:
                f.write(struct.pack("<III", w.shape[0], w.shape[1], 0 if b is None else 1))
                f.write(encode(w, dtype))
                if b is not None:
                    f.write(encode(b, dtype))
    return header


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True, help=".pth, .safetensors or .npz checkpoint")
    ap.add_argument("--output", required=True, help="the .bin file to write")
    ap.add_argument("--dtype", choices=sorted(DTYPE_CODES), default="fp16")
    ap.add_argument("--prefix-order", default=DEFAULT_PREFIXES,
                    help=f"comma-separated MLP prefixes in file order (default {DEFAULT_PREFIXES})")
    ap.add_argument("--slot-order", default=DEFAULT_SLOTS,
                    help=f"comma-separated Sequential indices of the 3 Linear layers (default {DEFAULT_SLOTS})")
    ap.add_argument("--min-seq-len", type=int, default=2)
    ap.add_argument("--num-heads", type=int, default=0)
    ap.add_argument("--compression-factor", type=int, default=None,
                    help="default: first Linear's input width / head_dim")
    args = ap.parse_args(argv)
    try:
        prefixes = [p.strip() for p in args.prefix_order.split(",") if p.strip()]
        slots = [int(s) for s in args.slot_order.split(",") if s.strip()]
        if len(slots) != 3:
            raise ConvertError(f"--slot-order needs 3 slots, got {slots}")
        state = load_state_dict(args.input)
        layers, order = build_layers(state, prefixes, slots)
        write_bin(args.output, layers, args.dtype, args.min_seq_len, args.num_heads,
                  args.compression_factor)
    except (ConvertError, ValueError, OSError) as e:
        print(f"convert: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {len(layers)} layers, prefixes {order}, dtype {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
