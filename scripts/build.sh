#!/usr/bin/env bash
# Configures and builds canopy.
#   scripts/build.sh              -> build/       gcc, RelWithDebInfo
#   scripts/build.sh --sanitize   -> build-asan/  clang, ASan + UBSan, with the
#                                    libFuzzer targets (fuzz/) built alongside
#                                    the tests, so one sanitizer build serves both
# Extra arguments after "--" go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build
cmake_args=()
while (($#)); do
  case "$1" in
    --sanitize)
      dir=build-asan
      export CC=clang CXX=clang++
      cmake_args+=(-DCANOPY_SANITIZE=ON -DCANOPY_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
                   "-DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link" "-DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link")
      ;;
    --dir) dir=$2; shift ;;
    --) shift; cmake_args+=("$@"); break ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

cmake -S . -B "$dir" -G Ninja "${cmake_args[@]}" >/dev/null
cmake --build "$dir" -j "$(nproc)"
