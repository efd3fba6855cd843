#!/usr/bin/env bash
# Makes integrations/mnn/model/<name>/ for a GGUF model: MNN's graph of the model, written by
# MNN's own exporter (transformers/llm/export/llmexport.py), with its weights removed, for
# fetch-and-build.sh's gguf2mnn.py to fill with the GGUF's exact weights. Run it once per
# model; CI never does (it needs torch, transformers and onnx: gigabytes from PyPI).
#   export-graph.sh MODEL.gguf NAME [MNN_TREE]
# MNN_TREE: an MNN source tree (default: the patched tree fetch-and-build.sh made). The
# environment lives in .cache/mnn/venv-export (KVC_MNN_CACHE).
#
# Steps: transformers reads the GGUF (dequantized; it undoes llama.cpp's Q/K row order) and
# saves a Hugging Face folder (config, tokenizer, float weights); llmexport.py exports it with
# the linear layers left unfused (gguf2mnn.py maps 7 convolutions per block to GGUF tensors by
# position); the convolutions' and norms' weights are dropped from the graph's JSON.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 MODEL.gguf NAME [MNN_TREE]" >&2; exit 2; }
gguf="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
name="$2"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${KVC_MNN_CACHE:-$repo/.cache/mnn}"
tree="${3:-$(ls -d "$cache"/src-*-kvc-* 2>/dev/null | head -n1)}"
[ -f "$tree/transformers/llm/export/llmexport.py" ] || { echo "no MNN tree with llmexport.py: give MNN_TREE" >&2; exit 1; }

venv="$cache/venv-export"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet torch transformers accelerate gguf onnx onnxslim sentencepiece \
        yaspin tqdm safetensors packaging "mnn==3.6.1"
fi
work="$cache/export-$name"
rm -rf "$work"
mkdir -p "$work"
"$venv/bin/python" - "$gguf" "$work/hf" <<'PY'
import os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = sys.argv[1:3]
folder, name = os.path.dirname(gguf), os.path.basename(gguf)
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
config = model.config
if hasattr(config, "quantization_config"):
    del config.quantization_config  # a GGUF-quantized model cannot be saved; its float copy can
plain = AutoModelForCausalLM.from_config(config)
plain.load_state_dict(model.state_dict())
plain.save_pretrained(out)
tok.save_pretrained(out)
PY
(cd "$tree/transformers/llm/export" && "$venv/bin/python" llmexport.py --path "$work/hf" --export mnn \
    --dst_path "$work/mnn" --disable_fuse_qkv_proj --disable_fuse_gate_up_proj --disable_fuse_ln_proj) \
    >"$work/llmexport.log" 2>&1 || { tail -n 30 "$work/llmexport.log" >&2; exit 1; }
mkdir -p "$here/model/$name"
"$venv/bin/python" - "$work/mnn" "$here/model/$name" <<'PY'
import gzip, json, os, sys
src, dst = sys.argv[1:3]
graph = json.load(open(os.path.join(src, "llm.mnn.json")))
for op in graph["oplists"]:
    main = op.get("main")
    if op["type"] == "Convolution":
        main.pop("quanParameter", None)
        main.pop("external", None)
    elif op["type"] == "LayerNorm":
        for key in ("external", "gamma", "beta"):
            main.pop(key, None)
with gzip.GzipFile(os.path.join(dst, "llm.mnn.json.gz"), "wb", compresslevel=9, mtime=0) as f:
    f.write(json.dumps(graph, indent=1).encode())
llm_config = json.load(open(os.path.join(src, "llm_config.json")))
llm_config.pop("tie_embeddings", None)  # gguf2mnn.py writes the GGUF's
json.dump(llm_config, open(os.path.join(dst, "llm_config.json"), "w"), indent=4)
config = json.load(open(os.path.join(src, "config.json")))
config["tokenizer_file"] = "tokenizer.txt"  # gguf2mnn.py --load_token writes it from the GGUF
json.dump(config, open(os.path.join(dst, "config.json"), "w"), indent=4)
PY
echo "wrote $here/model/$name"
