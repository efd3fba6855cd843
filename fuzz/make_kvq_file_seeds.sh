#!/usr/bin/env bash
# Writes fuzz/seeds/kvq_file/: kvq packed cache files written by `kvc quant apply --kvq`
# from the first tokens of each layer of the embedded sample (data/sample/textA.{K,V}.f16.bin,
# [4][512][3][64] f16): a config string with uniform codes (k4v2:u32, 4 tokens), a plan
# with a different K and V width per layer (spec kind 1, 3 tokens), and K per channel over
# groups of 16 tokens (k2v3, 17 tokens: one block per head and a one-token f16 tail).
#
#   fuzz/make_kvq_file_seeds.sh [path/to/kvc]     (default: target/debug/kvc, built if absent)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
kvc="${1:-target/debug/kvc}"
[ -x "$kvc" ] || cargo build -p kvc-cli
out=fuzz/seeds/kvq_file
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cut() { # raw file, tokens -> first tokens of each of the 4 layers
    python3 - "$1" "$2" <<'PY'
import sys
raw = open(sys.argv[1], "rb").read()
tokens, per_tok, layer = int(sys.argv[2]), 3 * 64 * 2, 512 * 3 * 64 * 2
sys.stdout.buffer.write(b"".join(raw[l * layer:l * layer + tokens * per_tok] for l in range(4)))
PY
}
cat >"$tmp/plan.json" <<'JSON'
{"format":"kvc-kvq-plan","version":1,"method":"lm","seed":7743485870786113841,"head_dim":64,"n_kv_head":3,"sink_tokens":0,"recent_tokens":0,"layers":[{"k_bits":8,"v_bits":4},{"k_bits":5,"v_bits":3},{"k_bits":4,"v_bits":2},{"k_bits":3,"v_bits":6}]}
JSON
apply() { # name, spec, tokens, extra args...
    local name="$1" spec="$2" tokens="$3"
    shift 3
    cut data/sample/textA.K.f16.bin "$tokens" >"$tmp/k.f16"
    cut data/sample/textA.V.f16.bin "$tokens" >"$tmp/v.f16"
    "$kvc" quant apply --kvq "$spec" --dtype f16 --layers 4 --kv-heads 3 --head-dim 64 \
        --k "$tmp/k.f16" --v "$tmp/v.f16" --out-k "$out/$name.K.kvq" --out-v "$out/$name.V.kvq" "$@" >/dev/null
}
apply k4v2-u32-t4 k4v2:u32 4
apply plan-t3 "$tmp/plan.json" 3
apply k2v3-g16-t17 k2v3 17 --k-channel-group 16
rm -f "$out/k2v3-g16-t17.V.kvq" # V has no channel group: the same rows as other V files
ls -l "$out"
