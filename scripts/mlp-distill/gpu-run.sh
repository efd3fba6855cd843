#!/usr/bin/env bash
# Runs the distillation of factors 4 and 5 on a machine with JAX (CPU or GPU), from files
# staged in STAGE (default /tmp/kvcd): model.gguf.p* parts (the GGUF split
# in parts, `split -n 3 -d GGUF model.gguf.p`, joined in name order), tokens.npz, texts.json and the gguf wheel
# (wheels/). Writes OUT (default $OUT, else ./distill-out): smollm2-135m-distill-f{4,5}.{bin,json}
# and the logs.
#   STAGE=/tmp/kvcd OUT=/tmp/out STEPS=1500 TIME_LIMIT=100 scripts/mlp-distill/gpu-run.sh [FACTORS]
# (also BATCH, PREFIX, QUERIES, LR, SINK, KEEP, VAL_WINDOWS, LOCAL_WEIGHT, EVAL_EVERY; defaults below)
set -euo pipefail
# pipefail: a failing distill.py fails the script although tee succeeds
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
stage="${STAGE:-/tmp/kvcd}"
out="${OUT:-$PWD/distill-out}"
factors="${1:-4 5}"
mkdir -p "$out"
want=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$stage/model.gguf" ]; then
    # the GGUF travels in parts (`split -n K -d GGUF model.gguf.p`), joined in name order
    parts=("$stage"/model.gguf.p*)
    [ -f "${parts[0]}" ] || { echo "no $stage/model.gguf.p* parts: the machine was released between the staging calls? stage them again"; exit 1; }
    cat "${parts[@]}" >"$stage/model.gguf"
fi
got="$(sha256sum "$stage/model.gguf" | cut -d' ' -f1)"
[ "$got" = "$want" ] || { echo "model.gguf: sha256 $got, expected $want"; exit 1; }
if ! python3 -c "import gguf" 2>/dev/null; then
    # into a folder of its own: a plain `pip install` may serve another interpreter than python3
    python3 -m pip install -q --no-deps --no-index --no-compile --target "$stage/site" "$stage"/wheels/gguf-0.19.0-py3-none-any.whl
    export PYTHONPATH="$stage/site${PYTHONPATH:+:$PYTHONPATH}"
fi
for f in $factors; do
    python3 "$here/distill.py" --gguf "$stage/model.gguf" --tokens "$stage/tokens.npz" --texts "$stage/texts.json" \
        --init "$repo/data/mlp-weights/smollm2-135m-f$f.bin" --factor "$f" \
        --steps "${STEPS:-1500}" --time-limit "${TIME_LIMIT:-100}" --batch "${BATCH:-8}" \
        --prefix "${PREFIX:-256,512,1024}" --queries "${QUERIES:-128}" --lr "${LR:-5e-5}" \
        --eval-every "${EVAL_EVERY:-0}" --sink "${SINK:-32}" --keep "${KEEP:-64}" \
        --val-windows "${VAL_WINDOWS:-16}" --local-weight "${LOCAL_WEIGHT:-0}" --out "$out/smollm2-135m-distill-f$f.bin" 2>&1 | tee "$out/distill-f$f.log"
done
cp "$stage/texts.json" "$out/texts.json"
