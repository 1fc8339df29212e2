#!/usr/bin/env bash
# bench/scenarios/b_skip.sh — fixture: a scenario whose peer is missing.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"
bench_skip "peer frobnicator missing (fixture)"
