#!/usr/bin/env bash
# bench/scenarios/board_cluster_size.sh — the seed's first experiment, scaled
# to this machine: one node's bulletin board under `load -c 1000 -k` while
# the cluster holds 3, 10 (and 20 and 50) nodes, RF 3, fsync none, data on
# tmpfs. For each size, once the cluster has settled (one SWIM cycle): node
# 1's idle CPU and all nodes' (SWIM-style membership: one probe per node per
# round, gossip piggybacked, so a node's should not grow with N), then
# four loads against node 1 one after another: reads (list 10) at cl=ONE and
# cl=QUORUM, posts at cl=ONE and cl=QUORUM. The board's three owners are
# wherever the ring puts them, so with more nodes node 1 is usually not an
# owner and its board forwards to the owners (one SLICE or COMMIT round
# trip; listings at ONE and QUORUM are pipelined from the HTTP thread,
# see replication/slice_forwarder.h). Goal (issue 18): node 1's rate at the
# largest size >= 0.8x its rate at 3. Env: BOARD_SIZES (default by mode: "3", "3 10 50",
# "3 10 20 50"), BOARD_SECONDS. Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

canopy=$BENCH_BUILD/tools/canopy/canopy
load=$BENCH_BUILD/tools/load/load
for b in "$canopy" "$load"; do
  [[ -x $b ]] || { bench_log "$b not built (cmake --build $BENCH_BUILD --target canopy load)"; exit 1; }
done
reps=${BENCH_REPS:-1}
seconds=${BOARD_SECONDS:-$(bench_pick 1 3 5)}
sizes=${BOARD_SIZES:-$(bench_pick "3" "3 10 50" "3 10 20 50")}
conns=$(bench_pick 200 1000 1000)
ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
(($(ulimit -n) > conns + 100)) || bench_skip "ulimit -n $(ulimit -n) is too low for $conns connections"

work=$BENCH_WORK/board_cluster_size
pids=()
stop_nodes() { bench_kill "${pids[@]}"; pids=(); }
cleanup() { stop_nodes; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
echo "board cluster size bench secret, loopback only" > "$work/secret"
common=(--cluster bench --secret-file "$work/secret")
body='{"author":"bench","text":"a bulletin board post of about one hundred bytes of text, as a person would write it."}'

start_cluster() {
  local n=$1 i d seeds=()
  for ((i = 1; i <= n; i++)); do
    d=$work/n$n-$i
    "$canopy" node --listen tcp://127.0.0.1:0 --data "$d" --node-id "$i" "${common[@]}" --fsync none \
      --uri-file "$d.uri" --http 127.0.0.1:0 --http-port-file "$d.port" --log warn "${seeds[@]}" > "$d.log" 2>&1 &
    pids+=($!)
    bench_wait_file "$d.uri" 15 && bench_wait_file "$d.port" 15 || { bench_log "node $i did not start: $(tail -3 "$d.log")"; return 1; }
    seeds=(--seed "$(cat "$work/n$n-1.uri")")
  done
  local members=0
  for _ in $(seq 1 600); do
    members=$("$canopy" status --node "$(cat "$work/n$n-$n.uri")" "${common[@]}" --json 2>/dev/null | jq '.nodes | length' 2>/dev/null || echo 0)
    if [[ $members == "$n" ]]; then
      # Settle: SWIM probes one member per 100 ms round and dials its link to
      # that member on first use, so the cluster's links (and their
      # handshakes) are all up after one cycle of N rounds. The seed's
      # experiment measures a running cluster, not one still forming.
      sleep "$(awk -v n="$n" 'BEGIN { print n * 0.1 + 1 }')"
      return 0
    fi
    sleep 0.1
  done
  bench_log "only $members of $n members joined"
  return 1
}

# idle_cpu SECONDS -> "NODE1 ALL": % of one core that node 1, and all nodes
# together, used over SECONDS with no load.
idle_cpu() {
  local n0 a0 n1 a1
  n0=$(bench_cpu_seconds "${pids[0]}") a0=$(bench_cpu_seconds "${pids[@]}")
  sleep "$1"
  n1=$(bench_cpu_seconds "${pids[0]}") a1=$(bench_cpu_seconds "${pids[@]}")
  awk -v n0="$n0" -v n1="$n1" -v a0="$a0" -v a1="$a1" -v s="$1" \
    'BEGIN { printf "%.1f %.1f\n", (n1 - n0) / s * 100, (a1 - a0) / s * 100 }'
}

# run_load METHOD PATH -> node 1's requests/s (2xx only counted as success; others logged).
run_load() {
  local out rps bad
  if [[ $1 == POST ]]; then
    out=$("$load" -n 100000000 -c "$conns" -t 1 -k -d "$seconds" --json --timeout 10 --method POST --body "$body" \
      -H 'Content-Type: application/json' "http://127.0.0.1:$port1$2" 2>/dev/null || true)
  else
    out=$("$load" -n 100000000 -c "$conns" -t 1 -k -d "$seconds" --json --timeout 10 "http://127.0.0.1:$port1$2" 2>/dev/null || true)
  fi
  rps=$(jq '.requests_per_s // 0' <<<"$out" 2>/dev/null || echo 0)
  bad=$(jq '[.status_codes | to_entries[] | select(.key | startswith("2") | not) | .value] | add // 0' <<<"$out" 2>/dev/null || echo 0)
  ((bad == 0)) || bench_log "$1 $2: $bad answers not 2xx: $(jq -c .status_codes <<<"$out")"
  echo "$rps"
}

declare -A rates idle cluster_idle
labels=("reads ONE" "reads QUORUM" "posts ONE" "posts QUORUM")
paths=("GET /boards/bench/messages?limit=10&cl=ONE" "GET /boards/bench/messages?limit=10&cl=QUORUM"
       "POST /boards/bench/messages?cl=ONE" "POST /boards/bench/messages?cl=QUORUM")
for ((rep = 1; rep <= reps; rep++)); do
  for n in $sizes; do
    start_cluster "$n" || exit 1
    port1=$(cat "$work/n$n-1.port")
    code=""
    for _ in $(seq 1 100); do
      code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d '{"name":"bench"}' "http://127.0.0.1:$port1/boards" || true)
      [[ $code == 201 ]] && break
      sleep 0.2
    done
    [[ $code == 201 ]] || { bench_log "creating the board answered $code"; exit 1; }
    "$load" -n 100 -c 4 -t 1 -k --json --method POST --body "$body" -H 'Content-Type: application/json' \
      "http://127.0.0.1:$port1/boards/bench/messages?cl=ALL" > /dev/null || true
    read -r node1_idle all_idle < <(idle_cpu 2)
    idle[$n]+="$node1_idle " cluster_idle[$n]+="$all_idle "
    for k in 0 1 2 3; do
      r=$(run_load ${paths[$k]})
      rates[$n,$k]+="$r "
    done
    stop_nodes
    rm -rf "$work"/n"$n"-*
    bench_log "rep $rep, $n nodes: idle before the loads, node 1 $(awk '{ print $NF }' <<<"${idle[$n]}")%" \
      "and all $n nodes $(awk '{ print $NF }' <<<"${cluster_idle[$n]}")% of a core;" \
      "$(for k in 0 1 2 3; do printf '%s %.0f/s; ' "${labels[$k]}" "$(awk '{ print $NF }' <<<"${rates[$n,$k]}")"; done)"
  done
done

first=$(awk '{ print $1 }' <<<"$sizes")
last=$(awk '{ print $NF }' <<<"$sizes")
comparisons=$(
  for k in 0 1 2 3; do
    # shellcheck disable=SC2206
    a=(${rates[$last,$k]}) b=(${rates[$first,$k]})
    bench_comparison "node 1 ${labels[$k]}/s (load -c $conns -k): $last-node cluster vs $first" "requests/s" true \
      "$last nodes" "$(bench_samples "${a[@]}")" "$first nodes" "$(bench_samples "${b[@]}")" \
      0.8 "the rate at $last nodes >= 0.8x the rate at $first"
  done | jq -s -c .
)
series="["
sep=""
for k in 0 1 2 3; do
  pts="[" s2=""
  for n in $sizes; do
    pts+="$s2[$n,$(tr ' ' '\n' <<<"${rates[$n,$k]}" | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')]"
    s2=","
  done
  series+="$sep{\"label\": \"${labels[$k]}\", \"points\": $pts]}"
  sep=","
done
series+="]"
idle_json=$(for n in $sizes; do
  echo "{\"nodes\": $n, \"node1_idle_cpu_percent\": [$(tr ' ' '\n' <<<"${idle[$n]}" | grep -v '^$' | paste -sd,)],"
  echo " \"cluster_idle_cpu_percent\": [$(tr ' ' '\n' <<<"${cluster_idle[$n]}" | grep -v '^$' | paste -sd,)]}"
done | jq -s -c .)

jq -n --argjson comparisons "$comparisons" --argjson series "$series" --argjson idle "$idle_json" \
  --argjson conns "$conns" --argjson seconds "$seconds" --argjson reps "$reps" --arg sizes "$sizes" '
  { scenario: "board_cluster_size",
    title: "One node of the bulletin board under load -c 1000 -k as the cluster grows",
    path: "http://127.0.0.1 to node 1 (canopy node --http); nodes on tcp://127.0.0.1; data on tmpfs, fsync none; RF 3",
    params: { connections: $conns, seconds_per_load: $seconds, reps: $reps, sizes: $sizes, rf: 3,
              settle: "N x 0.1 s + 1 s once every node lists N members (one SWIM cycle: every member link dialed)",
              membership: "SWIM-style: one probe per node per round, gossip piggybacked",
              forwarding: "listings at ONE and QUORUM: pipelined SLICEs started from the HTTP thread; posts: worker threads" },
    sweeps: [ { name: "node 1 rate by cluster size", x_label: "nodes", y_label: "requests/s", series: $series } ],
    comparisons: $comparisons,
    details: { idle: $idle } }' > "$BENCH_OUT"
bench_log "done"
