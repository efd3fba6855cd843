#!/usr/bin/env bash
# llama-server instances sharing prompt prefixes through kvc's tiers (issue 51; patch 0007,
# --kvc-tier): two servers on a real redis-server, on a 3-node Redis Cluster and on a shared
# disk directory, all on 127.0.0.1; the second server restores what the first prefilled and
# its answer equals its own cold prefill's (gear-v2, lossless); then each fault: Redis stopped,
# Redis frozen past the timeout, every chunk damaged, every chunk swapped (foreign), a full disk.
# Each must answer as a cold prefill, keep both servers up and show in /metrics; then two slots
# restoring at once, a kvq cache refused with its reason in /props, and options kvc refuses
# stopping the server at start with the flag named; then slot files through kvc's codecs (patch
# 0009, --kvc-slot-files gear-v2 and tc-0.032): saved by one server, restored by another
# process, the lossless answer equal to a cold prefill's, a damaged and a foreign file refused
# with the server answering on, llama.cpp's own file still restoring
# (integrations/llama/server_tiers.py). No timing is checked here: docs/results/server-tiers.md
# has the measured times. Then the host prompt cache through kvc's codecs (below). The build is
# fetch-and-build.sh's (50-llama.sh built it).
set -euo pipefail
cd "$(dirname "$0")/../.."

t0=$SECONDS
eval "$(integrations/llama/fetch-and-build.sh | grep -E '^[A-Z_]+=')"
echo "56-llama-server-tiers: fetch and build took $((SECONDS - t0)) s"
out=".cache/llama/ci-server-tiers"
rm -rf "$out"
mkdir -p "$out"
t1=$SECONDS
python3 integrations/llama/server_tiers.py --server "$LLAMA_SERVER" --model "$MODEL" \
    --texts "$(dirname "$TEXT_A")" --prefix 1024 --out "$out" \
    --slot-codec gear-v2 --slot-codec tc-0.032 --calibration data/tc-calibrations/smollm2-135m.kvctc
echo "56-llama-server-tiers: the servers' workload took $((SECONDS - t1)) s"
# the host prompt cache through kvc's codecs (--kvc-prompt-cache, patch 0008) at one --cache-ram
# budget: llama.cpp's own raw states, gear-v2 and tc-0.008; each must hold at least as many
# prompts as llama.cpp's own cache, and a prompt restored through a lossless one answers as its
# cold prefill, distribution and tokens (integrations/llama/server_prompt_cache.py)
t2=$SECONDS
python3 integrations/llama/server_prompt_cache.py --server "$LLAMA_SERVER" --model "$MODEL" \
    --texts "$(dirname "$TEXT_A")" --prompts 6 --prompt-tokens 512 --cache-ram 24 \
    --codec raw-states --codec gear-v2 --codec tc-0.008 --calibration data/tc-calibrations/smollm2-135m.kvctc \
    --out "$out/prompt-cache"
echo "56-llama-server-tiers: the prompt cache's workload took $((SECONDS - t2)) s"
echo "56-llama-server-tiers: passed"
