#!/usr/bin/env bash
# Builds every libFuzzer target under fuzz/ (AddressSanitizer, stable toolchain with
# RUSTC_BOOTSTRAP=1 for the flags cargo-fuzz would pass on nightly) and runs each in turn.
# llama_state is C++ (fuzz/cpp/): clang++ -fsanitize=fuzzer,address,undefined.
#
#   scripts/fuzz-all.sh N                 N executions per target (default 10000000)
#   scripts/fuzz-all.sh --time S          S seconds per target (the CI mode)
#   FUZZ_TARGETS="mlp_weights h2o_replay" scripts/fuzz-all.sh ...   only these targets
#   FUZZ_BUILD_ONLY=1 scripts/fuzz-all.sh  build, seed the corpora, run nothing
#
# Corpora grow in fuzz/corpus/<target> (git-ignored), seeded from the repository's real
# files; a crash leaves its input in fuzz/artifacts/<target>/ and makes the script exit 1
# after the remaining targets ran. The last lines print each target's execution count.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"

mode=runs
limit="${1:-10000000}"
if [ "${1:-}" = "--time" ]; then
    mode=time
    limit="${2:?usage: fuzz-all.sh --time SECONDS}"
fi
all_targets="gear_v1_decode gear_v2_decode mlp_weights c8_checkpoint h2o_replay kvq_plan kvq_rows kvq_block kvq_channel kvq_file tier_blob prefix_file tc_calibration tc_section kvq_cells_state llama_state"
targets="${FUZZ_TARGETS:-$all_targets}"

host="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Zsanitizer=address -Cdebug-assertions -Coverflow-checks"
bins=()
for t in $targets; do [ "$t" = llama_state ] || bins+=(--bin "$t"); done
[ ${#bins[@]} -eq 0 ] || cargo build --release --locked --target "$host" "${bins[@]}"
# llama_state: the C++ parser of llama.cpp's state container (header only), libFuzzer with
# AddressSanitizer and UndefinedBehaviorSanitizer.
if [[ " $targets " = *" llama_state "* ]]; then
    mkdir -p target/cpp
    clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        -I ../include cpp/llama_state_fuzz.cpp -o target/cpp/llama_state
fi
bin_of() { # target -> its binary
    if [ "$1" = llama_state ]; then echo target/cpp/llama_state; else echo "target/$host/release/$1"; fi
}

# Seed corpora from the repository's own files.
seed() { # target, files...
    local dir="corpus/$1"
    shift
    mkdir -p "$dir"
    local f
    for f in "$@"; do [ -f "$f" ] && cp -n "$f" "$dir/" 2>/dev/null || true; done
}
seed gear_v1_decode seeds/gear_v1_decode/*
seed gear_v2_decode ../crates/kvc-codec/tests/golden/*.kvg2
seed mlp_weights ../crates/kvc-mlp/tests/fixtures/*.bin
seed h2o_replay seeds/h2o_replay/*
seed kvq_plan ../data/kvq-plans/*.json
seed kvq_cells_state ../crates/kvc-kvq-cells/tests/golden/kvq-cells-state-v1/*
seed prefix_file ../crates/kvc-store-tiers/tests/golden/kv-prefix-v1/*
# kvq_file: packed cache files `kvc quant apply --kvq` wrote (fuzz/make_kvq_file_seeds.sh).
seed kvq_file seeds/kvq_file/*
# c8_checkpoint: u16 LE description length, the description, the safetensors file (the
# fixtures scripts/make_c8_fixtures.py wrote).
mkdir -p corpus/c8_checkpoint
for d in ../crates/kvc-int8/tests/fixtures/c8/*/; do
    desc="$d/quant_model_description.json"
    n=$(stat -c %s "$desc")
    {
        printf "\\x$(printf %02x $((n & 255)))\\x$(printf %02x $((n >> 8)))"
        cat "$desc" "$d/quant_model_weight.safetensors"
    } >"corpus/c8_checkpoint/$(basename "$d")"
done

# kvq_rows, kvq_block, kvq_channel, tier_blob, prefix_file: the target writes seeds from the
# embedded sample (data/sample) itself on its first call (kvq rows quantized per config or per
# block format; K channel-group blocks per bits and group; blobs per codec; kv-prefix files per
# codec). tc_calibration and tc_section write theirs the same way (fixed calibrations of small
# layouts; sections the encoder made with the fixed calibration). kvq_cells_state: saves of
# its fixed cells.
for t in kvq_rows kvq_block kvq_channel tier_blob prefix_file tc_calibration tc_section kvq_cells_state; do
    if [[ " $targets " = *" $t "* ]]; then
        mkdir -p "corpus/$t"
        KVC_FUZZ_WRITE_SEEDS="corpus/$t" "$(bin_of "$t")" -runs=1 "corpus/$t" >/dev/null 2>&1 || true
        ls "corpus/$t"/sample-* >/dev/null
    fi
done
# llama_state: valid state blobs written by the seed generator (real f16 values of data/sample).
[[ " $targets " = *" llama_state "* ]] && python3 cpp/make_llama_state_seeds.py corpus/llama_state

max_len() {
    case "$1" in
        gear_v1_decode | h2o_replay) echo 4096 ;;
        mlp_weights) echo 32768 ;;
        kvq_rows) echo 2048 ;;
        kvq_file | prefix_file) echo 16384 ;;
        *) echo 8192 ;;
    esac
}

[ -n "${FUZZ_BUILD_ONLY:-}" ] && exit 0

# c8_checkpoint writes its two files per input here (tmpfs when there is one).
scratch="$(mktemp -d -p /dev/shm kvc-fuzz.XXXXXX 2>/dev/null || mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export KVC_FUZZ_SCRATCH="$scratch"

status=0
summary=()
for t in $targets; do
    mkdir -p "artifacts/$t"
    log="artifacts/$t.log"
    if [ "$mode" = time ]; then
        budget=(-max_total_time="$limit")
    else
        budget=(-runs="$limit")
    fi
    echo "== $t (${budget[*]})"
    start=$(date +%s)
    if "$(bin_of "$t")" "corpus/$t" "${budget[@]}" -max_len="$(max_len "$t")" \
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="artifacts/$t/" \
        -print_final_stats=1 >"$log" 2>&1; then
        result=ok
    else
        result="CRASH (see fuzz/$log and fuzz/artifacts/$t/)"
        status=1
        tail -40 "$log"
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    summary+=("$t: ${runs:-?} executions in $(($(date +%s) - start)) s, corpus $(ls "corpus/$t" | wc -l) files: $result")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$status"
