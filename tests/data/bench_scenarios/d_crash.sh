#!/usr/bin/env bash
# bench/scenarios/d_crash.sh — fixture: a scenario that finishes and writes
# its fragment, but one of its programs (named as canopy's own, canopy)
# crashed on the way: bench/run must fail it from the kernel's log.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"
cc=$(command -v cc || command -v gcc || command -v clang) || bench_skip "no C compiler to build the crashing program"
printf 'int main(void) { return *(volatile int *)42; }\n' | "$cc" -x c -o "$BENCH_WORK/canopy" -
"$BENCH_WORK/canopy" 2> /dev/null || echo "fixture: the program exited with status $?" >&2
jq -n '{scenario: "d_crash", title: "fixture", path: "none", params: {}, comparisons: []}' > "$BENCH_OUT"
