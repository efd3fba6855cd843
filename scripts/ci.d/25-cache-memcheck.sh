#!/usr/bin/env bash
# kvc-cache's unsafe code (PagedBuffer's mmap / madvise / mincore / munmap) under valgrind
# memcheck: the crate's unit-test binary, which 10-rust.sh has
# already built, so this step compiles nothing new (about 20 s).
#
# Why not AddressSanitizer: `RUSTC_BOOTSTRAP=1 RUSTFLAGS=-Zsanitizer=address cargo test
# -p kvc-cache --lib --target x86_64-unknown-linux-gnu` does work on the stable toolchain
# (all tests pass clean), but it rebuilds every dependency, dev-dependencies included,
# instrumented: 17.6 minutes wall (7 min CPU) on the 2-core dev machine, far over this
# step's 2-minute budget. Run it by hand when the unsafe code changes.
set -euo pipefail
cd "$(dirname "$0")/../.."
# `--workspace`, exactly as 10-rust.sh built it: with `-p kvc-cache` cargo would unify
# features differently and rebuild dependencies.
bin=$(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "kvc_cache" \
            and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
')
[ -n "$bin" ] || { echo "cache-memcheck: kvc-cache test binary not found" >&2; exit 1; }
valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite --show-possibly-lost=no -q \
    "$bin" --test-threads=2
echo "cache-memcheck: kvc-cache unit tests clean under valgrind memcheck"
