#!/usr/bin/env bash
# Configures and builds canopy.
#   scripts/build.sh              -> build/        (RelWithDebInfo)
#   scripts/build.sh --sanitize   -> build-asan/   (ASan + UBSan)
# Extra arguments after "--" go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build
cmake_args=()
while (($#)); do
  case "$1" in
    --sanitize) dir=build-asan; cmake_args+=(-DCANOPY_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug) ;;
    --dir) dir=$2; shift ;;
    --) shift; cmake_args+=("$@"); break ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

jobs=$(nproc)
cmake -S . -B "$dir" -G Ninja "${cmake_args[@]}" >/dev/null
cmake --build "$dir" -j "$jobs"
