#!/usr/bin/env bash
# bench/scenarios/a_pair.sh — fixture for tests/bench_run_test.sh: fixed samples, so the
# harness's medians, ratios and goals can be checked exactly.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"
[[ $BENCH_MODE == tiny && $BENCH_REPS == 3 && -d $BENCH_WORK && -n $BENCH_BUILD ]] || { echo "bad environment" >&2; exit 1; }
up=$(bench_comparison "higher is better" Gbit/s true fast "$(bench_samples 3 1 2)" slow "$(bench_samples 1 1 1)" 1.5 "fast at least 1.5x slow")
down=$(bench_comparison "lower is better" us false quick "$(bench_samples 10 30 20 40)" slow "$(bench_samples 80 80 80 80)" 5 "quick 5x faster")
jq -n --argjson up "$up" --argjson down "$down" '{scenario: "a_pair", title: "fixture", path: "none",
  params: {n: 3}, comparisons: [$up, $down],
  sweeps: [{name: "line", x_label: "x", y_label: "y", logscale_x: true,
            series: [{label: "it'"'"'s A", points: [[1, 2], [4, 3]]}, {label: "B", points: [[1, 1], [4, 1]]}]}]}' > "$BENCH_OUT"
echo "fixture progress line" >&2
