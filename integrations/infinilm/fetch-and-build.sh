#!/usr/bin/env bash
# Builds InfiniLM's C++ engine on InfiniCore's CPU backend with kvc's patch series, converts
# SmolLM2-135M-Instruct into InfiniLM's Hugging Face folder and builds the evaluation client, all
# cached under .cache/infinilm/ (git-ignored), offline once the inputs are there:
#   1. the sources: INFINICORE_SOURCE_DIR, INFINILM_SOURCE_DIR and SPDLOG_SOURCE_DIR (a tree
#      with include/spdlog), else the sha256-pinned tarballs in ../shared/engines/, unpacked
#      into the cache. With neither, prints one line saying so and exits 3 (CI skips its
#      InfiniLM step on that code);
#   1b. kvc's patch series (patches/infinicore/*.patch on InfiniCore, patches/infinilm/*.patch
#      on InfiniLM, in name order, exactly); the patched trees are synced into fixed folders
#      file by file, so a changed patch recompiles only the files it changes;
#   2. SmolLM2-135M-Instruct GGUF and the two texts (integrations/common/fetch-inputs.sh);
#   3. kvc's shared library (cargo, release), which InfiniLM loads at run time (dlopen and
#      kvc_get_api; the KV-compression config's kvc_library); InfiniLM does not link it;
#   4. InfiniCore (infinirt, infiniop, infiniccl, infinicore_cpp_api), InfiniLM's csrc and the
#      client with CMake + ninja (CMakeLists.txt here: the xmake files' sources and flags, without
#      xmake's network package step), Release, no -march=native;
#   5. the model: convert-model.py writes config.json, model.safetensors (f32) and
#      tokenizer.json from the GGUF, and the two texts' token ids, in a virtual environment in
#      the cache with numpy, gguf and tokenizers.
# Prints the paths it produced. Environment:
#   INFINICORE_SOURCE_DIR, INFINILM_SOURCE_DIR, SPDLOG_SOURCE_DIR   source trees (default: tarballs)
#   KVC_INFINILM_ENGINES   folder with the tarballs (default <repo>/../shared/engines)
#   KVC_INFINILM_CACHE     cache directory (default <repo>/.cache/infinilm)
#   KVC_INFINILM_JOBS      parallel build jobs (default: nproc)
set -euo pipefail

INFINICORE_TARBALL=InfiniCore-f465f826.tar.gz
INFINICORE_SHA256=6281bb186a8dcfc1408b2283922f68d612d3876a883cd8ba49c0b0e19d26ca92
INFINILM_TARBALL=InfiniLM-03dad85d.tar.gz
INFINILM_SHA256=9472897706a03d6610a97c57228e3bdc317750071f78bb580d0535e8db4e8602
SPDLOG_TARBALL=spdlog-62302019-include.tar.gz
SPDLOG_SHA256=fd6bc0ee6ea6dfc530f83d4b7da2732432b4a01b05fc7f682fecf54baf4ad42e
PY_PACKAGES=(numpy==2.4.6 gguf==0.19.0 tokenizers==0.23.3)

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${KVC_INFINILM_CACHE:-$repo/.cache/infinilm}"
jobs="${KVC_INFINILM_JOBS:-$(nproc)}"
engines="${KVC_INFINILM_ENGINES:-$repo/../shared/engines}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

log() { echo "fetch-and-build (infinilm): $*" >&2; }

# shellcheck source=../common/engine-build.sh
. "$here/../common/engine-build.sh"

# ---- 1. sources ---------------------------------------------------------------------------
# source_tree VAR TARBALL SHA256 MARKER: sets TREE to the tree VAR names, else to the tarball
# unpacked into the cache. MARKER is a file the tree must have.
source_tree() {
    local var="$1" tarball="$2" sha="$3" marker="$4"
    if [ -n "${!var:-}" ]; then
        [ -e "${!var}/$marker" ] || { log "$var=${!var} has no $marker"; exit 1; }
        TREE="$(cd "${!var}" && pwd)"
        return
    fi
    if [ ! -f "$engines/$tarball" ]; then
        echo "no InfiniLM sources: set $var (or put $tarball in $engines)"
        exit 3
    fi
    TREE="$cache/${tarball%.tar.gz}"
    unpack_pinned "$engines/$tarball" "$sha" "$TREE" "$marker"
}
source_tree INFINICORE_SOURCE_DIR "$INFINICORE_TARBALL" "$INFINICORE_SHA256" xmake.lua
core_src="$TREE"
source_tree INFINILM_SOURCE_DIR "$INFINILM_TARBALL" "$INFINILM_SHA256" csrc/cache/kv_cache.hpp
lm_src="$TREE"
source_tree SPDLOG_SOURCE_DIR "$SPDLOG_TARBALL" "$SPDLOG_SHA256" include/spdlog/spdlog.h
spdlog_src="$TREE"

# ---- 1b. patch series, synced into fixed folders ------------------------------------------
# sync_tree SRC DEST: DEST becomes a copy of SRC; files whose bytes did not change keep their
# times, so ninja rebuilds only what a patch changed.
sync_tree() {
    local src="$1" dest="$2" f
    mkdir -p "$dest"
    (cd "$src" && find . -type f ! -name .kvc-patched -print0) | while IFS= read -r -d '' f; do
        if ! cmp -s "$src/$f" "$dest/$f"; then
            mkdir -p "$(dirname "$dest/$f")"
            cp "$src/$f" "$dest/$f"
        fi
    done
    (cd "$dest" && find . -type f -print0) | while IFS= read -r -d '' f; do
        [ -e "$src/$f" ] || rm -f "$dest/$f"
    done
}
apply_patch_series "$core_src" "$here/patches/infinicore" "$cache/src-infinicore" "InfiniCore ($core_src)"
sync_tree "$PATCHED_SRC" "$cache/infinicore"
apply_patch_series "$lm_src" "$here/patches/infinilm" "$cache/src-infinilm" "InfiniLM ($lm_src)"
sync_tree "$PATCHED_SRC" "$cache/infinilm"

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

# ---- 4. InfiniCore, InfiniLM and the client -------------------------------------------------
build="$cache/build"
if [ ! -f "$build/build.ninja" ]; then
    log "configuring InfiniCore (CPU, OpenMP) + InfiniLM csrc + client, Release"
    rm -rf "$build"
    cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DINFINICORE_SOURCE_DIR="$cache/infinicore" -DINFINILM_SOURCE_DIR="$cache/infinilm" \
        -DSPDLOG_INCLUDE_DIR="$spdlog_src/include" -DKVC_INCLUDE_DIR="$repo/include" \
        >"$cache/configure.log" 2>&1 || { cat "$cache/configure.log" >&2; exit 1; }
fi
t0=$SECONDS
[ -f "$build/kvc_infinilm_eval" ] || log "building (about 5 minutes on 2 cores the first time)"
ninja -C "$build" -j "$jobs" >"$cache/build.log" 2>&1 || { tail -n 50 "$cache/build.log" >&2; exit 1; }
log "build step took $((SECONDS - t0)) s"

# ---- 5. the model as a Hugging Face folder --------------------------------------------------
venv="$cache/venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import numpy, gguf, tokenizers" >/dev/null 2>&1; then
    log "installing ${PY_PACKAGES[*]} into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "${PY_PACKAGES[@]}" || { log "pip install ${PY_PACKAGES[*]} failed"; exit 1; }
fi
model_hash="$(cat "$here/convert-model.py" "$gguf" | sha256sum | cut -c1-12)"
mdir="$cache/model-$model_hash"
if [ ! -f "$mdir/model.safetensors" ]; then
    rm -rf "$cache"/model-????????????
    log "converting $MODEL_FILE into a Hugging Face folder (convert-model.py)"
    rm -rf "$mdir.tmp"
    "$venv/bin/python" "$here/convert-model.py" "$gguf" "$mdir.tmp" \
        --text "gpl-3=$texts/gpl-3.txt" --text "debian-constitution=$texts/debian-constitution.txt" \
        >"$cache/convert-model.log" 2>&1 || { tail -n 30 "$cache/convert-model.log" >&2; exit 1; }
    mv "$mdir.tmp" "$mdir"
fi

echo "INFINICORE_SRC=$cache/infinicore"
echo "INFINILM_SRC=$cache/infinilm"
echo "INFINILM_BUILD=$build"
echo "MODEL=$mdir"
echo "GGUF=$gguf"
echo "KVC_LIBRARY=$kvc_so"
echo "EVAL=$build/kvc_infinilm_eval"
echo "FAULT_SHIM=$build/libkvc_fault_shim.so"
echo "TOKENS_A=$mdir/gpl-3.ids"
echo "TOKENS_B=$mdir/debian-constitution.ids"
echo "TEXT_A=$texts/gpl-3.txt"
echo "TEXT_B=$texts/debian-constitution.txt"
echo "MLP_WEIGHTS=$repo/data/mlp-weights"
