#!/usr/bin/env python3
"""Tiny random-weight GGUF models of several llama.cpp architectures, for kvc_arch_test.

Every kvc quality number so far comes from one model (SmolLM2-135M: head size 64, 3 KV heads,
full attention). These models exercise what that one does not: other head sizes (96, 128,
256), grouped-query attention from group 1 to group 16, Q/K/V biases, Q/K norms, and
sliding-window layers (gemma3, llama.cpp's iSWA cache with two caches). They are made at test
time (nothing is checked in), deterministically (numpy's PCG64 seeded per model), and are a few
MB each.

The weights are random, so the models say nothing about language; they are for checking that
kvc's cache types are wired to the right heads, head sizes and layers of each architecture,
which random weights show as well as trained ones (attention outputs of different heads and
positions differ).

Vocabulary: tokenizer model "none" with `<arch>.vocab_size` dummy tokens (llama-vocab.cpp,
LLAMA_VOCAB_TYPE_NONE): the test feeds token ids, it never tokenizes text. With
--tokenizer-from GGUF the tokenizer.* metadata of that model is copied instead (read with
gguf.GGUFReader), so that programs which tokenize text (kvc_llama_eval) can run the model; the
embedding and output tables then have that vocabulary's size (SmolLM2's 49152: ~25 MB more).

Key and tensor names are llama.cpp's (src/llama-arch.cpp: LLM_KV_NAMES, LLM_TENSOR_NAMES) and
what each architecture's loader asks for (src/models/<arch>.cpp, load_arch_hparams /
load_arch_tensors) in the llama.cpp version kvc's patch series is made for (0.1.161).

Usage: make_models.py OUT_DIR [--only NAME[,NAME...]] [--tokenizer-from GGUF] [--list]
Writes OUT_DIR/<name>.gguf and prints one line per model: name, file, bytes, head sizes.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - reported, not raised
    sys.exit("make_models.py: the python package 'gguf' is needed (pip install gguf)")


@dataclass
class Spec:
    """One test model. head_k/head_v: the per-head K and V sizes (attention.key_length /
    value_length, written only when they differ from n_embd / n_head, as converters do)."""

    name: str
    arch: str
    n_embd: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_layer: int
    n_ff: int
    seed: int
    n_vocab: int = 256
    n_ctx_train: int = 4096
    rope_base: float = 10000.0
    qkv_bias: bool = False  # qwen2: Q/K/V biases
    qk_norm: bool = False  # qwen3, gemma3: RMS norm of each Q and K head
    fused_qkv: bool = False  # phi3: one attn_qkv matrix
    swa: int = 0  # gemma3: sliding window (tokens); 0: none
    swa_pattern: int = 0  # gemma3: every n-th layer is full attention (llama_hparams::set_swa_pattern)
    note: str = ""
    extra: dict = field(default_factory=dict)


# The models. Sizes are chosen so that the head size and GQA group are the real ones of the
# architecture's small members, with few layers and a narrow embedding.
SPECS = [
    # llama, head size 128 (Llama 3 8B's), GQA group 4 (its 32 query / 8 KV heads)
    Spec("llama-h128-g4", "llama", n_embd=512, n_head=4, n_head_kv=1, head_k=128, head_v=128,
         n_layer=2, n_ff=512, seed=101, rope_base=500000.0,
         note="llama, head 128, GQA group 4"),
    # llama with 16 query heads on one KV head (group 16, the fused kernel's largest group), head 64:
    # key_length 64 != n_embd / n_head (16), as Q is projected up to 16 * 64
    Spec("llama-h64-g16", "llama", n_embd=256, n_head=16, n_head_kv=1, head_k=64, head_v=64,
         n_layer=2, n_ff=512, seed=102, note="llama, head 64, GQA group 16, key_length != n_embd/n_head"),
    # llama without GQA (group 1: the kvq flash-attention kernel's one-head path), head 64
    Spec("llama-h64-g1", "llama", n_embd=256, n_head=4, n_head_kv=4, head_k=64, head_v=64,
         n_layer=2, n_ff=512, seed=108, note="llama, head 64, GQA group 1 (MHA)"),
    # qwen2: Q/K/V biases (Qwen2.5-0.5B: head 64, 14 query / 2 KV heads); head = n_embd / n_head
    Spec("qwen2-h64-g2-bias", "qwen2", n_embd=256, n_head=4, n_head_kv=2, head_k=64, head_v=64,
         n_layer=2, n_ff=512, seed=103, rope_base=1000000.0, qkv_bias=True,
         note="qwen2, head 64, GQA group 2, Q/K/V bias"),
    # qwen3: Q/K RMS norms, head 128 with n_embd / n_head = 64 (Qwen3-0.6B: 1024 / 16 heads of 128)
    Spec("qwen3-h128-g2-qknorm", "qwen3", n_embd=256, n_head=4, n_head_kv=2, head_k=128, head_v=128,
         n_layer=2, n_ff=512, seed=104, rope_base=1000000.0, qk_norm=True,
         note="qwen3, head 128 (key_length != n_embd/n_head), GQA group 2, Q/K norm"),
    # gemma3: iSWA (sliding-window layers in their own cache), key_length 256 != n_embd / n_head
    # (gemma3-270m: 640 / 4 heads of 256, 1 KV head); window 32, every 2nd layer full
    Spec("gemma3-h256-g4-swa", "gemma3", n_embd=256, n_head=4, n_head_kv=1, head_k=256, head_v=256,
         n_layer=4, n_ff=512, seed=105, rope_base=1000000.0, qk_norm=True, swa=32, swa_pattern=2,
         note="gemma3, head 256, GQA group 4, iSWA window 32 (layers 0, 2 sliding)"),
    # the same architecture at head 128, so that iSWA meets a head size that has kvq types today
    Spec("gemma3-h128-g2-swa", "gemma3", n_embd=256, n_head=4, n_head_kv=2, head_k=128, head_v=128,
         n_layer=4, n_ff=512, seed=106, rope_base=1000000.0, qk_norm=True, swa=32, swa_pattern=2,
         note="gemma3, head 128, GQA group 2, iSWA window 32 (layers 0, 2 sliding)"),
    # phi3: fused QKV, head 96 (Phi-3-mini's: 3072 / 32), no GQA (group 1)
    Spec("phi3-h96-g1", "phi3", n_embd=384, n_head=4, n_head_kv=4, head_k=96, head_v=96,
         n_layer=2, n_ff=512, seed=107, fused_qkv=True,
         note="phi3, head 96 (not a power of two), GQA group 1 (MHA), fused QKV"),
]


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)


def _mat(rng: np.random.Generator, n_out: int, n_in: int) -> np.ndarray:
    """A weight of ggml shape {n_in, n_out} (numpy (n_out, n_in)), f16, variance 1/n_in so that
    a unit-variance input gives unit-variance outputs."""
    return _f16(rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in))


def _norm(rng: np.random.Generator, n: int, gemma: bool = False) -> np.ndarray:
    # RMS norm weights near 1 (llama.cpp's gemma converter already folds the +1 in), varied a
    # little so that each channel is scaled differently
    del gemma
    return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


def read_tokenizer(path: str) -> list[tuple[str, object, "gguf.GGUFValueType", "gguf.GGUFValueType | None"]]:
    """The tokenizer.* key-value pairs of a GGUF file, as (key, value, type, element type)."""
    r = gguf.GGUFReader(path)
    out = []
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        out.append((key, f.contents(), vtype, sub))
    if not any(k == "tokenizer.ggml.tokens" for k, _, _, _ in out):
        raise SystemExit(f"make_models.py: '{path}' has no tokenizer.ggml.tokens")
    return out


def write_model(spec: Spec, path: str, tokenizer: list | None = None) -> int:
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    a = spec.arch
    if tokenizer is not None:
        spec = Spec(**{**spec.__dict__, "n_vocab": len(next(v for k, v, _, _ in tokenizer if k == "tokenizer.ggml.tokens"))})
    w = gguf.GGUFWriter(path, a)
    w.add_name(spec.name)
    w.add_uint32(f"{a}.vocab_size", spec.n_vocab)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(spec.rope_base)
    default_head = spec.n_embd // spec.n_head
    if spec.head_k != default_head or spec.head_v != default_head:
        w.add_key_length(spec.head_k)
        w.add_value_length(spec.head_v)
    w.add_rope_dimension_count(spec.head_k)
    if spec.swa:
        w.add_uint32(f"{a}.attention.sliding_window", spec.swa)
        w.add_uint32(f"{a}.attention.sliding_window_pattern", spec.swa_pattern)
        w.add_float32(f"{a}.rope.freq_base_swa", 10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if tokenizer is None:
        # no tokenizer: dummy tokens (llama-vocab.cpp: "none" reads <arch>.vocab_size)
        w.add_tokenizer_model("none")
    else:
        for key, val, vtype, sub in tokenizer:
            w.add_key_value(key, val, vtype, sub_type=sub)

    E, V, F = spec.n_embd, spec.n_vocab, spec.n_ff
    q_dim = spec.n_head * spec.head_k
    k_dim = spec.n_head_kv * spec.head_k
    v_dim = spec.n_head_kv * spec.head_v
    o_in = spec.n_head * spec.head_v

    # embeddings of unit variance per element; gemma scales its input by sqrt(n_embd) itself
    emb = rng.standard_normal((V, E), dtype=np.float32)
    if a == "gemma3":
        emb /= np.sqrt(E)
    w.add_tensor("token_embd.weight", _f16(emb))
    w.add_tensor("output_norm.weight", _norm(rng, E))
    w.add_tensor("output.weight", _mat(rng, V, E))
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", _norm(rng, E))
        if spec.fused_qkv:
            w.add_tensor(p + "attn_qkv.weight", _mat(rng, q_dim + k_dim + v_dim, E))
        else:
            w.add_tensor(p + "attn_q.weight", _mat(rng, q_dim, E))
            w.add_tensor(p + "attn_k.weight", _mat(rng, k_dim, E))
            w.add_tensor(p + "attn_v.weight", _mat(rng, v_dim, E))
        if spec.qkv_bias:
            for t, n in (("attn_q", q_dim), ("attn_k", k_dim), ("attn_v", v_dim)):
                w.add_tensor(p + t + ".bias", (0.5 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32))
        if spec.qk_norm:
            w.add_tensor(p + "attn_q_norm.weight", _norm(rng, spec.head_k))
            w.add_tensor(p + "attn_k_norm.weight", _norm(rng, spec.head_k))
        w.add_tensor(p + "attn_output.weight", _mat(rng, E, o_in))
        if a == "gemma3":
            w.add_tensor(p + "post_attention_norm.weight", _norm(rng, E))
            w.add_tensor(p + "post_ffw_norm.weight", _norm(rng, E))
        w.add_tensor(p + "ffn_norm.weight", _norm(rng, E))
        if a == "phi3":
            # phi3's ffn_up holds gate and up ({n_embd, 2 n_ff}), no ffn_gate
            w.add_tensor(p + "ffn_up.weight", _mat(rng, 2 * F, E))
        else:
            w.add_tensor(p + "ffn_gate.weight", _mat(rng, F, E))
            w.add_tensor(p + "ffn_up.weight", _mat(rng, F, E))
        w.add_tensor(p + "ffn_down.weight", _mat(rng, E, F))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.path.getsize(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--list", action="store_true", help="print the models' names and what each is for")
    ap.add_argument("--tokenizer-from", default="", help="copy the tokenizer.* metadata of this GGUF")
    args = ap.parse_args()
    if args.list:
        for s in SPECS:
            print(f"{s.name}\t{s.note}")
        return 0
    if not args.out_dir:
        ap.error("OUT_DIR is required")
    names = {s.name for s in SPECS}
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only if n not in names]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    tokenizer = read_tokenizer(args.tokenizer_from) if args.tokenizer_from else None
    os.makedirs(args.out_dir, exist_ok=True)
    for s in SPECS:
        if only and s.name not in only:
            continue
        path = os.path.join(args.out_dir, s.name + ".gguf")
        size = write_model(s, path, tokenizer)
        print(f"{s.name}\t{path}\t{size}\thead_k={s.head_k}\thead_v={s.head_v}\t"
              f"heads={s.n_head}/{s.n_head_kv}\tlayers={s.n_layer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
