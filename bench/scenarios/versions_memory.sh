#!/usr/bin/env bash
# bench/scenarios/versions_memory.sh — memory of retained past versions.
# Goal (issue 15): keeping the last 10^4 versions of a 10^6-node tree, each
# commit changing one node, costs <= 2x the memory of the latest version
# alone. versions_bench builds a FANOUT x FANOUT2 tree through commits, then
# makes EDITS commits that each change one leaf; the figure is the process's
# RSS growth over the run. A: the store retains the newest EDITS versions
# (every edit's version); B: it retains the latest version alone (--keep 1),
# the same tree and edits. Separate processes, alternating A, B, A, B.
# lower is better, so ratio = B / A; the goal (<= 2x) is ratio >= 0.5.
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

bin=$BENCH_BUILD/bench/versions_bench
[[ -x $bin ]] || { bench_log "$bin not built (cmake --build $BENCH_BUILD --target versions_bench)"; exit 1; }
reps=${BENCH_REPS:-3}
fanout=$(bench_pick 100 1000 1000)
fanout2=$(bench_pick 100 1000 1000)
edits=$(bench_pick 1000 10000 10000)

work=$BENCH_WORK/versions_memory
trap 'rm -rf "$work"' EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
runs=$work/runs.jsonl
: > "$runs"

for ((i = 1; i <= reps; i++)); do
  for keep in "$edits" 1; do
    bench_log "rep $i/$reps: tree $fanout x $fanout2, $edits one-leaf edits, keep $keep versions"
    "$bin" --json --dir "$work" --fanout "$fanout" --fanout2 "$fanout2" --edits "$edits" --keep "$keep" \
      --seed "$i" | jq -c --argjson rep "$i" '. + {rep: $rep}' >> "$runs"
  done
done

# mib KEEP -> JSON array of the RSS growth (MiB) of the runs that kept KEEP versions.
mib() { jq -s -c --argjson k "$1" 'map(select(.keep_versions == $k) | .rss_growth_bytes / 1048576)' "$runs"; }
nodes=$(jq -s '.[0].nodes' "$runs")
ratio=$(jq -s --argjson k "$edits" '
  (map(select(.keep_versions == $k) | .rss_growth_bytes) | sort | .[length / 2 | floor]) as $a |
  (map(select(.keep_versions == 1) | .rss_growth_bytes) | sort | .[length / 2 | floor]) as $b |
  if $b > 0 then $a / $b else 0 end' "$runs")
bench_log "tree $fanout x $fanout2 ($nodes nodes): keeping $edits versions costs $(printf '%.2f' "$ratio")x the RSS of the latest alone (goal <= 2x)"

comparisons=$(
  bench_comparison "RSS growth, tree $fanout x $fanout2 ($nodes nodes), $edits one-leaf commits" "MiB" false \
    "keep last $edits versions" "$(mib "$edits")" "latest version alone" "$(mib 1)" \
    0.5 "keeping the last $edits versions costs <= 2x the memory of the latest version alone" | jq -s -c .
)

jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" \
  --arg shape "$fanout x $fanout2" --argjson nodes "$nodes" --argjson edits "$edits" --argjson ratio "$ratio" '
  { scenario: "versions_memory",
    title: "Memory of retained versions: the last N versions vs the latest alone",
    path: "memory only: one process per run, store WAL on tmpfs (not in RSS), fsync none, no checkpoints",
    params: { shape: $shape, nodes: $nodes, edits: $edits, edit: "one 8-byte attribute on a random leaf",
              invocations: ($runs | length) },
    comparisons: $comparisons,
    details: { retained_over_latest: $ratio, runs: $runs } }' > "$BENCH_OUT"
bench_log "done"
