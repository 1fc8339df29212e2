#!/usr/bin/env bash
# bench/scenarios/membership_scaling.sh — what does an idle canopy node spend
# on membership as the cluster grows? For each size N (tiny: 3 10, quick:
# 3 10 20, full: 3 10 20 50) an idle cluster of N `canopy node`s (no trees,
# no raft, fsync none, data on BENCH_WORK, every node seeded with node 1
# only: the rest is gossip) is started on 127.0.0.1; once every node lists N
# members and a settle period passed, for WINDOW seconds each node's CPU
# (utime + stime from /proc/PID/stat) and its membership counters
# (canopy_membership_messages_total / _bytes_total from --metrics: SWIM
# probes, acks, ping-reqs and gossip, sent + received) are sampled. Printed
# per size: messages/s, bytes/s and % of a core per node (mean over nodes).
# Comparison: CPU per node at the largest N against N = 3 (lower is better;
# goal: within 1.5x, i.e. an idle node's cost does not grow with N); the
# issue's baseline (every node heartbeating every member every 100 ms)
# measured 2.3%, 7.6% and 28.6% of a core at 3, 10 and 20 nodes.
# MEMBERSHIP_BASELINE=PATH: also run every size with that canopy binary (e.g.
# one built before SWIM membership), alternating with this build, for a
# same-run A/B of CPU per node (its membership counters read 0).
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

canopy=$BENCH_BUILD/tools/canopy/canopy
[[ -x $canopy ]] || { bench_log "$canopy not built (cmake --build $BENCH_BUILD --target canopy)"; exit 1; }
sizes=${MEMBERSHIP_SIZES:-$(bench_pick "3 10" "3 10 20" "3 10 20 50")}
window=${MEMBERSHIP_WINDOW_S:-$(bench_pick 3 8 15)}
settle=${MEMBERSHIP_SETTLE_S:-$(bench_pick 2 3 5)}
reps=${BENCH_REPS:-1}

work=$BENCH_WORK/membership_scaling
pids=()
cleanup() { bench_kill "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
echo "membership bench secret, loopback only" > "$work/secret"
common=(--cluster members --secret-file "$work/secret")

# membership PORT -> "messages bytes" (sent + received) from a node's metrics.
membership() {
  curl -s --max-time 5 "http://127.0.0.1:$1/metrics" |
    awk '/^canopy_membership_messages_total/ { m += $NF } /^canopy_membership_bytes_total/ { b += $NF }
         END { printf "%d %d\n", m, b }'
}

rows=()
for ((rep = 1; rep <= reps; rep++)); do
  for n in $sizes; do
   for build_name in this ${MEMBERSHIP_BASELINE:+baseline}; do
    bin=$canopy
    [[ $build_name == baseline ]] && bin=$MEMBERSHIP_BASELINE
    d=$work/n$n-$build_name
    mkdir -p "$d"
    pids=()
    uris=() mports=()
    for ((i = 1; i <= n; i++)); do
      seeds=()
      ((i > 1)) && seeds=(--seed "${uris[0]}")
      "$bin" node --listen tcp://127.0.0.1:0 --uri-file "$d/uri$i" --data "$d/data$i" --node-id "$i" \
        --fsync none "${common[@]}" "${seeds[@]}" --metrics 127.0.0.1:0 --metrics-port-file "$d/mport$i" \
        --log warn > "$d/log$i" 2>&1 &
      pids+=($!)
      bench_wait_file "$d/uri$i" 20 && bench_wait_file "$d/mport$i" 20 ||
        { bench_log "node $i of $n did not start: $(tail -n 5 "$d/log$i")"; exit 1; }
      uris+=("$(cat "$d/uri$i")")
      mports+=("$(cat "$d/mport$i")")
    done
    # Everyone lists n members (gossip converged).
    deadline=$((SECONDS + 60 + n))
    for u in "${uris[@]}"; do
      until [[ $("$bin" status --node "$u" "${common[@]}" --json 2>/dev/null | jq -r '.nodes | length' 2>/dev/null) == "$n" ]]; do
        ((SECONDS < deadline)) || { bench_log "$n-node cluster did not converge"; exit 1; }
        sleep 0.2
      done
    done
    sleep "$settle"
    c0=$(bench_cpu_seconds "${pids[@]}")
    m0=0 b0=0
    for p in "${mports[@]}"; do read -r m b < <(membership "$p"); m0=$((m0 + m)); b0=$((b0 + b)); done
    t0=$(bench_now)
    sleep "$window"
    c1=$(bench_cpu_seconds "${pids[@]}")
    m1=0 b1=0
    for p in "${mports[@]}"; do read -r m b < <(membership "$p"); m1=$((m1 + m)); b1=$((b1 + b)); done
    t1=$(bench_now)
    dead=$("$bin" status --node "${uris[0]}" "${common[@]}" --json | jq '[.nodes[] | select(.alive | not)] | length')
    row=$(awk -v n="$n" -v c0="$c0" -v c1="$c1" -v m="$((m1 - m0))" -v b="$((b1 - b0))" -v s="$(bench_elapsed "$t0" "$t1")" \
      -v dead="$dead" -v rep="$rep" -v build="$build_name" \
      'BEGIN { printf "{\"build\":\"%s\",\"rep\":%d,\"nodes\":%d,\"messages_per_node_s\":%.1f,\"bytes_per_node_s\":%.0f,\"cpu_pct_per_node\":%.3f,\"members_seen_dead_by_node_1\":%d,\"window_s\":%.2f}\n",
               build, rep, n, m / n / s, b / n / s, 100 * (c1 - c0) / n / s, dead, s }')
    rows+=("$row")
    bench_log "$(jq -r '"\(.build): \(.nodes) nodes: \(.messages_per_node_s) membership msgs/s, \(.bytes_per_node_s) B/s, \(.cpu_pct_per_node)% of a core per node (node 1 sees \(.members_seen_dead_by_node_1) dead)"' <<<"$row")"
    bench_kill "${pids[@]}"
    pids=()
    rm -rf "$d"
   done
  done
done

everything=$(printf '%s\n' "${rows[@]}" | jq -s -c .)
all=$(jq -c 'map(select(.build == "this"))' <<<"$everything")
base=$(jq -c 'map(select(.build == "baseline"))' <<<"$everything")
small=$(jq -r '[.[].nodes] | min' <<<"$all")
large=$(jq -r '[.[].nodes] | max' <<<"$all")
col() { jq -c --argjson n "$1" --arg f "$2" 'map(select(.nodes == $n) | .[$f])' <<<"$all"; }
comparisons=$(
  bench_comparison "idle node CPU, % of a core: $large nodes vs $small" "% of a core" false \
    "$large nodes" "$(col "$large" cpu_pct_per_node)" "$small nodes" "$(col "$small" cpu_pct_per_node)" \
    0.67 "an idle node's CPU at $large nodes within 1.5x of its CPU at $small"
  bench_comparison "membership messages per node per second: $large nodes vs $small" "messages/s" false \
    "$large nodes" "$(col "$large" messages_per_node_s)" "$small nodes" "$(col "$small" messages_per_node_s)"
  bench_comparison "membership bytes per node per second: $large nodes vs $small" "bytes/s" false \
    "$large nodes" "$(col "$large" bytes_per_node_s)" "$small nodes" "$(col "$small" bytes_per_node_s)"
  if [[ $(jq length <<<"$base") -gt 0 ]]; then
    for n in $sizes; do
      bench_comparison "idle node CPU, % of a core, $n nodes: this build (SWIM) vs baseline ($MEMBERSHIP_BASELINE)" \
        "% of a core" false "SWIM probes" "$(col "$n" cpu_pct_per_node)" "baseline" \
        "$(jq -c --argjson n "$n" 'map(select(.nodes == $n) | .cpu_pct_per_node)' <<<"$base")"
    done
  fi
)
comparisons=$(jq -s -c . <<<"$comparisons")
sweeps=$(jq -c '[
  {name: "membership_messages", x_label: "nodes", y_label: "membership messages per node per second",
   series: [{label: "sent + received", points: (group_by(.nodes) | map([.[0].nodes, (map(.messages_per_node_s) | add / length)]))}]},
  {name: "membership_cpu", x_label: "nodes", y_label: "% of a core per idle node",
   series: [{label: "canopy (SWIM probes)", points: (group_by(.nodes) | map([.[0].nodes, (map(.cpu_pct_per_node) | add / length)]))},
            {label: "baseline build (measured in this run)", points: ($base | group_by(.nodes) | map([.[0].nodes, (map(.cpu_pct_per_node) | add / length)]))}]}]' \
  --argjson base "$base" <<<"$all")
jq -n --argjson comparisons "$comparisons" --argjson sweeps "$sweeps" --argjson rows "$everything" \
  --arg sizes "$sizes" --argjson window "$window" --argjson settle "$settle" '
  { scenario: "membership_scaling",
    title: "Idle cluster: membership traffic and CPU per node against cluster size",
    path: "tcp://127.0.0.1 (kernel loopback): N canopy node processes on this machine, no trees, no raft",
    params: { sizes: $sizes, window_s: $window, settle_s: $settle, heartbeat_ms: 100,
              seeding: "every node seeds node 1 only", counters: "canopy_membership_messages_total, canopy_membership_bytes_total (sent + received)" },
    comparisons: $comparisons, sweeps: $sweeps,
    details: { rows: $rows, issue_baseline_cpu_pct: "2.3, 7.6, 28.6 at 3, 10, 20 nodes (all-to-all heartbeats, issue 18)" } }' > "$BENCH_OUT"
bench_log "done"
