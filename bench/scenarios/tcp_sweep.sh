#!/usr/bin/env bash
# bench/scenarios/tcp_sweep.sh — the bench tool's perftest-style message-size
# sweep on tcp://127.0.0.1 (bandwidth peak / average, message rate, ping-pong
# latency p50 / p99, as sweeps), and per rep one comparison at 1 MiB messages:
# bench's average bandwidth versus iperf3 single stream with -l 1M sending the
# same number of bytes (its receiver-side rate). Decimal Gbit/s.
# Goal: bench >= 0.9x iperf3. Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

bench=$BENCH_BUILD/tools/bench/bench
[[ -x $bench ]] || { bench_log "$bench not built"; exit 1; }
bench_need_peer iperf3 iperf3 || bench_skip "iperf3 missing and cannot be installed (apt-get install iperf3 needs root)"
reps=${BENCH_REPS:-3}
sizes=$(bench_pick 2:64K 2:8M 2:8M)
sweep_t=$(bench_pick 0.05 0.2 1)
cmp_t=$(bench_pick 0.2 0.5 2)
msg=1M

work=$BENCH_WORK/tcp_sweep
server_pid="" iperf_pid=""
cleanup() { bench_kill "$server_pid" "$iperf_pid"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"

"$bench" --server -q --bind 127.0.0.1 -p 0 --port-file "$work/port" 2> "$work/server.err" &
server_pid=$!
bench_wait_file "$work/port" 10 || { bench_log "bench server did not start: $(cat "$work/server.err")"; exit 1; }
port=$(cat "$work/port")

iperf_port=$(bench_free_port)
iperf3 -s -B 127.0.0.1 -p "$iperf_port" > "$work/iperf3.out" 2>&1 &
iperf_pid=$!
bench_wait_port "$iperf_port" 10 || { bench_log "iperf3 server did not start: $(cat "$work/iperf3.out")"; exit 1; }

bench_log "sweep $sizes, -t $sweep_t s per size and test"
"$bench" --json -p "$port" --sizes "$sizes" -t "$sweep_t" 127.0.0.1 > "$work/sweep.json" ||
  { bench_log "bench sweep failed: $(head -c 2000 "$work/sweep.json")"; exit 1; }

runs=$work/runs.jsonl
: > "$runs"
a=() b=()
for ((rep = 1; rep <= reps; rep++)); do
  out=$("$bench" --json -p "$port" -s "$msg" --test bw -t "$cmp_t" 127.0.0.1) ||
    { bench_log "bench -s $msg failed: $out"; exit 1; }
  jq -e '.ok == true and (.results | length) == 1' <<<"$out" > /dev/null || { bench_log "bench -s $msg failed: $out"; exit 1; }
  nbytes=$(jq -r '.results[0].bw_bytes' <<<"$out")
  a+=("$(jq -r '.results[0].bw_avg_gbps * 10000 | round / 10000' <<<"$out")")
  jq -c --argjson r "$rep" '{label: "bench", rep: $r, result: .results[0]}' <<<"$out" >> "$runs"
  iout=$(iperf3 -c 127.0.0.1 -p "$iperf_port" -l "$msg" -n "$nbytes" -J) ||
    { bench_log "iperf3 failed: $(jq -r '.error // empty' <<<"$iout" 2>/dev/null)"; exit 1; }
  b+=("$(jq -r '.end.sum_received.bits_per_second / 1e9 * 10000 | round / 10000' <<<"$iout")")
  jq -c --argjson r "$rep" '{label: "iperf3 -l 1M", rep: $r, received: .end.sum_received, sent: .end.sum_sent}' \
    <<<"$iout" >> "$runs"
  bench_log "rep $rep/$reps: bench $msg ${a[-1]}, iperf3 -l $msg ${b[-1]} Gbit/s ($nbytes bytes)"
done

comparisons=$(jq -s . <<EOC
$(bench_comparison "bench vs iperf3, 1 MiB messages, single stream" Gbit/s true \
  "bench -s 1M" "$(bench_samples "${a[@]}")" "iperf3 -l 1M" "$(bench_samples "${b[@]}")" \
  0.9 "bench at least 0.9x iperf3")
EOC
)

jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" --slurpfile sweep "$work/sweep.json" \
  --argjson reps "$reps" --arg sizes "$sizes" --argjson sweep_t "$sweep_t" --argjson cmp_t "$cmp_t" \
  --argjson cpus "$(nproc)" --arg iperf "$(iperf3 --version | head -n 1)" \
  '($sweep[0].results) as $r
   | def series($name; f): {"label": $name, points: [$r[] | select(f != null) | [.size, f]]};
   {scenario: "tcp_sweep",
    title: "bench message-size sweep on tcp:// and bench vs iperf3 at 1 MiB",
    path: "tcp://127.0.0.1 kernel loopback (same-host TCP, no NIC)",
    params: {sizes: $sizes, sweep_seconds_per_size: $sweep_t, comparison_seconds: $cmp_t,
             comparison_message_bytes: 1048576, reps: $reps, cpus: $cpus,
             order: "sweep once; then per rep: bench -s 1M --test bw, iperf3 -l 1M -n <the bytes bench sent>",
             metric: "decimal Gbit/s: bench bw_avg_gbps (all bytes / all round time), iperf3 end.sum_received"},
    comparisons: $comparisons,
    sweeps: [
      {name: "tcp:// bandwidth by message size", x_label: "message size (bytes)", y_label: "Gbit/s",
       logscale_x: true, series: [series("peak Gbit/s"; .bw_peak_gbps), series("average Gbit/s"; .bw_avg_gbps)]},
      {name: "tcp:// ping-pong latency by message size", x_label: "message size (bytes)", y_label: "latency (µs)",
       logscale_x: true, series: [series("p50 µs"; .lat_p50_us), series("p99 µs"; .lat_p99_us)]},
      {name: "tcp:// message rate by message size", x_label: "message size (bytes)", y_label: "Mmsg/s",
       logscale_x: true, series: [series("Mmsg/s"; .msg_rate_mmps)]}],
    details: {iperf3_version: $iperf, sweep: $sweep[0], runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
