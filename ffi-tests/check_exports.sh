#!/bin/sh
# check_exports.sh LIB SONAME: the shared library's dynamic symbol table defines only
# kvc_* symbols (no Rust std, no bundled C library such as zstd), and its soname is SONAME.
set -eu
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
