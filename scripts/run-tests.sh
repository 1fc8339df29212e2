#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds with gcc and runs
# every test with ctest; then builds again with clang + ASan + UBSan and runs
# the tests there too (all but those labelled no_sanitize), and runs every
# fuzz target for CANOPY_FUZZ_SECONDS (default 30) each.
# Tests that need hardware this machine lacks (an RDMA device) skip, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

jobs=$(nproc)
start=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - start )) s] $*"; }

stamp "build (gcc, RelWithDebInfo)"
bash scripts/build.sh
stamp "tests"
(cd build && ctest --output-on-failure -j "$jobs" --timeout 600)

stamp "build (clang, ASan + UBSan, fuzz targets)"
bash scripts/build.sh --sanitize
stamp "tests under ASan + UBSan"
# Freed memory is filled: a use after free by code ASan does not instrument
# (libraft, libuv, rdma-core) then reads garbage instead of the old bytes.
export ASAN_OPTIONS=detect_leaks=1:max_free_fill_size=4096:free_fill_byte=42
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-asan && ctest --output-on-failure -j "$jobs" --timeout 900 -LE no_sanitize)

stamp "fuzzing"
bash scripts/run-fuzz.sh "${CANOPY_FUZZ_SECONDS:-30}"
stamp "done"
