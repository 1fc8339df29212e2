#!/usr/bin/env bash
# bench/scenarios/rdma_perftest.sh — RDMA, on a host with an InfiniBand / RoCE
# device (or Soft-RoCE: hw/RDMA.md), else in two QEMU guests with Soft-RoCE:
# the bench tool over rdma:// versus perftest's ib_send_bw (same message size,
# same seconds; bench's message path is two-sided SEND like ib_send_bw), bench
# --bulk (RDMA READ above the eager limit) versus ib_write_bw, 64-byte
# ping-pong latency versus ib_send_lat, the one-sided log ring's round trip (bench --one-sided)
# versus ib_write_lat's, alternating per rep; a 3-node canopy cluster's QUORUM commit p50 with
# --one-sided-replication versus ib_write_lat's round trip and versus the message stream; and rcopy over
# rdma:// versus ib_write_bw and versus rcopy over tcp:// on the same
# addresses, tmpfs -> tmpfs. Decimal Gbit/s, microseconds. Env:
# RDMA_BENCH_DEVICE, RDMA_BENCH_ADDR (defaults: the first device and its
# netdev's IPv4 address), RDMA_BENCH_VM (auto|never|always; auto: guests in quick and full mode,
# not in tiny mode, where booting them would take most of the minute). Contract: bench/lib.sh.
# Without a device on this host the scenario runs itself inside a pair of QEMU guests with
# Soft-RoCE (hw/rdma-vm.sh): guest B serves (an agent starts the bench, rcopy and perftest
# servers that guest A asks for), guest A runs every client against B's address. Under TCG the
# absolute figures are emulation speed; the ratios against perftest on the same emulated link
# are the result.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

bench=$BENCH_BUILD/tools/bench/bench
rcopy=$BENCH_BUILD/tools/rcopy/rcopy
for b in "$bench" "$rcopy"; do [[ -x $b ]] || { bench_log "$b not built"; exit 1; }; done
bench_need_peer ibv_devices ibverbs-utils || bench_skip "ibv_devices missing (apt-get install ibverbs-utils)"
bench_need_peer ib_write_bw perftest || bench_skip "perftest missing (apt-get install perftest)"
devices=$(ibv_devices 2> /dev/null | awk 'NR > 2 { print $1 }' || true)
role=${CANOPY_VM_ROLE:-}
# Guest A tells B's agent when it is done, however it exits.
[[ $role == a ]] && trap 'echo finished > "$CANOPY_VM_DIR/finished"' EXIT

# --- guest B: serve what guest A asks for, until A has finished.
if [[ $role == b ]]; then
  a_dir=$CANOPY_VM_OUT/a
  n=0
  children=()
  echo ready > "$CANOPY_VM_DIR/agent.ready"
  while [[ ! -e $a_dir/finished ]]; do
    if [[ -f $a_dir/req.$n ]]; then
      bash -c "$(cat "$a_dir/req.$n")" > "$CANOPY_VM_DIR/srv.$n.log" 2>&1 &
      children+=($!)
      echo $! > "$CANOPY_VM_DIR/ack.$n"
      n=$((n + 1))
    else
      sleep 0.05
    fi
  done
  bench_kill "${children[@]}"
  exit 0
fi

# --- the host without a device: run the scenario in a guest pair.
if [[ -z $role && -z $devices ]]; then
  vm_mode=${RDMA_BENCH_VM:-auto}
  why="no RDMA device (ibv_devices lists none); Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE (hw/RDMA.md)"
  [[ $vm_mode == never ]] && bench_skip "$why; RDMA_BENCH_VM=never: no Soft-RoCE guest pair either"
  [[ $vm_mode == auto && ${BENCH_MODE:-quick} == tiny ]] &&
    bench_skip "$why; tiny mode does not boot the Soft-RoCE guest pair (minutes; RDMA_BENCH_VM=always does)"
  vm_out=$BENCH_WORK/rdma_perftest.vm
  mkdir -p "$vm_out"
  envs=()
  for v in BENCH_MODE BENCH_REPS BENCH_BUILD BENCH_REPO; do envs+=(--env "$v=${!v:-}"); done
  envs+=(--env "BENCH_WORK=/tmp/bench-work" --env "BENCH_OUT=$vm_out/a/fragment.json")
  rc=0
  nice -n 5 bash "$BENCH_REPO/hw/rdma-vm.sh" pair --quiet --out "$vm_out" --timeout "$(bench_pick 900 1800 3600)" "${envs[@]}" \
    --a "mkdir -p /tmp/bench-work && bash $0" --b "bash $0" > "$vm_out/host.log" 2>&1 || rc=$?
  if ((rc == 77)); then bench_skip "$why; and no guests: $(tail -1 "$vm_out/host.log")"; fi
  if ((rc != 0)) || [[ ! -s $vm_out/a/fragment.json ]]; then
    bench_log "the guest run failed (exit $rc):"
    for f in "$vm_out"/a/stdout "$vm_out"/a/stderr "$vm_out"/b/stderr "$vm_out"/host.log; do
      [[ -s $f ]] && { echo "--- ${f#"$vm_out"/}" >&2; tail -20 "$f" >&2; }
    done
    exit 1
  fi
  cat "$vm_out/a/stderr" >&2 2> /dev/null || true
  cp "$vm_out/a/fragment.json" "$BENCH_OUT"
  bench_log "wrote $BENCH_OUT (from the guests)"
  exit 0
fi

[[ -n $devices ]] || bench_skip "no RDMA device (ibv_devices lists none); Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE (hw/RDMA.md)"
device=${RDMA_BENCH_DEVICE:-$(head -n 1 <<<"$devices")}
grep -qx "$device" <<<"$devices" || { bench_log "device $device not found; devices: $devices"; exit 1; }
addr=${RDMA_BENCH_ADDR:-}
if [[ $role == a ]]; then
  addr=$CANOPY_VM_PEER  # the servers run on guest B
elif [[ -z $addr ]]; then
  for n in /sys/class/infiniband/"$device"/ports/1/gid_attrs/ndevs/0 /sys/class/infiniband/"$device"/device/net/*; do
    [[ -e $n ]] || continue
    if [[ -f $n ]]; then ifname=$(cat "$n"); else ifname=$(basename "$n"); fi
    addr=$(ip -4 -o addr show dev "$ifname" 2> /dev/null | awk '{ split($4, a, "/"); print a[1]; exit }')
    [[ -n $addr ]] && break
  done
fi
[[ -n $addr ]] || bench_skip "no IPv4 address on $device's netdev (set RDMA_BENCH_ADDR)"
reps=${BENCH_REPS:-3}
if [[ $role == a ]]; then
  # TCG moves ~0.1-0.5 Gbit/s: smaller files, same structure. rcopy's time
  # includes connecting, the handshake and the final commit (fsync, rename):
  # about 0.4 s for a 1-byte file in these guests (rcopy_setup_seconds below),
  # a third of a 32 MiB copy. perftest's figure leaves its set-up out, so the
  # file is big enough for that to stay near a tenth of the copy.
  read -r -a sizes <<<"$(bench_pick "65536" "65536 1048576" "65536 1048576 4194304")"
  secs=$(bench_pick 1 2 4)
  file_mb=$(bench_pick 8 128 256)
  lat_iters=$(bench_pick 200 1000 5000)
else
  read -r -a sizes <<<"$(bench_pick "65536" "65536 1048576" "65536 1048576 4194304")"
  secs=$(bench_pick 1 2 5)
  file_mb=$(bench_pick 64 512 2048)
  lat_iters=$(bench_pick 1000 10000 100000)
fi

work=$BENCH_WORK/rdma_perftest
pids=()
cleanup() {
  bench_kill "${pids[@]}"
  rm -rf "$work"
  [[ $role == a ]] && echo finished > "$CANOPY_VM_DIR/finished"
  return 0
}
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work/dst"
runs=$work/runs.jsonl
: > "$runs"
# Each perftest server gets a port of its own (a file: perftest runs inside $(...) subshells).
echo $((18515 + RANDOM % 1000)) > "$work/perf.port"
next_perf_port() {
  local p
  p=$(($(cat "$work/perf.port") + 1))
  echo "$p" > "$work/perf.port"
  echo "$p"
}

# Servers run here, or on guest B (its agent runs each request; files it must write go to
# $share, which both guests see).
if [[ $role == a ]]; then
  share=$CANOPY_VM_OUT/b
  dst=/tmp/rdma_perftest-dst
  # serve COMMAND: start COMMAND on guest B, return once it runs there. The request counter is
  # a file: serve runs inside $(...) subshells too, where a variable's increment is lost.
  echo 0 > "$work/req.next"
  serve() {
    local req
    req=$(cat "$work/req.next")
    echo $((req + 1)) > "$work/req.next"
    printf '%s\n' "$*" > "$CANOPY_VM_DIR/req.tmp"
    mv "$CANOPY_VM_DIR/req.tmp" "$CANOPY_VM_DIR/req.$req"
    bench_wait_file "$share/ack.$req" 120 || { bench_log "guest B did not start: $*"; return 1; }
  }
  # The guests boot at their own pace (minutes on a loaded host): wait for B's agent.
  bench_wait_file "$share/agent.ready" 900 || { bench_log "guest B's agent did not come up"; exit 1; }
  serve "mkdir -p $dst"
else
  share=$work
  dst=$work/dst
  serve() {
    bash -c "$*" &
    pids+=($!)
  }
fi

# perftest_client TOOL ARGS...: the client, tried again while its server is not listening yet
# (it prints nothing when ready; in the guests it can take seconds to start).
perftest_client() {
  local attempt out
  for attempt in 1 2 3 4 5; do
    out=$("$@" 2>&1) && { echo "$out"; return 0; }
    grep -qi "couldn't connect\|unable to connect\|connection refused" <<<"$out" || break
    sleep 2
  done
  echo "$out"
  return 1
}

# perftest TOOL SIZE -> its average Gbit/s (server started first).
# perftest converts cycles to time with a clock rate it measures at start;
# when that measurement is too noisy ("Correlation coefficient r^2: 0.18 <
# 0.9", common under TCG emulation) it prints 0.000000 for every figure. Such
# a run measured nothing: it is run again (up to 3 times), never kept as 0.
perftest() {
  local tool=$1 size=$2 out attempt gbps
  local perf_port
  for attempt in 1 2 3; do
    perf_port=$(next_perf_port)
    serve "$tool -d $device -s $size -D $secs -F --report_gbits -p $perf_port > $share/perf.$perf_port.srv 2>&1"
    sleep 1  # perftest's server prints nothing machine-readable when ready
    out=$(perftest_client "$tool" -d "$device" -s "$size" -D "$secs" -F --report_gbits -p "$perf_port" "$addr") ||
      { bench_log "$tool -s $size failed: $out"; return 1; }
    jq -cn --arg t "$tool" --argjson s "$size" --arg out "$out" --argjson a "$attempt" \
      '{label: $t, size: $s, attempt: $a, output: $out}' >> "$runs"
    gbps=$(perftest_gbps "$size" <<<"$out")
    [[ -n $gbps ]] && { echo "$gbps"; return 0; }
    bench_log "$tool -s $size, attempt $attempt: no figure ($(grep -m1 -i 'correlation' <<<"$out" || echo 'no result line')); again"
  done
  bench_log "$tool -s $size gave no figure in 3 attempts"
  return 1
}
# perftest_gbps SIZE < OUTPUT -> the BW average column of SIZE's result line;
# nothing when it is missing or perftest printed 0 for want of a clock rate.
perftest_gbps() {
  awk -v s="$1" '$1 == s && ($4 + 0) > 0 { print $4; exit }'
}
# send_lat -> ib_send_lat's typical one-way latency (us) for 64-byte messages.
send_lat() {
  local out
  local perf_port
  perf_port=$(next_perf_port)
  serve "ib_send_lat -d $device -s 64 -n $lat_iters -F -p $perf_port > $share/perf.$perf_port.srv 2>&1"
  sleep 1
  out=$(perftest_client ib_send_lat -d "$device" -s 64 -n "$lat_iters" -F -p "$perf_port" "$addr") ||
    { bench_log "ib_send_lat failed: $out"; return 1; }
  jq -cn --arg out "$out" '{label: "ib_send_lat", size: 64, output: $out}' >> "$runs"
  awk '$1 == 64 { print $5; exit }' <<<"$out"
}

rm -f "$share/bench.port"
serve "$bench --server -q --transport rdma --bind $addr -p 0 --port-file $share/bench.port 2> $share/bench.err"
bench_wait_file "$share/bench.port" 120 || { bench_log "bench server over rdma:// did not start: $(cat "$share/bench.err")"; exit 1; }
bport=$(cat "$share/bench.port")
# bench_bw SIZE [--bulk] -> bw_avg_gbps over rdma://.
bench_bw() {
  local size=$1 out; shift
  out=$("$bench" --json --transport rdma -p "$bport" -s "$size" -t "$secs" --test bw "$@" "$addr") ||
    { bench_log "bench rdma:// -s $size $* failed: $out"; return 1; }
  jq -c --argjson s "$size" --arg f "$*" '{label: ("bench rdma:// " + $f), size: $s, result: .results[0]}' <<<"$out" >> "$runs"
  jq -r '.results[0].bw_avg_gbps * 10000 | round / 10000' <<<"$out"
}
# bench_lat -> half of bench's 64-byte ping-pong round trip p50 (us), comparable with
# ib_send_lat's one-way t_typical.
bench_lat() {
  local out
  out=$("$bench" --json --transport rdma -p "$bport" -s 64 -n "$lat_iters" --test lat "$addr") ||
    { bench_log "bench rdma:// --test lat failed: $out"; return 1; }
  jq -c '{label: "bench rdma:// --test lat", size: 64, result: .results[0]}' <<<"$out" >> "$runs"
  jq -r '.results[0].lat_p50_us / 2 * 1000 | round / 1000' <<<"$out"
}

comparisons=()
for size in "${sizes[@]}"; do
  bs=() sb=() bb=() wb=()
  for ((rep = 1; rep <= reps; rep++)); do
    bs+=("$(bench_bw "$size")"); psend=$(perftest ib_send_bw "$size") || psend=""
    bb+=("$(bench_bw "$size" --bulk)"); pwrite=$(perftest ib_write_bw "$size") || pwrite=""
    # A perftest run that gave no figure (see perftest) is left out, not counted as 0.
    [[ -n $psend ]] && sb+=("$psend")
    [[ -n $pwrite ]] && wb+=("$pwrite")
    bench_log "size $size rep $rep/$reps Gbit/s: bench ${bs[-1]} / ib_send_bw ${psend:-none}, bench --bulk ${bb[-1]} / ib_write_bw ${pwrite:-none}"
  done
  comparisons+=("$(bench_comparison "bench rdma:// vs ib_send_bw, $size-byte messages" Gbit/s true \
    "bench rdma://" "$(bench_samples "${bs[@]}")" ib_send_bw "$(bench_samples "${sb[@]}")" 0.9 "bench at least 0.9x ib_send_bw")")
  comparisons+=("$(bench_comparison "bench rdma:// --bulk vs ib_write_bw, $size-byte messages" Gbit/s true \
    "bench rdma:// --bulk" "$(bench_samples "${bb[@]}")" ib_write_bw "$(bench_samples "${wb[@]}")" 0.9 "bench --bulk at least 0.9x ib_write_bw")")
done

bl=() sl=()
for ((rep = 1; rep <= reps; rep++)); do
  bl+=("$(bench_lat)"); sl+=("$(send_lat)")
  bench_log "64 B latency rep $rep/$reps, one-way us: bench (RTT p50 / 2) ${bl[-1]} / ib_send_lat t_typical ${sl[-1]}"
done
comparisons+=("$(bench_comparison "64-byte ping-pong, one-way latency: bench rdma:// (round-trip p50 / 2) vs ib_send_lat (t_typical)" us false \
  "bench rdma://" "$(bench_samples "${bl[@]}")" ib_send_lat "$(bench_samples "${sl[@]}")" 0.6667 "bench p50 within 1.5x of ib_send_lat")")

# One-sided replication's round trip (transport/rdma/log_ring.h through bench --one-sided): a
# 64-byte record RDMA-WRITten into the server's ring, its number RDMA-WRITten back as the
# durable version; p50 against one ib_write_lat round trip (2 x its one-way t_typical).
write_lat_rtt() {
  local out perf_port
  perf_port=$(next_perf_port)
  serve "ib_write_lat -d $device -s 64 -n $lat_iters -F -p $perf_port > $share/perf.$perf_port.srv 2>&1"
  sleep 1
  out=$(perftest_client ib_write_lat -d "$device" -s 64 -n "$lat_iters" -F -p "$perf_port" "$addr") ||
    { bench_log "ib_write_lat failed: $out"; return 1; }
  jq -cn --arg out "$out" '{label: "ib_write_lat", size: 64, output: $out}' >> "$runs"
  awk '$1 == 64 { print $5 * 2; exit }' <<<"$out"
}
ring_lat() {
  local out
  out=$("$bench" --json --transport rdma -p "$bport" -s 64 -n "$lat_iters" --test lat --one-sided "$addr") ||
    { bench_log "bench rdma:// --one-sided failed: $out"; return 1; }
  jq -c '{label: "bench rdma:// --test lat --one-sided", size: 64, result: .results[0]}' <<<"$out" >> "$runs"
  jq -r '.results[0].lat_p50_us * 1000 | round / 1000' <<<"$out"
}
rl=() wl=()
for ((rep = 1; rep <= reps; rep++)); do
  rl+=("$(ring_lat)"); wl+=("$(write_lat_rtt)")
  bench_log "64 B one-sided round trip rep $rep/$reps, us: log ring append -> durable ${rl[-1]} / ib_write_lat RTT ${wl[-1]}"
done
comparisons+=("$(bench_comparison "64-byte one-sided replication round trip: log ring append -> durable WRITE back (p50) vs ib_write_lat round trip (2 x t_typical)" us false \
  "bench rdma:// --one-sided" "$(bench_samples "${rl[@]}")" "ib_write_lat RTT" "$(bench_samples "${wl[@]}")" 0.3333 "within 3x of one ib_write_lat round trip")")

# QUORUM commit latency of a 3-node canopy cluster on rdma:// (all three nodes on the serving
# side, the client `canopy bench` here), once with --one-sided-replication (deltas and ACKs as
# RDMA WRITEs into log rings, replication/one_sided.h) and once over the message stream,
# alternating per rep with ib_write_lat. The commit's p50 includes the client's own round trip
# to the leader (messages), the leader's WAL append, the replica's apply + ACK.
canopy=$BENCH_BUILD/tools/canopy/canopy
[[ -x $canopy ]] || { bench_log "$canopy not built"; exit 1; }
if [[ $role == a ]]; then cluster_dir=$CANOPY_VM_DIR/cluster; data_root=/tmp/rdma_perftest-cluster; else cluster_dir=$work/cluster; data_root=$work/cluster-data; fi
mkdir -p "$cluster_dir"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$cluster_dir/secret"
cluster_args=(--cluster bench --secret-file "$cluster_dir/secret")
commits=$(bench_pick 60 300 2000)
# start_cluster NAME BASE_PORT NODE_FLAGS...: sets $leader to the URI of tree "bench"'s leader
# (not in a $(...) subshell: on a host with a device, serve keeps the nodes' pids for cleanup).
start_cluster() {
  local name=$1 base=$2 n seeds="" uri1="rdma://$addr:$(($2 + 1))" created="" attempt
  leader=""
  shift 2
  for n in 1 2 3; do
    serve "$canopy node --listen rdma://$addr:$((base + n)) --data $data_root/$name-$n --node-id $n ${cluster_args[*]} $seeds --heartbeat-ms 100 --failure-ms 3000 --handshake-ms 30000 $* > $share/cluster-$name.$n.log 2>&1" || return 1
    seeds+=" --seed rdma://$addr:$((base + n))"
  done
  for attempt in $(seq 1 120); do
    [[ $("$canopy" status --node "$uri1" "${cluster_args[@]}" --json 2> /dev/null | grep -o '"alive":true' | wc -l) -ge 3 ]] && break
    sleep 1
  done
  for attempt in 1 2 3 4 5; do
    created=$("$canopy" create-tree --node "$uri1" "${cluster_args[@]}" --tree bench 2>&1) && break
    sleep 2
  done
  leader=$(sed -n 's/^created bench on leader \([^ ]*\) .*/\1/p' <<<"$created")
  [[ -n $leader ]] || { bench_log "cluster $name: no leader in: $created"; return 1; }
  # ALL once: every replica has subscribed (and, with the option, set its ring up).
  "$canopy" commit --node "$leader" "${cluster_args[@]}" --tree bench --cl ALL --put "/:warm=1" > /dev/null ||
    { bench_log "cluster $name: the first ALL commit failed"; return 1; }
}
# commit_lat LEADER LABEL -> QUORUM commit p50 (us) of $commits commits, one client. Tried
# again when the client's own connection set-up fails (under TCG an rdma:// connect can lose
# the race with its bounds: "disconnected before the connection was set up").
commit_lat() {
  local out attempt
  for attempt in 1 2 3; do
    out=$("$canopy" bench --node "$1" "${cluster_args[@]}" --tree bench --count "$commits" --cl QUORUM --json 2>&1) && break
    bench_log "canopy bench ($2) attempt $attempt failed: $out"
    grep -Eq 'Closed|Unavailable|Timeout|deadline|refused' <<<"$out" && ((attempt < 3)) || return 1
    sleep 2
  done
  out=$(grep '^{' <<<"$out" | tail -1)
  jq -c --arg l "$2" '{label: $l, canopy_bench: .}' <<<"$out" >> "$runs"
  jq -r '.p50_us * 1000 | round / 1000' <<<"$out"
}
start_cluster ring 7610 --one-sided-replication || exit 1
ring_leader=$leader
start_cluster msg 7620 || exit 1
msg_leader=$leader
ql=() qm=() qw=()
for ((rep = 1; rep <= reps; rep++)); do
  ql+=("$(commit_lat "$ring_leader" "canopy bench QUORUM, --one-sided-replication")")
  qw+=("$(write_lat_rtt)")
  qm+=("$(commit_lat "$msg_leader" "canopy bench QUORUM, message stream")")
  bench_log "QUORUM commit rep $rep/$reps, p50 us: one-sided ${ql[-1]} / ib_write_lat RTT ${qw[-1]} / message stream ${qm[-1]}"
done
comparisons+=("$(bench_comparison "QUORUM commit latency (p50, 3 nodes on rdma://, --one-sided-replication) vs ib_write_lat round trip (2 x t_typical)" us false \
  "canopy QUORUM one-sided" "$(bench_samples "${ql[@]}")" "ib_write_lat RTT" "$(bench_samples "${qw[@]}")" 0.3333 "within 3x of one ib_write_lat round trip")")
comparisons+=("$(bench_comparison "QUORUM commit latency (p50, 3 nodes on rdma://): --one-sided-replication vs the message stream" us false \
  "canopy QUORUM one-sided" "$(bench_samples "${ql[@]}")" "canopy QUORUM messages" "$(bench_samples "${qm[@]}")")")
grep -h "over the one-sided ring" "$share"/cluster-ring.*.log > /dev/null 2>&1 ||
  bench_log "note: no node log of the one-sided cluster says it streamed over a ring"
# The six nodes are done: stopped before rcopy, which must not share the
# guest's emulated CPUs with them (idle, they still took 10-28% of a vCPU
# each under TCG, and rcopy rdma:// fell from 0.15-0.17 to 0.08-0.10 Gbit/s).
serve "pkill -f -- '[-]-data $data_root/' || true"  # [-]: the pattern does not match this shell's own command line
sleep 3

# rcopy, rdma:// vs ib_write_bw moving 1 MiB messages, and vs tcp:// on the same address.
src=$work/src.bin
file_mb=$(bench_fit_mib "$file_mb" 3) || bench_skip "no room under $BENCH_WORK for the rcopy file"
bench_random_file "$src" "$file_mb"
declare -A rport
for scheme in rdma tcp; do
  rm -f "$share/rcopy.$scheme.port"
  serve "$rcopy --server -q --root $dst --transport $scheme --bind $addr -p 0 --port-file $share/rcopy.$scheme.port 2> $share/rcopy.$scheme.err"
  bench_wait_file "$share/rcopy.$scheme.port" 120 || { bench_log "rcopy server ($scheme) did not start: $(cat "$share/rcopy.$scheme.err")"; exit 1; }
  rport[$scheme]=$(cat "$share/rcopy.$scheme.port")
done
rcopy_once() {
  local scheme=$1 out
  out=$("$rcopy" --json --transport "$scheme" -p "${rport[$scheme]}" "$src" "$addr:copy") ||
    { bench_log "rcopy over $scheme:// failed: $out"; return 1; }
  [[ $role == a ]] || rm -f "$dst/copy"
  jq -c --arg l "rcopy $scheme://" '{label: $l, rcopy: .}' <<<"$out" >> "$runs"
  jq -r '.gbit_per_s * 10000 | round / 10000' <<<"$out"
}
# What a copy costs besides its bytes (connect, handshake, commit): a 1-byte file.
printf x > "$work/one.bin"
rcopy_setup_s=$("$rcopy" --json --transport rdma -p "${rport[rdma]}" "$work/one.bin" "$addr:one" | jq '.seconds') ||
  rcopy_setup_s=null
[[ $role == a ]] || rm -f "$dst/one"
bench_log "rcopy rdma:// of a 1-byte file: $rcopy_setup_s s"
rr=() rt=() rw=()
for ((rep = 1; rep <= reps; rep++)); do
  rr+=("$(rcopy_once rdma)"); pwrite=$(perftest ib_write_bw 1048576) || pwrite=""; rt+=("$(rcopy_once tcp)")
  [[ -n $pwrite ]] && rw+=("$pwrite")
  bench_log "rcopy rep $rep/$reps: rdma ${rr[-1]}, ib_write_bw ${pwrite:-none}, tcp ${rt[-1]} Gbit/s"
done
comparisons+=("$(bench_comparison "rcopy rdma:// ($file_mb MiB, tmpfs -> tmpfs) vs ib_write_bw (1 MiB messages)" Gbit/s true \
  "rcopy rdma://" "$(bench_samples "${rr[@]}")" ib_write_bw "$(bench_samples "${rw[@]}")" 0.8 "rcopy at least 0.8x ib_write_bw")")
comparisons+=("$(bench_comparison "rcopy rdma:// vs rcopy tcp:// ($file_mb MiB, tmpfs -> tmpfs)" Gbit/s true \
  "rcopy rdma://" "$(bench_samples "${rr[@]}")" "rcopy tcp://" "$(bench_samples "${rt[@]}")")")

if [[ $role == a ]]; then
  path="Soft-RoCE (rxe0) between two QEMU guests under TCG (-accel tcg -cpu max, emulated, 2 vCPUs each), one QEMU socket link $CANOPY_VM_SELF -> $addr: absolute figures are emulation speed, the ratios against perftest on the same link are the result; rdma:// vs tcp:// here says nothing about hardware"
else
  path="RDMA device $device at $addr (both ends on this host: through the device, loopback in the HCA / rxe)"
fi
printf '%s\n' "${comparisons[@]}" | jq -s . > "$work/comparisons.json"
jq -n --slurpfile c "$work/comparisons.json" --slurpfile runs "$runs" --arg dev "$device" --arg addr "$addr" \
  --arg path "$path" --argjson secs "$secs" --argjson reps "$reps" --argjson file_mb "$file_mb" \
  --argjson lat_iters "$lat_iters" --argjson setup "${rcopy_setup_s:-null}" --arg guests "${role:+two QEMU guests (hw/rdma-vm.sh)}" \
  --arg perftest "$(dpkg-query -W -f '${Version}' perftest 2> /dev/null || echo unknown)" '
  {scenario: "rdma_perftest",
   title: "RDMA: bench over rdma:// vs perftest, rcopy over rdma:// vs ib_write_bw and tcp://",
   path: $path,
   params: {device: $dev, address: $addr, seconds_per_sample: $secs, reps: $reps, rcopy_file_mib: $file_mb,
            rcopy_setup_seconds: $setup,
            latency_iterations: $lat_iters, hosts: (if $guests == "" then "this host" else $guests end),
            metric: "decimal Gbit/s: bench bw_avg_gbps, perftest BW average (--report_gbits), rcopy gbit_per_s; latency: one-way us"},
   comparisons: $c[0],
   details: {perftest_version: $perftest, runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
