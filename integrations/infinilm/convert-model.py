#!/usr/bin/env python3
"""Convert a llama-architecture GGUF (such as SmolLM2-135M-Instruct Q4_1) into the Hugging
Face model folder that InfiniLM's C++ engine loads, and tokenize texts for its client.

usage: convert-model.py GGUF OUT_DIR [--text NAME=PATH ...] [--check N]

Writes into OUT_DIR:
  config.json        LlamaConfig keys read from the GGUF's metadata
  model.safetensors  every tensor dequantized to float32 under its Hugging Face name, with
                     llama.cpp's Q/K row permutation undone; lm_head.weight is written even
                     when the embeddings are tied (InfiniLM always creates its own lm_head)
  tokenizer.json     GPT-2 byte-level BPE built from the GGUF's tokens and merges
  NAME.ids           for each --text: the text's token ids, one per line, without BOS
--check N runs the converted float32 model in numpy on the first N ids of the first --text
(BOS prepended when the GGUF asks for it) and prints the mean NLL and perplexity; a wrong
Q/K un-permutation shows up as a perplexity in the hundreds (27.8 right, 181 and 569 wrong,
on SmolLM2-135M-Instruct and 64 ids of the GPL).

Exit status: 0 on success, 2 on an unsupported or malformed input.
Depends on numpy and the PyPI packages gguf and tokenizers (no torch, no safetensors).
"""
import argparse
import json
import os
import sys

import numpy as np
from gguf import GGUFReader, TokenType
from gguf.quants import dequantize
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

# llama.cpp pre-tokenizer types handled here -> whether digits are split one by one before
# the GPT-2 regex (llama-vocab.cpp gives these types the regexes "\p{N}" then GPT-2's).
PRE_TOKENIZER_SPLITS_DIGITS = {
    "gpt2": False,
    "smollm": True,
    "starcoder": True,
    "refact": True,
    "command-r": True,
    "codeshell": True,
    "exaone": True,
    "minerva": True,
}

LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
MODEL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


class ConvertError(Exception):
    """An input this script cannot convert."""


_REQUIRED = object()


def meta(reader, key, default=_REQUIRED):
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise ConvertError(f"GGUF metadata lacks {key}")
        return default
    return field.contents()


# ---------------------------------------------------------------- config.json

def make_config(reader):
    arch = meta(reader, "general.architecture")
    if arch != "llama":
        raise ConvertError(f"general.architecture is {arch!r}; only 'llama' is supported")
    hidden = meta(reader, "llama.embedding_length")
    heads = meta(reader, "llama.attention.head_count")
    head_dim = meta(reader, "llama.attention.key_length", hidden // heads)
    rope_dim = meta(reader, "llama.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise ConvertError(f"partial RoPE ({rope_dim} of {head_dim} dims) is not supported")
    tensor_names = {t.name for t in reader.tensors}
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": len(meta(reader, "tokenizer.ggml.tokens")),
        "hidden_size": hidden,
        "intermediate_size": meta(reader, "llama.feed_forward_length"),
        "num_hidden_layers": meta(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta(reader, "llama.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "max_position_embeddings": meta(reader, "llama.context_length"),
        "rope_theta": meta(reader, "llama.rope.freq_base", 10000.0),
        "rms_norm_eps": meta(reader, "llama.attention.layer_norm_rms_epsilon"),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }


# ---------------------------------------------------------------- model.safetensors

def hf_name(gguf_name):
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.{suffix}"
    if base in MODEL_TENSORS:
        return f"{MODEL_TENSORS[base]}.{suffix}"
    raise ConvertError(f"no Hugging Face name for GGUF tensor {gguf_name}")


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf.py's permute(w, n_head, n_head_kv)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_tensor(t):
    """The GGUF tensor as float32 in Hugging Face shape (GGUF lists dims innermost first)."""
    data = dequantize(t.data, t.tensor_type)
    return np.ascontiguousarray(data.reshape([int(n) for n in reversed(t.shape)]), dtype="<f4")


def load_weights(reader, config):
    weights = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        w = load_tensor(t)
        if name.endswith("self_attn.q_proj.weight"):
            w = unpermute(w, config["num_attention_heads"])
        elif name.endswith("self_attn.k_proj.weight"):
            w = unpermute(w, config["num_key_value_heads"])
        weights[name] = w
    if config["tie_word_embeddings"]:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].copy()
    return weights


def safetensors_header(weights):
    header, offset = {}, 0
    for name, w in weights.items():
        header[name] = {"dtype": "F32", "shape": list(w.shape), "data_offsets": [offset, offset + w.nbytes]}
        offset += w.nbytes
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)


def write_safetensors(f, weights):
    header = safetensors_header(weights)
    f.write(len(header).to_bytes(8, "little"))
    f.write(header)
    for w in weights.values():
        f.write(w.tobytes())


# ---------------------------------------------------------------- tokenizer

def make_tokenizer(reader):
    kind, pre = meta(reader, "tokenizer.ggml.model"), meta(reader, "tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2" or pre not in PRE_TOKENIZER_SPLITS_DIGITS:
        raise ConvertError(f"tokenizer {kind!r} with pre-tokenizer {pre!r} is not supported")
    tokens = meta(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in meta(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if PRE_TOKENIZER_SPLITS_DIGITS[pre]:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    types = meta(reader, "tokenizer.ggml.token_type")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == TokenType.CONTROL])
    return tok


def read_text(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def tokenize(tok, path):
    return tok.encode(read_text(path), add_special_tokens=False).ids


# ---------------------------------------------------------------- numpy forward check

def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_tables(n_pos, head_dim, theta):
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(n_pos), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(h, w, prefix, config, cos, sin):
    n_pos, hd = h.shape[0], config["head_dim"]
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]

    def heads(proj, n):
        return (h @ w[f"{prefix}self_attn.{proj}.weight"].T).reshape(n_pos, n, hd).transpose(1, 0, 2)

    q, k, v = heads("q_proj", n_head), heads("k_proj", n_kv), heads("v_proj", n_kv)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = np.repeat(k, n_head // n_kv, axis=0), np.repeat(v, n_head // n_kv, axis=0)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
    scores += np.triu(np.full((n_pos, n_pos), -np.inf, dtype=np.float32), 1)
    out = (softmax(scores) @ v).transpose(1, 0, 2).reshape(n_pos, n_head * hd)
    return out @ w[f"{prefix}self_attn.o_proj.weight"].T


def mlp(h, w, prefix):
    gate = h @ w[f"{prefix}mlp.gate_proj.weight"].T
    up = h @ w[f"{prefix}mlp.up_proj.weight"].T
    return (gate / (1.0 + np.exp(-gate)) * up) @ w[f"{prefix}mlp.down_proj.weight"].T


def forward(w, config, ids):
    eps = config["rms_norm_eps"]
    cos, sin = rope_tables(len(ids), config["head_dim"], config["rope_theta"])
    x = w["model.embed_tokens.weight"][ids]
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        x = x + attention(rms_norm(x, w[prefix + "input_layernorm.weight"], eps), w, prefix, config, cos, sin)
        x = x + mlp(rms_norm(x, w[prefix + "post_attention_layernorm.weight"], eps), w, prefix)
    return rms_norm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def mean_nll(logits, targets):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -log_probs[np.arange(len(targets)), targets].mean()


def check(weights, config, ids, add_bos):
    ids = ([config["bos_token_id"]] if add_bos else []) + ids
    nll = mean_nll(forward(weights, config, np.array(ids))[:-1], np.array(ids[1:]))
    return nll, len(ids) - 1


# ---------------------------------------------------------------- driver

def write_atomic(path, mode, write):
    tmp = path + ".tmp"
    with open(tmp, mode) as f:
        write(f)
    os.replace(tmp, path)


def text_arg(value):
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {value!r}")
    return name, path


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--text", type=text_arg, action="append", default=[], metavar="NAME=PATH",
                    help="tokenize PATH into OUT_DIR/NAME.ids (repeatable)")
    ap.add_argument("--check", type=int, metavar="N",
                    help="print the converted model's perplexity over the first N ids of the first --text")
    args = ap.parse_args()
    if args.check is not None and (not args.text or args.check < 2):
        ap.error("--check N needs N >= 2 and a --text")
    return args


def convert(args):
    reader = GGUFReader(args.gguf)
    config = make_config(reader)
    tok = make_tokenizer(reader)
    weights = load_weights(reader, config)
    os.makedirs(args.out_dir, exist_ok=True)
    out = lambda name: os.path.join(args.out_dir, name)
    write_atomic(out("config.json"), "w", lambda f: f.write(json.dumps(config, indent=2) + "\n"))
    write_atomic(out("model.safetensors"), "wb", lambda f: write_safetensors(f, weights))
    write_atomic(out("tokenizer.json"), "w", lambda f: f.write(tok.to_str(pretty=True)))
    print(f"wrote {args.out_dir}: config.json, model.safetensors ({len(weights)} tensors), tokenizer.json")
    texts = {}
    for name, path in args.text:
        texts[name] = tokenize(tok, path)
        write_atomic(out(f"{name}.ids"), "w", lambda f: f.write("".join(f"{i}\n" for i in texts[name])))
        print(f"wrote {name}.ids: {len(texts[name])} ids")
    if args.check is not None:
        name = args.text[0][0]
        add_bos = bool(meta(reader, "tokenizer.ggml.add_bos_token", False))
        nll, n = check(weights, config, texts[name][:args.check], add_bos)
        print(f"check: {name}, first {args.check} ids (BOS {'prepended' if add_bos else 'not added'}), "
              f"{n} predictions: mean NLL {nll:.4f}, PPL {np.exp(nll):.3f}")


def main():
    args = parse_args()
    try:
        convert(args)
    except ConvertError as e:
        print(f"convert-model.py: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
