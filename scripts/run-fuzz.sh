#!/usr/bin/env bash
# Runs every libFuzzer target (built by scripts/build.sh --sanitize, ASan +
# UBSan) for a bounded time, starting from the seed corpus in
# fuzz/corpus/<target>/, two at a time (one per core of a CI machine).
#   scripts/run-fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     default 60 s
# Fails (non-zero) on any crash, leak, timeout or out-of-memory; the input
# that triggered it is left in build-asan/fuzz-artifacts/ and the log in
# build-asan/fuzz-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true

[[ -d build-asan/fuzz ]] || bash scripts/build.sh --sanitize

targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cd build-asan/fuzz && ls fuzz_* | sort)
fi
mkdir -p build-asan/fuzz-artifacts build-asan/fuzz-logs
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_one() {
  local t=$1 name=${1#fuzz_}
  local seed="fuzz/corpus/$name" work="build-asan/fuzz-corpus/$name" log="build-asan/fuzz-logs/$t.log"
  mkdir -p "$work"
  if [[ -d $seed ]]; then cp -n "$seed"/* "$work"/ 2>/dev/null || true; fi
  if "build-asan/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -artifact_prefix="build-asan/fuzz-artifacts/$t-" -print_final_stats=1 "$work" >"$log" 2>&1; then
    echo "fuzz: $t ok ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') runs in ${seconds} s)"
  else
    echo "fuzz: $t FAILED, see $log:"
    tail -40 "$log"
    return 1
  fi
}
failed=0
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if ((${#pids[@]} >= $(nproc))); then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if ((failed)); then
  echo "fuzz: failures found"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, no crash, leak or hang"
