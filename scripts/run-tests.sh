#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test with
# ctest, then builds the tests again with ASan+UBSan and runs them there too.
# Hardware-only tests skip (with the reason) when the hardware is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

jobs=$(nproc)
echo "=== build (RelWithDebInfo)"
bash scripts/build.sh
echo "=== tests"
(cd build && ctest --output-on-failure -j "$jobs" --timeout 600)

echo "=== build (ASan + UBSan)"
bash scripts/build.sh --sanitize
echo "=== tests under ASan + UBSan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-asan && ctest --output-on-failure -j "$jobs" --timeout 900 -LE no_sanitize)
