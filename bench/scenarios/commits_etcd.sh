#!/usr/bin/env bash
# bench/scenarios/commits_etcd.sh — replicated commits: a 3-node canopy
# cluster (RF 3, --fsync always) on 127.0.0.1 versus a 3-member etcd cluster
# on 127.0.0.1 (fsync of its WAL on every write, its default), the same number
# of sequential writes of a 100-byte value from one client with one
# connection and one request at a time. canopy: `canopy bench --cl QUORUM`
# (C++, canopy's client; a commit returns once 2 of 3 replicas are durable).
# etcd: canopy's HTTP load generator `load -c 1 -k` POSTing
# {"key","value"} (base64) to the leader's /v3/kv/put JSON gateway (a put
# returns once the raft quorum has it in the WAL). Per rep: a fresh canopy
# tree, then the etcd run. Comparisons: commits/s (higher is better), p50 and
# p99 latency in µs (lower is better). All data dirs are under BENCH_WORK
# (tmpfs: fsync is cheap there, so this measures the protocol and the
# software path, not a disk). Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

canopy=$BENCH_BUILD/tools/canopy/canopy
load=$BENCH_BUILD/tools/load/load
[[ -x $canopy ]] || { bench_log "$canopy not built"; exit 1; }
[[ -x $load ]] || { bench_log "$load not built"; exit 1; }
bench_need_peer etcd etcd-server || bench_skip "etcd missing and cannot be installed (apt-get install etcd-server needs root)"
bench_need_peer etcdctl etcd-client || bench_skip "etcdctl missing and cannot be installed (apt-get install etcd-client needs root)"
reps=${BENCH_REPS:-3}
count=$(bench_pick 300 2000 10000)
value_bytes=100
cl=QUORUM
start_wait=$(bench_pick 20 30 60)  # seconds a cluster may take to form

work=$BENCH_WORK/commits_etcd
pids=()
cleanup() { bench_kill "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
fs=$(df -PT "$BENCH_WORK" | awk 'NR == 2 { print $2 " " $7 }')

# ---- canopy: 3 nodes, RF 3, each started once the previous one listens
echo "commits_etcd bench secret" > "$work/secret"
common=(--cluster commits --secret-file "$work/secret")
uris=() seeds=()
for i in 1 2 3; do
  "$canopy" node --listen tcp://127.0.0.1:0 --uri-file "$work/canopy$i.uri" --data "$work/canopy$i" \
    --node-id "$i" --fsync always "${common[@]}" "${seeds[@]}" --log warn > "$work/canopy$i.log" 2>&1 &
  pids+=($!)
  bench_wait_file "$work/canopy$i.uri" 10 ||
    { bench_log "canopy node $i did not start: $(tail -n 5 "$work/canopy$i.log")"; exit 1; }
  uris+=("$(cat "$work/canopy$i.uri")")
  seeds+=(--seed "${uris[-1]}")
done
members() { "$canopy" status --node "$1" "${common[@]}" --json 2>/dev/null | jq -r '.nodes | length' 2>/dev/null || echo 0; }
deadline=$((SECONDS + start_wait))
for u in "${uris[@]}"; do
  until [[ $(members "$u") == 3 ]]; do
    ((SECONDS < deadline)) || { bench_log "canopy cluster did not reach 3 members in $start_wait s"; exit 1; }
    sleep 0.1
  done
done
bench_log "canopy: 3 nodes up (${uris[*]})"

# ---- etcd: 3 members on 127.0.0.1, ports picked up front (etcd cannot bind 0 and report it)
ports=()
while ((${#ports[@]} < 6)); do
  p=$(bench_free_port)
  [[ " ${ports[*]} " == *" $p "* ]] || ports+=("$p")
done
cport=("${ports[@]:0:3}") pport=("${ports[@]:3:3}")
initial=""
for i in 0 1 2; do initial+="${initial:+,}e$i=http://127.0.0.1:${pport[$i]}"; done
for i in 0 1 2; do
  etcd --name "e$i" --data-dir "$work/etcd$i" \
    --listen-client-urls "http://127.0.0.1:${cport[$i]}" --advertise-client-urls "http://127.0.0.1:${cport[$i]}" \
    --listen-peer-urls "http://127.0.0.1:${pport[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${pport[$i]}" \
    --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token canopy-bench \
    > "$work/etcd$i.log" 2>&1 &
  pids+=($!)
done
endpoints="127.0.0.1:${cport[0]},127.0.0.1:${cport[1]},127.0.0.1:${cport[2]}"
# The leader's client URL (a put sent to a follower is forwarded: one more hop
# than canopy's client, which talks to the tree's leader).
leader_port=""
deadline=$((SECONDS + start_wait))
while [[ -z $leader_port ]]; do
  ((SECONDS < deadline)) || { bench_log "etcd cluster elected no leader in $start_wait s: $(tail -n 3 "$work/etcd0.log")"; exit 1; }
  leader_port=$(ETCDCTL_API=3 etcdctl --endpoints="$endpoints" --command-timeout=2s endpoint status -w json 2>/dev/null |
    jq -r '[.[] | select(.Status.leader != 0 and .Status.header.member_id == .Status.leader) | .Endpoint][0] // empty
           | sub(".*:"; "")' 2>/dev/null) || leader_port=""
  [[ -n $leader_port ]] || sleep 0.2
done
url="http://127.0.0.1:$leader_port/v3/kv/put"
key_b64=$(printf 'bench-key' | base64 -w0)
value_b64=$(head -c "$value_bytes" /dev/zero | tr '\0' v | base64 -w0)
body="{\"key\":\"$key_b64\",\"value\":\"$value_b64\"}"
# The body must be accepted (200) before anything is measured.
if command -v curl > /dev/null; then
  code=$(curl -s -o "$work/put.out" -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d "$body" "$url") || code=000
  [[ $code == 200 ]] || { bench_log "etcd put answered $code: $(head -c 300 "$work/put.out")"; exit 1; }
else
  out=$("$load" -n 1 -c 1 --method POST --body "$body" -H 'Content-Type: application/json' --json "$url") || true
  jq -e '.ok_2xx == 1' <<<"$out" > /dev/null 2>&1 || { bench_log "etcd put failed: $out"; exit 1; }
fi
bench_log "etcd: 3 members up, leader at 127.0.0.1:$leader_port"

runs=$work/runs.jsonl
: > "$runs"

# canopy_sample REP -> one JSON line {commits_per_s, p50_us, p99_us} (also in runs).
canopy_sample() {
  local rep=$1 tree="commits-r$1" out
  # Warm-up on the same tree (replicas subscribe, connections open), unmeasured.
  "$canopy" bench --node "${uris[0]}" "${common[@]}" --tree "$tree" --cl ALL --count 10 \
    --value-bytes "$value_bytes" > /dev/null || { bench_log "canopy warm-up failed"; return 1; }
  out=$("$canopy" bench --node "${uris[0]}" "${common[@]}" --tree "$tree" --cl "$cl" --count "$count" \
    --value-bytes "$value_bytes" --json) || { bench_log "canopy bench failed: $out"; return 1; }
  jq -c --argjson r "$rep" '{label: "canopy", rep: $r, commits_per_s, p50_us, p99_us, canopy_bench: .}' \
    <<<"$out" | tee -a "$runs"
}

# etcd_sample REP -> the same fields from load's JSON.
etcd_sample() {
  local rep=$1 out
  "$load" -n 10 -c 1 -k --method POST --body "$body" -H 'Content-Type: application/json' "$url" > /dev/null ||
    { bench_log "etcd warm-up failed"; return 1; }
  out=$("$load" -n "$count" -c 1 -t 1 -k --method POST --body "$body" -H 'Content-Type: application/json' \
    --timeout 10 --json "$url") || true
  jq -e --argjson n "$count" '.ok_2xx == $n and .errors.total == 0' <<<"$out" > /dev/null 2>&1 ||
    { bench_log "etcd load run failed: $out"; return 1; }
  jq -c --argjson r "$rep" '{label: "etcd", rep: $r, commits_per_s: .requests_per_s,
      p50_us: (.latency_ms.p50 * 1000), p99_us: (.latency_ms.p99 * 1000), load: .}' <<<"$out" | tee -a "$runs"
}

r2() { jq -r '. * 100 | round / 100'; }
ca_tput=() ca_p50=() ca_p99=() et_tput=() et_p50=() et_p99=()
for ((rep = 1; rep <= reps; rep++)); do
  c=$(canopy_sample "$rep")
  e=$(etcd_sample "$rep")
  ca_tput+=("$(jq .commits_per_s <<<"$c" | r2)"); ca_p50+=("$(jq .p50_us <<<"$c" | r2)"); ca_p99+=("$(jq .p99_us <<<"$c" | r2)")
  et_tput+=("$(jq .commits_per_s <<<"$e" | r2)"); et_p50+=("$(jq .p50_us <<<"$e" | r2)"); et_p99+=("$(jq .p99_us <<<"$e" | r2)")
  bench_log "rep $rep/$reps: canopy $cl ${ca_tput[-1]} commits/s p50 ${ca_p50[-1]} p99 ${ca_p99[-1]} µs;" \
    "etcd ${et_tput[-1]} puts/s p50 ${et_p50[-1]} p99 ${et_p99[-1]} µs"
done

what="$count sequential writes of $value_bytes B, 1 client, 3 nodes"
comparisons=$(jq -s . <<EOC
$(bench_comparison "commits/s, canopy $cl vs etcd ($what)" commits/s true \
  "canopy $cl" "$(bench_samples "${ca_tput[@]}")" etcd "$(bench_samples "${et_tput[@]}")")
$(bench_comparison "p50 commit latency, canopy $cl vs etcd ($what)" µs false \
  "canopy $cl" "$(bench_samples "${ca_p50[@]}")" etcd "$(bench_samples "${et_p50[@]}")")
$(bench_comparison "p99 commit latency, canopy $cl vs etcd ($what)" µs false \
  "canopy $cl" "$(bench_samples "${ca_p99[@]}")" etcd "$(bench_samples "${et_p99[@]}")")
EOC
)

jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" \
  --argjson count "$count" --argjson vb "$value_bytes" --argjson reps "$reps" --arg cl "$cl" \
  --argjson cpus "$(nproc)" --arg fs "$fs" --arg etcdv "$(etcd --version 2>/dev/null | head -n 1)" \
  --arg canopy_uris "${uris[*]}" --arg etcd_url "$url" \
  '{scenario: "commits_etcd",
    title: "Replicated commits: 3-node canopy (QUORUM) vs 3-member etcd",
    path: "all on 127.0.0.1 kernel loopback (no NIC); canopy: tcp://127.0.0.1 between client and nodes; etcd: HTTP/JSON gateway + raft over http://127.0.0.1; every data dir under BENCH_WORK on tmpfs, so fsync is nearly free",
    params: {writes_per_run: $count, value_bytes: $vb, reps: $reps, canopy_consistency: $cl,
             replication: "3 nodes, canopy RF 3 / etcd 3 members", cpus: $cpus, filesystem: $fs,
             fsync: "canopy --fsync always (fsync before ACK, group commit); etcd default (WAL fsync per raft batch)",
             canopy_client: "canopy bench (C++ canopy client, one connection, one commit at a time, keys k0..k999 of a fresh tree per rep, 10 ALL commits of warm-up)",
             etcd_client: "canopy load -c 1 -t 1 -k (one keep-alive HTTP/1.1 connection, one request at a time) POST /v3/kv/put to the leader, one key, base64 JSON body, 10 puts of warm-up",
             order: "per rep: canopy, etcd",
             metric: "commits/s = writes / run seconds; latency per write as the client saw it (canopy bench p50_us/p99_us, load latency_ms * 1000)"},
    comparisons: $comparisons,
    details: {etcd_version: $etcdv, canopy_nodes: $canopy_uris, etcd_put_url: $etcd_url, runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
