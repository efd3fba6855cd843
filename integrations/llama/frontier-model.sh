#!/usr/bin/env bash
# Issue 50's recipe on any model: calibrate layer-weighted kvq plans with kvq-calibrate.py (on
# the Apache-2.0 text, never an evaluated one) and measure them in llama-perplexity
# --kl-divergence at 2048 tokens on both texts, next to llama.cpp's own cache types and kvq4's
# default protections, in the same run.
#   integrations/llama/frontier-model.sh MODEL.gguf OUT_DIR BUDGET...
# BUDGET: the quantized rows' ratio to f16 (kvq-calibrate.py --budget); what the cache holds
# with the cells (llama.cpp's "KV cache ... at capacity" line, both caches of a sliding-window
# model) is in the table. The calibration's dump and probes are kept in OUT_DIR/calibration.
# Environment: KVC_FRONTIER_THREADS (default: nproc). Tables: OUT_DIR/table.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 3 ] || { echo "usage: $0 MODEL.gguf OUT_DIR BUDGET..." >&2; exit 2; }
model="$1" out="$2"
shift 2
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
threads="${KVC_FRONTIER_THREADS:-$(nproc)}"
mkdir -p "$out/calibration"
configs=(
    "q8_0|-ctk q8_0 -ctv q8_0 -fa on"
    "q5_0-q4_0|-ctk q5_0 -ctv q4_0 -fa on"
    "q4_0|-ctk q4_0 -ctv q4_0 -fa on"
    "kvq4-s4w64|-ctk kvq4 -ctv kvq4"
)
for b in "$@"; do
    plan="$out/plan-b$b.json"
    integrations/llama/kvq-calibrate.py --model "$model" --text /usr/share/common-licenses/Apache-2.0 \
        --budget "$b" --work "$out/calibration" --threads "$threads" --out "$plan" | tail -n 3
    configs+=("lw-b$b|--kvc-plan $plan")
done
bin="$(dirname "$LLAMA_PERPLEXITY")"
for t in "gpl-3|$TEXT_A" "debian-constitution|$TEXT_B"; do
    name="${t%%|*}" text="${t#*|}"
    base="$out/$name.f16.kld"
    ppl=("$bin/llama-perplexity" -m "$model" -f "$text" -c 2048 -b 2048 -t "$threads" --chunks 3)
    echo "frontier-model: $name f16 base" >&2
    OMP_WAIT_POLICY=passive "${ppl[@]}" --kl-divergence-base "$base" >"$out/$name.f16.log" 2>&1
    for c in "${configs[@]}"; do
        label="${c%%|*}"
        read -r -a args <<<"${c#*|}"
        echo "frontier-model: $name $label" >&2
        OMP_WAIT_POLICY=passive "${ppl[@]}" "${args[@]}" --kl-divergence-base "$base" --kl-divergence \
            >"$out/$name.$label.log" 2>&1
    done
    rm -f "$base"
done
python3 - "$out" <<'EOF' | tee "$out/table.md"
import glob, os, re, sys
d = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(d, "*.log"))):
    text_name, label = os.path.basename(path)[:-4].split(".", 1)
    log = open(path, errors="replace").read()
    r = {}
    for key, pat in [("kld", r"Mean    KLD:\s+([0-9.]+)"), ("ppl_ratio", r"Mean PPL\(Q\)/PPL\(base\)\s+:\s+([0-9.]+)"),
                     ("top", r"Same top p:\s+([0-9.]+)")]:
        m = re.search(pat, log)
        if m:
            r[key] = float(m.group(1))
    # llama.cpp's own line: "KV cache <type>, N cells: X MiB at capacity (...), f16 Y MiB: R:1" (one
    # per cache; a sliding-window model has two), else its size lines
    held = [(float(a), float(b)) for a, b in re.findall(r"KV cache [^\n]*?\d+ cells: ([0-9.]+) MiB[^\n]*?f16 ([0-9.]+) MiB", log)]
    if held:
        r["held"], r["f16"] = sum(h for h, _ in held), sum(f for _, f in held)
    else:
        r["held"] = sum(float(x) for x in re.findall(r"llama_kv_cache: size =\s+([0-9.]+) MiB", log))
    rows.setdefault(text_name, {})[label] = r
for text_name, r in rows.items():
    f16 = r.get("f16", {}).get("held")
    print(f"### {text_name} (2048 tokens, 3 chunks)\n")
    print("| cache | held MiB | ratio to f16 | KL | PPL(Q)/PPL(f16) | same top % |")
    print("|---|---|---|---|---|---|")
    for label, x in r.items():
        if label == "f16" or "kld" not in x:
            continue
        print(f"| {label} | {x['held']:.3f} | {f16 / x['held']:.3f} | {x['kld']:.5f} | {x.get('ppl_ratio', float('nan')):.4f} | "
              f"{x.get('top', float('nan')):.2f} |")
    print()
EOF
