#!/usr/bin/env bash
# bench/scenarios/dpdk_tcp.sh — canopy's `bench` tool over dpdk:// between
# two processes joined by a net_memif shared-memory port pair (--no-huge, no
# PCI device, no NIC) versus tcp:// on 127.0.0.1:
# bulk bandwidth per message size (one comparison per size, plus a sweep of
# the per-size medians) and small-message ping-pong latency p50 / p99. Then
# "vs raw frame I/O": dpdk-testpmd in txonly mode on a second memif pair
# feeding a testpmd in rxonly mode, with frames of the size canopy's dpdk
# backend sends (its port MTU + the 14-byte Ethernet header, read from the
# server's log); its receive rate, counted as canopy's stream payload per frame
# (the MSS), is compared with dpdk:// bench at the largest message size. Server
# sides (bench --server, testpmd rxonly) are pinned to one core and client
# sides to another (taskset; testpmd through --lcores). The idle dpdk:// server
# is stopped (SIGSTOP) while tcp:// and testpmd run, so its idle poller does
# not take their core. Skips (77) when DPDK's EAL cannot start; when testpmd
# cannot run only that comparison is left out (reason in details).
# Also over dpdk://, per rep: two connections at once on the one memif port
# (bench -P 2, one process; the slower one's Gbit/s against the faster one's),
# and, on a machine with four CPUs or more, bench -P 2 over two memif port
# pairs (port=0+1: one port per core, each with its own poll lock and I/O
# thread) against bench -P 2 on one of those pairs, each process on the same
# two cores of its own (left out, reason in details, with fewer CPUs),
# and loss injection on the sending side (fault_drop=0.01 and 0.05 on the
# client's frames): goodput against the same rep's lossless figure at the
# largest size, and frames retransmitted against frames dropped (the client's
# "N frames sent, R retransmitted, D dropped by fault injection" line).
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

bench=$BENCH_BUILD/tools/bench/bench
[[ -x $bench ]] || { bench_log "$bench not built"; exit 1; }
reps=${BENCH_REPS:-3}
read -r -a sizes <<<"$(bench_pick "65536" "65536 1048576" "65536 1048576 4194304")"
seconds=$(bench_pick 1 2 3)
lat_size=64
lat_seconds=$(bench_pick 0.5 1 2)

if bench_split_cores; then
  cores_note="servers (bench --server, testpmd rxonly) on core $server_cpu, clients (bench, testpmd txonly) on core $client_cpu"
else
  cores_note="only one CPU: servers and clients share core $server_cpu"
fi

work=$BENCH_WORK/dpdk_tcp
pfx=canopy-bench-$$  # EAL --file-prefix of every DPDK process started here
dpdk_pid="" tcp_pid="" rx_pid="" tx_pid="" two_pid=""
cleanup() {
  [[ -z $dpdk_pid ]] || kill -CONT "$dpdk_pid" 2>/dev/null || true
  [[ -z $two_pid ]] || kill -CONT "$two_pid" 2>/dev/null || true
  bench_kill "$tx_pid" "$rx_pid" "$dpdk_pid" "$tcp_pid" "$two_pid"
  # EAL's runtime dirs (root: /var/run/dpdk; others: $XDG_RUNTIME_DIR or /tmp).
  rm -rf /var/run/dpdk/"$pfx"-* "${XDG_RUNTIME_DIR:-/tmp}"/dpdk/"$pfx"-* /tmp/dpdk/"$pfx"-* 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"

eal="--no-huge -m 512 --no-pci --log-level=lib.eal:warning"
sock=$work/memif.sock
# bsize: memif buffers that hold a whole jumbo frame (canopy sends frames up to one buffer).
memif_bsize=16384
server_args="$eal --file-prefix=$pfx-srv --vdev=net_memif0,role=server,bsize=$memif_bsize,socket=$sock"
client_args="$eal --file-prefix=$pfx-cli --vdev=net_memif0,role=client,bsize=$memif_bsize,socket=$sock ip=10.0.0.2"

# ---- servers
taskset -c "$server_cpu" "$bench" --server --transport dpdk --bind 10.0.0.1 -p 0 --port-file "$work/port.dpdk" \
  --transport-arg "$server_args" > "$work/server.dpdk.log" 2>&1 &
dpdk_pid=$!
deadline=$((SECONDS + 30))
until [[ -s $work/port.dpdk ]] || ! kill -0 "$dpdk_pid" 2>/dev/null || ((SECONDS >= deadline)); do sleep 0.05; done
if [[ ! -s $work/port.dpdk ]]; then
  why=$(grep -a '^bench:' "$work/server.dpdk.log" | tail -n 1) || true
  [[ -n $why ]] || why=$(grep -a -v '^$' "$work/server.dpdk.log" | tail -n 4 | tr '\n' ' ' | tr -s ' ')
  bench_kill "$dpdk_pid"
  dpdk_pid=""
  grep -a -q -i 'eal\|dpdk' "$work/server.dpdk.log" && bench_skip "DPDK cannot run here (bench --server over dpdk:// with memif, --no-huge): $why"
  bench_log "dpdk:// bench server did not start: $why"
  exit 1
fi
dport=$(cat "$work/port.dpdk")
# "dpdk: DPDK port 0 (net_memif0) up: mac ... mtu 1500 (mss 1352), ..."
mtu=$(grep -a -o 'mtu [0-9]* (mss [0-9]*)' "$work/server.dpdk.log" | head -n 1 | awk '{ print $2 }')
mss=$(grep -a -o 'mtu [0-9]* (mss [0-9]*)' "$work/server.dpdk.log" | head -n 1 | tr -d ')' | awk '{ print $4 }')

taskset -c "$server_cpu" "$bench" --server -q --bind 127.0.0.1 -p 0 --port-file "$work/port.tcp" \
  > "$work/server.tcp.log" 2>&1 &
tcp_pid=$!
bench_wait_file "$work/port.tcp" 10 || { bench_log "tcp:// bench server did not start: $(cat "$work/server.tcp.log")"; exit 1; }
tport=$(cat "$work/port.tcp")
bench_log "dpdk:// server on 10.0.0.1:$dport over memif (mtu ${mtu:-?}, mss ${mss:-?}), tcp:// on 127.0.0.1:$tport; $cores_note"

runs=$work/runs.jsonl
: > "$runs"

# sample SCHEME TEST SIZE REP -> the bench JSON's results[0] (one line); the
# dpdk:// server runs only during dpdk:// samples.
sample() {
  local scheme=$1 test=$2 size=$3 rep=$4 out t host port args=()
  if [[ $test == bw ]]; then t=$seconds; else t=$lat_seconds; fi
  if [[ $scheme == dpdk ]]; then
    # The resumed server (SIGCONT) may take seconds to answer ARP on a busy host.
    host=10.0.0.1 port=$dport args=(--connect-timeout 20 --transport-arg "$client_args")
    kill -CONT "$dpdk_pid"
  else
    host=127.0.0.1 port=$tport
  fi
  out=$(timeout 120 taskset -c "$client_cpu" "$bench" "$host" --transport "$scheme" -p "$port" -s "$size" \
    -t "$t" -n 100000000 --test "$test" --json "${args[@]}" 2> "$work/client.log") || true
  [[ $scheme == dpdk ]] && kill -STOP "$dpdk_pid"
  jq -e '.ok == true and (.results | length) == 1' <<<"$out" > /dev/null 2>&1 ||
    { bench_log "$scheme $test -s $size failed: $(head -c 500 <<<"$out") $(tail -n 3 "$work/client.log")"; return 1; }
  jq -c --arg s "$scheme" --arg t "$test" --argjson r "$rep" '{label: "bench \($s)://", test: $t, rep: $r, result: .results[0]}' \
    <<<"$out" >> "$runs"
  jq -c '.results[0]' <<<"$out"
}
kill -STOP "$dpdk_pid"

# ---- raw frame I/O: testpmd txonly -> memif -> testpmd rxonly
testpmd_note=""
frame=0
if ! bench_need_peer dpdk-testpmd dpdk; then
  testpmd_note="dpdk-testpmd missing and cannot be installed (apt-get install dpdk needs root)"
elif [[ -z $mtu || -z $mss ]]; then
  testpmd_note="no 'mtu N (mss M)' line in the dpdk:// server's log: frame size unknown"
else
  frame=$((mtu + 14))
fi
tp_sock=$work/testpmd.sock
tp_period=1
tp_tx_seconds=$((seconds + 2))  # traffic time after the first period with frames: seconds + 1 full periods + a partial one
# testpmd checks --txpkts against the mbuf size when it parses it, so
# --mbuf-size must come first (else: "length[0]=9014 > mbuf_data_size=2176 -
# give up", and it sends 64 B frames).
tp_mbuf=()
((frame + 128 <= 2176)) || tp_mbuf=(--mbuf-size=$((frame + 128)))

# stop_int PID: SIGINT (testpmd prints its totals and exits), up to 5 s, then
# bench_kill; sets STOP_RC to its exit status (testpmd 22.11 over memif
# sometimes crashes, 139, when its peer goes away: its figures are printed by
# then, and the shell's report of the crash goes to the caller's stderr).
STOP_RC=0
stop_int() {
  local i
  STOP_RC=0
  kill -INT "$1" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$1" 2>/dev/null || { wait "$1" || STOP_RC=$?; return 0; }
  bench_kill "$1"
  STOP_RC=137
}

# testpmd_sample REP -> receive packets/s (mean of the full stats periods);
# returns 1 with sample_note set when testpmd does not run (the caller retries once).
testpmd_sample() {
  local rep=$1 deadline pps
  rm -f "$tp_sock"
  # --lcores MAIN@cpu,FORWARD@cpu: the forwarding lcore sits on the server / client core.
  timeout -s INT 60 dpdk-testpmd --no-huge -m 256 --no-pci --log-level=lib.eal:warning \
    --file-prefix="$pfx-tprx" --lcores="0@$client_cpu,1@$server_cpu" --vdev="net_memif0,role=server,bsize=$memif_bsize,socket=$tp_sock" -- \
    --forward-mode=rxonly --stats-period "$tp_period" --nb-cores=1 --total-num-mbufs=16384 "${tp_mbuf[@]}" \
    < /dev/null > "$work/testpmd.rx.$rep.log" 2>&1 &
  rx_pid=$!
  deadline=$((SECONDS + 20))
  # memif sockets are abstract by default (no file): wait until it forwards.
  until grep -a -q "packet forwarding - ports=" "$work/testpmd.rx.$rep.log"; do
    if ((SECONDS >= deadline)) || ! kill -0 "$rx_pid" 2>/dev/null; then
      sample_note="testpmd rxonly on memif did not come up: $(grep -a -v '^$' "$work/testpmd.rx.$rep.log" | tail -n 3 | tr '\n' ' ')"
      bench_kill "$rx_pid"; rx_pid=""
      return 1
    fi
    sleep 0.05
  done
  timeout -s INT 60 dpdk-testpmd --no-huge -m 256 --no-pci --log-level=lib.eal:warning \
    --file-prefix="$pfx-tptx" --lcores="0@$server_cpu,1@$client_cpu" --vdev="net_memif0,role=client,bsize=$memif_bsize,socket=$tp_sock" -- \
    --forward-mode=txonly "${tp_mbuf[@]}" --txpkts="$frame" --stats-period "$tp_period" --nb-cores=1 --total-num-mbufs=16384 \
    < /dev/null > "$work/testpmd.tx.$rep.log" 2>&1 &
  tx_pid=$!
  deadline=$((SECONDS + 20))
  until grep -a -q "packet forwarding - ports=" "$work/testpmd.tx.$rep.log"; do
    if ((SECONDS >= deadline)) || ! kill -0 "$tx_pid" 2>/dev/null; then
      sample_note="testpmd txonly on memif did not come up: $(grep -a -v '^$' "$work/testpmd.tx.$rep.log" | tail -n 3 | tr '\n' ' ')"
      bench_kill "$tx_pid" "$rx_pid"; tx_pid="" rx_pid=""
      return 1
    fi
    sleep 0.05
  done
  # The memif link comes up some time after both sides forward (the client
  # retries its connection about once a second; longer on a busy machine):
  # measure from the first stats period with traffic, not from the start.
  deadline=$((SECONDS + 20))
  until grep -a -o 'Rx-pps: *[0-9]*' "$work/testpmd.rx.$rep.log" | awk '$2 > 0 { f = 1 } END { exit !f }'; do
    if ((SECONDS >= deadline)) || ! kill -0 "$tx_pid" 2>/dev/null || ! kill -0 "$rx_pid" 2>/dev/null; then
      sample_note="testpmd rxonly saw no frames within 20 s of txonly forwarding over memif: $(grep -a -v '^$' "$work/testpmd.tx.$rep.log" | tail -n 3 | tr '\n' ' ')"
      bench_kill "$tx_pid" "$rx_pid"; tx_pid="" rx_pid=""
      return 1
    fi
    sleep 0.1
  done
  # Then until tp_tx_seconds of full periods are printed (bounded). Each
  # testpmd's main lcore, which prints the stats, shares its core with the
  # other testpmd's busy-polling forwarder, so a "1 s" period can run much
  # longer: a fixed sleep left fewer than 3 periods with traffic (no sample:
  # 2 of 3 reps in one quick run). testpmd computes Rx-pps over the time a
  # period really took, so longer periods are still right.
  deadline=$((SECONDS + 4 * tp_tx_seconds + 10))
  until (($(grep -a -o 'Rx-pps: *[0-9]*' "$work/testpmd.rx.$rep.log" | awk '$2 > 0 { n++ } END { print n + 0 }') >=
          tp_tx_seconds + 1)); do
    ((SECONDS < deadline)) && kill -0 "$tx_pid" 2>/dev/null && kill -0 "$rx_pid" 2>/dev/null || break
    sleep 0.2
  done
  # The receiver stops first, while frames still flow (testpmd 22.11's memif
  # server can crash when its client disconnects under traffic).
  local rx_rc tx_rc
  stop_int "$rx_pid"; rx_pid="" rx_rc=$STOP_RC
  stop_int "$tx_pid"; tx_pid="" tx_rc=$STOP_RC
  # Rx-pps per stats period: the first non-zero one is partial; drop the last too.
  pps=$(grep -a -o 'Rx-pps: *[0-9]*' "$work/testpmd.rx.$rep.log" | awk '$2 > 0 { v[n++] = $2 }
    END { if (n < 3) exit; s = 0; for (i = 1; i < n - 1; i++) s += v[i]; printf "%.0f\n", s / (n - 2) }')
  if [[ -z $pps ]]; then
    sample_note="testpmd received no frames over memif in full stats periods: $(grep -a -v '^$' "$work/testpmd.tx.$rep.log" | tail -n 3 | tr '\n' ' ')"
    return 1
  fi
  # The frames must be the size asked for (--txpkts): bytes per frame from
  # testpmd's own Rx-bps / Rx-pps over the same periods. A sample whose
  # frames are not that size (seen: far more frames/s than memory bandwidth
  # allows at 9014 B) is refused rather than turned into a bogus Gbit/s.
  local bps seen
  bps=$(grep -a -o 'Rx-pps: *[0-9]* *Rx-bps: *[0-9]*' "$work/testpmd.rx.$rep.log" | awk '$2 > 0 { v[n++] = $4 }
    END { if (n < 3) exit; s = 0; for (i = 1; i < n - 1; i++) s += v[i]; printf "%.0f\n", s / (n - 2) }')
  seen=$(awk -v b="${bps:-0}" -v p="$pps" 'BEGIN { printf "%.0f\n", (p > 0) ? b / 8 / p : 0 }')
  if ! awk -v s="$seen" -v f="$frame" 'BEGIN { d = s - f; if (d < 0) d = -d; exit !(d <= f * 0.1) }'; then
    sample_note="testpmd's frames averaged $seen B by its own Rx-bps / Rx-pps, not the $frame B asked for (--txpkts $frame, mbufs of ${tp_mbuf[*]:-2176 B}): sample refused"
    return 1
  fi
  jq -cn --argjson r "$rep" --argjson pps "$pps" --argjson f "$frame" --argjson m "$mss" \
    --argjson rx_rc "$rx_rc" --argjson tx_rc "$tx_rc" \
    --arg rx "$(grep -a -o 'Rx-pps: *[0-9]* *Rx-bps: *[0-9]*' "$work/testpmd.rx.$rep.log" | tr -s ' ' | tr '\n' ';')" \
    '{label: "testpmd", rep: $r, rx_pps: $pps, frame_bytes: $f, payload_gbps: ($pps * $m * 8 / 1e9),
      frame_gbps: ($pps * $f * 8 / 1e9), rx_periods: $rx,
      exit_status: {rxonly: $rx_rc, txonly: $tx_rc}}' >> "$runs"
  echo "$pps"
}

# fair_sample REP -> "SLOWER FASTER" Gbit/s of the two connections of one
# bench -P 2 over dpdk:// (both on the client's one memif port).
fair_sample() {
  local rep=$1 out
  kill -CONT "$dpdk_pid"
  out=$(timeout 120 taskset -c "$client_cpu" "$bench" 10.0.0.1 --transport dpdk -p "$dport" -s "$fair_size" -P 2 --connect-timeout 20 \
    -t "$seconds" -n 100000000 --test bw --json --transport-arg "$client_args" 2> "$work/client.log") || true
  kill -STOP "$dpdk_pid"
  jq -e '.ok == true and (.streams | length) == 2 and ([.streams[] | length] | min) == 1' <<<"$out" > /dev/null 2>&1 ||
    { bench_log "dpdk bench -P 2 failed: $(head -c 500 <<<"$out") $(tail -n 3 "$work/client.log")"; return 1; }
  jq -c --argjson r "$rep" '{label: "bench dpdk:// -P 2", rep: $r, result: .results[0],
    streams: [.streams[][0] | {bw_avg_gbps, bw_bytes, bw_rounds}]}' <<<"$out" >> "$runs"
  jq -r '[.streams[][0].bw_avg_gbps * 10000 | round / 10000] | "\(min) \(max)"' <<<"$out"
}

# ---- one port per core: a second dpdk:// server with two memif ports
# (port=0+1), on two cores of its own; clients on two other cores.
mapfile -t all_cpus < <(bench_cpus)
two_ports_note="" srv2_cores="" cli2_cores=""
# two_vdevs ROLE -> the two memif vdevs of the port-per-core pair.
two_vdevs() {
  echo "--vdev=net_memif0,role=$1,bsize=$memif_bsize,socket=$work/two0.sock" \
    "--vdev=net_memif1,role=$1,bsize=$memif_bsize,socket=$work/two1.sock"
}
if ((${#all_cpus[@]} >= 4)); then
  srv2_cores="${all_cpus[0]},${all_cpus[1]}" cli2_cores="${all_cpus[2]},${all_cpus[3]}"
  taskset -c "$srv2_cores" "$bench" --server --transport dpdk --bind 10.0.0.1 -p 0 --port-file "$work/port.two" \
    --transport-arg "$eal --file-prefix=$pfx-srv2 $(two_vdevs server) port=0+1" > "$work/server.two.log" 2>&1 &
  two_pid=$!
  if bench_wait_file "$work/port.two" 30; then
    kill -STOP "$two_pid"
  else
    two_ports_note="the dpdk:// server on two memif ports did not start: $(tail -n 3 "$work/server.two.log" | tr '\n' ' ')"
    bench_log "$two_ports_note"
    bench_kill "$two_pid"
    two_pid=""
  fi
else
  two_ports_note="needs 4 CPUs (two cores for each process), this machine offers ${#all_cpus[@]}"
fi

# two_sample PORTS REP -> total Gbit/s of bench -P 2 over dpdk:// from a
# client with both memif ports of the pair that dials with port=PORTS (0: one
# pair, 0+1: one port per core).
two_sample() {
  local ports=$1 rep=$2 out
  kill -CONT "$two_pid"
  out=$(timeout 120 taskset -c "$cli2_cores" "$bench" 10.0.0.1 --transport dpdk -p "$(cat "$work/port.two")" -s "$fair_size" \
    -P 2 --connect-timeout 20 -t "$seconds" -n 100000000 --test bw --json \
    --transport-arg "$eal --file-prefix=$pfx-cli2 $(two_vdevs client) ip=10.0.0.2 port=$ports" 2> "$work/client.two.log") || true
  kill -STOP "$two_pid"
  jq -e '.ok == true and (.streams | length) == 2' <<<"$out" > /dev/null 2>&1 ||
    { bench_log "dpdk bench -P 2 with port=$ports failed: $(head -c 500 <<<"$out") $(tail -n 3 "$work/client.two.log")"; return 1; }
  jq -c --argjson r "$rep" --arg p "$ports" '{label: "bench dpdk:// -P 2 port=\($p)", rep: $r, result: .results[0],
    streams: [.streams[][0] | {bw_avg_gbps, bw_bytes, bw_rounds}]}' <<<"$out" >> "$runs"
  jq -r '.results[0].bw_avg_gbps * 10000 | round / 10000' <<<"$out"
}

# loss_sample DROP REP -> "GBPS RETRANSMITTED DROPPED": bench bw over dpdk://
# at the largest size with fault_drop=DROP on the client (the sender).
loss_sample() {
  local drop=$1 rep=$2 out line
  kill -CONT "$dpdk_pid"
  out=$(timeout 120 taskset -c "$client_cpu" "$bench" 10.0.0.1 --transport dpdk -p "$dport" -s "$last" --connect-timeout 20 \
    -t "$seconds" -n 100000000 --test bw --json \
    --transport-arg "$client_args fault_drop=$drop fault_seed=$rep" 2> "$work/client.log") || true
  kill -STOP "$dpdk_pid"
  jq -e '.ok == true and (.results | length) == 1' <<<"$out" > /dev/null 2>&1 ||
    { bench_log "dpdk bench at drop $drop failed: $(head -c 500 <<<"$out") $(tail -n 3 "$work/client.log")"; return 1; }
  line=$(grep -a -o '[0-9]* frames sent, [0-9]* retransmitted, [0-9]* dropped by fault injection' "$work/client.log" | tail -n 1)
  [[ -n $line ]] || { bench_log "dpdk bench at drop $drop: no fault-injection account in its log"; return 1; }
  jq -c --argjson r "$rep" --arg d "$drop" \
    --arg l "$(grep -a -o '[0-9]* frames sent, .*' "$work/client.log" | tail -n 1)" '{label: "bench dpdk:// fault_drop=\($d)", rep: $r,
    result: .results[0], faults: $l}' <<<"$out" >> "$runs"
  echo "$(jq '.results[0].bw_avg_gbps * 10000 | round / 10000' <<<"$out") $(awk '{ print $4, $6 }' <<<"$line")"
}

fair_size=1048576
declare -A bw_d bw_t
fair_lo=() fair_hi=() two_one=() two_two=() loss_base=() loss1=() loss5=() retx1=() drop1=() retx5=() drop5=()
lat_d50=() lat_t50=() lat_d99=() lat_t99=() tp=() tp_dpdk=() tp_failures=()
last=${sizes[-1]}
for ((rep = 1; rep <= reps; rep++)); do
  r=$(sample dpdk lat "$lat_size" "$rep")
  lat_d50+=("$(jq '.lat_p50_us * 100 | round / 100' <<<"$r")") lat_d99+=("$(jq '.lat_p99_us * 100 | round / 100' <<<"$r")")
  r=$(sample tcp lat "$lat_size" "$rep")
  lat_t50+=("$(jq '.lat_p50_us * 100 | round / 100' <<<"$r")") lat_t99+=("$(jq '.lat_p99_us * 100 | round / 100' <<<"$r")")
  line="lat $lat_size B p50 dpdk ${lat_d50[-1]} / tcp ${lat_t50[-1]} µs"
  for size in "${sizes[@]}"; do
    # The largest size runs tcp first, so that dpdk:// sits next to testpmd.
    if [[ $size != "$last" || $frame == 0 ]]; then
      d=$(sample dpdk bw "$size" "$rep" | jq '.bw_avg_gbps * 10000 | round / 10000')
      t=$(sample tcp bw "$size" "$rep" | jq '.bw_avg_gbps * 10000 | round / 10000')
    else
      t=$(sample tcp bw "$size" "$rep" | jq '.bw_avg_gbps * 10000 | round / 10000')
      d=$(sample dpdk bw "$size" "$rep" | jq '.bw_avg_gbps * 10000 | round / 10000')
    fi
    bw_d[$size]+="$d " bw_t[$size]+="$t "
    line+="; $size B dpdk $d / tcp $t Gbit/s"
  done
  if ((frame > 0)) && [[ -z $testpmd_note ]]; then
    for try in 1 2; do
      sample_note=""
      if testpmd_sample "$rep" > "$work/tp.out" 2> "$work/testpmd.shell.$rep.err"; then
        pps=$(cat "$work/tp.out")
        tp+=("$(awk -v p="$pps" -v m="$mss" 'BEGIN { printf "%.4f\n", p * m * 8 / 1e9 }')")
        tp_dpdk+=("$d")
        line+="; testpmd $pps frames/s of $frame B = ${tp[-1]} Gbit/s of $mss B payloads"
        break
      fi
      tp_failures+=("rep $rep, try $try: $sample_note")
      bench_log "testpmd rep $rep try $try failed: $sample_note"
    done
  fi
  if f=$(fair_sample "$rep"); then
    read -r lo hi <<<"$f"
    fair_lo+=("$lo") fair_hi+=("$hi")
    line+="; -P 2: $lo / $hi Gbit/s"
  fi
  if [[ -n $two_pid ]]; then
    # Alternate which goes first, so that neither always follows the same sample.
    if ((rep % 2)); then
      one=$(two_sample 0 "$rep") && two=$(two_sample 0+1 "$rep") && ok=1 || ok=0
    else
      two=$(two_sample 0+1 "$rep") && one=$(two_sample 0 "$rep") && ok=1 || ok=0
    fi
    if ((ok)); then
      two_one+=("$one") two_two+=("$two")
      line+="; -P 2 over one memif pair $one / over two (port=0+1) $two Gbit/s"
    fi
  fi
  if [[ -n $d && $d != null ]] && l1=$(loss_sample 0.01 "$rep") && l5=$(loss_sample 0.05 "$rep"); then
    read -r g r x <<<"$l1"
    loss_base+=("$d") loss1+=("$g") retx1+=("$r") drop1+=("$x")
    line+="; drop 1%: $g Gbit/s, $r retransmitted / $x dropped"
    read -r g r x <<<"$l5"
    loss5+=("$g") retx5+=("$r") drop5+=("$x")
    line+="; drop 5%: $g Gbit/s, $r / $x"
  fi
  bench_log "rep $rep/$reps: $line"
done
# Only reps where testpmd ran add a pair (dpdk:// largest size, testpmd) to the comparison.
if ((${#tp[@]} == 0)) && [[ -z $testpmd_note ]] && ((${#tp_failures[@]} > 0)); then
  testpmd_note="testpmd failed in every rep: ${tp_failures[-1]}"
fi

comparisons=$(
  for size in "${sizes[@]}"; do
    bench_comparison "bandwidth, $size B messages: dpdk:// (memif) vs tcp:// (127.0.0.1)" Gbit/s true \
      "dpdk://" "$(bench_samples ${bw_d[$size]})" "tcp://" "$(bench_samples ${bw_t[$size]})" \
      1.0 "issue 17: dpdk:// over memif at least as fast as tcp:// loopback"
  done
  bench_comparison "ping-pong latency p50, $lat_size B: dpdk:// (memif) vs tcp:// (127.0.0.1)" µs false \
    "dpdk://" "$(bench_samples "${lat_d50[@]}")" "tcp://" "$(bench_samples "${lat_t50[@]}")" \
    1.0 "issue 17: p50 at or below tcp://"
  bench_comparison "ping-pong latency p99, $lat_size B: dpdk:// (memif) vs tcp:// (127.0.0.1)" µs false \
    "dpdk://" "$(bench_samples "${lat_d99[@]}")" "tcp://" "$(bench_samples "${lat_t99[@]}")" \
    1.0 "issue 17: p99 at or below tcp://"
  if ((${#fair_lo[@]} > 0)); then
    bench_comparison "two dpdk:// connections at once on one memif port (bench -P 2, $fair_size B messages): the slower vs the faster" \
      Gbit/s true "slower connection" "$(bench_samples "${fair_lo[@]}")" "faster connection" "$(bench_samples "${fair_hi[@]}")" \
      0.8 "each connection within 20% of the other"
  fi
  if ((${#two_two[@]} > 0)); then
    bench_comparison "one port per core: bench -P 2 ($fair_size B messages) over two memif port pairs (port=0+1) vs over one pair, each process on two cores" \
      Gbit/s true "two port pairs" "$(bench_samples "${two_two[@]}")" "one port pair" "$(bench_samples "${two_one[@]}")"
  fi
  if ((${#loss1[@]} > 0)); then
    bench_comparison "dpdk:// goodput with 1% of the sender's frames dropped vs lossless ($last B messages, same rep)" \
      Gbit/s true "fault_drop=0.01" "$(bench_samples "${loss1[@]}")" "lossless" "$(bench_samples "${loss_base[@]}")" \
      0.8 "goodput at 1% drop at least 0.8x lossless"
    bench_comparison "dpdk:// goodput with 5% of the sender's frames dropped vs lossless ($last B messages, same rep)" \
      Gbit/s true "fault_drop=0.05" "$(bench_samples "${loss5[@]}")" "lossless" "$(bench_samples "${loss_base[@]}")"
    bench_comparison "dpdk:// at 1% drop: frames retransmitted vs frames dropped by fault injection" frames false \
      "retransmitted" "$(bench_samples "${retx1[@]}")" "dropped" "$(bench_samples "${drop1[@]}")" \
      0.6667 "frames retransmitted at most 1.5x frames dropped"
    bench_comparison "dpdk:// at 5% drop: frames retransmitted vs frames dropped by fault injection" frames false \
      "retransmitted" "$(bench_samples "${retx5[@]}")" "dropped" "$(bench_samples "${drop5[@]}")" \
      0.6667 "frames retransmitted at most 1.5x frames dropped"
  fi
  if ((${#tp[@]} > 0)); then
    bench_comparison "dpdk:// bench ($last B messages) vs raw testpmd txonly -> rxonly, $frame B frames on memif (Gbit/s of $mss B stream payload per frame)" \
      Gbit/s true "dpdk:// bench" "$(bench_samples "${tp_dpdk[@]}")" "testpmd (raw frames)" "$(bench_samples "${tp[@]}")" \
      0.7 "issue 17: at least 0.7x raw testpmd on the same frames"
  fi
)
comparisons=$(jq -s -c . <<<"$comparisons")

sweep_in=$(for size in "${sizes[@]}"; do
  jq -cn --argjson s "$size" --argjson d "$(bench_samples ${bw_d[$size]})" --argjson t "$(bench_samples ${bw_t[$size]})" \
    '{size: $s, dpdk: $d, tcp: $t}'
done | jq -s -c .)
sweeps=$(jq -c 'def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  [{name: "bandwidth by message size (median of the reps)", x_label: "message size (bytes)", y_label: "Gbit/s",
    logscale_x: true,
    series: [{label: "dpdk:// (memif)", points: map([.size, (.dpdk | median)])},
             {label: "tcp:// (127.0.0.1)", points: map([.size, (.tcp | median)])}]}]' <<<"$sweep_in")

jq -n --argjson comparisons "$comparisons" --argjson sweeps "$sweeps" --slurpfile runs "$runs" \
  --argjson sizes "$(bench_samples "${sizes[@]}")" --argjson seconds "$seconds" --argjson lat_size "$lat_size" \
  --argjson lat_seconds "$lat_seconds" --argjson reps "$reps" --argjson cpus "$(nproc)" --arg cores "$cores_note" \
  --arg mtu "${mtu:-}" --arg mss "${mss:-}" --argjson frame "$frame" --arg tp_note "$testpmd_note" \
  --argjson tp_failures "$( ((${#tp_failures[@]})) && printf '%s\n' "${tp_failures[@]}" | jq -R . | jq -s -c . || echo '[]')" \
  --argjson fair_size "$fair_size" --arg eal "$eal" --arg two_note "$two_ports_note" \
  --arg srv2 "$srv2_cores" --arg cli2 "$cli2_cores" --arg tpv "$(dpkg-query -W -f '${Version}' dpdk 2>/dev/null || true)" \
  '{scenario: "dpdk_tcp",
    title: "dpdk:// (memif) vs tcp:// (loopback): bandwidth, latency, and vs raw testpmd frames",
    path: "dpdk://: two processes on this host over a net_memif shared-memory port pair (DPDK --no-huge --no-pci, no NIC), canopy reliable stream over Ethernet/IPv4/UDP frames; tcp://127.0.0.1: kernel loopback (same-host TCP, no NIC); testpmd: the same kind of memif pair, raw frames",
    params: {sizes: $sizes, seconds_per_bandwidth_sample: $seconds, latency_message_bytes: $lat_size,
             seconds_per_latency_sample: $lat_seconds, reps: $reps, cpus: $cpus, cores: $cores, eal_args: $eal,
             dpdk_port_mtu: (if $mtu == "" then null else ($mtu | tonumber) end),
             dpdk_mss: (if $mss == "" then null else ($mss | tonumber) end),
             testpmd_frame_bytes: (if $frame > 0 then $frame else null end),
             testpmd: "dpdk-testpmd --forward-mode=txonly --txpkts=<frame> (memif client) -> --forward-mode=rxonly (memif server), --stats-period 1, mean Rx-pps of the full periods",
             order: "per rep: lat dpdk, lat tcp; per size dpdk, tcp (the largest size: tcp, dpdk, then testpmd); dpdk -P 2; dpdk -P 2 on one memif pair and on two (alternating which first; 4 CPUs or more); dpdk at fault_drop 0.01, then 0.05",
             parallel_message_bytes: $fair_size,
             port_per_core: (if $srv2 == "" then "left out: \($two_note)"
                             else "server on cores \($srv2), client on cores \($cli2)" end),
             metric: "decimal Gbit/s: bench bw_avg_gbps (all bytes / all round time); latency: bench lat_p50_us / lat_p99_us; testpmd: Rx-pps * MSS * 8 / 1e9 (the stream bytes those frames carry for canopy)"},
    comparisons: $comparisons,
    sweeps: $sweeps,
    details: {dpdk_package: $tpv,
              testpmd_left_out: (if $tp_note == "" then null else $tp_note end),
              testpmd_failed_tries: $tp_failures,
              runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
