#!/usr/bin/env bash
# kvc's whole test suite: installs what is missing, then runs every step in scripts/ci.d/
# in name order (Rust lint and tests, header check, C/C++ tests, integrations).
# Each step is a script of its own so that one area's tests are changed in one place.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
for step in scripts/ci.d/*.sh; do
    echo "==> $step"
    start=$SECONDS
    bash "$step"
    echo "<== $step ($((SECONDS - start)) s)"
done
echo "test-all: every step passed"
