#!/bin/sh
# check_exports.sh LIB SONAME: the shared library's dynamic symbol table defines only
# kvc_* symbols (no Rust std, no bundled C library such as zstd), its soname is SONAME, and
# its ABI matches the checked-in baseline ffi-tests/abi-baseline.txt: every exported kvc_*
# symbol and the layout (size, field offsets) of every struct in include/kvc.h, offsets
# measured by the C compiler ($CC, default cc). See ffi-tests/abi_baseline.py.
#
# The rule (docs/c-api.md, "Versioning"): within an ABI major version no symbol is removed or
# renamed, no kvc_api field moves (new fields only at the end), and no other struct changes.
# Additions fail this check too until they are recorded: bump KVC_ABI_VERSION_MINOR, then
#
# check_exports.sh --update [--force]: build the release library (cargo build --release -p
# kvc-capi into target/) and rewrite the baseline from it. Refuses a baseline that breaks the
# old one or adds without a new ABI minor; --force only for a new ABI major version.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
baseline="$here/abi-baseline.txt"
if [ "${1:-}" = "--update" ]; then
    shift
    (cd "$root" && cargo build --locked --release -p kvc-capi)
    exec python3 "$here/abi_baseline.py" update "$root/target/release/libkvc.so" \
        "$root/include/kvc.h" "$baseline" "$@"
fi
lib=$1
want_soname=$2
defined=$(nm -D --defined-only "$lib" | awk '{print $NF}')
if [ -z "$defined" ]; then
    echo "check_exports: $lib defines no dynamic symbols" >&2
    exit 1
fi
stray=$(printf '%s\n' "$defined" | grep -v '^kvc_' || true)
if [ -n "$stray" ]; then
    echo "check_exports: $lib exports symbols outside kvc_*:" >&2
    printf '%s\n' "$stray" | head -20 >&2
    exit 1
fi
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
if [ "$soname" != "$want_soname" ]; then
    echo "check_exports: soname of $lib is '$soname', expected '$want_soname'" >&2
    exit 1
fi
echo "check_exports: $(printf '%s\n' "$defined" | wc -l) symbols, all kvc_*; soname $soname"
python3 "$here/abi_baseline.py" check "$lib" "$root/include/kvc.h" "$baseline"
