#!/usr/bin/env bash
# kvc-kvq's unit and integration tests under AddressSanitizer + LeakSanitizer
# (scripts/asan-tests.sh kvc-kvq): its AVX2 / AVX-512 kernels read packed rows by pointer,
# at strides an engine passes through kvc_kvq_block_*, the most pointer-heavy unsafe code
# kvc has. Budget: 2 min 20 s wall measured on the shared 2-core machine with one job
# (2 min 15 s for the instrumented build of kvc-kvq and its few dependencies in
# target/asan, 5 s for its 48 tests). The other crates' instrumented build takes far longer
# (docs/DEVELOPING.md, Sanitizers): scripts/asan-tests.sh runs all of them, by hand.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/asan-tests.sh kvc-kvq
