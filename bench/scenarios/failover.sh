#!/usr/bin/env bash
# bench/scenarios/failover.sh — how long are writes unavailable when the
# leader dies? A 3-node canopy cluster with the metadata raft (--raft, RF 3,
# fsync always, data on BENCH_WORK) on 127.0.0.1; an independent client
# (bench/failover_client: QUORUM commits one at a time, its own retry over
# the three nodes, bounded in time and count) runs throughout. KILLS times:
# SIGKILL the tree's leader, note when, wait until the client's next QUORUM
# commit that started after the killed process was reaped is acknowledged
# (the window runs from just before the kill to that acknowledgement),
# restart the killed node, wait until every replica is within 100 versions
# of the leader (so that a window measures failover, not a lagging
# replica's catch-up). The same is done to a
# 3-member etcd on 127.0.0.1 (its leader SIGKILLed, an etcdctl put loop over
# all three endpoints as the client; etcdctl starts a process per put, which
# adds ~10-30 ms of resolution to etcd's windows), alternating canopy and
# etcd kills. Prints every window and p50/p99/max. Goal (issue 18): canopy's
# p99 <= 500 ms. Comparisons (lower is better): canopy's p99 over all kills
# against that goal; every window, canopy (A) against etcd (B).
# Sizes: tiny 2 kills, quick and full 20 (the issue asks for 20). Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

canopy=$BENCH_BUILD/tools/canopy/canopy
client=$BENCH_BUILD/bench/failover_client
for b in "$canopy" "$client"; do
  [[ -x $b ]] || { bench_log "$b not built (cmake --build $BENCH_BUILD --target canopy failover_client)"; exit 1; }
done
kills=${FAILOVER_KILLS:-$(bench_pick 2 20 20)}
with_etcd=${FAILOVER_ETCD:-1}
if ((with_etcd)); then
  bench_need_peer etcd etcd-server || with_etcd=0
  bench_need_peer etcdctl etcd-client || with_etcd=0
fi
settle=${FAILOVER_SETTLE_S:-$(bench_pick 0.5 1.5 1.5)}  # after a restart, before the next kill
work=$BENCH_WORK/failover
pids=()
declare -A node_pid=() etcd_pid=()
cleanup() {
  touch "$work/stop" 2>/dev/null || true
  bench_kill "${pids[@]}" "${node_pid[@]}" "${etcd_pid[@]}"
  # FAILOVER_KEEP_LOGS=DIR keeps the node and client logs for a post-mortem.
  [[ -n ${FAILOVER_KEEP_LOGS:-} ]] && mkdir -p "$FAILOVER_KEEP_LOGS" && cp "$work"/*.log "$FAILOVER_KEEP_LOGS"/ 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
now() { date +%s.%N; }

# ---------------------------------------------------------------- canopy
echo "failover bench secret, loopback only" > "$work/secret"
common=(--cluster failover --secret-file "$work/secret")
ports=()
while ((${#ports[@]} < 6)); do
  p=$(bench_free_port)
  [[ " ${ports[*]} " == *" $p "* ]] || ports+=("$p")
done
raft_peers=()
for i in 1 2 3; do raft_peers+=(--raft-peer "$i=127.0.0.1:${ports[$((i + 2))]}"); done
uri_of() { echo "tcp://127.0.0.1:${ports[$(($1 - 1))]}"; }
# FAILOVER_NODE_ARGS: extra `canopy node` flags for an A/B by hand, e.g.
# "--raft-rebalance-ms 0" (the raft leader stays where it was elected).
read -ra node_extra <<< "${FAILOVER_NODE_ARGS:-}"
start_node() {
  local i=$1 seeds=() j
  for j in 1 2 3; do ((j == i)) || seeds+=(--seed "$(uri_of "$j")"); done
  "$canopy" node --listen "$(uri_of "$i")" --data "$work/canopy$i" --node-id "$i" --fsync always "${common[@]}" \
    --raft "127.0.0.1:${ports[$((i + 2))]}" "${raft_peers[@]}" "${seeds[@]}" --log info "${node_extra[@]}" \
    >> "$work/canopy$i.log" 2>&1 &
  node_pid[$i]=$!
}
for i in 1 2 3; do start_node "$i"; done
for i in 1 2 3; do bench_wait_port "${ports[$((i - 1))]}" 20 || { bench_log "canopy node $i did not start: $(tail -n 5 "$work/canopy$i.log")"; exit 1; }; done
all_uris="$(uri_of 1),$(uri_of 2),$(uri_of 3)"
created=""
for _ in $(seq 1 200); do
  if "$canopy" create-tree --node "$(uri_of 1)" "${common[@]}" --tree fo > /dev/null 2>&1; then created=1; break; fi
  sleep 0.1
done
[[ -n $created ]] || { bench_log "could not create the tree: $(tail -n 5 "$work/canopy1.log")"; exit 1; }
# Every replica follows (an ALL commit succeeds).
ok=""
for _ in $(seq 1 200); do
  if "$canopy" commit --node "$(uri_of 1)" "${common[@]}" --tree fo --cl ALL --put /:warm=1 > /dev/null 2>&1; then ok=1; break; fi
  sleep 0.1
done
[[ -n $ok ]] || { bench_log "replicas did not follow: $(tail -n 5 "$work/canopy2.log")"; exit 1; }
bench_log "canopy: 3 nodes up ($all_uris)"
# tree_field NODE FIELD -> the tree's FIELD in NODE's status (empty when unreachable).
tree_field() {
  "$canopy" status --node "$(uri_of "$1")" "${common[@]}" --json 2>/dev/null |
    jq -r --arg f "$2" '.trees[] | select(.tree == "fo") | .[$f]' 2>/dev/null || true
}
"$client" --nodes "$all_uris" "${common[@]}" --tree fo --cl QUORUM --timeout-ms 1000 --retry-ms 2 \
  --seconds 3000 --max-commits 50000000 --stop-file "$work/stop" --out "$work/canopy-client.log" \
  2> "$work/canopy-client.err" &
client_pid=$!
pids+=("$client_pid")

# ---------------------------------------------------------------- etcd
if ((with_etcd)); then
  eports=()
  while ((${#eports[@]} < 6)); do
    p=$(bench_free_port)
    [[ " ${eports[*]} ${ports[*]} " == *" $p "* ]] || eports+=("$p")
  done
  initial=""
  for i in 0 1 2; do initial+="${initial:+,}e$i=http://127.0.0.1:${eports[$((i + 3))]}"; done
  start_etcd() {
    local i=$1 state=${2:-new}
    etcd --name "e$i" --data-dir "$work/etcd$i" \
      --listen-client-urls "http://127.0.0.1:${eports[$i]}" --advertise-client-urls "http://127.0.0.1:${eports[$i]}" \
      --listen-peer-urls "http://127.0.0.1:${eports[$((i + 3))]}" \
      --initial-advertise-peer-urls "http://127.0.0.1:${eports[$((i + 3))]}" \
      --initial-cluster "$initial" --initial-cluster-state "$state" --initial-cluster-token canopy-failover \
      >> "$work/etcd$i.log" 2>&1 &
    etcd_pid[$i]=$!
  }
  for i in 0 1 2; do start_etcd "$i"; done
  endpoints="127.0.0.1:${eports[0]},127.0.0.1:${eports[1]},127.0.0.1:${eports[2]}"
  ok=""
  for _ in $(seq 1 200); do
    if ETCDCTL_API=3 etcdctl --endpoints "$endpoints" put warm 1 > /dev/null 2>&1; then ok=1; break; fi
    sleep 0.1
  done
  [[ -n $ok ]] || { bench_log "etcd did not form: $(tail -n 5 "$work/etcd0.log")"; exit 1; }
  # The put loop: one etcdctl per put, over all endpoints, bounded.
  (
    for ((n = 0; n < 2000000; n++)); do
      [[ -e $work/stop ]] && break
      s=$(now)
      if ETCDCTL_API=3 etcdctl --endpoints "$endpoints" --dial-timeout 1s --command-timeout 1s put k "$n" > /dev/null 2>&1; then
        echo "ok $s $(now)"
      else
        echo "err $s $(now)"
        sleep 0.002
      fi
    done
  ) > "$work/etcd-client.log" 2>&1 &
  pids+=($!)
  etcd_leader() {
    ETCDCTL_API=3 etcdctl --endpoints "$endpoints" endpoint status -w json 2>/dev/null |
      jq -r '.[] | select(.Status.leader == .Status.header.member_id) | .Endpoint' | head -n 1
  }
  bench_log "etcd: 3 members up ($endpoints)"
fi

# wait_ok LOG SINCE -> 0 once LOG has an "ok" line whose start is after SINCE (20 s at most).
wait_ok() {
  local log=$1 since=$2 deadline=$((SECONDS + 20))
  while ((SECONDS < deadline)); do
    awk -v t="$since" '$1 == "ok" && $2 / (($2 > 1e11) ? 1000 : 1) > t { found = 1; exit } END { exit !found }' "$log" && return 0
    sleep 0.02
  done
  return 1
}

canopy_kills=() etcd_kills=()
for ((k = 1; k <= kills; k++)); do
  # ---- canopy: kill the leader of "fo"
  leader=""
  for _ in $(seq 1 100); do
    for i in 1 2 3; do
      leader=$(tree_field "$i" leader)
      [[ -n $leader && $leader != null ]] && break
    done
    [[ -n $leader && $leader != null && -n ${node_pid[$leader]:-} ]] && break
    sleep 0.1
  done
  [[ -n $leader && -n ${node_pid[$leader]:-} ]] || { bench_log "no canopy leader known"; exit 1; }
  wait_ok "$work/canopy-client.log" "$(now)" || { bench_log "canopy client makes no progress before kill $k"; exit 1; }
  t=$(now)
  kill -KILL "${node_pid[$leader]}"
  wait "${node_pid[$leader]}" 2>/dev/null || true
  dead=$(now)
  canopy_kills+=("$t:$dead")
  if wait_ok "$work/canopy-client.log" "$dead"; then
    bench_log "kill $k/$kills: canopy leader $leader killed; writes back"
  else
    bench_log "kill $k/$kills: canopy writes did not come back within 20 s: $(tail -n 3 "$work/canopy-client.log")"
  fi
  start_node "$leader"
  bench_wait_port "${ports[$((leader - 1))]}" 20 || true
  # Caught up: the restarted node is a replica again, and every replica is
  # within 100 versions of the leader (a replica still catching up would make
  # the next window measure its catch-up: QUORUM needs one replica's ACK).
  # The client keeps committing (hundreds of versions per status call), so
  # the versions are read in order: the current leader's first, then each
  # replica's; a replica read after the leader that is still behind that
  # earlier figure by more than 100 is really lagging.
  caught_up=""
  for _ in $(seq 1 150); do
    if [[ $(tree_field "$leader" role) == replica ]]; then
      now_leader=$(tree_field "$leader" leader)
      vs=()
      if [[ $now_leader =~ ^[123]$ ]]; then
        vs+=("$now_leader:$(tree_field "$now_leader" durable_version)")
        for i in 1 2 3; do [[ $i != "$now_leader" ]] && vs+=("$i:$(tree_field "$i" durable_version)"); done
        if printf '%s\n' "${vs[@]}" | awk -F: '$2 !~ /^[0-9]+$/ { bad = 1 } NR == 1 { m = $2 } NR > 1 && $2 + 100 < m { bad = 1 }
            END { exit bad ? 1 : 0 }'; then
          caught_up=1
          break
        fi
      fi
    fi
    sleep 0.1
  done
  [[ -n $caught_up ]] || bench_log "kill $k/$kills: replicas not within 100 versions of the leader after 15 s (node:version, leader first): ${vs[*]:-}"

  # ---- etcd: kill its leader
  if ((with_etcd)); then
    ep=$(etcd_leader)
    idx=-1
    for i in 0 1 2; do [[ $ep == *":${eports[$i]}" ]] && idx=$i; done
    if ((idx >= 0)); then
      wait_ok "$work/etcd-client.log" "$(now)" || true
      t=$(now)
      kill -KILL "${etcd_pid[$idx]}"
      wait "${etcd_pid[$idx]}" 2>/dev/null || true
      dead=$(now)
      etcd_kills+=("$t:$dead")
      wait_ok "$work/etcd-client.log" "$dead" || bench_log "etcd writes did not come back within 20 s"
      bench_log "kill $k/$kills: etcd leader e$idx killed; writes back"
      start_etcd "$idx" existing
      bench_wait_port "${eports[$idx]}" 20 || true
    else
      bench_log "kill $k/$kills: no etcd leader found ($ep)"
    fi
  fi
  sleep "$settle"
done
touch "$work/stop"
sleep 0.5

# windows LOG KILL:DEAD... -> one line per kill: the window in ms, from the
# moment before the SIGKILL (KILL) to the end of the first acknowledged
# commit that started after the process was reaped (DEAD), so that no commit
# the old leader still answered counts; or "lost".
windows() {
  local log=$1
  shift
  python3 - "$log" "$@" <<'PY'
import sys
log, kills = sys.argv[1], [tuple(float(x) for x in k.split(":")) for k in sys.argv[2:]]
oks = []
for line in open(log):
    f = line.split()
    if len(f) >= 3 and f[0] == "ok":
        s, e = float(f[1]), float(f[2])
        if s > 1e11:  # milliseconds
            s, e = s / 1000, e / 1000
        oks.append((s, e))
oks.sort()
for k, dead in kills:
    after = [e for s, e in oks if s > dead]
    print(round((min(after) - k) * 1000, 1) if after else "lost")
PY
}
mapfile -t canopy_w < <(windows "$work/canopy-client.log" "${canopy_kills[@]}")
etcd_w=()
if ((with_etcd && ${#etcd_kills[@]} > 0)); then mapfile -t etcd_w < <(windows "$work/etcd-client.log" "${etcd_kills[@]}"); fi
# stats W... -> "p50 p99 max" (nearest rank; 'lost' counts as 20000 ms).
stats() {
  printf '%s\n' "$@" | sed 's/^lost$/20000/' | sort -n |
    awk '{ v[NR] = $1 } END { if (NR == 0) { print "0 0 0"; exit }
      i50 = int(0.5 * NR + 0.999999); i99 = int(0.99 * NR + 0.999999); if (i50 < 1) i50 = 1; if (i99 < 1) i99 = 1
      print v[i50], v[i99], v[NR] }'
}
read -r c50 c99 cmax < <(stats "${canopy_w[@]}")
bench_log "canopy windows (ms): ${canopy_w[*]}"
bench_log "canopy p50 $c50 ms, p99 $c99 ms, max $cmax ms over ${#canopy_w[@]} kills"
e50=0 e99=0 emax=0
if ((${#etcd_w[@]} > 0)); then
  read -r e50 e99 emax < <(stats "${etcd_w[@]}")
  bench_log "etcd windows (ms): ${etcd_w[*]}"
  bench_log "etcd p50 $e50 ms, p99 $e99 ms, max $emax ms over ${#etcd_w[@]} kills"
fi
num() { printf '%s\n' "$@" | sed 's/^lost$/20000/'; }
cs=$(num "${canopy_w[@]}" | jq -s -c .)
es=$(num "${etcd_w[@]}" | jq -s -c .)
failovers=$(grep -h -c "now the leader of fo" "$work"/canopy*.log | paste -sd+ | bc)
comparisons=$(
  {
    # The goal is on the p99 over all kills: one sample per run, against 500 ms.
    if ((${#canopy_w[@]} > 0)); then
      bench_comparison "canopy p99 unavailability over ${#canopy_w[@]} leader SIGKILLs vs the 500 ms goal (ms, nearest rank)" \
        "ms" false "canopy p99" "[$c99]" "goal" "[500]" 1.0 "canopy p99 <= 500 ms"
    fi
    if ((${#etcd_w[@]} > 0)); then
      bench_comparison "unavailability after a leader SIGKILL, per kill (ms, until a QUORUM commit started after the kill is acknowledged): canopy vs etcd" \
        "ms" false "canopy (--raft, 3 nodes)" "$cs" "etcd 3.4 (3 members, etcdctl put loop)" "$es"
    fi
  } | jq -s -c .
)
jq -n --argjson comparisons "$comparisons" --argjson cs "$cs" --argjson es "$es" --argjson kills "$kills" \
  --arg c50 "$c50" --arg c99 "$c99" --arg cmax "$cmax" --arg e50 "$e50" --arg e99 "$e99" --arg emax "$emax" \
  --argjson failovers "${failovers:-0}" --arg settle "$settle" '
  { scenario: "failover",
    title: "Write unavailability after the leader is SIGKILLed (3 nodes, QUORUM)",
    path: "tcp://127.0.0.1 (kernel loopback): client -> canopy nodes; peer links and the metadata raft on loopback too; data on BENCH_WORK (tmpfs), fsync always",
    params: { kills: $kills, nodes: 3, rf: 3, consistency: "QUORUM", settle_after_restart_s: $settle,
              canopy_defaults: "--heartbeat-ms 100 --failure-ms 1500 --raft-election-ms 150 --raft-rebalance-ms 1000",
              canopy_extra_args: (env.FAILOVER_NODE_ARGS // ""),
              goal: "canopy p99 <= 500 ms (issue 18); etcd default election timeout 1000 ms" },
    comparisons: $comparisons,
    details: { canopy_windows_ms: $cs, canopy_p50_ms: ($c50 | tonumber), canopy_p99_ms: ($c99 | tonumber),
               canopy_max_ms: ($cmax | tonumber), canopy_takeovers_logged: $failovers,
               etcd_windows_ms: $es, etcd_p50_ms: ($e50 | tonumber), etcd_p99_ms: ($e99 | tonumber),
               etcd_max_ms: ($emax | tonumber) } }' > "$BENCH_OUT"
bench_log "done"
