#!/bin/sh
# pkgconfig_consumer.sh PREFIX BUILD_DIR: builds ffi-tests/consumer/consumer.c with the
# flags `pkg-config kvc` gives for an install tree at PREFIX, shared and static, and runs both.
set -eu
prefix=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
pcdir=$(dirname "$(find "$prefix" -name kvc.pc | head -1)")
export PKG_CONFIG_PATH="$pcdir"
cc=${CC:-cc}
mkdir -p "$out"
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Wextra -Werror "$here/consumer/consumer.c" -o "$out/pc_shared" \
    $(pkg-config --cflags --libs kvc) -Wl,-rpath,"$(pkg-config --variable=libdir kvc)"
"$out/pc_shared"
libdir=$(pkg-config --variable=libdir kvc)
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Wextra -Werror "$here/consumer/consumer.c" -o "$out/pc_static" \
    $(pkg-config --cflags kvc) "$libdir/libkvc.a" $(pkg-config --static --libs-only-l kvc | sed 's/-lkvc//')
"$out/pc_static"
