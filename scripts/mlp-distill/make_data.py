"""Builds the distillation corpus: English prose Debian ships, tokenized with llama.cpp's
tokenizer of the GGUF, written as one uint16 token file per split plus texts.json.

  python3 scripts/mlp-distill/make_data.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
      --eval-texts .cache/llama/texts/gpl-3.txt,.cache/llama/texts/debian-constitution.txt \
      --out /tmp/kvc-distill-data

Writes OUT/tokens.npz (arrays `train`, `val`: uint16 token ids, the texts one after the other,
each preceded by nothing: no BOS, as the client decodes), OUT/texts.json (per text: file,
split, tokens, offset into its split, licence) in the spirit of scripts/mlp-train-data.sh's
texts.json. Sources: /usr/share/common-licenses/* and /usr/share/doc/*/{README*,*.txt,NEWS*,*.md,*/*.txt,*/*.md,changelog.gz}
(plain or gzip). Never the evaluation texts: any file sharing more than a few 12-word runs
with the GPL-3 or the Debian Constitution (given by --eval-texts) is refused, which also
drops the GPL symlink, and every COPYING that holds the GPL-3; the names GPL-3 and
*onstitution* are refused outright. Validation: whole files, every `--val-every`-th by a
stable hash of the path, so no text is in both splits.
"""

import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import sys

import numpy as np

import smollm


def read_text(path):
    try:
        raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    except OSError:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def words(t):
    return re.findall(r"[a-z0-9]+", t.lower())


def shingles(t, n=12):
    w = words(t)
    return {" ".join(w[i:i + n]) for i in range(0, max(0, len(w) - n + 1))}


def prose_like(t):
    """Mostly letters and spaces: README and licence prose rather than code or tables."""
    if len(t) < 1500:
        return False
    letters = sum(c.isalpha() and c.isascii() for c in t)
    spaces = t.count(" ")
    return letters / len(t) > 0.6 and spaces / len(t) > 0.1


def licence_of(path):
    if path.startswith("/usr/share/common-licenses/"):
        return (f"licence text {os.path.basename(path)} (Debian base-files); the licence's own terms permit "
                f"verbatim copies")
    m = re.match(r"/usr/share/doc/([^/]+)/", path)
    pkg = m.group(1) if m else "?"
    cp = f"/usr/share/doc/{pkg}/copyright"
    return f"documentation of Debian package {pkg}; licence: {cp}" + ("" if os.path.exists(cp) else " (absent)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--eval-texts", required=True, help="comma list: the evaluation texts to keep out")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens-per-file", type=int, default=6000)
    ap.add_argument("--max-total", type=int, default=2_200_000)
    ap.add_argument("--val-every", type=int, default=10)
    a = ap.parse_args()

    evals = [open(p, encoding="utf-8").read() for p in a.eval_texts.split(",")]
    bad = set().union(*(shingles(t) for t in evals))
    _, _, _, reader = smollm.load_gguf_meta(a.gguf)
    tk = smollm.tokenizer_from_gguf(reader)

    cands = sorted(glob.glob("/usr/share/common-licenses/*"))
    for pat in ("README*", "*.txt", "NEWS*", "*.md", "*/*.txt", "*/*.md", "changelog.gz"):
        cands += sorted(glob.glob(f"/usr/share/doc/*/{pat}"))
    seen_real, seen_hash = set(), set()
    texts, toks = [], {"train": [], "val": []}
    total = {"train": 0, "val": 0}
    refused = []
    for p in cands:
        rp = os.path.realpath(p)
        base = os.path.basename(rp)
        if base.startswith("GPL-3") or "onstitution" in base or "onstitution" in p:
            refused.append({"file": p, "why": "evaluation text by name"})
            continue
        if rp in seen_real or not os.path.isfile(rp):
            continue
        seen_real.add(rp)
        t = read_text(rp)
        if t is None or not prose_like(t):
            continue
        h = hashlib.sha256(t.encode()).hexdigest()
        if h in seen_hash:
            continue
        seen_hash.add(h)
        overlap = len(shingles(t) & bad)
        if overlap > 3:
            refused.append({"file": p, "why": f"shares {overlap} 12-word runs with an evaluation text"})
            continue
        ids = tk.encode(t).ids[:a.max_tokens_per_file]
        if len(ids) < 256:
            continue
        split = "val" if int(hashlib.sha256(p.encode()).hexdigest(), 16) % a.val_every == 0 else "train"
        if total["train"] + total["val"] + len(ids) > a.max_total:
            break
        texts.append({"file": p, "split": split, "tokens": len(ids), "offset": total[split],
                      "sha256": h, "licence": licence_of(p)})
        toks[split].append(np.asarray(ids, np.uint16))
        total[split] += len(ids)
    if not toks["val"] or not toks["train"]:
        sys.exit("no texts found for one of the splits")
    os.makedirs(a.out, exist_ok=True)
    np.savez(os.path.join(a.out, "tokens.npz"), train=np.concatenate(toks["train"]), val=np.concatenate(toks["val"]))
    smollm.write_json(os.path.join(a.out, "texts.json"), {
        "kind": "kvc-mlp-distill texts v1",
        "tokenizer": f"llama.cpp's of {os.path.basename(a.gguf)} (gpt2 BPE, smollm pre-tokenizer), no BOS",
        "dtype": "uint16", "tokens": total,
        "rule": "English prose from Debian (common-licenses, /usr/share/doc README*, *.txt, NEWS*, *.md, upstream changelog.gz); "
                "files sharing >3 12-word runs with the evaluation texts (GPL-3, Debian Constitution) refused; "
                f"each text's first {a.max_tokens_per_file} tokens at most; at most {a.max_total} tokens in all",
        "refused": refused, "texts": texts})
    print(f"{len(texts)} texts: train {total['train']} tokens, val {total['val']} tokens; refused {len(refused)}")


if __name__ == "__main__":
    main()
