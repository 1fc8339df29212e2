#!/usr/bin/env bash
# bench/scenarios/board_nodes.sh — the bulletin board's posts/s and reads/s on
# 1, 3 and 5 `canopy node --http` nodes (RF 3, fsync none, data on tmpfs),
# 64 keep-alive connections spread evenly over the nodes (one `load -k` per
# node, run side by side for the same duration; the rates are summed). Reads
# list 10 messages at cl=ONE; posts are at cl=QUORUM. Beside them, nginx
# (one worker, not pinned, like the nodes) serving a 1 KiB file to
# `load -c 64 -k` on the same machine: the HTTP
# ceiling of the box. Samples are paired per rep (board reads from one node,
# nginx). Goal (issue 18): >= 20 k board reads/s from one node; the rates
# grow with nodes or the fragment names the bottleneck: every process here
# shares the same 2 cores, so more nodes add work (replication), not CPUs;
# the machine's CPU (busy %, CPU per post) is measured around the posts.
# Env: BOARD_NODES (default "1 3 5"), BOARD_SECONDS (per load; default by mode).
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

canopy=$BENCH_BUILD/tools/canopy/canopy
load=$BENCH_BUILD/tools/load/load
for b in "$canopy" "$load"; do
  [[ -x $b ]] || { bench_log "$b not built (cmake --build $BENCH_BUILD --target canopy load)"; exit 1; }
done
reps=${BENCH_REPS:-3}
seconds=${BOARD_SECONDS:-$(bench_pick 1 3 5)}
node_counts=${BOARD_NODES:-"1 3 5"}
conns=64
prefill=$(bench_pick 50 200 1000)

work=$BENCH_WORK/board_nodes
pids=()
BENCH_NGINX_PID=""
stop_nodes() { bench_kill "${pids[@]}"; pids=(); }
cleanup() { stop_nodes; bench_kill "$BENCH_NGINX_PID"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work/root"
echo "board nodes bench secret, loopback only" > "$work/secret"
common=(--cluster bench --secret-file "$work/secret")
body='{"author":"bench","text":"a bulletin board post of about one hundred bytes of text, as a person would write it."}'
head -c 1024 /dev/urandom > "$work/root/small.bin"
chmod 755 "$work" "$work/root"
chmod 644 "$work/root/small.bin"
nginx_url=""
if bench_need_peer nginx nginx-light && bench_nginx_start "$work/nginx" "$work/root" "$(bench_cpus | paste -sd,)"; then
  nginx_url="http://127.0.0.1:$BENCH_NGINX_PORT/small.bin"
else
  bench_log "no nginx: the fragment has no nginx figure"
fi

# start_cluster N -> N nodes, ports in $work/nN-i.port; waits for membership.
start_cluster() {
  local n=$1 i d seeds=()
  for ((i = 1; i <= n; i++)); do
    d=$work/n$n-$i
    "$canopy" node --listen tcp://127.0.0.1:0 --data "$d" --node-id "$i" "${common[@]}" --fsync none \
      --uri-file "$d.uri" --http 127.0.0.1:0 --http-port-file "$d.port" --log warn "${seeds[@]}" > "$d.log" 2>&1 &
    pids+=($!)
    bench_wait_file "$d.uri" 15 && bench_wait_file "$d.port" 15 || { bench_log "node $i did not start: $(tail -3 "$d.log")"; return 1; }
    seeds+=(--seed "$(cat "$d.uri")")
  done
  local members=0
  for _ in $(seq 1 300); do
    members=$("$canopy" status --node "$(cat "$work/n$n-1.uri")" "${common[@]}" --json 2>/dev/null | jq '.nodes | length' 2>/dev/null || echo 0)
    [[ $members == "$n" ]] && return 0
    sleep 0.1
  done
  bench_log "only $members of $n members joined"
  return 1
}

# spread N METHOD URL_PATH -> summed requests/s of N loads (one per node, $conns/N connections each).
spread() {
  local n=$1 method=$2 path=$3 i c out=() total
  c=$((conns / n))
  for ((i = 1; i <= n; i++)); do
    local port
    port=$(cat "$work/n$n-$i.port")
    if [[ $method == POST ]]; then
      "$load" -n 100000000 -c "$c" -t 1 -k -d "$seconds" --json --timeout 10 --method POST --body "$body" \
        -H 'Content-Type: application/json' "http://127.0.0.1:$port$path" > "$work/load.$i" 2> /dev/null &
    else
      "$load" -n 100000000 -c "$c" -t 1 -k -d "$seconds" --json --timeout 10 "http://127.0.0.1:$port$path" > "$work/load.$i" 2> /dev/null &
    fi
    out+=($!)
  done
  for p in "${out[@]}"; do wait "$p" || true; done
  total=0
  for ((i = 1; i <= n; i++)); do
    local r bad
    r=$(jq '.requests_per_s // 0' "$work/load.$i" 2>/dev/null || echo 0)
    bad=$(jq '[.status_codes | to_entries[] | select(.key | startswith("2") | not) | .value] | add // 0' "$work/load.$i" 2>/dev/null || echo 0)
    ((bad == 0)) || bench_log "$n nodes, $method node $i: $bad answers not 2xx: $(jq -c .status_codes "$work/load.$i")"
    total=$(awk -v a="$total" -v b="$r" 'BEGIN { printf "%.1f", a + b }')
  done
  echo "$total"
}

declare -A post_rates read_rates post_busy post_cpu read_cpu
one_node_reads=() nginx_rates=()
for ((rep = 1; rep <= reps; rep++)); do
  if [[ -n $nginx_url ]]; then
    ng=$({ "$load" -n 100000000 -c "$conns" -t 1 -k -d "$seconds" --json "$nginx_url" 2> /dev/null || true; } | jq '.requests_per_s // 0')
    nginx_rates+=("$ng")
    bench_log "rep $rep: nginx 1 KiB file: $ng req/s"
  fi
  for n in $node_counts; do
    start_cluster "$n" || exit 1
    port1=$(cat "$work/n$n-1.port")
    code=""
    for _ in $(seq 1 100); do
      code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d '{"name":"bench"}' "http://127.0.0.1:$port1/boards" || true)
      [[ $code == 201 ]] && break
      sleep 0.1
    done
    [[ $code == 201 ]] || { bench_log "creating the board answered $code"; exit 1; }
    "$load" -n "$prefill" -c 4 -t 1 -k --json --method POST --body "$body" -H 'Content-Type: application/json' \
      "http://127.0.0.1:$port1/boards/bench/messages?cl=QUORUM" > /dev/null
    sleep 0.5  # replicas catch up before reads at ONE
    # The whole machine's CPU over the posts and over the reads: how busy,
    # and CPU us per request (rate x seconds requests).
    before=$(bench_machine_cpu)
    p=$(spread "$n" POST "/boards/bench/messages?cl=QUORUM")
    read -r busy us < <(bench_machine_cpu_used "$before" "$(bench_machine_cpu)" "$(awk -v r="$p" -v s="$seconds" 'BEGIN { print r * s }')")
    post_busy[$n]+="$busy " post_cpu[$n]+="$us "
    before=$(bench_machine_cpu)
    r=$(spread "$n" GET "/boards/bench/messages?limit=10")
    read -r busy us < <(bench_machine_cpu_used "$before" "$(bench_machine_cpu)" "$(awk -v r="$r" -v s="$seconds" 'BEGIN { print r * s }')")
    read_cpu[$n]+="$us "
    bench_log "rep $rep, $n node(s): $p posts/s (machine CPU $(awk '{ print $NF }' <<<"${post_busy[$n]}")% busy," \
      "$(awk '{ print $NF }' <<<"${post_cpu[$n]}") µs per post), $r reads/s ($(awk '{ print $NF }' <<<"${read_cpu[$n]}") µs" \
      "per read; 64 connections over the nodes)"
    post_rates[$n]+="$p "
    read_rates[$n]+="$r "
    [[ $n == 1 ]] && one_node_reads+=("$r")
    stop_nodes
    rm -rf "$work"/n"$n"-*
  done
done

post_points="[" read_points="[" sep=""
for n in $node_counts; do
  # shellcheck disable=SC2086
  post_points+="$sep[$n,$(bench_median ${post_rates[$n]})]"
  # shellcheck disable=SC2086
  read_points+="$sep[$n,$(bench_median ${read_rates[$n]})]"
  sep=","
done
post_points+="]" read_points+="]"
first=$(awk '{ print $1 }' <<<"$node_counts")
last=$(awk '{ print $NF }' <<<"$node_counts")
# shellcheck disable=SC2206
first_reads=(${read_rates[$first]}) last_reads=(${read_rates[$last]})
first_posts=(${post_rates[$first]}) last_posts=(${post_rates[$last]})
first_post_cpu=(${post_cpu[$first]}) last_post_cpu=(${post_cpu[$last]})
first_read_cpu=(${read_cpu[$first]}) last_read_cpu=(${read_cpu[$last]})
goal_reads=()
for ((i = 0; i < ${#one_node_reads[@]}; i++)); do goal_reads+=(20000); done

comparisons=$(
  {
    if ((${#one_node_reads[@]} > 0)); then
      bench_comparison "board reads/s from one node (1-node cluster, list 10, cl=ONE, load -c $conns -k) vs the 20 k goal" \
        "requests/s" true "board reads, 1 node" "$(bench_samples "${one_node_reads[@]}")" \
        "goal 20 k reads/s" "$(bench_samples "${goal_reads[@]}")" 1.0 ">= 20 k board reads/s from one node"
    fi
    if ((${#nginx_rates[@]} > 0 && ${#one_node_reads[@]} > 0)); then
      bench_comparison "board reads/s from one node vs nginx serving a 1 KiB file (load -c $conns -k)" \
        "requests/s" true "board reads, 1 node" "$(bench_samples "${one_node_reads[@]}")" \
        "nginx 1 KiB file" "$(bench_samples "${nginx_rates[@]}")"
    fi
    bench_comparison "board reads/s: $last nodes vs $first (64 connections spread over the nodes)" "requests/s" true \
      "$last nodes" "$(bench_samples "${last_reads[@]}")" "$first node(s)" "$(bench_samples "${first_reads[@]}")" \
      1.0 "reads grow with nodes (every node shares the same 2 cores here)"
    # With more nodes than copies, some nodes hold no copy and forward the
    # listing (one more hop): the whole machine's CPU per read shows it.
    bench_comparison "machine CPU per board read (list 10, ONE): $last nodes vs $first" "CPU µs/read" false \
      "$last nodes" "$(bench_samples "${last_read_cpu[@]}")" "$first node(s)" "$(bench_samples "${first_read_cpu[@]}")"
    # shellcheck disable=SC2086
    bench_comparison "board QUORUM posts/s: $last nodes vs $first (64 connections spread over the nodes; RF $((last < 3 ? last : 3)) vs $((first < 3 ? first : 3)); machine CPU busy: $(bench_median ${post_busy[$last]})% vs $(bench_median ${post_busy[$first]})%)" "requests/s" true \
      "$last nodes" "$(bench_samples "${last_posts[@]}")" "$first node(s)" "$(bench_samples "${first_posts[@]}")"
    # Where the post rate goes: the whole machine's CPU per post.
    bench_comparison "machine CPU per board QUORUM post: $last nodes vs $first" "CPU µs/post" false \
      "$last nodes" "$(bench_samples "${last_post_cpu[@]}")" "$first node(s)" "$(bench_samples "${first_post_cpu[@]}")"
  } | jq -s -c .
)

jq -n --argjson comparisons "$comparisons" --argjson posts "$post_points" --argjson reads "$read_points" \
  --argjson conns "$conns" --argjson seconds "$seconds" --argjson reps "$reps" --argjson cpus "$(nproc)" \
  --argjson prefill "$prefill" --arg nginx "${nginx_url:+$(nginx -v 2>&1)}" '
  { scenario: "board_nodes",
    title: "Bulletin board posts/s and reads/s by cluster size",
    path: "http://127.0.0.1 (kernel loopback) to canopy node --http; nodes replicate over tcp://127.0.0.1; data on tmpfs, fsync none",
    params: { connections: $conns, seconds_per_load: $seconds, reps: $reps, cpus: $cpus, rf: 3,
              prefilled_messages: $prefill, read: "GET /boards/bench/messages?limit=10 (cl=ONE)",
              post: "POST /boards/bench/messages?cl=QUORUM",
              bottleneck: "all nodes and load generators share the same CPUs: a node added brings replication work, not a core; RF is min(3, nodes), so one node stores each post once and 3 or more store it 3 times, and beyond 3 nodes some nodes hold no copy and forward reads (machine CPU per post and per read are compared)" },
    sweeps: [ { name: "board rate by node count", x_label: "nodes", y_label: "requests/s",
                series: [ {label: "reads (list 10, ONE)", points: $reads}, {label: "posts (QUORUM)", points: $posts} ] } ],
    comparisons: $comparisons,
    details: { nginx: $nginx } }' > "$BENCH_OUT"
bench_log "done"
