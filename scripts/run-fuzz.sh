#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) and runs each for a
# bounded time, starting from the seed corpus in fuzz/corpus/<target>/.
#   scripts/run-fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
# Fails (non-zero) on any crash, leak, timeout or out-of-memory; the input
# that triggered it is left in build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCANOPY_FUZZ=ON -DCANOPY_SANITIZE=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCANOPY_WITH_DPDK=OFF -DCANOPY_WITH_RDMA=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null
cmake --build build-fuzz --target fuzzers -j "$(nproc)"

targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cd build-fuzz/fuzz && ls fuzz_* | sort)
fi
mkdir -p build-fuzz/artifacts
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=0
run_one() {
  local t=$1 corpus_seed="fuzz/corpus/${1#fuzz_}" work="build-fuzz/corpus/${1#fuzz_}"
  mkdir -p "$work"
  [[ -d $corpus_seed ]] && cp -n "$corpus_seed"/* "$work"/ 2>/dev/null || true
  if "build-fuzz/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -artifact_prefix="build-fuzz/artifacts/$t-" -print_final_stats=1 "$work" >"build-fuzz/$t.log" 2>&1; then
    echo "fuzz: $t ok ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "build-fuzz/$t.log" | grep -o '[0-9]*$') runs in ${seconds}s)"
  else
    echo "fuzz: $t FAILED, see build-fuzz/$t.log:"; tail -40 "build-fuzz/$t.log"; return 1
  fi
}
# Two at a time: one per core of a CI machine.
pids=()
for t in "${targets[@]}"; do
  run_one "$t" & pids+=($!)
  if ((${#pids[@]} >= $(nproc))); then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if ((failed)); then echo "fuzz: failures found"; exit 1; fi
echo "fuzz: ${#targets[@]} targets, no crash, leak or hang"
