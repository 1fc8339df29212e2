#!/usr/bin/env bash
# Tests bench/run, the benchmark harness, so it cannot rot:
#  1. bad usage exits 2 with a message;
#  2. on fixture scenarios (tests/data/bench_scenarios) with fixed samples: the
#     medians, spreads, ratios (inverted for lower-is-better), goals, skip and
#     failure records, the exit status, the results page and the plots;
#  3. every real scenario in bench/scenarios in tiny mode: run.json conforms
#     to bench/run.schema.json, no scenario fails (skips must give a reason),
#     and RESULTS.md has one row per comparison.
#   tests/bench_run_test.sh REPO BUILD_DIR JSON_SCHEMA_CHECK
set -euo pipefail
repo=$1 build=$2 check=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
expect_eq() { [[ "$1" == "$2" ]] || fail "$3: expected '$2', got '$1'"; }

# 1. usage
for args in "--mode bogus" "--reps 0" "--only no_such_scenario" "--frobnicate" "--scenarios $tmp/none"; do
  set +e
  bash "$repo/bench/run" $args --no-build --build "$build" > "$tmp/usage.out" 2> "$tmp/usage.err"
  rc=$?
  set -e
  expect_eq "$rc" 2 "bench/run $args exit status"
  grep -q '^bench/run: ' "$tmp/usage.err" || fail "bench/run $args printed no error: $(cat "$tmp/usage.err")"
done

# 2. fixtures
set +e
bash "$repo/bench/run" --mode tiny --reps 3 --no-build --build "$build" \
  --scenarios "$repo/tests/data/bench_scenarios" --out "$tmp/fx" > "$tmp/fx.out" 2> "$tmp/fx.err"
rc=$?
set -e
expect_eq "$rc" 1 "exit status with failed scenarios"
run=$tmp/fx/run.json
"$check" "$repo/bench/run.schema.json" "$run" || fail "fixture run.json does not conform to bench/run.schema.json"
q() { jq -r "$1" "$run"; }
# d_crash: failed from the kernel log where the harness can read it.
crash_status=failed
[[ $(q '.scenarios[3].crash_check') == kernel-log ]] || crash_status=ok
[[ $(q '.scenarios[3].status') == skipped ]] && crash_status=skipped
expect_eq "$(q '.scenarios | map(.scenario + "=" + .status) | join(",")')" \
  "a_pair=ok,b_skip=skipped,c_fail=failed,d_crash=$crash_status" "statuses"
if [[ $crash_status == failed ]]; then
  q '.scenarios[3].crashes[0]' | grep -q '^canopy\[[0-9]*\]: segfault at 2a ' ||
    fail "d_crash: the kernel's crash line is missing: $(q '.scenarios[3]')"
  [[ $(q '.scenarios[0].crashes') == null ]] || fail "a_pair reported crashes: $(q '.scenarios[0].crashes')"
fi
expect_eq "$(q '.scenarios[0].comparisons[0] | [.a.stats.median, .a.stats.min, .a.stats.max, .a.stats.n, .b.stats.median, .ratio, .goal.met] | map(tostring) | join(" ")')" \
  "2 1 3 3 1 2 true" "higher-is-better stats, ratio and goal"
expect_eq "$(q '.scenarios[0].comparisons[1] | [.a.stats.median, .b.stats.median, .ratio, .goal.met] | map(tostring) | join(" ")')" \
  "25 80 3.2 false" "lower-is-better median (even count), inverted ratio, missed goal"
expect_eq "$(q '.scenarios[1].skipped')" "peer frobnicator missing (fixture)" "skip reason"
expect_eq "$(q '.scenarios[2].exit_code')" 3 "failed scenario's exit code"
q '.scenarios[2].error' | grep -q 'server did not start' || fail "failed scenario's stderr tail missing"
grep -q 'fixture progress line' "$tmp/fx/logs/a_pair.log" || fail "scenario log missing its stderr"
md=$tmp/fx/RESULTS.md
[[ -f $md ]] || fail "no RESULTS.md beside a fixture run"
grep -q '^| 1 | a_pair | higher is better | fast: 2 (1–3, n=3) | slow: 1 (1–1, n=3) | Gbit/s ↑ | \*\*2\*\* | met: fast at least 1.5x slow |$' "$md" ||
  fail "RESULTS.md row 1 wrong: $(grep '^| 1 ' "$md")"
grep -q '^| 2 | a_pair | lower is better | .* | \*\*3.2\*\* | missed: quick 5x faster |$' "$md" || fail "RESULTS.md row 2 wrong"
grep -q 'b_skip\*\*: skipped — peer frobnicator missing' "$md" || fail "RESULTS.md does not list the skip"
grep -q 'c_fail\*\*: failed (exit 3)' "$md" || fail "RESULTS.md does not list the failure"
grep -qF 'higher is better: fast 2 vs slow 1 Gbit/s  ratio 2  (goal met' "$tmp/fx.out" || fail "summary line missing: $(cat "$tmp/fx.out")"
if command -v gnuplot > /dev/null; then
  for png in ratios a_pair-line; do
    [[ -s $tmp/fx/plots/$png.png ]] && [[ $(head -c 4 "$tmp/fx/plots/$png.png" | tail -c 3) == PNG ]] ||
      fail "plot $png.png missing or not a PNG"
  done
  grep -q '(plots/ratios.png)' "$md" || fail "RESULTS.md does not link the ratio plot"
fi
# bench/report rebuilds the same page from the stored JSON.
bash "$repo/bench/report" "$run" --md "$tmp/fx/again.md"
diff <(sed '/^## Plots/,$d' "$md") <(sed '/^## Plots/,$d' "$tmp/fx/again.md") > /dev/null || fail "bench/report does not reproduce RESULTS.md"

# 3. the real scenarios, tiny
set +e
bash "$repo/bench/run" --mode tiny --no-build --build "$build" --out "$tmp/real" > "$tmp/real.out" 2> "$tmp/real.err"
rc=$?
set -e
run=$tmp/real/run.json
if [[ ! -f $run ]]; then
  fail "bench/run --mode tiny wrote no run.json (exit $rc): $(tail -n 20 "$tmp/real.err")"
else
  "$check" "$repo/bench/run.schema.json" "$run" || fail "tiny run.json does not conform to bench/run.schema.json"
  expect_eq "$rc" 0 "tiny run exit status"
  n_scen=$(ls "$repo"/bench/scenarios/*.sh | wc -l)
  expect_eq "$(q '.scenarios | length')" "$n_scen" "scenarios run"
  q '.scenarios[] | select(.status == "failed") | "FAILED \(.scenario): \(.error)"' >&2
  expect_eq "$(q '[.scenarios[] | select(.status == "failed")] | length')" 0 "failed scenarios"
  expect_eq "$(q '[.scenarios[] | select(.status == "skipped" and ((.skipped // "") | length) == 0)] | length')" 0 "skips without a reason"
  [[ $(q '[.scenarios[] | select(.status == "ok")] | length') -ge 1 ]] || fail "no scenario ran"
  expect_eq "$(q '[.scenarios[] | select(.status == "ok") | .comparisons[] | select(.a.stats.n < 1 or .b.stats.n < 1)] | length')" 0 "comparisons without samples"
  rows=$(grep -c '^| [0-9]' "$tmp/real/RESULTS.md" || true)
  expect_eq "$rows" "$(q '[.scenarios[] | select(.status == "ok") | .comparisons[]] | length')" "RESULTS.md rows"
  q '.scenarios[] | "  \(.scenario): \(.status) \(.seconds) s \(.skipped // "")"' >&2
fi
((fails == 0)) || { echo "bench_run_test: $fails failure(s)" >&2; exit 1; }
echo "bench_run_test: all checks passed"
