"""Logit distillation of kvc-mlp's compressors through the frozen model (issue 24).

  python3 scripts/mlp-distill/distill.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
      --tokens DATA/tokens.npz --texts DATA/texts.json \
      --init data/mlp-weights/smollm2-135m-f4.bin --factor 4 --steps 600 --out OUT.bin

A sample is a window of P + Q tokens of one training text. The teacher is the full-attention
forward over the window. The student: the prefix [0, P) is prefilled with full attention
(its K and V per layer are the teacher's), then in every layer the span [sink, P - keep) is
compressed in whole groups by that layer's K and V MLPs (kvc-mlp's grouping, post-RoPE, never
re-rotated), and the Q tokens [P, P + Q) run through all 30 layers at their true positions,
attending to the sink, the compressed cells, the uncompressed rest of the prefix and causally
to themselves. Loss: KL(teacher || student) of the next-token distributions at [P, P + Q),
averaged. Gradients reach every layer's K and V MLPs jointly; the model is frozen.
P is drawn per step from --prefix (one compiled step per value). Adam, linear warm-up then
cosine decay to a tenth. Validation: fixed windows of the validation texts, KL of the start
weights, of mean pooling, at --eval-points points of the schedule and of the weights written
as stored (f16, read back from the file). The weights written are those of lowest validation
KL among the start, those points and the last step (--no-keep-best: the last step).
Writes OUT (.bin v1) and OUT with .json (the sidecar).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

import binv1
import smollm


def stack_params(p):
    return {kv: {n: np.stack([lay[n] for lay in p[kv]]) for n in ("w0", "b0", "w1", "b1", "w2", "b2")}
            for kv in ("k", "v")}


def unstack_params(c):
    L = c["k"]["w0"].shape[0]
    return {kv: [{n: np.asarray(c[kv][n][l]) for n in c[kv]} for l in range(L)] for kv in ("k", "v")}


def windows_of(texts, split, length):
    """(offset, tokens) of the texts of a split long enough for a window."""
    return [(t["offset"], t["tokens"]) for t in texts if t["split"] == split and t["tokens"] >= length]


def sample_batch(rng, arr, spans, length, batch):
    w = np.asarray([n - length + 1 for _, n in spans], np.float64)
    pick = rng.choice(len(spans), size=batch, p=w / w.sum())
    out = np.empty((batch, length), np.int32)
    for i, j in enumerate(pick):
        off, n = spans[j]
        s = off + int(rng.integers(0, n - length + 1))
        out[i] = arr[s:s + length]
    return out


def fixed_windows(arr, spans, length, count):
    """Deterministic validation windows: evenly over the texts, one window each, from their start."""
    if not spans:
        return np.zeros((0, length), np.int32)
    idx = np.linspace(0, len(spans) - 1, num=min(count, len(spans))).round().astype(int)
    return np.stack([arr[spans[j][0]:spans[j][0] + length] for j in idx]).astype(np.int32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--tokens", required=True, help="tokens.npz of make_data.py (train, val)")
    ap.add_argument("--texts", help="texts.json of make_data.py [beside --tokens]")
    ap.add_argument("--init", required=True, help=".bin v1 to start from, or 'meanpool'")
    ap.add_argument("--factor", type=int, required=True)
    ap.add_argument("--meanpool-offset", type=float, default=32.0,
                    help="ReLU offset of the mean-pool MLP (--init meanpool and the reference): exact for group "
                         "means above -offset (SmolLM2's |K|, |V| stay below ~24); the client's 256 makes Adam's "
                         "first steps move the output by 256 x 64 x lr")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prefix", default="256,512,768", help="prefix lengths P, one drawn per step")
    ap.add_argument("--queries", type=int, default=128, help="tokens Q after the prefix, scored")
    ap.add_argument("--sink", type=int, default=32, help="as the client's --sink")
    ap.add_argument("--keep", type=int, default=64, help="prefix tail kept uncompressed (the client's --recent)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--local-weight", type=float, default=0.0,
                    help="weight of the layer-local attention-output loss (mean over layers) added to the KL")
    ap.add_argument("--warmup", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--val-windows", type=int, default=16, help="validation windows per prefix length")
    ap.add_argument("--eval-every", type=int, default=0, help="validation KL every N steps as well (0: no)")
    ap.add_argument("--eval-points", type=int, default=4,
                    help="validation KL at k/N of the schedule, k = 1..N-1, and at the end")
    ap.add_argument("--keep-best", action=argparse.BooleanOptionalAction, default=True,
                    help="write the weights of lowest validation KL (start included), not the last")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="seconds of training: the schedule is shortened to the steps that fit (0: no limit)")
    ap.add_argument("--dtype", choices=["f16", "f32"], default="f16")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    smollm.jax_setup()
    import jax
    import jax.numpy as jnp

    t_start = time.time()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.devices()[0].device_kind}); "
          f"matmul precision {jax.config.jax_default_matmul_precision}", flush=True)
    cfg, md, w, _ = smollm.load_gguf(a.gguf)
    M = smollm.stack_layers(cfg, w)
    del w
    F, D = a.factor, cfg.head_dim
    print(f"model: {cfg.n_layer} layers, {cfg.n_head}/{cfg.n_head_kv} heads, head_dim {D} "
          f"({time.time() - t_start:.1f} s to load)", flush=True)

    if a.init == "meanpool":
        init = binv1.meanpool(cfg.n_layer, D, F, a.meanpool_offset)
        init_hdr = {"compression_factor": F, "num_heads": cfg.n_head_kv, "min_seq_len": 1}
    else:
        init_hdr, init = binv1.read(a.init)
        if init_hdr["compression_factor"] != F or len(init["k"]) != cfg.n_layer or init["k"][0]["w0"].shape != (D, D * F):
            sys.exit(f"--init {a.init}: factor {init_hdr['compression_factor']}, {len(init['k'])} layers, "
                     f"w0 {init['k'][0]['w0'].shape}; expected factor {F}, {cfg.n_layer} layers, ({D}, {D * F})")
    C0 = jax.tree.map(jnp.asarray, stack_params(init))
    Cmp = jax.tree.map(jnp.asarray, stack_params(binv1.meanpool(cfg.n_layer, D, F, a.meanpool_offset)))

    data = np.load(a.tokens)
    texts = json.load(open(a.texts or os.path.join(os.path.dirname(a.tokens), "texts.json")))["texts"]
    prefixes = [int(x) for x in a.prefix.split(",")]
    for P in prefixes:
        g, rest = smollm.plan(P, a.sink, a.keep, F)
        if g < 1:
            sys.exit(f"--prefix {P}: no whole group of {F} between sink {a.sink} and keep {a.keep}")
    Q = a.queries
    train_spans = {P: windows_of(texts, "train", P + Q) for P in prefixes}
    val_sets = {}
    for P in prefixes:
        vs = fixed_windows(data["val"], windows_of(texts, "val", P + Q), P + Q, a.val_windows)
        if len(vs) == 0:
            sys.exit(f"no validation text has {P + Q} tokens")
        # whole batches (the validation runs the compiled training step): cycle the windows
        n = max(a.batch, len(vs) // a.batch * a.batch)
        val_sets[P] = vs[np.arange(n) % len(vs)]
    for P in prefixes:
        if not train_spans[P]:
            sys.exit(f"no training text has {P + Q} tokens")
        print(f"P {P}: {smollm.plan(P, a.sink, a.keep, F)[0]} groups per head and layer, "
              f"{len(train_spans[P])} training texts long enough, {len(val_sets[P])} validation windows", flush=True)

    # M (the frozen model) is an argument of every jitted function, never a closure: a closed-over
    # array becomes a constant of the compiled program (540 MB folded and copied per program).
    def losses(C, M, toks, P, local_weight):
        """(training loss, (KL, mean layer-local loss or 0))."""
        if local_weight:
            t_logits, (K, V, Qt) = smollm.forward_full(cfg, M, toks, return_qkv=True, logits_from=P)
            tq = (Qt[:, :, P:], K[:, :, P:], V[:, :, P:])
        else:
            t_logits, (K, V) = smollm.forward_full(cfg, M, toks, logits_from=P)
            tq = None
        kvp = (K[:, :, :P], V[:, :, :P])
        out = smollm.forward_student(cfg, M, C, toks, kvp, P, a.sink, a.keep, F, teacher_qkv=tq)
        s_logits, local = (out[0], jnp.mean(out[1])) if local_weight else (out, jnp.float32(0))
        kl = smollm.kl_teacher_student(jax.lax.stop_gradient(t_logits), s_logits)
        return kl + local_weight * local, (kl, local)


    sched = {"total": a.steps, "warm": max(1, int(a.warmup * a.steps))}

    def lr_at(step):
        total, warm = sched["total"], sched["warm"]
        if step < warm:
            return a.lr * (step + 1) / warm
        t = min(1.0, (step - warm) / max(1, total - warm))
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    b1, b2, eps = 0.9, 0.999, 1e-8

    def train_step(C, m, v, M, toks, lr, t, P):
        (_, (loss, local)), g = jax.value_and_grad(losses, has_aux=True)(C, M, toks, P, a.local_weight)
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        C = jax.tree.map(lambda c, m, v: c - lr * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + eps), C, m, v)
        gnorm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g)))
        return C, m, v, loss, local, gnorm

    step_fn = jax.jit(train_step, static_argnums=(7,), donate_argnums=(0, 1, 2))

    def validate(C):
        """Mean KL over the fixed validation windows, through the compiled training step with
        lr 0 on copies (one compiled program per prefix length, not two)."""
        out = {}
        for P in prefixes:
            vs = val_sets[P]
            kls = []
            for i in range(0, len(vs), a.batch):
                Cc = jax.tree.map(lambda x: x + 0, C)
                z = jax.tree.map(jnp.zeros_like, C)
                z2 = jax.tree.map(jnp.zeros_like, C)
                kls.append(float(step_fn(Cc, z, z2, M, jnp.asarray(vs[i:i + a.batch]), jnp.float32(0), jnp.float32(1), P)[3]))
            out[str(P)] = float(np.mean(kls))
        out["mean"] = float(np.mean([v for v in out.values()]))
        return out

    t0 = time.time()
    val_start = validate(C0)
    val_mp = validate(Cmp) if a.init != "meanpool" else val_start
    print(f"validation KL: start {val_start['mean']:.5f} {val_start}  mean pooling {val_mp['mean']:.5f} "
          f"({time.time() - t0:.1f} s)", flush=True)

    rng = np.random.default_rng(a.seed)
    C = jax.tree.map(lambda x: x + 0, C0)
    m = jax.tree.map(jnp.zeros_like, C)
    v = jax.tree.map(jnp.zeros_like, C)
    curve, evals = [], []
    point = 1
    # the weights written are those of lowest validation KL among the start, the validation
    # points and the end (--no-keep-best: the end)
    best = {"step": 0, "kl": val_start["mean"] if a.keep_best else math.inf, "C": C0}
    t_train = time.time()
    done = 0
    # --time-limit counts training steps only: not the first step of each prefix length (it
    # compiles) nor validation passes during training
    seen_p, steady = set(), []
    excluded = 0.0

    def clock():
        return time.time() - t_train - excluded

    step = 0
    while step < sched["total"]:
        total = sched["total"]
        P = prefixes[int(rng.integers(0, len(prefixes)))]
        toks = sample_batch(rng, data["train"], train_spans[P], P + Q, a.batch)
        ts = time.time()
        C, m, v, loss, local, gn = step_fn(C, m, v, M, jnp.asarray(toks), jnp.float32(lr_at(step)), jnp.float32(step + 1), P)
        loss = float(loss)
        done = step + 1
        if P in seen_p:
            steady.append(time.time() - ts)
        else:
            excluded += time.time() - ts
        seen_p.add(P)
        if a.time_limit and len(steady) == 10:
            # the schedule is shortened to what fits the time limit (compile steps excluded)
            per = float(np.median(steady))
            fit = done + int(max(0.0, a.time_limit - clock()) / per)
            if fit < sched["total"]:
                print(f"{per:.3f} s a step: {fit} steps fit in --time-limit {a.time_limit:g} s; schedule shortened",
                      flush=True)
                sched["total"] = max(done + 1, fit)
                sched["warm"] = min(sched["warm"], max(done, int(a.warmup * sched["total"]), 1))
        if not math.isfinite(loss):
            sys.exit(f"step {step}: loss {loss}: stopping, nothing written")
        curve.append({"step": step, "P": P, "kl": loss, **({"local": float(local)} if a.local_weight else {})})
        if step < 3 or (step + 1) % max(1, total // 50) == 0 or step + 1 == total:
            el = time.time() - t_train
            lo = f" local {float(local):.4f}" if a.local_weight else ""
            print(f"step {step + 1}/{total} P {P} kl {loss:.5f}{lo} |g| {float(gn):.3g} lr {lr_at(step):.2e} "
                  f"({time.time() - ts:.2f} s this step, {el:.0f} s so far)", flush=True)
        due = a.eval_every and (step + 1) % a.eval_every == 0
        if a.eval_points > 1 and point < a.eval_points and step + 1 >= math.ceil(point * total / a.eval_points):
            due, point = True, point + 1
        if due and step + 1 < total:
            te = time.time()
            ev = validate(C)
            evals.append({"step": step + 1, **ev})
            print(f"validation KL at step {step + 1}: {ev['mean']:.5f} {ev}", flush=True)
            if ev["mean"] < best["kl"]:
                best = {"step": step + 1, "kl": ev["mean"], "C": jax.tree.map(lambda x: x + 0, C)}
            excluded += time.time() - te
        if a.time_limit and clock() > 1.2 * a.time_limit:
            print(f"time limit {a.time_limit} s passed by a fifth after {step + 1} steps: stopping", flush=True)
            break
        step += 1
    train_s = time.time() - t_train
    compile_s = excluded
    val_last = validate(C)
    if val_last["mean"] <= best["kl"]:
        best = {"step": done, "kl": val_last["mean"], "C": C}
    val_end_f32 = val_last if best["step"] == done else next(
        ({k: v for k, v in e.items() if k != "step"} for e in evals if e["step"] == best["step"]), val_start)
    print(f"validation KL after the last step {val_last['mean']:.5f}; writing the weights of step {best['step']} "
          f"({best['kl']:.5f}){' = the start: training did not help' if best['step'] == 0 else ''}", flush=True)
    binv1.write(a.out, unstack_params(jax.device_get(best["C"])), factor=F, head_dim=D, num_heads=cfg.n_head_kv,
                min_seq_len=int(init_hdr.get("min_seq_len", 1)), dtype=a.dtype)
    _, stored = binv1.read(a.out)
    val_end = validate(jax.tree.map(jnp.asarray, stack_params(stored)))
    print(f"validation KL: start {val_start['mean']:.5f}, written {val_end['mean']:.5f} (as stored, {a.dtype}; "
          f"f32 {val_end_f32['mean']:.5f}), mean pooling {val_mp['mean']:.5f}", flush=True)

    tenth = max(1, len(curve) // 10)
    side = {
        "kind": "kvc-mlp-distill sidecar v1",
        "model": {"file": os.path.basename(a.gguf), "desc": f"{md.get('general.architecture')} {md.get('general.size_label')} "
                  f"file_type {md.get('general.file_type')}", "architecture": md.get("general.architecture"),
                  "name": md.get("general.name"), "n_layer": cfg.n_layer, "n_head": cfg.n_head,
                  "n_head_kv": cfg.n_head_kv, "head_dim": D,
                  "forward": "scripts/mlp-distill/smollm.py (JAX, GGUF dequantized to f32, NORM RoPE)"},
        "objective": {
            "name": "logit distillation: KL(full-KV model || compressed-KV model), all layers jointly",
            "recent": a.keep,
            "loss": "KL(teacher || student) of next-token distributions, mean over the Q scored positions"
                    + (f" + {a.local_weight} x layer-local attention-output error (mean over layers)" if a.local_weight else ""),
            "local_weight": a.local_weight,
            "teacher": "full attention over the window",
            "student": "prefix [0,P) prefilled with full attention; per layer [sink, P-keep) compressed in whole "
                       "groups by the layer's K and V MLPs (post-RoPE, never re-rotated); tokens [P,P+Q) at their "
                       "true positions attend to sink + compressed cells + uncompressed rest + themselves",
            "sink": a.sink, "keep": a.keep, "prefix_lengths": prefixes, "queries": Q, "factor": F},
        "texts": {split: [{"text_source": f"{sum(t['split'] == key for t in texts)} Debian texts, "
                                          f"{int(data[key].size)} tokens (make_data.py's texts.json)"}]
                  for split, key in (("train", "train"), ("validation", "val"))},
        "data": {"tokens": os.path.basename(a.tokens), "train_tokens": int(data["train"].size),
                 "val_tokens": int(data["val"].size),
                 "texts": sorted({t["file"] for t in texts}), "val_texts": sorted({t["file"] for t in texts
                                                                                    if t["split"] == "val"}),
                 "texts_json": "texts.json of make_data.py (files, licences)"},
        "training": {"init": a.init, "steps": done, "steps_planned": a.steps, "steps_scheduled": sched["total"], "batch": a.batch, "lr": a.lr,
                     "schedule": f"linear warm-up {sched['warm']} steps, cosine to lr/10", "optimizer": "Adam (0.9, 0.999, 1e-8)",
                     "seed": a.seed, "train_seconds": round(train_s, 1),
                     "first_step_and_validation_seconds": round(compile_s, 1),
                     "device": f"{jax.devices()[0].platform} {jax.devices()[0].device_kind}",
                     "jax": jax.__version__, "matmul_precision": str(jax.config.jax_default_matmul_precision)},
        "validation_kl": {"windows_per_prefix": a.val_windows, "start": val_start, "mean_pooling": val_mp,
                          "end_stored": val_end, "end_f32": val_end_f32, "last_step_f32": val_last,
                          "written_step": best["step"], "during": evals,
                          "selection": "the weights written are those of lowest validation KL among start, "
                                       "validation points and the last step" if a.keep_best else "the last step"},
        "curve_by_tenths": [{"step": c["step"], "kl_mean": float(np.mean([x["kl"] for x in curve[c["step"]:c["step"] + tenth]]))}
                            for c in curve[::tenth]],
        "dtype": a.dtype,
        "wall_seconds": round(time.time() - t_start, 1),
    }
    smollm.write_json(os.path.splitext(a.out)[0] + ".json", side)
    print(f"wrote {a.out} and its sidecar ({time.time() - t_start:.0f} s in all)", flush=True)


if __name__ == "__main__":
    main()
