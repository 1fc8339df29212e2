#!/usr/bin/env bash
# bench/scenarios/commit_scaling.sh — does a commit's cost grow with the size
# of the node it touches? tree_bench --commit-scaling builds, in a store on
# tmpfs (fsync none), a node /0 with N children (each a node of its own with
# one attribute) and N attributes, for N = 10^2, 10^4, 10^6 (quick and tiny
# modes use smaller top sizes), then times single-op commits through
# Store::Commit: insert a child at 0, append a child, delete child 0, put an
# existing attribute. One invocation measures every size back to back, so
# each invocation gives one paired sample of (largest N, N = 100); it runs
# BENCH_REPS times. Goal (issue 15): the largest N's p50 within 2x of
# N = 100's (A = largest N, B = 100; lower is better, so the ratio is
# p50(100) / p50(largest) and the goal is >= 0.5).
# The same invocation prints memory per node: a 1000 x 999 tree without
# attributes (RSS growth / nodes, goal <= 64 B) next to the same shape as a
# plain mutable unique_ptr tree built in the same process.
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

bin=$BENCH_BUILD/bench/tree_bench
[[ -x $bin ]] || { bench_log "$bin not built (cmake --build $BENCH_BUILD --target tree_bench)"; exit 1; }
"$bin" --help | grep -q -- --commit-scaling || { bench_log "$bin predates --commit-scaling: rebuild tree_bench"; exit 1; }
reps=${BENCH_REPS:-3}
top=$(bench_pick 10000 1000000 1000000)
commits=$(bench_pick 50 300 1000)
memory_nodes=$(bench_pick 100000 1000000 1000000)
sizes="100,10000"
((top > 10000)) && sizes="$sizes,$top"

work=$BENCH_WORK/commit_scaling
trap 'rm -rf "$work"' EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
runs=$work/runs.jsonl
: > "$runs"

for ((i = 1; i <= reps; i++)); do
  bench_log "rep $i/$reps: tree_bench --commit-scaling --scaling-sizes $sizes --scaling-commits $commits"
  "$bin" --commit-scaling --dir "$work" --scaling-sizes "$sizes" --scaling-commits "$commits" \
    --memory-nodes "$memory_nodes" | jq -c . >> "$runs"
done

# col N FIELD -> JSON array of that p50 for node size N over all reps.
col() { jq -s -c --argjson n "$1" --arg f "$2" 'map(.scaling[] | select(.children == $n) | .[$f])' "$runs"; }

comparisons=$(
  for op in insert_at_0 append delete_at_0 put_attribute; do
    case $op in
      put_attribute) what="put an existing attribute, node with N attributes" ;;
      insert_at_0) what="insert a child at 0, node with N children" ;;
      append) what="append a child, node with N children" ;;
      *) what="delete child 0, node with N children" ;;
    esac
    # A = the large node, B = N = 100: ratio = p50(100) / p50(large), goal >= 0.5.
    bench_comparison "commit p50, $what: N = $top vs N = 100" "µs" false \
      "N = $top" "$(col "$top" "${op}_p50_us")" "N = 100" "$(col 100 "${op}_p50_us")" \
      0.5 "N = $top within 2x of N = 100"
  done
  bench_comparison "memory per node, ${memory_nodes}-node tree without attributes" "bytes/node" false \
    "canopy (persistent, shared)" "$(jq -s -c 'map(.memory_no_attributes.bytes_per_node)' "$runs")" \
    "plain unique_ptr tree" "$(jq -s -c 'map(.memory_plain_tree.bytes_per_node)' "$runs")"
) 
comparisons=$(jq -s -c . <<<"$comparisons")

sweep=$(jq -s -c '[{name: "commit_p50_by_node_size", x_label: "children (and attributes) of the touched node (log)",
    y_label: "commit p50, µs (median over reps)", logscale_x: true,
    series: ([ "insert_at_0", "append", "delete_at_0", "put_attribute" ] | map(. as $op |
      {label: $op, points: ([ $runs[0].scaling[].children ] | map(. as $n |
        [$n, ([ $runs[] | .scaling[] | select(.children == $n) | .[$op + "_p50_us"] ] | sort | .[length / 2 | floor])]))}))}]' \
  --slurpfile runs "$runs" <<<'null')

jq -n --argjson comparisons "$comparisons" --argjson sweeps "$sweep" --slurpfile runs "$runs" \
  --arg sizes "$sizes" --argjson commits "$commits" --argjson mn "$memory_nodes" '
  { scenario: "commit_scaling",
    title: "Commit latency against the size of the touched node; memory per node",
    path: "memory + tmpfs: one thread, Store::Commit with fsync none on BENCH_WORK (tmpfs), wall-clock time per commit",
    params: { node_sizes: $sizes, timed_commits_per_op_and_size: $commits, memory_tree_nodes: $mn,
              memory_tree_shape: ($runs[0].memory_no_attributes.shape), invocations: ($runs | length),
              memory_goal: "<= 64 bytes/node (RSS growth / nodes)",
              memory_bytes_per_node_median: ([ $runs[].memory_no_attributes.bytes_per_node ] | sort | .[length / 2 | floor]) },
    comparisons: $comparisons,
    sweeps: $sweeps,
    details: { runs: $runs } }' > "$BENCH_OUT"
bench_log "done"
