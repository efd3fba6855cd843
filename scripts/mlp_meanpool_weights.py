#!/usr/bin/env python3
"""Write a `.bin` v1 compressor whose MLPs compute the exact mean of each group: a baseline.

Not a trained compressor: every layer's K and V MLP (Linear-ReLU-Linear-ReLU-Linear, hidden
width head_dim as the format fixes) maps a group of `factor` consecutive tokens to their mean,
realised exactly with the ReLUs by an offset: the first Linear averages the group and adds
`--offset` c, so that relu(mean + c) = mean + c for every value above -c; the second is the
identity; the third subtracts c again. Values below -c would be clipped: the default c = 256
is ten times the largest |K| or |V| of SmolLM2-135M's cache (about 24), and kvc_llama_eval's
mlp-meanpool mode checks its own copy of these weights against the exact mean.

The file goes through scripts/convert_kv_compressor_pth_to_bin.py's writer (text MLPs only,
min_seq_len 1, fp32 so that 1/factor is not rounded to f16). The shape must be the model's,
e.g. SmolLM2-135M: --layers 30 --heads 3 --head-dim 64.

    scripts/mlp_meanpool_weights.py --layers 30 --heads 3 --head-dim 64 --factor 4 --output mp4.bin

`--pick I` writes a check of the plumbing instead: each group becomes a copy of its token I
(0-based), i.e. strided eviction written as a compressor. With I = factor - 1 the cell holds
exactly the K and V of the token whose position it takes, so the run must behave like
evicting the other tokens with positions kept.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert_kv_compressor_pth_to_bin import ConvertError, write_bin  # noqa: E402


def meanpool_mlp(head_dim, factor, offset, pick=None):
    """[(weight[out, in], bias)] x 3: mean of `factor` tokens of `head_dim` values (or, with
    `pick`, a copy of token `pick`)."""
    d = head_dim
    w1 = np.zeros((d, d * factor), dtype=np.float32)
    for f in range(factor):
        # group input: token f's value j sits at f * head_dim + j
        if pick is None:
            w1[:, f * d:(f + 1) * d] = np.eye(d, dtype=np.float32) / np.float32(factor)
        elif f == pick:
            w1[:, f * d:(f + 1) * d] = np.eye(d, dtype=np.float32)
    eye = np.eye(d, dtype=np.float32)
    return [
        (w1, np.full(d, offset, dtype=np.float32)),
        (eye, np.zeros(d, dtype=np.float32)),
        (eye.copy(), np.full(d, -offset, dtype=np.float32)),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, required=True, help="the model's layer count")
    ap.add_argument("--heads", type=int, required=True, help="the model's KV head count")
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--factor", type=int, required=True, help="tokens per group (at least 2)")
    ap.add_argument("--offset", type=float, default=256.0, help="ReLU offset c [256]")
    ap.add_argument("--pick", type=int, default=None,
                    help="copy token PICK of each group instead of the mean (a plumbing check)")
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)
    try:
        for name in ("layers", "heads", "head_dim"):
            if getattr(args, name) < 1:
                raise ConvertError(f"--{name.replace('_', '-')} must be at least 1")
        if args.factor < 2:
            raise ConvertError("--factor must be at least 2")
        if not args.offset > 0:
            raise ConvertError("--offset must be positive")
        if args.pick is not None and not 0 <= args.pick < args.factor:
            raise ConvertError(f"--pick must be in [0, {args.factor})")
        mlp = meanpool_mlp(args.head_dim, args.factor, args.offset, args.pick)
        # text K, then text V, per layer (prefixes compress_tk, compress_tv)
        layers = [mlp + mlp for _ in range(args.layers)]
        write_bin(args.output, layers, "fp32", min_seq_len=1, num_heads=args.heads, factor=args.factor)
    except (ConvertError, OSError) as e:
        print(f"mlp_meanpool_weights: {e}", file=sys.stderr)
        return 2
    kind = "mean-pool" if args.pick is None else f"pick-token-{args.pick}"
    print(f"wrote {args.output}: {kind} compressor, {args.layers} layers, {args.heads} KV heads, "
          f"head_dim {args.head_dim}, factor {args.factor}, offset {args.offset:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
