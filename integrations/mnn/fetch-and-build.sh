#!/usr/bin/env bash
# Builds MNN's LLM engine for the CPU with kvc's patch series, converts SmolLM2-135M-Instruct
# into MNN's format and builds the evaluation client, all cached under .cache/mnn/ (git-ignored),
# so a second run only checks:
#   1. the MNN source: MNN_SOURCE_DIR (your upstream MNN checkout), else the upstream tarball in
#      ../shared/engines/ (sha256-pinned), unpacked into the cache. With neither, prints one
#      line saying so and exits 3 (CI skips its MNN step on that code);
#   1b. kvc's patch series (integrations/mnn/patches/*.patch, in name order) on a copy of it;
#      a patch that no longer applies stops the script;
#   2. SmolLM2-135M-Instruct GGUF and the two texts (integrations/common/fetch-inputs.sh);
#   3. kvc's shared library (cargo, release), which MNN finds at run time (llm_config
#      kvc_library); MNN does not link it;
#   4. MNN: CMake + ninja, Release, MNN_BUILD_LLM=ON, MNN_KVC=ON (kvc.h from include/),
#      AVX-512 off (MNN's x86 kernels are SSE/AVX2/FMA objects chosen at run time; no
#      -march=native, no AMX), only the targets the client needs (MNN, MNN_Express, llm);
#   5. the model: MNN's own gguf2mnn.py (patched: 0001) writes the GGUF's exact Q4_1 weights
#      into the graph llmexport.py made for this model (integrations/mnn/model/, made by
#      export-graph.sh with torch, which this script never installs); needs only numpy and
#      PyPI's MNN converter (mnn==3.6.1, in a virtual environment in the cache);
#   6. the kvc_mnn_eval client and a kvc library that fails on purpose for CI's mid-run error
#      check (integrations/mnn/CMakeLists.txt).
# With --fork it does the same for the research fork the specification describes, to measure it
# beside kvc (evaluate.sh): MNN_FORK_SOURCE_DIR or the fork's tarball, the series in
# integrations/mnn/fork-patches/ (gguf2mnn's fix and the same bytes-held report; no kvc), the
# graph the fork's exporter makes (mnn==3.4.0: newer exporters emit ops the fork cannot run).
# --source-only stops after step 1 and prints the unpatched tree (MNN_SRC).
# Prints the paths it produced. Environment:
#   MNN_SOURCE_DIR   upstream MNN tree to build (default: the tarball, see 1)
#   MNN_FORK_SOURCE_DIR  the fork's tree, with --fork (default: its tarball)
#   KVC_MNN_ENGINES  folder with the MNN tarballs (default <repo>/../shared/engines)
#   KVC_MNN_CACHE    cache directory (default <repo>/.cache/mnn)
#   KVC_MNN_JOBS     parallel build jobs (default: nproc)
set -euo pipefail

tree=upstream
source_only=0
for arg in "$@"; do
    case "$arg" in
        --fork) tree=fork ;;
        --source-only) source_only=1 ;;
        *) echo "usage: $0 [--fork] [--source-only]" >&2; exit 2 ;;
    esac
done
if [ "$tree" = upstream ]; then
    MNN_TARBALL=mnn-upstream-4d40bdbd7.tar.gz
    MNN_TARBALL_SHA256=2a0eb78b7a7738ad996838ea02e8d6cfd452a2713ae4c03318b098f791917bb7
    MNN_PYPI_VERSION=3.6.1
    MODEL_NAME=smollm2-135m-instruct
    PATCHES=patches
    source_dir="${MNN_SOURCE_DIR:-}"
    source_var=MNN_SOURCE_DIR
    kvc_flags=(-DMNN_KVC=ON)
else
    MNN_TARBALL=mnn-kvfork-3e0f511e.tar.gz
    MNN_TARBALL_SHA256=28edac3a8cb2d3eb4ae5d9fa1ae235d3398b4a3ec57fba93ab337ec0169fd7af
    MNN_PYPI_VERSION=3.4.0
    MODEL_NAME=smollm2-135m-instruct-fork
    PATCHES=fork-patches
    source_dir="${MNN_FORK_SOURCE_DIR:-}"
    source_var=MNN_FORK_SOURCE_DIR
    kvc_flags=()
fi

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${KVC_MNN_CACHE:-$repo/.cache/mnn}"
jobs="${KVC_MNN_JOBS:-$(nproc)}"
engines="${KVC_MNN_ENGINES:-$repo/../shared/engines}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

log() { echo "fetch-and-build (mnn): $*" >&2; }
# shellcheck source=../common/engine-build.sh
. "$here/../common/engine-build.sh"

# ---- 1. MNN source ------------------------------------------------------------------------
if [ -n "$source_dir" ]; then
    [ -f "$source_dir/transformers/llm/engine/src/llm.cpp" ] \
        || { log "$source_var=$source_dir is not an MNN tree with the LLM engine"; exit 1; }
    src="$(cd "$source_dir" && pwd)"
    src_id="dir-$(printf '%s' "$src" | sha256sum | cut -c1-12)"
elif [ -f "$engines/$MNN_TARBALL" ]; then
    src_id="${MNN_TARBALL%.tar.gz}"
    src="$cache/$src_id"
    unpack_pinned "$engines/$MNN_TARBALL" "$MNN_TARBALL_SHA256" "$src" transformers/llm/engine/src/llm.cpp
else
    echo "no MNN source: set $source_var to an MNN checkout (or put $MNN_TARBALL in $engines)"
    exit 3
fi

if [ "$source_only" = 1 ]; then
    echo "MNN_SRC=$src"
    exit 0
fi

# ---- 1b. patch series -----------------------------------------------------------------------
apply_patch_series "$src" "$here/$PATCHES" "$cache/src-$src_id" "MNN $tree ($src)"
psrc="$PATCHED_SRC"

# ---- 2. model and texts -------------------------------------------------------------------
# shellcheck source=../common/fetch-inputs.sh
. "$here/../common/fetch-inputs.sh"
fetch_inputs "$cache"
gguf="$cache/model/$MODEL_FILE"
texts="$cache/texts"

# ---- 3. kvc's shared library --------------------------------------------------------------
build_kvc_library "$repo"
kvc_so="$KVC_TARGET/release/libkvc.so"
[ -f "$kvc_so" ] || { log "no $kvc_so after cargo build"; exit 1; }

# ---- 4. MNN -------------------------------------------------------------------------------
build="$cache/build-$src_id"
stamp="$build/kvc-stamp.txt"
stamp_text="source=$psrc kvc_include=$repo/include"
if [ ! -f "$build/build.ninja" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$stamp_text" ]; then
    log "configuring MNN $tree (CPU, Release, LLM, ${kvc_flags[*]:-no kvc}, AVX-512 off)"
    rm -rf "$build"
    mkdir -p "$build"
    cmake -S "$psrc" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DMNN_BUILD_LLM=ON -DMNN_LOW_MEMORY=ON -DMNN_SUPPORT_TRANSFORMER_FUSE=ON \
        -DMNN_AVX512=OFF -DMNN_BUILD_TOOLS=OFF -DMNN_BUILD_TEST=OFF -DMNN_LLM_BUILD_DEMO=OFF \
        "${kvc_flags[@]}" -DMNN_KVC_INCLUDE_DIR="$repo/include" \
        >"$cache/configure-mnn-$tree.log" 2>&1 || { cat "$cache/configure-mnn-$tree.log" >&2; exit 1; }
    echo "$stamp_text" >"$stamp"
fi
t0=$SECONDS
ninja -C "$build" -j "$jobs" MNN MNN_Express llm >"$cache/build-mnn-$tree.log" 2>&1 \
    || { tail -n 50 "$cache/build-mnn-$tree.log" >&2; exit 1; }
log "MNN $tree build step took $((SECONDS - t0)) s"

# ---- 5. the model in MNN's format ----------------------------------------------------------
venv="$cache/venv-mnn-$MNN_PYPI_VERSION"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import MNN, numpy" >/dev/null 2>&1; then
    log "installing numpy and mnn==$MNN_PYPI_VERSION (MNN's converter) into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "mnn==$MNN_PYPI_VERSION" numpy \
        || { log "pip install mnn==$MNN_PYPI_VERSION numpy failed"; exit 1; }
fi
graph="$here/model/$MODEL_NAME"
model_hash="$(cat "$graph"/* "$psrc/transformers/llm/export/gguf2mnn.py" "$gguf" | sha256sum | cut -c1-12)"
mdir="$cache/model-$MODEL_NAME-$model_hash"
if [ ! -f "$mdir/llm.mnn" ]; then
    rm -rf "$cache/model-$MODEL_NAME"-????????????  # an older conversion
    log "converting $MODEL_FILE into MNN's format with gguf2mnn.py"
    rm -rf "$mdir.tmp"
    mkdir -p "$mdir.tmp"
    gzip -dc "$graph/llm.mnn.json.gz" >"$mdir.tmp/llm.mnn.json"
    cp "$graph/llm_config.json" "$graph/config.json" "$mdir.tmp/"
    (cd "$psrc/transformers/llm/export" && "$venv/bin/python" gguf2mnn.py --gguf "$gguf" \
        --mnn_dir "$mdir.tmp" --load_token 1) >"$cache/convert-model-$tree.log" 2>&1 \
        || { tail -n 30 "$cache/convert-model-$tree.log" >&2; exit 1; }
    rm -f "$mdir.tmp/llm.mnn.json"
    rm -rf "$mdir"
    mv "$mdir.tmp" "$mdir"
fi

# ---- 6. the client -------------------------------------------------------------------------
cbuild="$build/client"
mkdir -p "$cbuild"
if [ ! -f "$cbuild/build.ninja" ]; then
    cmake -S "$here" -B "$cbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DMNN_SOURCE_DIR="$psrc" -DMNN_BUILD_DIR="$build" >"$cbuild/configure-client.log" 2>&1 \
        || { cat "$cbuild/configure-client.log" >&2; exit 1; }
fi
ninja -C "$cbuild" -j "$jobs" >"$cbuild/build-client.log" 2>&1 || { cat "$cbuild/build-client.log" >&2; exit 1; }

echo "MNN_SRC=$psrc"
echo "MNN_BUILD=$build"
echo "MNN_CONFIG=$mdir/config.json"
echo "GGUF=$gguf"
echo "KVC_LIBRARY=$kvc_so"
echo "EVAL=$cbuild/kvc_mnn_eval"
echo "FAULT_SHIM=$cbuild/libkvc_fault_shim.so"
echo "TEXT_A=$texts/gpl-3.txt"
echo "TEXT_B=$texts/debian-constitution.txt"
