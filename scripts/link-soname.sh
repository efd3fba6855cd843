#!/usr/bin/env bash
# Makes a cargo build tree usable as it stands: `cargo build` writes libkvc.so with the
# soname libkvc.so.0 (crates/kvc-capi/build.rs) but no file of that name, so a program
# linked with -L target/release -lkvc records libkvc.so.0 and then fails to start
# ("libkvc.so.0: cannot open shared object file"). This adds the link the CMake install
# makes, beside the library:
#
#   scripts/link-soname.sh                  target/release and target/debug, where built
#   scripts/link-soname.sh DIR...           these directories
#
# The link's name is the library's own DT_SONAME (read with readelf), so it follows an ABI
# major bump by itself. Run it again after a clean; it only ever touches DIR/<soname>.
# Linux only (macOS' install name and Windows' DLL need no link).
set -euo pipefail
cd "$(dirname "$0")/.."
dirs=("$@")
explicit=1
if [ ${#dirs[@]} -eq 0 ]; then
    dirs=(target/release target/debug)
    explicit=0
fi
command -v readelf >/dev/null 2>&1 || { echo "link-soname: readelf not found (binutils)" >&2; exit 1; }
made=0
for dir in "${dirs[@]}"; do
    lib="$dir/libkvc.so"
    if [ ! -f "$lib" ]; then
        [ "$explicit" = 0 ] && continue
        echo "link-soname: no $lib (build it first: cargo build [--release] -p kvc-capi)" >&2
        exit 1
    fi
    soname="$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
    case "$soname" in
        libkvc.so.*) ;;
        *) echo "link-soname: $lib has no libkvc.so.N soname (found '$soname')" >&2; exit 1 ;;
    esac
    ln -sfn libkvc.so "$dir/$soname"
    echo "$dir/$soname -> libkvc.so"
    made=$((made + 1))
done
[ "$made" -gt 0 ] || { echo "link-soname: no libkvc.so under target/release or target/debug; build first" >&2; exit 1; }
