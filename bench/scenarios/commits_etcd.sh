#!/usr/bin/env bash
# bench/scenarios/commits_etcd.sh — replicated commits under concurrency: a
# 3-node canopy cluster (RF 3, --fsync always) on 127.0.0.1 versus a 3-member
# etcd cluster on 127.0.0.1 (fsync of its WAL on every raft batch, its
# default), at 1, 16 and 64 concurrent clients, each client sending one write
# of a 100-byte value at a time (the next once the last was answered).
# canopy: `canopy bench -c C --conns N --cl QUORUM` (C++ canopy client; its
# commits are multiplexed over N connections and return once 2 of 3 replicas
# are durable). etcd: bench/etcdload, a Go program on etcd's native gRPC
# client (clientv3, as etcd's own `benchmark put` tool), the same C and N,
# talking to the leader (a put returns once the raft quorum has it in its
# WAL); built here from Debian's golang-go and golang-etcd-server-dev with
# GO111MODULE=off (the scenario skips when they are missing). At 1 client the
# etcd JSON gateway (canopy's `load -c 1 -k` POSTing /v3/kv/put) is measured
# too, as the earlier rows were. Per rep and level: canopy, then etcd, each
# on keys k0..k999 (canopy: a fresh tree per rep). Comparisons: commits/s
# (higher is better) and p99 latency in µs (lower is better) per level.
# Then write capacity with the node count: `canopy bench -c 64 --trees 64`
# (the ring gives the 64 trees leaders on every node) on 3 nodes against the
# same on 5 nodes (RF 3 both), alternating per rep. All data dirs are under
# BENCH_WORK (tmpfs: fsync is cheap there, so this measures the protocol and
# the software path, not a disk). Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

canopy=$BENCH_BUILD/tools/canopy/canopy
load=$BENCH_BUILD/tools/load/load
[[ -x $canopy ]] || { bench_log "$canopy not built"; exit 1; }
[[ -x $load ]] || { bench_log "$load not built"; exit 1; }
"$canopy" bench --help | grep -q -- --conns || { bench_log "$canopy predates bench --conns: rebuild canopy"; exit 1; }
bench_need_peer etcd etcd-server || bench_skip "etcd missing and cannot be installed (apt-get install etcd-server needs root)"
bench_need_peer etcdctl etcd-client || bench_skip "etcdctl missing and cannot be installed (apt-get install etcd-client needs root)"
bench_need_peer go golang-go || bench_skip "Go missing and cannot be installed (apt-get install golang-go golang-etcd-server-dev): no native etcd client to compare with"
gopath=/usr/share/gocode
if [[ ! -d $gopath/src/go.etcd.io/etcd/clientv3 && $(id -u) -eq 0 ]] && command -v apt-get > /dev/null; then
  bench_log "installing golang-etcd-server-dev for etcd's Go client"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-etcd-server-dev >&2 || true
fi
[[ -d $gopath/src/go.etcd.io/etcd/clientv3 ]] ||
  bench_skip "etcd's Go client library missing (apt-get install golang-etcd-server-dev)"
reps=${BENCH_REPS:-3}
levels=(1 16 64)
count1=$(bench_pick 200 1500 5000)     # writes per run at 1 client
count=$(bench_pick 400 6000 30000)     # writes per run at 16 and 64 clients
value_bytes=100
cl=QUORUM
start_wait=$(bench_pick 20 30 60)  # seconds a cluster may take to form
conns_for() { (($1 < 4)) && echo "$1" || echo 4; }
count_for() { (($1 == 1)) && echo "$count1" || echo "$count"; }

work=$BENCH_WORK/commits_etcd
pids=()
cleanup() { bench_kill "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
fs=$(df -PT "$BENCH_WORK" | awk 'NR == 2 { print $2 " " $7 }')

# ---- the etcd load program (native gRPC client): built into the build
# directory, again only when its source is newer (a cold go build takes minutes here)
etcdload=$BENCH_BUILD/bench/etcdload/etcdload
if [[ ! -x $etcdload || $BENCH_REPO/bench/etcdload/main.go -nt $etcdload ]]; then
  bench_log "building bench/etcdload (go build, GO111MODULE=off)"
  mkdir -p "$(dirname "$etcdload")"
  if ! (cd "$BENCH_REPO" && GO111MODULE=off GOPATH=$gopath go build -o "$etcdload.tmp" ./bench/etcdload/main.go) \
      > "$work/go-build.log" 2>&1; then
    bench_skip "bench/etcdload does not build with this Go and etcd client: $(tail -n 3 "$work/go-build.log" | tr '\n' ' ')"
  fi
  mv "$etcdload.tmp" "$etcdload"
fi

# ---- canopy: N nodes, RF 3, each started once the previous one listens
echo "commits_etcd bench secret" > "$work/secret"
common=(--cluster commits --secret-file "$work/secret")
# start_canopy NAME N -> starts nodes NAME1..NAMEN; sets uris_NAME (array)
start_canopy() {
  local name=$1 n=$2 i seeds=() list=()
  for ((i = 1; i <= n; i++)); do
    "$canopy" node --listen tcp://127.0.0.1:0 --uri-file "$work/$name$i.uri" --data "$work/$name$i" \
      --node-id "$i" --fsync always --cluster "$name" --secret-file "$work/secret" "${seeds[@]}" --log warn \
      > "$work/$name$i.log" 2>&1 &
    pids+=($!)
    bench_wait_file "$work/$name$i.uri" 10 ||
      { bench_log "canopy node $name$i did not start: $(tail -n 5 "$work/$name$i.log")"; return 1; }
    list+=("$(cat "$work/$name$i.uri")")
    seeds+=(--seed "${list[-1]}")
  done
  local deadline=$((SECONDS + start_wait)) u
  for u in "${list[@]}"; do
    until [[ $("$canopy" status --node "$u" --cluster "$name" --secret-file "$work/secret" --json 2>/dev/null |
      jq -r '.nodes | length' 2>/dev/null || echo 0) == "$n" ]]; do
      ((SECONDS < deadline)) || { bench_log "canopy cluster $name did not reach $n members in $start_wait s"; return 1; }
      sleep 0.1
    done
  done
  eval "uris_$name=(\"\${list[@]}\")"
  bench_log "canopy $name: $n nodes up (${list[*]})"
}
start_canopy commits 3
uris=("${uris_commits[@]}")

# ---- etcd: 3 members on 127.0.0.1, ports picked up front (etcd cannot bind 0 and report it)
ports=()
while ((${#ports[@]} < 6)); do
  p=$(bench_free_port)
  [[ " ${ports[*]} " == *" $p "* ]] || ports+=("$p")
done
cport=("${ports[@]:0:3}") pport=("${ports[@]:3:3}")
initial=""
for i in 0 1 2; do initial+="${initial:+,}e$i=http://127.0.0.1:${pport[$i]}"; done
etcd_pids=()
for i in 0 1 2; do
  etcd --name "e$i" --data-dir "$work/etcd$i" \
    --listen-client-urls "http://127.0.0.1:${cport[$i]}" --advertise-client-urls "http://127.0.0.1:${cport[$i]}" \
    --listen-peer-urls "http://127.0.0.1:${pport[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${pport[$i]}" \
    --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token canopy-bench \
    > "$work/etcd$i.log" 2>&1 &
  pids+=($!) etcd_pids+=($!)
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
out=$("$load" -n 1 -c 1 --method POST --body "$body" -H 'Content-Type: application/json' --json "$url") || true
jq -e '.ok_2xx == 1' <<<"$out" > /dev/null 2>&1 || { bench_log "etcd put failed: $out"; exit 1; }
"$etcdload" --endpoints "127.0.0.1:$leader_port" --total 10 > /dev/null ||
  { bench_log "etcdload warm-up failed"; exit 1; }
bench_log "etcd: 3 members up, leader at 127.0.0.1:$leader_port"

runs=$work/runs.jsonl
: > "$runs"

# canopy_sample REP CLIENTS [URI CLUSTER TREES LABEL] -> one JSON line (also in runs).
canopy_sample() {
  local rep=$1 c=$2 node=${3:-${uris[0]}} cluster=${4:-commits} trees=${5:-1} label=${6:-canopy}
  local tree="commits-$label-c$c-r$rep" out n
  n=$(count_for "$c")
  # Warm-up on the same tree(s) (replicas subscribe, connections open), unmeasured.
  "$canopy" bench --node "$node" --cluster "$cluster" --secret-file "$work/secret" --tree "$tree" --cl ALL \
    --count $((trees * 2 > 10 ? trees * 2 : 10)) --trees "$trees" -c "$((trees < 16 ? trees : 16))" \
    --value-bytes "$value_bytes" > /dev/null || { bench_log "canopy warm-up failed"; return 1; }
  before=$(bench_machine_cpu)
  out=$("$canopy" bench --node "$node" --cluster "$cluster" --secret-file "$work/secret" --tree "$tree" --cl "$cl" \
    --count "$n" -c "$c" --conns "$(conns_for "$c")" --trees "$trees" --value-bytes "$value_bytes" --json) ||
    { bench_log "canopy bench failed: $out"; return 1; }
  # The whole machine's CPU over the measured run (nodes, client, the rest):
  # how busy it was, and CPU microseconds per commit.
  read -r busy us < <(bench_machine_cpu_used "$before" "$(bench_machine_cpu)" "$n")
  jq -c --argjson r "$rep" --arg l "$label" --argjson busy "$busy" --argjson us "$us" \
    '{label: $l, rep: $r, clients, conns, trees, commits_per_s, p50_us, p99_us, p999_us,
      machine_cpu_busy_pct: $busy, machine_cpu_us_per_commit: $us, canopy_bench: .}' \
    <<<"$out" | tee -a "$runs"
}

# etcd_sample REP CLIENTS -> the same fields from etcdload's JSON.
etcd_sample() {
  local rep=$1 c=$2 out
  out=$("$etcdload" --endpoints "127.0.0.1:$leader_port" --total "$(count_for "$c")" --clients "$c" \
    --conns "$(conns_for "$c")" --val-size "$value_bytes") || { bench_log "etcdload failed: $out"; return 1; }
  jq -c --argjson r "$rep" '{label: "etcd", rep: $r, clients, conns, commits_per_s: .puts_per_s, p50_us, p99_us,
      p999_us, etcdload: .}' <<<"$out" | tee -a "$runs"
}

# etcd_json_sample REP -> etcd through its JSON gateway, 1 client (the earlier rows' peer).
etcd_json_sample() {
  local rep=$1 out
  out=$("$load" -n "$count1" -c 1 -t 1 -k --method POST --body "$body" -H 'Content-Type: application/json' \
    --timeout 10 --json "$url") || true
  jq -e --argjson n "$count1" '.ok_2xx == $n and .errors.total == 0' <<<"$out" > /dev/null 2>&1 ||
    { bench_log "etcd load run failed: $out"; return 1; }
  jq -c --argjson r "$rep" '{label: "etcd-json", rep: $r, clients: 1, commits_per_s: .requests_per_s,
      p50_us: (.latency_ms.p50 * 1000), p99_us: (.latency_ms.p99 * 1000), load: .}' <<<"$out" | tee -a "$runs"
}

r2() { jq -r '. * 100 | round / 100'; }
declare -A ca_tput ca_p99 et_tput et_p99
ej_tput=() ej_p99=() c1_tput=() c1_p99=()
for ((rep = 1; rep <= reps; rep++)); do
  for c in "${levels[@]}"; do
    a=$(canopy_sample "$rep" "$c")
    e=$(etcd_sample "$rep" "$c")
    ca_tput[$c]+=" $(jq .commits_per_s <<<"$a" | r2)"; ca_p99[$c]+=" $(jq .p99_us <<<"$a" | r2)"
    et_tput[$c]+=" $(jq .commits_per_s <<<"$e" | r2)"; et_p99[$c]+=" $(jq .p99_us <<<"$e" | r2)"
    bench_log "rep $rep/$reps, $c clients: canopy $cl $(jq .commits_per_s <<<"$a" | r2) commits/s" \
      "p99 $(jq .p99_us <<<"$a" | r2) µs; etcd (gRPC) $(jq .commits_per_s <<<"$e" | r2) puts/s" \
      "p99 $(jq .p99_us <<<"$e" | r2) µs"
    if ((c == 1)); then
      j=$(etcd_json_sample "$rep")
      c1_tput+=("$(jq .commits_per_s <<<"$a" | r2)"); c1_p99+=("$(jq .p99_us <<<"$a" | r2)")
      ej_tput+=("$(jq .commits_per_s <<<"$j" | r2)"); ej_p99+=("$(jq .p99_us <<<"$j" | r2)")
    fi
  done
done

# ---- write capacity: 64 trees on 3 nodes vs on 5 nodes (etcd is stopped first: CPU for canopy only)
bench_kill "${etcd_pids[@]}"
start_canopy wide 5
cap3=() cap5=() busy3=() busy5=() cpc3=() cpc5=()
for ((rep = 1; rep <= reps; rep++)); do
  a=$(canopy_sample "$rep" 64 "${uris[0]}" commits 64 three)
  b=$(canopy_sample "$rep" 64 "${uris_wide[0]}" wide 64 five)
  cap3+=("$(jq .commits_per_s <<<"$a" | r2)"); cap5+=("$(jq .commits_per_s <<<"$b" | r2)")
  busy3+=("$(jq .machine_cpu_busy_pct <<<"$a" | r2)"); busy5+=("$(jq .machine_cpu_busy_pct <<<"$b" | r2)")
  cpc3+=("$(jq .machine_cpu_us_per_commit <<<"$a" | r2)"); cpc5+=("$(jq .machine_cpu_us_per_commit <<<"$b" | r2)")
  bench_log "rep $rep/$reps, 64 trees, 64 clients: 3 nodes ${cap3[-1]} commits/s (machine CPU ${busy3[-1]}% busy," \
    "${cpc3[-1]} µs per commit), 5 nodes ${cap5[-1]} commits/s (${busy5[-1]}% busy, ${cpc5[-1]} µs per commit)"
done

comparisons=$(
  for c in "${levels[@]}"; do
    what="$(count_for "$c") writes of $value_bytes B, $c concurrent clients over $(conns_for "$c") connection(s), 3 nodes"
    # shellcheck disable=SC2086
    bench_comparison "commits/s, canopy $cl vs etcd gRPC ($what)" commits/s true \
      "canopy $cl" "$(bench_samples ${ca_tput[$c]})" "etcd (clientv3)" "$(bench_samples ${et_tput[$c]})" \
      3.0 "canopy >= 3x etcd's commits/s"
    # shellcheck disable=SC2086
    bench_comparison "p99 commit latency, canopy $cl vs etcd gRPC ($what)" µs false \
      "canopy $cl" "$(bench_samples ${ca_p99[$c]})" "etcd (clientv3)" "$(bench_samples ${et_p99[$c]})" \
      1.0 "canopy p99 <= etcd's"
  done
  bench_comparison "commits/s, canopy $cl vs etcd JSON gateway ($count1 sequential writes, 1 client)" commits/s true \
    "canopy $cl" "$(bench_samples "${c1_tput[@]}")" "etcd (HTTP/JSON)" "$(bench_samples "${ej_tput[@]}")"
  bench_comparison "p99 commit latency, canopy $cl vs etcd JSON gateway ($count1 sequential writes, 1 client)" µs false \
    "canopy $cl" "$(bench_samples "${c1_p99[@]}")" "etcd (HTTP/JSON)" "$(bench_samples "${ej_p99[@]}")"
  bench_comparison "write capacity: commits/s over 64 trees from 64 clients, 5 nodes vs 3 nodes (RF 3; machine CPU busy during the runs: 3 nodes $(bench_median "${busy3[@]}")%, 5 nodes $(bench_median "${busy5[@]}")%)" commits/s true \
    "5 nodes" "$(bench_samples "${cap5[@]}")" "3 nodes" "$(bench_samples "${cap3[@]}")" \
    1.4 "5 nodes >= 1.4x the commits/s of 3 (needs cores for the extra nodes)"
  # Where the capacity goes: the whole machine's CPU per commit (nodes and client).
  bench_comparison "machine CPU per commit over 64 trees from 64 clients, 5 nodes vs 3 nodes (RF 3)" "CPU µs/commit" false \
    "5 nodes" "$(bench_samples "${cpc5[@]}")" "3 nodes" "$(bench_samples "${cpc3[@]}")"
)
comparisons=$(jq -s . <<<"$comparisons")

jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" \
  --argjson count "$count" --argjson count1 "$count1" --argjson vb "$value_bytes" --argjson reps "$reps" --arg cl "$cl" \
  --argjson cpus "$(nproc)" --arg fs "$fs" --arg etcdv "$(etcd --version 2>/dev/null | head -n 1)" \
  --arg gov "$(go version 2>/dev/null)" --arg canopy_uris "${uris[*]}" --arg etcd_leader "127.0.0.1:$leader_port" \
  '{scenario: "commits_etcd",
    title: "Replicated commits at 1, 16 and 64 concurrent clients: 3-node canopy (QUORUM) vs 3-member etcd; write capacity 3 vs 5 nodes",
    path: "all on 127.0.0.1 kernel loopback (no NIC); canopy: tcp://127.0.0.1 between client and nodes; etcd: gRPC (clientv3) or the HTTP/JSON gateway + raft over http://127.0.0.1; every data dir under BENCH_WORK on tmpfs, so fsync is nearly free",
    params: {writes_per_run: $count, writes_per_run_1_client: $count1, value_bytes: $vb, reps: $reps,
             canopy_consistency: $cl, clients: [1, 16, 64], connections: "min(clients, 4) for both",
             replication: "3 nodes, canopy RF 3 / etcd 3 members", cpus: $cpus, filesystem: $fs,
             fsync: "canopy --fsync always (fsync before ACK, group commit; replicas sync a DELTA_BATCH once); etcd default (WAL fsync per raft batch)",
             canopy_client: "canopy bench -c C --conns N (C++ canopy client, C threads each with one commit outstanding, multiplexed over N connections; keys k0..k999 of a fresh tree per rep and level; ALL commits of warm-up)",
             etcd_client: "bench/etcdload --clients C --conns N (Go, etcd clientv3 over gRPC, as etcd benchmark put) to the leader, keys bench-key-0..999; 1 client also: canopy load -c 1 -t 1 -k POST /v3/kv/put (JSON gateway)",
             capacity: "canopy bench -c 64 --conns 4 --trees 64 on a 3-node and on a 5-node cluster (RF 3, both running, etcd stopped), alternating",
             order: "per rep and level: canopy, etcd (then the JSON gateway at 1 client); then the capacity pairs",
             metric: "commits/s = writes / run seconds; latency per write as the client saw it"},
    comparisons: $comparisons,
    details: {etcd_version: $etcdv, go_version: $gov, canopy_nodes: $canopy_uris, etcd_leader: $etcd_leader,
              capacity_note: "all nodes share this machine'"'"'s cores: 5 nodes at RF 3 do the same work per commit (1 leader + 2 replicas) as 3, so on one host the capacity can only grow where a node (not the CPU) was the limit",
              runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
