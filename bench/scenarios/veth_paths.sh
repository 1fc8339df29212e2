#!/usr/bin/env bash
# bench/scenarios/veth_paths.sh — off loopback: two network namespaces this
# script creates, joined by a veth pair (hw/netns-testbed.sh), so the bytes go
# through the kernel's full TCP/IP path and a real (virtual) link instead of
# same-host loopback. Per rep, alternating: the bench tool over tcp:// across
# the veth versus iperf3 across the same veth (1 MiB messages, the same bytes),
# and bench over dpdk:// (net_af_packet on the same veth interfaces, MTU 1500)
# versus bench over tcp:// on that veth at the same message size, and versus
# raw frames: dpdk-testpmd txonly (namespace b) -> rxonly (namespace a) over
# net_af_packet on the same veth ends, frames of the dpdk:// port's MTU + 14,
# counted as the MSS of stream payload each (the idle dpdk:// server is
# stopped meanwhile; testpmd's forwarding lcores pinned like the bench sides).
# And rcopy of one file tmpfs -> tmpfs over dpdk:// (net_af_packet) versus
# rcopy over tcp:// across the same veth (each rcopy a fresh process, so the
# dpdk:// figure includes the EAL's start; the idle DPDK servers not in use
# are stopped). dpdk:// runs jumbo frames on af_packet (framesz=16384: MTU
# 9000 like the veth). Decimal Gbit/s, receiver side. Needs root
# (namespaces). Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

bench=$BENCH_BUILD/tools/bench/bench
[[ -x $bench ]] || { bench_log "$bench not built"; exit 1; }
rcopy=$BENCH_BUILD/tools/rcopy/rcopy
[[ -x $rcopy ]] || { bench_log "$rcopy not built"; exit 1; }
[[ $(id -u) -eq 0 ]] || bench_skip "needs root to create network namespaces (ip netns add)"
command -v ip > /dev/null || bench_skip "ip (iproute2) missing"
bench_need_peer iperf3 iperf3 || bench_skip "iperf3 missing and cannot be installed (apt-get install iperf3 needs root)"
reps=${BENCH_REPS:-3}
secs=$(bench_pick 0.3 1 3)
msg=1M
dpdk_msg=64K
rc_mib=$(bench_pick 16 256 1024)

prefix=cbv$((RANDOM % 90000 + 10000))
ns_a=$prefix-a ns_b=$prefix-b if_a=$prefix-va if_b=$prefix-vb
work=$BENCH_WORK/veth_paths
pids=()
testbed_up=0
cleanup() {
  bench_kill "${pids[@]}"
  ((testbed_up)) && bash "$BENCH_REPO/hw/netns-testbed.sh" down "$prefix" > /dev/null 2>&1
  rm -rf "$work" /var/run/dpdk/"$prefix"-* 2>/dev/null
  return 0
}
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"

if ! bash "$BENCH_REPO/hw/netns-testbed.sh" up "$prefix" > "$work/testbed.log" 2>&1; then
  bash "$BENCH_REPO/hw/netns-testbed.sh" down "$prefix" > /dev/null 2>&1 || true
  bench_skip "cannot build the veth testbed here: $(tail -n 2 "$work/testbed.log" | tr '\n' ' ')"
fi
testbed_up=1
ip_a=10.9.0.1
mtu=$(ip netns exec "$ns_a" cat "/sys/class/net/$if_a/mtu")

# start_in NS NAME CMD... -> runs CMD in namespace NS in the background.
start_in() {
  local ns=$1 name=$2; shift 2
  ip netns exec "$ns" "$@" > "$work/$name.out" 2> "$work/$name.err" &
  pids+=($!)
}

start_in "$ns_a" bench-tcp "$bench" --server -q --bind "$ip_a" -p 0 --port-file "$work/tcp.port"
bench_wait_file "$work/tcp.port" 10 || { bench_log "bench server did not start: $(cat "$work/bench-tcp.err")"; exit 1; }
tcp_port=$(cat "$work/tcp.port")
iperf_port=5201
start_in "$ns_a" iperf3 iperf3 -s -B "$ip_a" -p "$iperf_port"
for ((i = 0; i < 100; i++)); do
  ip netns exec "$ns_a" ss -Htln "sport = :$iperf_port" | grep -q . && break
  sleep 0.05
done

# DPDK over net_af_packet on the same veth (its own addresses on that wire).
# Ring frames of 16 KiB carry jumbo frames (the dpdk:// port takes the veth's
# MTU, 9000, and its mbufs follow framesz); 2048 of them per ring, so a
# receiver that is not scheduled for a while (a busy host) does not drop.
dpdk_ok=1 dpdk_reason=""
eal="--no-huge -m 512 --no-pci --log-level=lib.eal:warning"
af_opts="framesz=16384,blocksz=16384,framecnt=2048"
start_in "$ns_a" bench-dpdk "$bench" --server --transport dpdk --bind 10.9.1.1 -p 0 --port-file "$work/dpdk.port" \
  --transport-arg "$eal --file-prefix=$prefix-s --vdev=net_af_packet0,iface=$if_a,$af_opts"
dpdk_srv_pid=${pids[-1]}
if ! bench_wait_file "$work/dpdk.port" 20; then
  dpdk_ok=0
  dpdk_reason="dpdk:// server over net_af_packet did not start: $(tail -n 3 "$work/bench-dpdk.err" | tr '\n' ' ')"
  bench_log "$dpdk_reason"
fi

# rcopy servers in namespace a: tcp:// on the kernel address, dpdk:// on its own
# address over af_packet (stopped, SIGSTOP, except while its own samples run:
# every af_packet socket on the veth sees every frame).
rc_mib=$(bench_fit_mib "$rc_mib" 4) || bench_skip "no room under $BENCH_WORK for the rcopy file and its copies"
rc_src=$work/rcopy-src.bin
bench_random_file "$rc_src" "$rc_mib"
mkdir -p "$work/rc-tcp" "$work/rc-dpdk"
start_in "$ns_a" rcopy-tcp "$rcopy" --server -q --root "$work/rc-tcp" --bind "$ip_a" -p 0 --port-file "$work/rc-tcp.port"
bench_wait_file "$work/rc-tcp.port" 10 || { bench_log "rcopy server did not start: $(cat "$work/rcopy-tcp.err")"; exit 1; }
rc_dpdk_ok=$dpdk_ok rc_dpdk_reason="" rc_dpdk_pid=""
if ((rc_dpdk_ok)); then
  start_in "$ns_a" rcopy-dpdk "$rcopy" --server -q --root "$work/rc-dpdk" --transport dpdk --bind 10.9.1.3 -p 0 \
    --port-file "$work/rc-dpdk.port" --transport-arg "$eal --file-prefix=$prefix-rs --vdev=net_af_packet0,iface=$if_a,$af_opts"
  rc_dpdk_pid=${pids[-1]}
  if bench_wait_file "$work/rc-dpdk.port" 20; then
    kill -STOP "$rc_dpdk_pid" 2>/dev/null || true
  else
    rc_dpdk_ok=0 rc_dpdk_reason="rcopy --server over dpdk:// did not start: $(tail -n 3 "$work/rcopy-dpdk.err" | tr '\n' ' ')"
    bench_log "$rc_dpdk_reason"
  fi
fi

bench_split_cores || true
tp_ok=1 tp_reason="" dpdk_mtu="" dpdk_mss=""
bench_need_peer dpdk-testpmd dpdk || { tp_ok=0 tp_reason="dpdk-testpmd missing"; }
# port_mtu -> sets dpdk_mtu / dpdk_mss from the dpdk:// client's log line
# "dpdk: DPDK port 0 (net_af_packet0) up: ... mtu 1500 (mss 1352), ..." (server log, at info level).
port_mtu() {
  local line
  line=$(grep -a -h -o 'mtu [0-9]* (mss [0-9]*)' "$work/client.err" "$work/bench-dpdk.err" 2>/dev/null | head -n 1) || true
  dpdk_mtu=$(awk '{ print $2 }' <<<"$line")
  dpdk_mss=$(tr -d ')' <<<"$line" | awk '{ print $4 }')
  [[ -n $dpdk_mtu && -n $dpdk_mss ]]
}

# tp_af_sample REP -> testpmd rxonly packets/s over net_af_packet on the veth
# (mean of the full stats periods after the first one with frames); 1 on failure.
tp_af_sample() {
  local rep=$1 rx tx deadline pps i
  # The same ring frames as dpdk://; testpmd's mbufs must hold one (--mbuf-size
  # before --txpkts, which testpmd checks against it).
  ip netns exec "$ns_a" timeout -s INT 60 dpdk-testpmd --no-huge -m 256 --no-pci --log-level=lib.eal:warning \
    --file-prefix="$prefix-tprx$rep" --lcores="0@$client_cpu,1@$server_cpu" --vdev="net_af_packet0,iface=$if_a,$af_opts" -- \
    --forward-mode=rxonly --stats-period 1 --nb-cores=1 --total-num-mbufs=4096 --mbuf-size=16512 \
    < /dev/null > "$work/tp.rx.$rep.log" 2>&1 &
  rx=$!
  ip netns exec "$ns_b" timeout -s INT 60 dpdk-testpmd --no-huge -m 256 --no-pci --log-level=lib.eal:warning \
    --file-prefix="$prefix-tptx$rep" --lcores="0@$server_cpu,1@$client_cpu" --vdev="net_af_packet0,iface=$if_b,$af_opts" -- \
    --forward-mode=txonly --total-num-mbufs=4096 --mbuf-size=16512 --txpkts=$((dpdk_mtu + 14)) --stats-period 1 --nb-cores=1 \
    < /dev/null > "$work/tp.tx.$rep.log" 2>&1 &
  tx=$!
  deadline=$((SECONDS + 20))
  until grep -a -o 'Rx-pps: *[0-9]*' "$work/tp.rx.$rep.log" | awk '$2 > 0 { f = 1 } END { exit !f }'; do
    if ((SECONDS >= deadline)) || ! kill -0 "$rx" 2>/dev/null || ! kill -0 "$tx" 2>/dev/null; then
      bench_kill "$tx" "$rx"
      return 1
    fi
    sleep 0.1
  done
  sleep $(( ${secs%.*} + 3 ))
  for pid in "$rx" "$tx"; do
    kill -INT "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    bench_kill "$pid"
  done
  pps=$(grep -a -o 'Rx-pps: *[0-9]*' "$work/tp.rx.$rep.log" | awk '$2 > 0 { v[n++] = $2 }
    END { if (n < 3) exit; s = 0; for (i = 1; i < n - 1; i++) s += v[i]; printf "%.0f\n", s / (n - 2) }')
  [[ -n $pps ]] || return 1
  jq -cn --argjson r "$rep" --argjson pps "$pps" --argjson f "$((dpdk_mtu + 14))" --argjson m "$dpdk_mss" \
    '{label: "testpmd af_packet", rep: $r, rx_pps: $pps, frame_bytes: $f, payload_gbps: ($pps * $m * 8 / 1e9)}' >> "$runs"
  awk -v p="$pps" -v m="$dpdk_mss" 'BEGIN { printf "%.4f\n", p * m * 8 / 1e9 }'
}

runs=$work/runs.jsonl
: > "$runs"

# rcopy_sample LABEL NS DEST ARGS... -> Gbit/s as rcopy reports it (bytes over
# its whole run, the transport's start included); the JSON goes to runs.
rcopy_sample() {
  local label=$1 ns=$2 dest=$3 out; shift 3
  out=$(ip netns exec "$ns" timeout 120 "$rcopy" --json "$@" "$rc_src" "$dest" 2> "$work/rcopy-client.err") ||
    { bench_log "rcopy $label failed: $(head -c 400 <<<"$out") $(tail -n 3 "$work/rcopy-client.err")"; return 1; }
  jq -e '.ok == true' <<<"$out" > /dev/null || { bench_log "rcopy $label failed: $out"; return 1; }
  jq -c --arg l "$label" --argjson r "$rep" '{label: $l, rep: $r, rcopy: (. | del(.files))}' <<<"$out" >> "$runs"
  rm -f "$work/rc-tcp/copy" "$work/rc-dpdk/copy"
  jq -r '.gbit_per_s * 10000 | round / 10000' <<<"$out"
}

# bench_bw NS LABEL ARGS... -> bw_avg_gbps; bytes sent land in $work/last.bytes.
bench_bw() {
  local ns=$1 label=$2 out; shift 2
  out=$(ip netns exec "$ns" "$bench" --json --test bw "$@" 2>> "$work/client.err") ||
    { bench_log "bench $label failed: $out $(tail -n 3 "$work/client.err")"; return 1; }
  jq -e '.ok == true' <<<"$out" > /dev/null || { bench_log "bench $label failed: $out"; return 1; }
  jq -c --arg l "$label" --argjson r "$rep" '{label: $l, rep: $r, result: .results[0]}' <<<"$out" >> "$runs"
  jq -r '.results[0].bw_bytes' <<<"$out" > "$work/last.bytes"
  jq -r '.results[0].bw_avg_gbps * 10000 | round / 10000' <<<"$out"
}

bt=() ip3=() bd=() btd=() tpd=() tpr=() tp_failures=() rct=() rcd=()
for ((rep = 1; rep <= reps; rep++)); do
  bt+=("$(bench_bw "$ns_b" "bench tcp:// -s $msg" -p "$tcp_port" -s "$msg" -t "$secs" "$ip_a")")
  nbytes=$(cat "$work/last.bytes")
  iout=$(ip netns exec "$ns_b" iperf3 -c "$ip_a" -p "$iperf_port" -l "$msg" -n "$nbytes" -J) ||
    { bench_log "iperf3 failed: $(jq -r '.error // empty' <<<"$iout" 2>/dev/null)"; exit 1; }
  ip3+=("$(jq -r '.end.sum_received.bits_per_second / 1e9 * 10000 | round / 10000' <<<"$iout")")
  jq -c --argjson r "$rep" '{label: "iperf3 -l 1M", rep: $r, received: .end.sum_received,
    cpu: .end.cpu_utilization_percent}' <<<"$iout" >> "$runs"
  if ((dpdk_ok)); then
    if d=$(bench_bw "$ns_b" "bench dpdk:// -s $dpdk_msg" --transport dpdk -p "$(cat "$work/dpdk.port")" -s "$dpdk_msg" \
        -t "$secs" --transport-arg "$eal --file-prefix=$prefix-c$rep --vdev=net_af_packet0,iface=$if_b,$af_opts ip=10.9.1.2" 10.9.1.1); then
      bd+=("$d")
      btd+=("$(bench_bw "$ns_b" "bench tcp:// -s $dpdk_msg" -p "$tcp_port" -s "$dpdk_msg" -t "$secs" "$ip_a")")
    else
      dpdk_ok=0 dpdk_reason="bench over dpdk:// failed on rep $rep: $(tail -n 3 "$work/client.err" | tr '\n' ' ')"
      bd=() btd=()
    fi
  fi
  if ((dpdk_ok && tp_ok)) && [[ -z $dpdk_mss ]] && ! port_mtu; then
    tp_ok=0 tp_reason="no 'mtu N (mss M)' line in the dpdk:// client's log: frame size unknown"
  fi
  if ((dpdk_ok && tp_ok)) && ((${#bd[@]} == rep)); then
    kill -STOP "$dpdk_srv_pid" 2>/dev/null || true
    if t=$(tp_af_sample "$rep") || t=$(tp_af_sample "$rep.2"); then
      tpd+=("${bd[-1]}") tpr+=("$t")
    else
      tp_failures+=("rep $rep: testpmd over af_packet gave no full stats periods: $(tail -n 2 "$work/tp.tx.$rep.log" 2>/dev/null | tr '\n' ' ')")
      bench_log "${tp_failures[-1]}"
    fi
    kill -CONT "$dpdk_srv_pid" 2>/dev/null || true
  fi
  if ((rc_dpdk_ok)); then
    # rcopy tcp://, then dpdk:// with only its own DPDK server running.
    if t=$(rcopy_sample "rcopy tcp://" "$ns_b" "$ip_a:copy" -p "$(cat "$work/rc-tcp.port")"); then
      kill -STOP "$dpdk_srv_pid" 2>/dev/null || true
      kill -CONT "$rc_dpdk_pid" 2>/dev/null || true
      if d=$(rcopy_sample "rcopy dpdk://" "$ns_b" "10.9.1.3:copy" --transport dpdk -p "$(cat "$work/rc-dpdk.port")" \
          --transport-arg "$eal --file-prefix=$prefix-rc$rep --vdev=net_af_packet0,iface=$if_b,$af_opts ip=10.9.1.4"); then
        rct+=("$t") rcd+=("$d")
      else
        rc_dpdk_ok=0 rc_dpdk_reason="rcopy over dpdk:// failed on rep $rep: $(tail -n 3 "$work/rcopy-client.err" | tr '\n' ' ')"
        rct=() rcd=()
      fi
      kill -STOP "$rc_dpdk_pid" 2>/dev/null || true
      kill -CONT "$dpdk_srv_pid" 2>/dev/null || true
    fi
  fi
  bench_log "rep $rep/$reps Gbit/s: bench tcp ${bt[-1]} / iperf3 ${ip3[-1]}${bd:+, dpdk ${bd[-1]} / tcp ${btd[-1]} at $dpdk_msg}${tpr:+, testpmd ${tpr[-1]}}${rcd:+, rcopy dpdk ${rcd[-1]} / tcp ${rct[-1]}}"
done

comparisons=$(
  bench_comparison "bench vs iperf3 over veth (netns), 1 MiB messages" Gbit/s true \
    "bench tcp:// -s 1M" "$(bench_samples "${bt[@]}")" "iperf3 -l 1M" "$(bench_samples "${ip3[@]}")" \
    0.9 "bench at least 0.9x iperf3"
  if ((dpdk_ok)); then
    bench_comparison "dpdk:// (net_af_packet) vs tcp:// over the same veth, 64 KiB messages" Gbit/s true \
      "bench dpdk:// -s 64K" "$(bench_samples "${bd[@]}")" "bench tcp:// -s 64K" "$(bench_samples "${btd[@]}")"
  fi
  if ((${#rcd[@]} > 0)); then
    bench_comparison "rcopy dpdk:// (net_af_packet) vs rcopy tcp:// over the same veth, one $rc_mib MiB file tmpfs -> tmpfs" \
      Gbit/s true "rcopy dpdk://" "$(bench_samples "${rcd[@]}")" "rcopy tcp://" "$(bench_samples "${rct[@]}")" \
      1.0 "rcopy over dpdk:// at least as fast as over tcp://"
  fi
  if ((${#tpr[@]} > 0)); then
    bench_comparison "dpdk:// bench (64 KiB messages) vs raw testpmd txonly -> rxonly, net_af_packet on the same veth (Gbit/s of ${dpdk_mss} B stream payload per frame)" \
      Gbit/s true "bench dpdk:// -s 64K" "$(bench_samples "${tpd[@]}")" "testpmd (raw frames)" "$(bench_samples "${tpr[@]}")" \
      0.7 "issue 17: at least 0.7x testpmd over af_packet on the same veth"
  fi
)
comparisons=$(jq -s -c . <<<"$comparisons")

jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" --argjson reps "$reps" --argjson secs "$secs" \
  --argjson mtu "$mtu" --arg dpdk_reason "$dpdk_reason" --argjson cpus "$(nproc)" \
  --arg tp_reason "$tp_reason" --arg dpdk_mtu "$dpdk_mtu" --arg af_opts "$af_opts" --argjson rc_mib "$rc_mib" \
  --arg rc_reason "$rc_dpdk_reason" \
  --argjson tp_failures "$( ((${#tp_failures[@]})) && printf '%s\n' "${tp_failures[@]}" | jq -R . | jq -s -c . || echo '[]')" \
  --arg iperf "$(iperf3 --version | head -n 1)" '
  {scenario: "veth_paths",
   title: "Off loopback: tcp:// and dpdk:// across a veth pair between two network namespaces",
   path: "veth pair between two network namespaces created by the scenario (kernel TCP/IP on both ends, no loopback short-circuit; dpdk:// through net_af_packet on the same veth ends, frames of the dpdk:// port MTU)",
   params: {veth_mtu_tcp: $mtu, dpdk_port_mtu: (if $dpdk_mtu == "" then null else ($dpdk_mtu | tonumber) end),
            af_packet_options: $af_opts, rcopy_file_mib: $rc_mib, seconds_per_sample: $secs, reps: $reps, cpus: $cpus,
            order: "per rep: bench tcp 1M, iperf3 1M (same bytes), bench dpdk 64K, bench tcp 64K, testpmd txonly -> rxonly (af_packet), rcopy tcp, rcopy dpdk",
            metric: "decimal Gbit/s: bench bw_avg_gbps, iperf3 end.sum_received, rcopy gbit_per_s (bytes / seconds from the dial to the server verdict; the transport setup before that, setup_seconds in details.runs, is left out as perftest and iperf3 leave theirs out: ~0.3 s for dpdk://, ~0 for tcp://)"},
   comparisons: $comparisons,
   details: ({iperf3_version: $iperf, runs: $runs, testpmd_failed_tries: $tp_failures}
             + (if $dpdk_reason != "" then {dpdk_not_measured: $dpdk_reason} else {} end)
             + (if $tp_reason != "" then {testpmd_left_out: $tp_reason} else {} end)
             + (if $rc_reason != "" then {rcopy_dpdk_not_measured: $rc_reason} else {} end))}' \
  > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
