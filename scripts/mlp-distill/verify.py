"""Checks the JAX forward (smollm.py) against llama.cpp.

  python3 scripts/mlp-distill/verify.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
      --dump /tmp/calib/textA --text /usr/share/common-licenses/Apache-2.0 [--tokens 1024]

The dump is the client's `--modes dump` output (TAG.K.f32.bin, TAG.Q.f32.bin and their JSON
sidecars: post-RoPE K and Q per layer of the first N tokens, no BOS). The text is tokenized
with the GGUF's tokenizer (smollm.tokenizer_from_gguf), run through the forward, and per layer
the relative error |K_jax - K_llama| / |K_llama| (Frobenius) is printed, K and Q. Any wrong
token id or a wrong RoPE/permutation shows as errors of order 1; llama.cpp's own noise
(activations quantized to 8 bits before every Q4_1 matmul) is of order 1e-2. Then the PPL of
positions [ppl_from, N) (targets), to compare with the client's `--modes full` run.
"""

import argparse
import json
import sys

import numpy as np

import smollm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--dump", required=True, help="path prefix of the dump, e.g. /tmp/calib/textA")
    ap.add_argument("--text", required=True)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--ppl-from", type=int, default=513)
    ap.add_argument("--max-rel", type=float, default=0.05, help="fail when a layer's K or Q error is above")
    ap.add_argument("--json", help="write the per-layer errors and the PPL here")
    a = ap.parse_args()
    smollm.jax_setup()
    import jax.numpy as jnp

    cfg, md, w, reader = smollm.load_gguf(a.gguf)
    tk = smollm.tokenizer_from_gguf(reader)
    with open(a.text, encoding="utf-8") as f:
        ids = tk.encode(f.read()).ids
    n = a.tokens
    if len(ids) < n:
        sys.exit(f"{a.text}: {len(ids)} tokens, fewer than {n}")
    ids = np.asarray(ids[:n], np.int32)
    M = smollm.stack_layers(cfg, w)
    logits, (K, V, Q) = smollm.forward_full(cfg, M, jnp.asarray(ids)[None], return_qkv=True)
    K = np.asarray(K[:, 0])  # [L, T, Hkv, D]
    Q = np.asarray(Q[:, 0])
    out = {"tokens": n, "text": a.text, "layers": []}
    worst = 0.0
    for name, mine in (("K", K), ("Q", Q)):
        side = json.load(open(f"{a.dump}.{name}.f32.json"))
        shape = side["shape"]
        ref = np.fromfile(f"{a.dump}.{name}.f32.bin", dtype="<f4").reshape(shape)
        t = min(n, shape[1])
        for l in range(cfg.n_layer):
            r = ref[l, :t]
            m = mine[l, :t]
            rel = float(np.linalg.norm(m - r) / np.linalg.norm(r))
            # per-token worst, to see drift along the sequence
            tok = np.linalg.norm((m - r).reshape(t, -1), axis=1) / np.linalg.norm(r.reshape(t, -1), axis=1)
            worst = max(worst, rel)
            print(f"{name} layer {l:2d}: rel err {rel:.4f}  (worst token {tok.max():.4f} at {int(tok.argmax())})")
            out["layers"].append({"tensor": name, "layer": l, "rel_err": rel, "worst_token_rel_err": float(tok.max())})
    lg = np.asarray(logits[0], np.float64)
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    nll = lse[:-1] - lg[np.arange(n - 1), ids[1:]]  # nll[t-1]: target position t
    sel = nll[a.ppl_from - 1:]
    ppl = float(np.exp(sel.mean()))
    print(f"PPL over target positions {a.ppl_from}..{n - 1} ({sel.size} predictions): {ppl:.4f}")
    print(f"worst per-layer relative error (K and Q): {worst:.4f}")
    # the student's path (prefix K/V from the teacher, suffix run alone at its true positions)
    # with nothing to compress must give the teacher's logits
    P, T = n // 2, min(n, n // 2 + 64)
    toks = jnp.asarray(ids[:T])[None]
    t_logits, (Kp, Vp) = smollm.forward_full(cfg, M, toks, logits_from=P)
    C = {kv: {k: jnp.zeros((cfg.n_layer,) + x.shape) for k, x in
              (("w0", np.zeros((cfg.head_dim, 2 * cfg.head_dim))), ("b0", np.zeros(cfg.head_dim)),
               ("w1", np.zeros((cfg.head_dim, cfg.head_dim))), ("b1", np.zeros(cfg.head_dim)),
               ("w2", np.zeros((cfg.head_dim, cfg.head_dim))), ("b2", np.zeros(cfg.head_dim)))} for kv in ("k", "v")}
    s_logits = smollm.forward_student(cfg, M, C, toks, (Kp[:, :, :P], Vp[:, :, :P]), P, 4, P, 2)
    same = float(jnp.abs(s_logits - t_logits).max())
    print(f"student path without compression vs full forward: max |logit difference| {same:.2e}")
    out["student_no_compression_max_logit_diff"] = same
    if same > 1e-3:
        sys.exit(f"FAIL: the student path differs from the full forward by {same}")
    out.update(ppl=ppl, ppl_from=a.ppl_from, worst_rel_err=worst, first_ids=ids[:16].tolist())
    if a.json:
        smollm.write_json(a.json, out)
    if worst > a.max_rel:
        sys.exit(f"FAIL: a layer's relative error {worst:.4f} > {a.max_rel}")


if __name__ == "__main__":
    main()
