#!/usr/bin/env bash
# The share mode's measurements (issue 23; docs/results/share-eval.md), one command:
#   integrations/llama/share-eval.sh [OUT_DIR] [kvc_llama_eval options, e.g. --threads 2]
# Starts a redis-server on a free port of 127.0.0.1 (no persistence, 1 GiB maxmemory, LRU),
# then runs kvc_llama_eval --modes share on the first 2048 + 32 tokens of text A: process 1
# prefills the 2048-token prefix and stores its 8 chunks of 256 tokens, process 2s restore them
# and decode the 32 tokens after, compared bit for bit. Per codec (gear-v2, gear-v1, raw) one
# run with 5 rounds of one process 2 and, for gear-v2 and raw, one with 3 rounds of 4 process 2s
# at once; then gear-v2 through the disk tier; then the lossy kvq-k4v4 and kvq-k8v4 (5 rounds
# each: KL instead of identical logits). Redis is emptied (FLUSHALL) before each run so that every run stores
# its chunks. Prefill and restore are measured in the same run. Then, against the same server,
# `kvc bench tiers` (target/release/kvc, when built: cargo build --release -p kvc-cli) on the
# real KV dumps (KVC_REALKV_DIR, ../shared/data/realkv, else the embedded sample): each tier
# and codec next to raw Redis GET/SET of the same bytes. Writes OUT_DIR/share-*.json and
# bench-tiers.json (default .cache/share-eval) and prints a Markdown table. Stops the server
# at the end.
# Environment: KVC_SHARE_PREFIX (2048), KVC_SHARE_REST (32), KVC_SHARE_CLIENTS (4),
# KVC_SHARE_ONLY (an extended regex: only the runs whose names match it, e.g. 'kvq|redis-raw$';
# the bench and the table then cover those runs only; default: every run).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-.cache/share-eval}"
shift || true
mkdir -p "$out"
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
prefix="${KVC_SHARE_PREFIX:-2048}"
rest="${KVC_SHARE_REST:-32}"
clients="${KVC_SHARE_CLIENTS:-4}"

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
rdir="$(mktemp -d)"
redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$rdir" \
    --maxmemory 1gb --maxmemory-policy allkeys-lru >"$rdir/log.txt" 2>&1 &
rpid=$!
trap 'kill -9 "$rpid" 2>/dev/null || true; rm -rf "$rdir"' EXIT
for _ in $(seq 200); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
redis-cli -p "$port" ping | grep -q PONG || { echo "share-eval: redis-server did not start" >&2; exit 1; }
echo "share-eval: $(redis-server --version | cut -d' ' -f1-3) on 127.0.0.1:$port" >&2

only="${KVC_SHARE_ONLY:-.}"
ran=()
run() { # name, options...
    local name="$1"
    shift
    [[ "$name" =~ $only ]] || return 0
    ran+=("$name")
    redis-cli -p "$port" flushall >/dev/null
    "$EVAL" --model "$MODEL" --text "$TEXT_A" --modes share --share-prefix "$prefix" --share-rest "$rest" \
        "$@" --json "$out/share-$name.json" >"$out/share-$name.txt"
    echo "share-eval: $name: $(grep -m1 '^share' "$out/share-$name.txt" | sed 's/  */ /g' | cut -d' ' -f9-)" >&2
}
url="redis://127.0.0.1:$port"
run redis-gear-v2 --redis "$url" --share-rounds 5 "$@"
run redis-raw --redis "$url" --share-codec raw --share-rounds 5 "$@"
run redis-gear-v1 --redis "$url" --share-codec gear-v1 --share-rounds 5 "$@"
run redis-gear-v2-x$clients --redis "$url" --share-clients "$clients" --share-rounds 3 "$@"
run redis-raw-x$clients --redis "$url" --share-codec raw --share-clients "$clients" --share-rounds 3 "$@"
run disk-gear-v2 --share-rounds 5 "$@"
run redis-kvq-k4v4 --redis "$url" --share-codec kvq-k4v4 --share-rounds 5 "$@"
run redis-kvq-k8v4 --redis "$url" --share-codec kvq-k8v4 --share-rounds 5 "$@"

kvc=target/release/kvc
if [ "$only" != . ]; then
    echo "share-eval: KVC_SHARE_ONLY set: kvc bench tiers skipped" >&2
elif [ -x "$kvc" ]; then
    realkv="${KVC_REALKV_DIR:-../shared/data/realkv}"
    data=()
    [ -f "$realkv/textA.K.f16.json" ] && data=(--data "$realkv")
    redis-cli -p "$port" flushall >/dev/null
    "$kvc" bench tiers --redis "$url" "${data[@]}" --prompts 4 --reps 3 --json "$out/bench-tiers.json" \
        >"$out/bench-tiers.txt"
    cat "$out/bench-tiers.txt" >&2
else
    echo "share-eval: no $kvc (cargo build --release -p kvc-cli): kvc bench tiers skipped" >&2
fi

python3 - "$out" "${ran[@]}" <<'PY'
import json, sys
d = sys.argv[1]
print("| run | tier | codec | clients x rounds | chunks stored | bytes stored | wire B/token | vs f16 | prefill s (CPU s) "
      "| restore s p50 (CPU s) | max | prefill / restore | lookup s | fetch+check+decode s | state blob s | set_data s "
      "| in-process codec restore s (MB/s) | logits identical (KL) | control caught | fallbacks |")
print("|" + " --- |" * 20)
for name in sys.argv[2:]:
    j = json.load(open(f"{d}/share-{name}.json"))
    r = j["texts"][0]["results"][0]
    c = sorted(r["client_detail"], key=lambda c: c["restore_s"])[(len(r["client_detail"]) - 1) // 2]
    ratio = r["prefill_over_restore"]
    print(f"| {name} | {r['tier']} | {r['codec']} | {r['clients']} x {r['rounds']} | {r['chunks_stored']} "
          f"| {r['bytes_stored']:,} | {r['wire_bytes_per_token']:.0f} | {r['wire_ratio_vs_f16']:.3f}:1 "
          f"| {r['prefill_s']:.3f} ({r['prefill_cpu_s']:.3f}) | {r['restore_s']:.4f} ({r['restore_cpu_s']:.4f}) "
          f"| {r['restore_s_max']:.4f} | {'%.1fx' % ratio if ratio else '-'} "
          f"| {c['lookup_s']:.4f} | {c['fetch_decode_s']:.4f} | {c['build_s']:.4f} | {c['set_data_s']:.4f} "
          f"| {r['memory_tier_restore_s']:.4f} ({r['memory_tier_restore_mb_s']:.0f}) "
          f"| {r['logits_identical'] if r['lossless'] else 'lossy (KL %.4f)' % r['kl_mean_max']} "
          f"| {r['control_caught']} | {r['fallbacks']:.0f} |")
print(f"\nthreads {j['threads']}, prefix {r['prefix_tokens']} tokens in chunks of {r['chunk_tokens']}, "
      f"{r['rest_tokens']} tokens compared per process 2 ({r['logits_compared'] // (r['clients'] * r['rounds']):,} logits each)")
PY
