"""SmolLM2-135M (llama.cpp's GGUF) in JAX: weights, tokenizer, the full forward and the
forward with kvc-mlp's prefix compression in every layer.

Weights: the GGUF's tensors dequantized to f32 by the `gguf` package (Q4_1, Q8_0 and F32 as
stored; nothing is requantized). The layout is llama.cpp's, not Hugging Face's: the GGUF
converter permutes the rows of attn_q and attn_k so that llama.cpp's NORM RoPE (rotating
adjacent pairs (2i, 2i+1)) on them equals HF's rotate-half on the originals, and the K that
kvc-mlp compresses is the K llama.cpp caches. So this forward uses the GGUF rows as they are
with NORM RoPE, exactly as llama.cpp runs the `llama` architecture, and its K and Q are
checked against the client's dumps (verify.py).
"""

from __future__ import annotations

import json
import os

import numpy as np

import jax
import jax.numpy as jnp


class Config:
    def __init__(self, md: dict):
        a = md["general.architecture"]
        if a != "llama":
            raise ValueError(f"architecture {a!r}: this forward is llama's")
        self.n_layer = int(md["llama.block_count"])
        self.n_embd = int(md["llama.embedding_length"])
        self.n_ff = int(md["llama.feed_forward_length"])
        self.n_head = int(md["llama.attention.head_count"])
        self.n_head_kv = int(md["llama.attention.head_count_kv"])
        self.rope_base = float(md["llama.rope.freq_base"])
        self.eps = float(md["llama.attention.layer_norm_rms_epsilon"])
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = int(md.get("llama.rope.dimension_count", self.head_dim))
        if self.n_rot != self.head_dim:
            raise ValueError(f"rope dimension {self.n_rot} != head_dim {self.head_dim}: not handled")
        if "llama.rope.scaling.type" in md:
            raise ValueError("rope scaling is not handled")

    def as_dict(self):
        return dict(self.__dict__)


def _field(f):
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 - arrays of strings etc. are not needed here
        return None


def load_gguf_meta(path: str):
    """(Config, metadata, None, reader) without dequantizing anything (for the tokenizer)."""
    import gguf

    r = gguf.GGUFReader(path)
    md = {k: _field(f) for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    return Config(md), md, None, r


def load_gguf(path: str):
    """(Config, metadata, dict of f32 numpy arrays in llama.cpp's [out, in] row order, reader)."""
    import gguf  # the pinned PyPI package (requirements.txt)

    r = gguf.GGUFReader(path)
    md = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.ggml.") and k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                                     "tokenizer.ggml.token_type"):
            continue
        md[k] = _field(f)
    cfg = Config(md)
    w = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        # gguf gives numpy's row-major shape (ne[1], ne[0]): [out, in] for a weight matrix
        w[t.name] = np.ascontiguousarray(a, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
    return cfg, md, w, r


def stack_layers(cfg: Config, w: dict):
    """The frozen model as JAX arrays: per-layer tensors stacked on a leading layer axis."""
    names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
    layers = {n: jnp.asarray(np.stack([w[f"blk.{i}.{n}.weight"] for i in range(cfg.n_layer)])) for n in names}
    emb = jnp.asarray(w["token_embd.weight"])  # [vocab, n_embd]
    out = jnp.asarray(w["output.weight"]) if "output.weight" in w else emb  # tied when absent
    return {"layers": layers, "tok_embd": emb, "output_norm": jnp.asarray(w["output_norm.weight"]), "output": out}


def tokenizer_from_gguf(reader):
    """llama.cpp's tokenizer of this GGUF (gpt2 BPE, pre-tokenizer `smollm`) as a HF
    `tokenizers` object: byte-level BPE over the GGUF's vocab and merges, digits split one by
    one (the `smollm` pre-tokenizer: \\p{N} first, then GPT-2's regex). Proven against
    llama.cpp by the K match of verify.py (a different id anywhere shifts every K after it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    f = reader.fields
    model = bytes(f["tokenizer.ggml.model"].parts[-1]).decode()
    pre = bytes(f["tokenizer.ggml.pre"].parts[-1]).decode()
    if model != "gpt2" or pre != "smollm":
        raise ValueError(f"tokenizer {model}/{pre}: only gpt2/smollm is rebuilt here")
    toks = f["tokenizer.ggml.tokens"].contents()
    merges = f["tokenizer.ggml.merges"].contents()
    vocab = {t: i for i, t in enumerate(toks)}
    merges = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    return tk


# ------------------------------------------------------------------------------------------
# forward

def rms_norm(x, g, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope_norm(x, pos, base):
    """llama.cpp's LLAMA_ROPE_TYPE_NORM: rotate adjacent pairs (x[2i], x[2i+1]) by
    pos * base^(-2i/d). x: [..., T, H, D], pos: [T]."""
    d = x.shape[-1]
    inv = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    ang = pos.astype(jnp.float32)[:, None] * inv[None, :]  # [T, D/2]
    c = jnp.cos(ang)[:, None, :]
    s = jnp.sin(ang)[:, None, :]
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    y0 = x0 * c - x1 * s
    y1 = x0 * s + x1 * c
    return jnp.stack([y0, y1], axis=-1).reshape(x.shape)


def qkv(cfg, L, x, pos):
    """x: [B, T, E] -> post-RoPE q [B,T,Hq,D], k [B,T,Hkv,D], v [B,T,Hkv,D]."""
    B, T, _ = x.shape
    h = rms_norm(x, L["attn_norm"], cfg.eps)
    q = (h @ L["attn_q"].T).reshape(B, T, cfg.n_head, cfg.head_dim)
    k = (h @ L["attn_k"].T).reshape(B, T, cfg.n_head_kv, cfg.head_dim)
    v = (h @ L["attn_v"].T).reshape(B, T, cfg.n_head_kv, cfg.head_dim)
    return rope_norm(q, pos, cfg.rope_base), rope_norm(k, pos, cfg.rope_base), v


def attend(cfg, q, k, v, mask):
    """q [B,Tq,Hq,D], k/v [B,S,Hkv,D], mask [Tq,S] (True: may attend). GQA: query head g
    reads KV head g // (Hq / Hkv), as llama.cpp."""
    B, Tq, Hq, D = q.shape
    rep = Hq // cfg.n_head_kv
    qg = q.reshape(B, Tq, cfg.n_head_kv, rep, D)
    s = jnp.einsum("bqhrd,bshd->bhrqs", qg, k) / np.sqrt(D)
    s = jnp.where(mask[None, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bhrqs,bshd->bqhrd", p, v)
    return o.reshape(B, Tq, Hq * D)


def ffn(cfg, L, x):
    h = rms_norm(x, L["ffn_norm"], cfg.eps)
    return (jax.nn.silu(h @ L["ffn_gate"].T) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T


def logits_of(cfg, M, x):
    return rms_norm(x, M["output_norm"], cfg.eps) @ M["output"].T


def forward_full(cfg, M, tokens, return_qkv=False, logits_from=0):
    """Full causal attention over tokens [B, T] at positions 0..T-1: logits [B,T-logits_from,V]
    (of positions logits_from..T-1) and
    per layer post-RoPE K, V [L,B,T,Hkv,D] (and Q [L,B,T,Hq,D] when asked)."""
    B, T = tokens.shape
    pos = jnp.arange(T)
    mask = jnp.tril(jnp.ones((T, T), bool))
    x = M["tok_embd"][tokens]

    def layer(x, L):
        q, k, v = qkv(cfg, L, x, pos)
        x = x + attend(cfg, q, k, v, mask) @ L["attn_output"].T
        x = x + ffn(cfg, L, x)
        return x, ((k, v, q) if return_qkv else (k, v))

    x, kv = jax.lax.scan(layer, x, M["layers"])
    return logits_of(cfg, M, x[:, logits_from:]), kv


# ------------------------------------------------------------------------------------------
# the compressor (kvc-mlp's structure) and the student forward

def mlp_apply(p, x):
    """Linear(F*D -> D), ReLU, Linear(D -> D), ReLU, Linear(D -> D); weights [out, in] as
    .bin v1 stores them. x: [..., F*D]."""
    h = jax.nn.relu(x @ p["w0"].T + p["b0"])
    h = jax.nn.relu(h @ p["w1"].T + p["b1"])
    return h @ p["w2"].T + p["b2"]


def compress_span(p, x, start, groups, factor):
    """kvc-mlp's grouping: x [B, S, H, D] post-RoPE rows of one layer; the groups of `factor`
    consecutive tokens of one head from `start` on, each the token-major concatenation
    [t0 d0..d(D-1), t1 d0.., ...] (kvc's [heads, tokens, head_dim] layout read F*D at a time)
    -> [B, groups, H, D]."""
    B, _, H, D = x.shape
    seg = x[:, start:start + groups * factor]  # [B, G*F, H, D]
    seg = seg.reshape(B, groups, factor, H, D).transpose(0, 1, 3, 2, 4).reshape(B, groups, H, factor * D)
    return mlp_apply(p, seg)


def plan(P, sink, keep, factor):
    """How a prefix of P tokens is compressed: (groups, start of the uncompressed rest).
    [0, sink) stays, [sink, sink + groups*F) becomes groups cells, [rest, P) stays; at least
    `keep` tokens of the prefix's tail stay uncompressed, as the client's --recent."""
    groups = max(0, (P - keep - sink) // factor)
    return groups, sink + groups * factor


def forward_student(cfg, M, C, tokens, kv_prefix, P, sink, keep, factor, teacher_qkv=None):
    """Tokens [B, T]: the prefix [0, P) was prefilled with full attention (its K, V per layer
    are kv_prefix = ([L,B,P,Hkv,D], [L,B,P,Hkv,D])); in every layer [sink, P - keep) is
    compressed in whole groups by that layer's K and V MLPs (C: stacked params), and the
    tokens [P, T) run through the model at their true positions, attending to the sink, the
    compressed cells (never re-rotated), the uncompressed rest of the prefix and causally to
    themselves. Returns logits [B, T-P, V].

    With teacher_qkv = (q, k, v) of the teacher at [P, T) per layer ([L,B,T-P,H,D]), it also
    returns the layer-local loss of the Rust trainer per layer [L]: the teacher's queries
    attending to the compressed cache against the full one, sum |o' - o|^2 / sum |o|^2."""
    B, T = tokens.shape
    Tq = T - P
    groups, rest = plan(P, sink, keep, factor)
    S = sink + groups + (P - rest)
    pos = jnp.arange(P, T)
    mask = jnp.concatenate([jnp.ones((Tq, S), bool), jnp.tril(jnp.ones((Tq, Tq), bool))], axis=1)
    x = M["tok_embd"][tokens[:, P:]]

    full_mask = jnp.concatenate([jnp.ones((Tq, P), bool), jnp.tril(jnp.ones((Tq, Tq), bool))], axis=1)

    def layer(x, inp):
        L, ck, cv, kp, vp = inp[:5]
        kc = jnp.concatenate([kp[:, :sink], compress_span(ck, kp, sink, groups, factor), kp[:, rest:P]], axis=1)
        vc = jnp.concatenate([vp[:, :sink], compress_span(cv, vp, sink, groups, factor), vp[:, rest:P]], axis=1)
        q, k, v = qkv(cfg, L, x, pos)
        a = attend(cfg, q, jnp.concatenate([kc, k], 1), jnp.concatenate([vc, v], 1), mask)
        x = x + a @ L["attn_output"].T
        x = x + ffn(cfg, L, x)
        if teacher_qkv is None:
            return x, None
        qt, kt, vt = inp[5:]
        oc = attend(cfg, qt, jnp.concatenate([kc, kt], 1), jnp.concatenate([vc, vt], 1), mask)
        of = attend(cfg, qt, jnp.concatenate([kp, kt], 1), jnp.concatenate([vp, vt], 1), full_mask)
        return x, jnp.sum((oc - of) ** 2) / jnp.sum(of ** 2)

    xs = (M["layers"], C["k"], C["v"], kv_prefix[0], kv_prefix[1])
    if teacher_qkv is not None:
        xs = xs + tuple(teacher_qkv)
    x, local = jax.lax.scan(layer, x, xs)
    if teacher_qkv is None:
        return logits_of(cfg, M, x)
    return logits_of(cfg, M, x), local


def kl_teacher_student(t_logits, s_logits):
    """Mean over positions of KL(teacher || student) of next-token distributions (nats)."""
    lt = jax.nn.log_softmax(t_logits, -1)
    ls = jax.nn.log_softmax(s_logits, -1)
    return jnp.mean(jnp.sum(jnp.exp(lt) * (lt - ls), -1))


def jax_setup():
    """f32 matmuls at full precision (TF32 on an H100 would add noise of the size of the KL
    we try to remove)."""
    jax.config.update("jax_default_matmul_precision", os.environ.get("KVC_DISTILL_PRECISION", "highest"))


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
