#!/usr/bin/env bash
# bench/scenarios/join_dd.sh — node join versus dd: a 4th node joins a loaded
# 3-node canopy cluster (RF 3, metadata raft) on 127.0.0.1 and receives the
# trees it now owns (about 3/4 of them) as snapshots, bulk installed with the
# default install fsync (--install-fsync finish: one fsync per tree file once
# it is complete); next to it, `dd if=/dev/zero bs=1M conv=fsync` writes as
# many MiB as the joiner received to the same file system (BENCH_WORK, tmpfs).
# The cluster is loaded once (every write on
# all 3 nodes, --cl ALL, --fsync none), stopped, and its data dirs are copied
# afresh before each join. Join time runs from the joiner's start to its last
# "installed snapshot" log line, accepted once `canopy status --json` shows
# node 1 with 4 members and every tree that lists the joiner among its owners
# at node 1's version on the joiner (bounded wait). Samples: decimal Gbit/s of
# the joiner's data dir bytes (du -sb) over join time, dd's own bytes / its
# seconds. A second comparison divides the same bytes by the streaming time
# alone (first "receiving snapshot" to last "installed snapshot" line: no
# process start, gossip or raft join). dd is the ceiling for writing those
# bytes; the ratio says how close the join gets. The streaming time is also
# set beside rcopy of as many bytes (one file, tmpfs -> tmpfs, over the same
# tcp://127.0.0.1), the ceiling of the transport itself: goal >= 0.9x.
# A third comparison sets the joiner's CPU per GB received beside the rcopy
# server's: the code's cost per byte, apart from the wall clock of a busy
# 2-core machine (which also runs the three sources).
# Every measured writer (the joiner, dd, rcopy) starts right after the same
# warm-up (warm_memory below: a file written where it writes and deleted), so
# that on a VM that hands freed pages back to its host none of them pays the
# first touch of those pages more than another.
# Each tree reaches the joiner as a checkpoint file sent whole (SNAPSHOT_FILE:
# sendfile, spliced into the joiner's file; see replication/README.md), from
# whichever of its owners was sending the joiner the fewest files (leaders
# and followers alike; each run records files_by_source), then the deltas
# after it from its leader. The sources' stores checkpoint by themselves as
# the WAL grows (--checkpoint-wal-bytes, tree/README.md), so an owner sends
# the newest file it has, and writes a fresh one inside the measured time
# only when the deltas after it reach half the file.
# Sources with capped links (issue 15: stream from every owner): as root, in
# quick and full modes, each rep also joins twice with every source's traffic
# from its listen port (files and deltas to the joiner) shaped on lo to
# cap_mbit by an htb class of its own (everything else unshaped), once taking
# files from every owner (the default) and once from the leaders only
# (--join-from-leader-only); the qdisc is removed right after. On a real
# cluster a source's disk or link is the limit this stands for; on this
# machine's loopback it is otherwise the CPU, shared by all four nodes.
# On a disk too (issue 15): when BENCH_DISK_DIR (default /var/tmp) is on a
# block device, each rep also joins with the joiner's data dir there, next to
# dd on the same file system, once as the machine is and (as root, quick and
# full modes) once under hw/join-tuning.sh (longer write-back, deadline
# scheduler; restored on exit). Those samples also give "join + sync": the
# join time plus a `sync -f` of the joiner's file system afterwards.
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

canopy=$BENCH_BUILD/tools/canopy/canopy
[[ -x $canopy ]] || { bench_log "$canopy not built"; exit 1; }
rcopy=$BENCH_BUILD/tools/rcopy/rcopy
[[ -x $rcopy ]] || { bench_log "$rcopy not built"; exit 1; }
reps=${BENCH_REPS:-3}
join_mib=$(bench_pick 32 256 1024)  # about this many MiB reach the joiner
tree_mib=$(bench_pick 4 16 16)      # each tree: tree_mib attributes of 1 MiB in its root
join_wait=$(bench_pick 60 120 300)  # seconds a join may take before the scenario fails
failure_ms=1500                     # every node's --failure-ms (the default)
# JOIN_DD_JOINER_ARGS: extra arguments for the joiner, e.g. --join-from-leader-only
# (an A/B of where the files come from; recorded in params).
read -r -a joiner_args <<< "${JOIN_DD_JOINER_ARGS:-}"

work=$BENCH_WORK/join_dd
pids=()
declare -A node_log=()  # pid -> its log file
# stop_nodes: stops every node. One that died of a signal, before or during
# its stop (a crash: canopy handles TERM by stopping cleanly), fails the
# scenario; the end of its log goes to the scenario's log and the whole log
# beside the run's logs.
stop_nodes() {
  bench_kill "${pids[@]}"
  pids=()
  [[ -n $BENCH_KILL_SIGNALLED ]] || return 0
  local e pid rc log logs=${BENCH_OUT%/fragments/*}/logs
  for e in $BENCH_KILL_SIGNALLED; do
    pid=${e%%:*} rc=${e#*:}
    log=${node_log[$pid]:-}
    bench_log "canopy node (pid $pid, log $log) died of signal $((rc - 128)); its log ends: $(tail -n 5 "$log" 2>&1)"
    [[ -d $logs && -f $log ]] && cp "$log" "$logs/join_dd-died-$pid.log"
  done
  return 1
}
cleanup() { stop_nodes || true; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
fs=$(df -PT "$BENCH_WORK" | awk 'NR == 2 { print $2 " " $7 }')

# Room: the loaded cluster holds 4/3 of join_mib per node (every node has
# every tree), twice (pristine + running copy), plus the joiner's and dd's
# bytes, plus WAL and checkpoint slack, plus the memory warm-up file (4 x,
# below, while the copies exist): about 16 x join_mib. Shrink if short.
avail_mb=$(($(df -Pk "$BENCH_WORK" | awk 'NR == 2 { print $4 }') / 1024))
if ((join_mib * 16 > avail_mb)); then
  new_mib=$((avail_mb / 16 / tree_mib * tree_mib))
  ((new_mib >= tree_mib * 2)) || bench_skip "no room under $BENCH_WORK (${avail_mb} MiB free) for a cluster to join"
  bench_log "only ${avail_mb} MiB free under $BENCH_WORK: join size shrunk from $join_mib to $new_mib MiB"
  join_mib=$new_mib
fi
trees=$(awk -v g="$join_mib" -v t="$tree_mib" 'BEGIN { n = g * 4 / 3 / t; print (n == int(n)) ? n : int(n) + 1 }')

echo "join_dd bench secret" > "$work/secret"
common=(--cluster joindd --secret-file "$work/secret")
# Fixed ports: the sources restart from copies of their data dirs, which name
# their own and their peers' addresses.
ports=()
while ((${#ports[@]} < 8)); do
  p=$(bench_free_port)
  [[ " ${ports[*]} " == *" $p "* ]] || ports+=("$p")
done
uris=() rafts=() peers=()
for i in 1 2 3 4; do
  uris[i]="tcp://127.0.0.1:${ports[i - 1]}"
  rafts[i]="127.0.0.1:${ports[i + 3]}"
done
for i in 1 2 3; do peers+=(--raft-peer "$i=${rafts[i]}"); done

# start_source I: node I of the loaded cluster, data under $work/src.
start_source() {
  local i=$1 k seeds=()
  for k in 1 2 3; do [[ $k != "$i" ]] && seeds+=(--seed "${uris[k]}"); done
  "$canopy" node --listen "${uris[i]}" --data "$work/src/n$i" --node-id "$i" --fsync none --failure-ms "$failure_ms" \
    "${common[@]}" --raft "${rafts[i]}" "${peers[@]}" "${seeds[@]}" --log warn >> "$work/src/n$i.log" 2>&1 &
  pids+=($!)
  node_log[$!]=$work/src/n$i.log
}
status_json() { "$canopy" status --node "$1" "${common[@]}" --json --timeout-ms 5000 2>/dev/null; }
wait_members() {  # N SECONDS
  local deadline=$((SECONDS + $2)) n
  while ((SECONDS < deadline)); do
    n=$(status_json "${uris[1]}" | jq -r '.nodes | length' 2>/dev/null) || n=0
    [[ $n == "$1" ]] && return 0
    sleep 0.1
  done
  bench_log "the cluster did not reach $1 members in $2 s; the nodes' logs end:"
  local log
  for log in "$work"/src/n*.log; do [[ -f $log ]] && bench_log "$(basename "$log"): $(tail -n 5 "$log")"; done
  return 1
}

# ---- load once: $trees trees of $tree_mib MiB, every write on all 3 nodes
bench_log "loading $trees trees of $tree_mib MiB on 3 nodes (~$join_mib MiB will reach the joiner)"
mkdir -p "$work/src"
t_load=$(bench_now)
for i in 1 2 3; do start_source "$i"; done
wait_members 3 30 || exit 1
for ((t = 1; t <= trees; t++)); do
  for ((attempt = 1; ; attempt++)); do
    "$canopy" bench --node "${uris[1]}" "${common[@]}" --tree "jt$t" --cl ALL --count "$tree_mib" \
      --value-bytes 1048576 --timeout-ms 20000 > /dev/null 2> "$work/load.err" && break
    ((attempt < 50)) || { bench_log "loading tree jt$t failed: $(tail -n 3 "$work/load.err")"; exit 1; }
    sleep 0.2  # e.g. no raft leader yet right after the start
  done
done
load_s=$(bench_elapsed "$t_load" "$(bench_now)")
stop_nodes
mkdir -p "$work/pristine"
for i in 1 2 3; do mv "$work/src/n$i" "$work/pristine/n$i"; done
bench_log "loaded in $load_s s"

# log_ts LINE -> epoch seconds of a canopy log line (2024-01-02T03:04:05.678Z ...).
log_ts() { date -d "${1%% *}" +%s.%N; }

# cpu_per_gb SECONDS BYTES -> CPU seconds per decimal GB.
cpu_per_gb() { awk -v s="$1" -v b="$2" 'BEGIN { printf "%.4f\n", s / (b / 1e9) }'; }

# warm_memory [DIR]: writes warm_mib MiB to a file on DIR's file system
# (default BENCH_WORK: the one the next writer writes to) and deletes it,
# right before each measured writer (the joiner, dd, rcopy). On a VM whose
# balloon reports free pages to the host (virtio free page reporting), the
# first write to a page the guest handed back costs a fault in the host;
# which writer pays for it then depends on what ran just before, not on
# its code (measured here: the joiner's CPU per GB 2.73 -> 1.26 with 1.5
# GB written and freed right before it; dd and rcopy, which ran right
# after the join freed its pages, did not move when warmed too). Each
# writer now starts from pages the guest has just used. On bare metal
# this changes nothing.
# A warm-up in tmpfs did not warm a writer on ext4: with it, every disk
# join landed its bytes in cold memory (the landing copy, splice into ext4,
# 55-65% of the machine's CPU in perf against 15-35% in the tmpfs joins:
# 4-5 Gbit/s); why ext4's page cache took other pages was not pinned down
# (large folios against tmpfs's single pages is a guess). Written on the
# writer's own file system, the warm-up put the disk joins at 11-14 Gbit/s.
# Its file is deleted before write-back reaches it: the disk sees none of it.
warm_floor=$(bench_pick 128 1024 1024)
warm_mib=$((join_mib * 4 > warm_floor ? join_mib * 4 : warm_floor))
warm_memory() {
  local dir=${1:-$work}
  dd if=/dev/zero of="$dir/warm.bin" bs=1M count="$warm_mib" 2> /dev/null || true
  rm -f "$dir/warm.bin"
}

runs=$work/runs.jsonl
: > "$runs"

# join_sample REP -> "JOIN_GBPS STREAM_GBPS": the joiner's bytes over the join
# time and over the streaming time alone; sets JOIN_BYTES for the dd that follows.
JOIN_BYTES=0
# JOINER_DIR (default $work/joiner) is where the joiner keeps its data; the
# sample also records the seconds a `sync -f` there takes once the join is done.
SYNC_SECONDS=0
join_sample() {
  local rep=$1 joiner=${2:-$work/joiner} label=${3:-join}
  local i t0 deadline last_check=0 s1 s4 last end secs bytes stream_s jlog=$work/joiner.log t_sync
  local installed="" cpu_s=0
  rm -rf "$work/src" "$joiner"
  mkdir -p "$work/src"
  for i in 1 2 3; do cp -a "$work/pristine/n$i" "$work/src/n$i"; done
  for i in 1 2 3; do start_source "$i"; done
  wait_members 3 30 || return 1
  # Every tree's version on node 1 (all final: loaded with ALL).
  deadline=$((SECONDS + 30))
  until status_json "${uris[1]}" > "$work/before.json" && [[ $(jq '.trees | length' "$work/before.json") == "$trees" ]]; do
    ((SECONDS < deadline)) || { bench_log "node 1 does not list the $trees trees after a restart"; return 1; }
    sleep 0.1
  done
  sync
  warm_memory "$(dirname "$joiner")"
  t0=$(bench_now)
  "$canopy" node --listen "${uris[4]}" --data "$joiner" --node-id 4 --raft "${rafts[4]}" \
    --failure-ms "$failure_ms" "${common[@]}" --seed "${uris[1]}" --seed "${uris[2]}" --seed "${uris[3]}" \
    "${joiner_args[@]}" --log info > "$jlog" 2>&1 &
  local jpid=$!
  pids+=("$jpid")
  node_log[$jpid]=$jlog
  # STATUS is not cheap (each node hashes its trees for the digest): ask only
  # once the joiner's log shows every snapshot it began installed, and at
  # most every 0.5 s.
  # The poll itself must not compete with the join for this machine's 2
  # cores: one awk per poll (the grep | awk | sort pipelines it replaced
  # took ~15% of the machine while the join ran), and a sleep without a
  # process (read -t on a pipe that never delivers).
  deadline=$((SECONDS + join_wait))
  end=""
  local nap progress begun_n done_n pending
  exec {nap}<> <(:)
  while [[ -z $end ]]; do
    ((SECONDS < deadline)) || { bench_log "the joiner did not catch up within $join_wait s; its log: $(tail -n 10 "$jlog")"; exec {nap}<&-; return 1; }
    read -r -t 0.05 -u "$nap" _ || true
    # Trees begun, trees installed, and begun trees not installed yet.
    progress=$(awk '/ receiving snapshot of / { for (i = 1; i < NF; i++) if ($i == "of") { b[$(i + 1)] = 1; break } }
                    / installed snapshot of / { for (i = 1; i < NF; i++) if ($i == "of") { d[$(i + 1)] = 1; break } }
                    END { n = 0; m = 0; p = 0; for (k in b) { n++; if (!(k in d)) p++ } for (k in d) m++; print n, m, p }' "$jlog")
    read -r begun_n done_n pending <<< "$progress"
    # The joiner's CPU (user + system) from its start, read within one poll
    # of each new install line: the join's cost in CPU, which the wall clock
    # of a busy 2-core machine blurs (and before STATUS makes it hash its trees).
    if [[ $done_n != "$installed" ]]; then
      installed=$done_n
      cpu_s=$(bench_cpu_seconds "$jpid")
    fi
    ((begun_n > 0 && pending == 0 && done_n == begun_n)) || continue
    local now_ms=$((${EPOCHREALTIME/./} / 1000))
    ((now_ms - last_check >= 500)) || continue
    last_check=$now_ms
    s1=$(status_json "${uris[1]}") || continue
    s4=$(status_json "${uris[4]}") || continue
    jq -e -n --argjson s1 "$s1" --argjson s4 "$s4" --slurpfile before "$work/before.json" '
      ($before[0].trees | map({key: .tree, value: .durable_version}) | from_entries) as $want
      | ($s4.trees | map({key: .tree, value: .}) | from_entries) as $have
      | [$s1.trees[] | select(.owners | map(tostring) | index("4")) | .tree] as $mine
      | ($s1.nodes | length) == 4 and ($mine | length) > 0
        and all($mine[]; $have[.] != null and $have[.].durable_version == $want[.] and $have[.].snapshots_received >= 1)' \
      > /dev/null 2>&1 || continue
    last=$(grep 'installed snapshot of ' "$jlog" | sort | tail -n 1)
    end=$(log_ts "$last")
  done
  exec {nap}<&-
  secs=$(bench_elapsed "$t0" "$end")
  stream_s=$(bench_elapsed "$(log_ts "$(grep 'receiving snapshot of ' "$jlog" | sort | head -n 1)")" "$end")
  # Keep the joiner's log beside the run's logs (bench/run: OUT/logs/).
  local logs=${BENCH_OUT%/fragments/*}/logs
  [[ -d $logs ]] && cp "$jlog" "$logs/join_dd-joiner-$label-$rep.log"
  t_sync=$(bench_now)
  sync -f "$joiner"
  SYNC_SECONDS=$(bench_elapsed "$t_sync" "$(bench_now)")
  stop_nodes
  bytes=$(du -sb "$joiner" | cut -f1)
  JOIN_BYTES=$bytes
  # Files per sending node: "receiving snapshot of T at version V from S (checkpoint file, ...".
  local by_source
  by_source=$({ grep -o 'receiving snapshot of [^ ]* at version [0-9]* from [^ ]*' "$jlog" || true; } |
    awk '{ print $NF }' | jq -R . | jq -s -c 'group_by(.) | map({key: .[0], value: length}) | from_entries')
  jq -cn --arg l "$label" --argjson r "$rep" --argjson s "$secs" --argjson st "$stream_s" --argjson b "$bytes" \
    --argjson sy "$SYNC_SECONDS" --arg dir "$joiner" --argjson cpu "$cpu_s" --argjson src "$by_source" \
    --argjson n "$(jq -n --argjson s1 "$s1" '[$s1.trees[] | select(.owners | map(tostring) | index("4"))] | length')" \
    '{label: $l, rep: $r, seconds: $s, streaming_seconds: $st, sync_seconds: $sy, bytes: $b, trees_to_joiner: $n,
      joiner_cpu_seconds: $cpu, files_by_source: $src, dir: $dir}' >> "$runs"
  rm -rf "$joiner" "$work/src"
  echo "$(bench_gbps "$bytes" "$secs") $(bench_gbps "$bytes" "$stream_s") $(cpu_per_gb "$cpu_s" "$bytes")"
}

# dd_sample REP MIB -> Gbit/s by dd's own report.
dd_sample() {
  local rep=$1 mib=$2 dir=${3:-$work} label=${4:-dd} out bytes secs
  warm_memory "$dir"
  out=$(LC_ALL=C dd if=/dev/zero of="$dir/dd.bin" bs=1M count="$mib" conv=fsync 2>&1 | tail -n 1)
  rm -f "$dir/dd.bin"
  bytes=$(awk '{ print $1 }' <<<"$out")
  secs=$(awk -F', ' '{ split($(NF - 1), a, " "); print a[1] }' <<<"$out")
  [[ $bytes =~ ^[0-9]+$ && $secs =~ ^[0-9.e+-]+$ ]] || { bench_log "cannot parse dd's report: $out"; return 1; }
  jq -cn --arg l "$label" --argjson r "$rep" --argjson s "$secs" --argjson b "$bytes" --arg out "$out" --arg dir "$dir" \
    '{label: $l, rep: $r, seconds: $s, bytes: $b, dd: $out, dir: $dir}' >> "$runs"
  bench_gbps "$bytes" "$secs"
}

# rcopy_sample REP MIB -> Gbit/s by wall clock of one rcopy of a file of
# random bytes (MIB MiB at the first call) over tcp://127.0.0.1 into the
# rcopy server's root on the same tmpfs.
rcopy_port="" rcopy_pid="" rcopy_mib=0
rcopy_sample() {
  local rep=$1 mib=$2 t0 t1 out secs bytes
  if [[ -z $rcopy_port ]]; then
    mkdir -p "$work/rcopy-dst"
    "$rcopy" --server -q --root "$work/rcopy-dst" --bind 127.0.0.1 -p 0 --port-file "$work/rcopy.port" \
      2> "$work/rcopy-server.err" &
    rcopy_pid=$!
    bench_wait_file "$work/rcopy.port" 10 || { bench_log "rcopy server did not start: $(cat "$work/rcopy-server.err")"; return 1; }
    rcopy_port=$(cat "$work/rcopy.port")
  fi
  if ((rcopy_mib == 0)); then  # made once, at the first join's size (rates compare, not sizes)
    bench_random_file "$work/rcopy.bin" "$mib"
    rcopy_mib=$mib
  fi
  bytes=$((rcopy_mib * 1024 * 1024))
  local cpu0 cpu1 cpu
  warm_memory
  cpu0=$(bench_cpu_seconds "$rcopy_pid")
  t0=$(bench_now)
  out=$("$rcopy" --json -p "$rcopy_port" "$work/rcopy.bin" "127.0.0.1:copy" 2> "$work/rcopy-client.err") ||
    { bench_log "rcopy failed: $out $(cat "$work/rcopy-client.err")"; return 1; }
  t1=$(bench_now)
  cpu1=$(bench_cpu_seconds "$rcopy_pid")
  secs=$(bench_elapsed "$t0" "$t1")
  cpu=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.3f", b - a }')
  RCOPY_CPU_PER_GB=$(cpu_per_gb "$cpu" "$bytes")
  jq -c --arg l rcopy --argjson r "$rep" --argjson s "$secs" --argjson b "$bytes" --argjson cpu "$cpu" \
    '{label: $l, rep: $r, seconds: $s, bytes: $b, server_cpu_seconds: $cpu, rcopy: .}' <<<"$out" >> "$runs"
  rm -f "$work/rcopy-dst/copy"
  bench_gbps "$bytes" "$secs"
}

# The disk: a directory on a block device for the joiner's data and dd.
disk_base=${BENCH_DISK_DIR:-/var/tmp}
disk_dir="" disk_fs="" disk_why=""
if [[ -d $disk_base ]] && [[ $(findmnt -n -o SOURCE --target "$disk_base" 2>/dev/null | tail -n 1) == /dev/* ]]; then
  disk_dir=$(mktemp -d "$disk_base/canopy-join-dd.XXXXXX")
  disk_fs=$(df -PT "$disk_dir" | awk 'NR == 2 { print $1 " " $2 " " $7 }')
  avail_disk_mb=$(($(df -Pk "$disk_dir" | awk 'NR == 2 { print $4 }') / 1024))
  if ((avail_disk_mb < join_mib * 4)); then
    disk_why="only ${avail_disk_mb} MiB free on $disk_base"
    rm -rf "$disk_dir"
    disk_dir=""
  fi
else
  disk_why="$disk_base is not on a block device"
fi
tune=false tune_why=""
tuning_state=$work/join-tuning.state
if [[ -n $disk_dir ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    tune_why="not root: hw/join-tuning.sh needs root"
  elif [[ ${BENCH_MODE:-quick} == tiny ]]; then
    tune_why="tiny mode changes no machine-wide settings"
  else
    tune=true
  fi
fi
# The capped-source samples: root, tc, quick/full mode, and lo without a
# qdisc of its own (never replaced).
cap_mbit=$(bench_pick 500 2000 2000)
cap=false cap_why=""
if [[ $(id -u) -ne 0 ]]; then
  cap_why="not root: shaping lo needs root"
elif [[ ${BENCH_MODE:-quick} == tiny ]]; then
  cap_why="tiny mode changes no machine-wide settings"
elif ! command -v tc > /dev/null; then
  cap_why="tc missing (apt-get install iproute2)"
elif tc qdisc show dev lo | grep -q 'qdisc htb 1: root'; then
  cap_why="lo already has an htb root qdisc (left alone)"
elif ! tc qdisc show dev lo | grep -q 'qdisc noqueue'; then
  cap_why="lo has a qdisc of its own: $(tc qdisc show dev lo | head -n 1) (left alone)"
else
  cap=true
fi
cap_on=false
cap_text="each rep: two more joins (tmpfs) with the traffic of each source from its listen port shaped on lo to \
$cap_mbit Mbit/s (tc htb, one class per source, u32 match on the source port; the rest of lo unshaped), files from \
every owner and with --join-from-leader-only"
# cap_sources on|off: "on" shapes what each source sends from its listen
# port to cap_mbit (one htb class per source, a u32 match on the source
# port); everything else on lo goes through an unshaped default class.
cap_sources() {
  if [[ $1 == off ]]; then
    $cap_on && { tc qdisc del dev lo root 2> /dev/null || true; }
    cap_on=false
    return 0
  fi
  local i port
  tc qdisc add dev lo root handle 1: htb default 99 r2q 10000 || return 1
  cap_on=true
  tc class add dev lo parent 1: classid 1:99 htb rate 100gbit burst 4m cburst 4m || return 1
  for i in 1 2 3; do
    port=${uris[i]##*:}
    tc class add dev lo parent 1: classid "1:$i" htb rate "${cap_mbit}mbit" ceil "${cap_mbit}mbit" burst 1m cburst 1m ||
      return 1
    tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip sport "$port" 0xffff flowid "1:$i" || return 1
  done
}
cleanup() {
  cap_sources off
  stop_nodes || true
  [[ -n $rcopy_pid ]] && bench_kill "$rcopy_pid"
  [[ -f $tuning_state ]] && "$BENCH_REPO/hw/join-tuning.sh" restore "$tuning_state" >&2
  [[ -n $disk_dir ]] && rm -rf "$disk_dir"
  restore_page_reporting
  rm -rf "$work"
}

# The warm-up holds only while the guest keeps the pages it freed. Where
# the guest kernel's free page reporting has a minimum age for a free page
# (this machine's page_reporting module: min_free_ms, 0 here, so freed
# pages may go to the host at once), the scenario sets it to a minute and
# restores it on exit, so that a warm-up is not handed back between it and
# the writer. Seen in two runs each: disk joins 10.1-14.3 Gbit/s with the
# hold, 6.7-13.8 without (the warm-up on the writer's file system in both);
# tmpfs joins still swung with it (8.7-13.1). Nothing else about the
# machine changes; where the parameter is missing this does nothing.
page_reporting_param=/sys/module/page_reporting/parameters/min_free_ms
page_reporting_old="" page_reporting="not adjustable here (no writable $page_reporting_param): left as it is"
if [[ -w $page_reporting_param ]] && page_reporting_old=$(cat "$page_reporting_param" 2> /dev/null) &&
  [[ $page_reporting_old =~ ^[0-9]+$ ]] && ((page_reporting_old < 60000)); then
  if echo 60000 > "$page_reporting_param" 2> /dev/null; then
    page_reporting="guest free page reporting held off for a minute after each free ($page_reporting_param $page_reporting_old -> 60000 for the scenario, restored after)"
  else
    page_reporting_old=""
  fi
else
  page_reporting_old=""
  [[ -r $page_reporting_param ]] && page_reporting="$page_reporting_param is $(cat "$page_reporting_param"): left as it is"
fi
restore_page_reporting() {
  if [[ -n $page_reporting_old ]]; then echo "$page_reporting_old" > "$page_reporting_param" 2> /dev/null || true; fi
  page_reporting_old=""
}

a=() s=() b=() rc=() jcpu=() rcpu=() ce=() cl=()
da=() dsync=() db=() ta=() tsync=() tb=()
for ((rep = 1; rep <= reps; rep++)); do
  # Assigned first (not in $(...)) so that JOIN_BYTES survives.
  join_sample "$rep" > "$work/sample"
  read -r ja js jc < "$work/sample"
  a+=("$ja") s+=("$js") jcpu+=("$jc")
  dd_mib=$(((JOIN_BYTES + 1048575) / 1048576))
  b+=("$(dd_sample "$rep" "$dd_mib")")
  rcopy_sample "$rep" "$dd_mib" > "$work/sample"
  rc+=("$(cat "$work/sample")")
  rcpu+=("$RCOPY_CPU_PER_GB")
  bench_log "rep $rep/$reps: join ${a[-1]} Gbit/s (streaming alone ${s[-1]}, $JOIN_BYTES bytes), dd ${b[-1]} Gbit/s ($dd_mib MiB), rcopy ${rc[-1]} Gbit/s"
  if $cap; then
    saved_args=("${joiner_args[@]}")
    cap_variants=(every leaders)
    ((rep % 2 == 0)) && cap_variants=(leaders every)  # alternating, as the disk samples below
    for variant in "${cap_variants[@]}"; do
      joiner_args=("${saved_args[@]}")
      [[ $variant == leaders ]] && joiner_args+=(--join-from-leader-only)
      cap_sources on || { cap_sources off; bench_log "shaping lo failed"; exit 1; }
      join_sample "$rep" "$work/joiner" "join-capped-$variant" > "$work/sample"
      cap_sources off
      read -r ja _ < "$work/sample"
      if [[ $variant == every ]]; then ce+=("$ja"); else cl+=("$ja"); fi
    done
    joiner_args=("${saved_args[@]}")
    bench_log "rep $rep/$reps, sources capped at $cap_mbit Mbit/s: join from every owner ${ce[-1]} Gbit/s, from the leaders only ${cl[-1]}"
  fi
  [[ -n $disk_dir ]] || continue
  # Which of the two goes first alternates between reps: each disk sample
  # follows the other's writes and deletes on the same file system, so a
  # fixed order would favour one of them.
  disk_variants=(untuned tuned)
  ((rep % 2 == 0)) && disk_variants=(tuned untuned)
  for variant in "${disk_variants[@]}"; do
    if [[ $variant == tuned ]]; then
      $tune || continue
      "$BENCH_REPO/hw/join-tuning.sh" apply "$disk_dir" "$tuning_state" >&2
    fi
    join_sample "$rep" "$disk_dir/joiner" "join-disk-$variant" > "$work/sample"
    read -r ja _ < "$work/sample"
    js=$(awk -v b="$JOIN_BYTES" -v g="$ja" -v y="$SYNC_SECONDS" 'BEGIN { t = b * 8 / (g * 1e9); printf "%.4f\n", b * 8 / (t + y) / 1e9 }')
    dd_mib=$(((JOIN_BYTES + 1048575) / 1048576))
    dd_g=$(dd_sample "$rep" "$dd_mib" "$disk_dir" "dd-disk-$variant")
    if [[ $variant == tuned ]]; then
      "$BENCH_REPO/hw/join-tuning.sh" restore "$tuning_state" >&2
      ta+=("$ja") tsync+=("$js") tb+=("$dd_g")
    else
      da+=("$ja") dsync+=("$js") db+=("$dd_g")
    fi
    bench_log "rep $rep/$reps, disk ($variant): join $ja Gbit/s, join + sync $js, dd $dd_g Gbit/s"
  done
done

comparisons=$(jq -s . <<EOC
$(bench_comparison "node join vs dd conv=fsync (~$join_mib MiB to the joiner, tmpfs)" Gbit/s true \
  "join (4th node)" "$(bench_samples "${a[@]}")" "dd bs=1M conv=fsync" "$(bench_samples "${b[@]}")" \
  0.8 "join >= 0.8x dd conv=fsync of the same bytes")
$(bench_comparison "snapshot streaming alone vs dd conv=fsync (~$join_mib MiB to the joiner, tmpfs)" Gbit/s true \
  "join streaming" "$(bench_samples "${s[@]}")" "dd bs=1M conv=fsync" "$(bench_samples "${b[@]}")")
$(bench_comparison "snapshot streaming alone vs rcopy of as many bytes (tcp://127.0.0.1, tmpfs)" Gbit/s true \
  "join streaming" "$(bench_samples "${s[@]}")" "rcopy (one file)" "$(bench_samples "${rc[@]}")" \
  0.9 "snapshot streaming >= 0.9x rcopy of the same bytes over the same transport")
$(bench_comparison "CPU per GB received: the joiner (start to last install) vs the rcopy server (tmpfs)" "CPU s/GB" false \
  "joiner" "$(bench_samples "${jcpu[@]}")" "rcopy server" "$(bench_samples "${rcpu[@]}")")
$(if $cap; then
  bench_comparison "node join, each source's link capped at $cap_mbit Mbit/s (tc htb on lo): files from every owner vs from the leaders only" Gbit/s true \
    "join, every owner" "$(bench_samples "${ce[@]}")" "join, leaders only" "$(bench_samples "${cl[@]}")"
  bench_comparison "node join from every owner, each source's link capped at $cap_mbit Mbit/s: vs the three links together" Gbit/s true \
    "join, every owner" "$(bench_samples "${ce[@]}")" "3 x $cap_mbit Mbit/s (the shaping rate, not measured)" "$(bench_samples "$(awk -v m="$cap_mbit" 'BEGIN { print 3 * m / 1000 }')")"
fi
if [[ -n $disk_dir ]]; then
  bench_comparison "node join vs dd conv=fsync, joiner on disk ($disk_fs), as the machine is" Gbit/s true \
    "join (4th node), disk" "$(bench_samples "${da[@]}")" "dd bs=1M conv=fsync, disk" "$(bench_samples "${db[@]}")" \
    0.8 "join >= 0.8x dd conv=fsync on the same file system"
  bench_comparison "node join + sync vs dd conv=fsync, joiner on disk ($disk_fs), as the machine is" Gbit/s true \
    "join + sync, disk" "$(bench_samples "${dsync[@]}")" "dd bs=1M conv=fsync, disk" "$(bench_samples "${db[@]}")" \
    0.8 "join + sync >= 0.8x dd conv=fsync on the same file system"
fi
if $tune; then
  bench_comparison "node join vs dd conv=fsync, joiner on disk ($disk_fs), hw/join-tuning.sh applied" Gbit/s true \
    "join (4th node), disk, tuned" "$(bench_samples "${ta[@]}")" "dd bs=1M conv=fsync, disk, tuned" "$(bench_samples "${tb[@]}")" \
    0.8 "join >= 0.8x dd conv=fsync on the same file system"
  bench_comparison "node join + sync vs dd conv=fsync, joiner on disk ($disk_fs), hw/join-tuning.sh applied" Gbit/s true \
    "join + sync, disk, tuned" "$(bench_samples "${tsync[@]}")" "dd bs=1M conv=fsync, disk, tuned" "$(bench_samples "${tb[@]}")" \
    0.8 "join + sync >= 0.8x dd conv=fsync on the same file system"
  bench_comparison "node join on disk: tuned vs as the machine is" Gbit/s true \
    "join, tuned" "$(bench_samples "${ta[@]}")" "join, as the machine is" "$(bench_samples "${da[@]}")"
fi)
EOC
)

# What "as the machine is" was: a run killed between apply and restore (or
# an image that ships these values) leaves the tuned settings behind, and
# then both disk rows measure the same thing.
as_is="vm.dirty_expire_centisecs $(sysctl -n vm.dirty_expire_centisecs 2>/dev/null || echo '?'), vm.dirty_ratio $(sysctl -n vm.dirty_ratio 2>/dev/null || echo '?'), vm.dirty_background_ratio $(sysctl -n vm.dirty_background_ratio 2>/dev/null || echo '?')"
jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" --arg as_is "$as_is" \
  --argjson join_mib "$join_mib" --argjson tree_mib "$tree_mib" --argjson trees "$trees" --argjson reps "$reps" \
  --argjson load_s "$load_s" --argjson failure_ms "$failure_ms" --argjson warm_mib "$warm_mib" --argjson cpus "$(nproc)" --arg fs "$fs" \
  --arg page_reporting "$page_reporting" --arg ddv "$(dd --version | head -n 1)" --arg disk_fs "${disk_fs:-none}" --arg jargs "${JOIN_DD_JOINER_ARGS:-}" \
  --arg capped "${cap_why:-$cap_text}" \
  --arg disk "${disk_why:-joiner data dir and dd under BENCH_DISK_DIR=$disk_base}" \
  --arg tuning "${tune_why:-hw/join-tuning.sh apply/restore around each tuned sample: vm.dirty_expire_centisecs 6000, vm.dirty_ratio 80, vm.dirty_background_ratio 40, deadline I/O scheduler}" \
  '{scenario: "join_dd",
    title: "Node join (4th node receives its trees) vs dd of the same bytes",
    path: "join: tcp://127.0.0.1 kernel loopback (no NIC) between 4 canopy nodes, snapshots written to BENCH_WORK (tmpfs) and, in the disk rows, to BENCH_DISK_DIR on a block device; dd: /dev/zero -> a file on the same file system, no network",
    params: {join_mib_planned: $join_mib, tree_mib: $tree_mib, trees_in_cluster: $trees, reps: $reps,
             replication: "RF 3, metadata raft on nodes 1-3, the joiner joins through its seeds",
             sources: "3 nodes loaded once with --cl ALL and --fsync none, restarted from copies of their data dirs for every join",
             joiner_args: $jargs,
             capped_sources: $capped,
             install_fsync: "finish (the default: one fsync per tree file once complete)",
             dd: "dd if=/dev/zero bs=1M count=ceil(joiner bytes / 1 MiB) conv=fsync", filesystem: $fs,
             failure_ms: $failure_ms, cpus: $cpus, load_seconds: $load_s,
             order: "per rep: join, dd, rcopy (tmpfs); joins with capped sources, every owner and leaders only; join, dd on disk as the machine is and tuned (the pairs alternate which goes first: odd reps as listed, even reps the other way)",
             rcopy: "rcopy --server on 127.0.0.1 (tmpfs root); one file of random bytes, sized at the first join, copied once per rep",
             disk_filesystem: $disk_fs, disk: $disk, disk_tuning: $tuning, disk_as_is: $as_is,
             join_plus_sync: "bytes / (join seconds + seconds of sync -f on the joiner file system right after)",
             warm_memory: ("before each measured writer (joiner, dd, rcopy): " + ($warm_mib | tostring) + " MiB written to a file on the file system it writes to next (BENCH_WORK, or the disk directory for the disk rows) and deleted, so that none of them pays more than another for the first touch of pages a VM handed back to its host (virtio-balloon free page reporting)"),
             free_page_reporting: $page_reporting,
             cpu: "joiner: user + system CPU seconds from its start, read from /proc within one 50 ms poll of its last install line, per decimal GB of its data dir; rcopy server: its CPU seconds over one copy, per GB copied",
             metric: "decimal Gbit/s: joiner data dir bytes (du -sb) * 8 / (joiner start .. its last installed snapshot log line, ms resolution) / 1e9; streaming: the same bytes over first receiving .. last installed snapshot line; dd: its bytes / its own seconds"},
    comparisons: $comparisons,
    details: {dd_version: $ddv, runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
