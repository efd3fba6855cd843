#!/usr/bin/env python3
"""Writes seeds for llama_state_fuzz: valid llama.cpp sequence-state blobs (single stream,
sequence 0, f16 K and V, V plain or transposed) in the layout that
integrations/llama/llama_state_parse.hpp documents, with real f16 values from the embedded
sample (data/sample/textA.{K,V}.f16.bin). Each file is the target's selector byte (layer
count and n_embd_kv), then the blob.

    fuzz/cpp/make_llama_state_seeds.py OUT_DIR
"""
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EMBD = [2, 8, 64, 192]  # the target's n_embd_kv choices
MAGIC = 0xAF143CD8
GGML_TYPE_F16 = 1
# llama_state_parse.hpp's kStateSeqVersion: version 4 writes the attention rotations after n_layer
STATE_SEQ_VERSION = 3


def blob(n_layer, ne, cells, v_trans, k_src, v_src):
    out = struct.pack("<IiII", MAGIC, 0, 1, cells)
    for c in range(cells):
        out += struct.pack("<iIi", c, 1, 0)
    out += struct.pack("<II", v_trans, n_layer)
    if STATE_SEQ_VERSION >= 4:
        out += struct.pack("<II", 64, 64)
    take = lambda src, l: src[l * cells * ne * 2:(l + 1) * cells * ne * 2]
    for l in range(n_layer):
        out += struct.pack("<iQ", GGML_TYPE_F16, ne * 2) + take(k_src, l)
    for l in range(n_layer):
        rows = take(v_src, l)
        if not v_trans:
            out += struct.pack("<iQ", GGML_TYPE_F16, ne * 2) + rows
        else:
            out += struct.pack("<iII", GGML_TYPE_F16, 2, ne)
            for j in range(ne):  # channel-major: channel j of every cell
                out += b"".join(rows[(c * ne + j) * 2:(c * ne + j) * 2 + 2] for c in range(cells))
    return out


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    k = open(os.path.join(ROOT, "data/sample/textA.K.f16.bin"), "rb").read()
    v = open(os.path.join(ROOT, "data/sample/textA.V.f16.bin"), "rb").read()
    for n_layer, ne, cells, v_trans in [(2, 8, 3, 0), (2, 8, 3, 1), (1, 64, 2, 0), (4, 2, 5, 1), (1, 192, 1, 1)]:
        sel = (n_layer - 1) | (EMBD.index(ne) << 2)
        name = f"l{n_layer}-e{ne}-c{cells}-t{v_trans}"
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(bytes([sel]) + blob(n_layer, ne, cells, v_trans, k, v))


if __name__ == "__main__":
    main()
