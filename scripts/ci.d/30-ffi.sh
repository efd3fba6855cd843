#!/usr/bin/env bash
# The C ABI from C and C++: build libkvc in release through the CMake routes, check its
# exports and soname, run ffi-tests/ with the default compiler and again with clang under
# ASan + UBSan, install it, and build a find_package(kvc) consumer and a pkg-config
# consumer against the install tree.
set -euo pipefail
root=$(pwd)
out="$root/build/ffi"
rm -rf "$out/install" "$out/consumer" "$out/pkgconfig" "$out/tree"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)

# 1. The shipped library (no test hooks), built by the top-level CMakeLists into the
#    workspace's target/ (shared with cargo), installed to a prefix.
cmake -S . -B "$out/package" "${gen[@]}" -DKVC_CARGO_TARGET_DIR="$root/target" >/dev/null
cmake --build "$out/package"
sh ffi-tests/check_exports.sh target/release/libkvc.so libkvc.so.0
# 1b. The cargo build tree as it stands (README, Install): scripts/link-soname.sh puts
#     libkvc.so.0 beside target/release/libkvc.so, and a program linked with
#     -L target/release -lkvc then starts.
scripts/link-soname.sh target/release
mkdir -p "$out/tree"
printf '#include "kvc.h"\nint main(void) { return kvc_abi_version() >> 16 == KVC_ABI_VERSION_MAJOR ? 0 : 1; }\n' \
    >"$out/tree/tree.c"
cc -Iinclude "$out/tree/tree.c" -Ltarget/release -lkvc -Wl,-rpath,"$root/target/release" -o "$out/tree/tree"
"$out/tree/tree"
cmake --install "$out/package" --prefix "$out/install" >/dev/null
test -L "$out/install/lib/libkvc.so" && test -L "$out/install/lib/libkvc.so.0"
test -f "$out/install/lib/libkvc.a" && test -f "$out/install/include/kvc.h" \
    && test -f "$out/install/include/kvc.hpp" && test -f "$out/install/lib/cmake/kvc/kvcConfig.cmake" \
    && test -f "$out/install/lib/pkgconfig/kvc.pc"

# 2. ffi-tests with the default compiler, then with clang + ASan + UBSan. Both use the
#    test-hooks build of the library in the dev profile (debug assertions and overflow
#    checks on) in the workspace's target/, reusing what `cargo test` built in 10-rust.sh.
hooks=(-DKVC_CARGO_TARGET_DIR="$root/target" -DKVC_CARGO_PROFILE=dev)
cmake -S ffi-tests -B "$out/tests" "${gen[@]}" "${hooks[@]}" >/dev/null
cmake --build "$out/tests"
ctest --test-dir "$out/tests" --output-on-failure
CC=clang CXX=clang++ cmake -S ffi-tests -B "$out/tests-asan" "${gen[@]}" \
    "${hooks[@]}" -DKVC_SANITIZE=ON >/dev/null
cmake --build "$out/tests-asan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$out/tests-asan" --output-on-failure

# 3. Consumers of the install tree: CMake find_package(kvc) and pkg-config.
cmake -S ffi-tests/consumer -B "$out/consumer" "${gen[@]}" -DCMAKE_PREFIX_PATH="$out/install" >/dev/null
cmake --build "$out/consumer"
"$out/consumer/consumer_shared"
"$out/consumer/consumer_static"
"$out/consumer/consumer_cpp"
ldd "$out/consumer/consumer_shared" | grep "libkvc.so.0 => $out/install/lib/libkvc.so.0"
sh ffi-tests/pkgconfig_consumer.sh "$out/install" "$out/pkgconfig"
echo "ffi: all C/C++ tests, sanitizers and consumers passed"
