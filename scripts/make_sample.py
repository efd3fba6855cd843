#!/usr/bin/env python3
"""Cut the embedded default sample out of a real KV dump (default: $KVC_REALKV_DIR, else
the maintainers' ../shared/data/realkv; any directory the llama.cpp client's dump mode
wrote works, see README.md "Real KV dumps of your own").

The sample is layers 0..3 and tokens 0..511 of every `textA.{K,V}.{f16,bf16}.bin`, written
in the same layout `[n_layer][n_tokens][n_kv_head][head_dim]` with a JSON sidecar that keeps
the source's provenance and says which slice this is. Standard library only.

usage: scripts/make_sample.py [SRC_DIR] [DST_DIR]
"""
import json
import os
import sys

LAYERS = 4
TOKENS = 512


def main() -> None:
    src = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KVC_REALKV_DIR", "../shared/data/realkv")
    dst = sys.argv[2] if len(sys.argv) > 2 else "data/sample"
    if not os.path.isfile(os.path.join(src, "textA.K.f16.json")):
        sys.exit(
            f"make_sample: no KV dump in {src} (textA.K.f16.json). data/sample/ is already in "
            "the repository; to cut a sample of your own, make a dump with the llama.cpp "
            "client's dump mode (README.md) and pass its directory."
        )
    os.makedirs(dst, exist_ok=True)
    for tensor in ("K", "V"):
        for dtype in ("f16", "bf16"):
            stem = f"textA.{tensor}.{dtype}"
            with open(os.path.join(src, stem + ".json")) as f:
                meta = json.load(f)
            n_layer, n_tokens, n_kv_head, head_dim = meta["shape"]
            row = n_kv_head * head_dim * 2
            with open(os.path.join(src, stem + ".bin"), "rb") as f:
                raw = f.read()
            assert len(raw) == n_layer * n_tokens * row, stem
            out = bytearray()
            for layer in range(LAYERS):
                base = layer * n_tokens * row
                out += raw[base : base + TOKENS * row]
            with open(os.path.join(dst, stem + ".bin"), "wb") as f:
                f.write(out)
            meta["shape"] = [LAYERS, TOKENS, n_kv_head, head_dim]
            meta["n_layer"] = LAYERS
            meta["n_tokens"] = TOKENS
            meta["token_count"] = TOKENS
            meta["sample_of"] = {
                "file": stem + ".bin",
                "shape": [n_layer, n_tokens, n_kv_head, head_dim],
                "selection": f"layers 0..{LAYERS - 1}, tokens 0..{TOKENS - 1}",
                "note": "kvc's embedded default sample, cut by scripts/make_sample.py",
            }
            with open(os.path.join(dst, stem + ".json"), "w") as f:
                json.dump(meta, f, indent=2)
                f.write("\n")


if __name__ == "__main__":
    main()
