#!/usr/bin/env bash
# Installs what a fresh Debian machine with only the Rust toolchain lacks for kvc's tests:
# cmake and C/C++ compilers (ffi-tests, the llama.cpp client), clang's sanitizer runtime, valgrind,
# redis-server and redis-cli (kvc-store-tiers' tests), and the Python packages the fixture
# scripts use. Installs nothing that is already there.
set -euo pipefail

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
command -v c++ >/dev/null 2>&1 || need_apt+=(g++)
command -v clang >/dev/null 2>&1 || need_apt+=(clang libclang-rt-14-dev)
command -v ninja >/dev/null 2>&1 || need_apt+=(ninja-build)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v valgrind >/dev/null 2>&1 || need_apt+=(valgrind)
# patch: fetch-and-build.sh applies kvc's patch series to llama.cpp
command -v patch >/dev/null 2>&1 || need_apt+=(patch)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
# virtual environments (the MNN step installs PyPI's MNN converter into one); Debian's python3
# lacks ensurepip without python3-venv
python3 -c 'import ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
# kvc-store-tiers' tests start their own Redis servers and cluster on 127.0.0.1.
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)

if ((${#need_apt[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "install-deps: apt-get install ${need_apt[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

need_py=()
for mod in numpy safetensors gguf; do
    python3 -c "import $mod" >/dev/null 2>&1 || need_py+=("$mod")
done
if ((${#need_py[@]})); then
    echo "install-deps: pip install ${need_py[*]}"
    python3 -m pip install -q "${need_py[@]}" 2>/dev/null \
        || python3 -m pip install -q --break-system-packages "${need_py[@]}"
fi

rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
