#!/usr/bin/env bash
# bench/scenarios/rdma_perftest.sh — RDMA, on a host with an InfiniBand / RoCE
# device (or Soft-RoCE: hw/RDMA.md): the bench tool over rdma:// versus
# perftest's ib_send_bw (same message size, same seconds; bench's message
# path is two-sided SEND like ib_send_bw) and bench --bulk (RDMA READ above
# the eager limit) versus ib_write_bw, alternating per rep; and rcopy over
# rdma:// versus rcopy over tcp:// on the device's IP address, tmpfs -> tmpfs.
# Decimal Gbit/s. Skips (exit 77) when no RDMA device exists — always on a
# machine without one. Env: RDMA_BENCH_DEVICE, RDMA_BENCH_ADDR (defaults: the
# first device and its netdev's IPv4 address). Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

bench=$BENCH_BUILD/tools/bench/bench
rcopy=$BENCH_BUILD/tools/rcopy/rcopy
for b in "$bench" "$rcopy"; do [[ -x $b ]] || { bench_log "$b not built"; exit 1; }; done
bench_need_peer ibv_devices ibverbs-utils || bench_skip "ibv_devices missing (apt-get install ibverbs-utils)"
devices=$(ibv_devices 2> /dev/null | awk 'NR > 2 { print $1 }' || true)
[[ -n $devices ]] || bench_skip "no RDMA device (ibv_devices lists none); Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE (hw/RDMA.md)"
bench_need_peer ib_write_bw perftest || bench_skip "perftest missing (apt-get install perftest)"
device=${RDMA_BENCH_DEVICE:-$(head -n 1 <<<"$devices")}
grep -qx "$device" <<<"$devices" || { bench_log "device $device not found; devices: $devices"; exit 1; }
addr=${RDMA_BENCH_ADDR:-}
if [[ -z $addr ]]; then
  for n in /sys/class/infiniband/"$device"/ports/1/gid_attrs/ndevs/0 /sys/class/infiniband/"$device"/device/net/*; do
    [[ -e $n ]] || continue
    if [[ -f $n ]]; then ifname=$(cat "$n"); else ifname=$(basename "$n"); fi
    addr=$(ip -4 -o addr show dev "$ifname" 2> /dev/null | awk '{ split($4, a, "/"); print a[1]; exit }')
    [[ -n $addr ]] && break
  done
fi
[[ -n $addr ]] || bench_skip "no IPv4 address on $device's netdev (set RDMA_BENCH_ADDR)"
reps=${BENCH_REPS:-3}
read -r -a sizes <<<"$(bench_pick "65536" "65536 1048576" "65536 1048576 4194304")"
secs=$(bench_pick 1 2 5)
file_mb=$(bench_pick 64 512 2048)

work=$BENCH_WORK/rdma_perftest
pids=()
cleanup() { bench_kill "${pids[@]}"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work/dst"
runs=$work/runs.jsonl
: > "$runs"
perf_port=$((18515 + RANDOM % 1000))

# perftest TOOL SIZE -> its average Gbit/s (server started and reaped here).
perftest() {
  local tool=$1 size=$2 srv out
  perf_port=$((perf_port + 1))
  "$tool" -d "$device" -s "$size" -D "$secs" -F --report_gbits -p "$perf_port" > "$work/perf.srv" 2>&1 &
  srv=$!
  sleep 1  # perftest's server prints nothing machine-readable when ready
  out=$("$tool" -d "$device" -s "$size" -D "$secs" -F --report_gbits -p "$perf_port" "$addr" 2>&1) ||
    { bench_log "$tool -s $size failed: $out"; bench_kill "$srv"; return 1; }
  wait "$srv" 2> /dev/null || true
  jq -cn --arg t "$tool" --argjson s "$size" --arg out "$out" '{label: $t, size: $s, output: $out}' >> "$runs"
  awk -v s="$size" '$1 == s { print $4; exit }' <<<"$out"
}

"$bench" --server -q --transport rdma --bind "$addr" -p 0 --port-file "$work/bench.port" 2> "$work/bench.err" &
pids+=($!)
bench_wait_file "$work/bench.port" 20 || { bench_log "bench server over rdma:// did not start: $(cat "$work/bench.err")"; exit 1; }
bport=$(cat "$work/bench.port")
# bench_bw SIZE [--bulk] -> bw_avg_gbps over rdma://.
bench_bw() {
  local size=$1 out; shift
  out=$("$bench" --json --transport rdma -p "$bport" -s "$size" -t "$secs" --test bw "$@" "$addr") ||
    { bench_log "bench rdma:// -s $size $* failed: $out"; return 1; }
  jq -c --argjson s "$size" --arg f "$*" '{label: ("bench rdma:// " + $f), size: $s, result: .results[0]}' <<<"$out" >> "$runs"
  jq -r '.results[0].bw_avg_gbps * 10000 | round / 10000' <<<"$out"
}

comparisons=()
for size in "${sizes[@]}"; do
  bs=() sb=() bb=() wb=()
  for ((rep = 1; rep <= reps; rep++)); do
    bs+=("$(bench_bw "$size")"); sb+=("$(perftest ib_send_bw "$size")")
    bb+=("$(bench_bw "$size" --bulk)"); wb+=("$(perftest ib_write_bw "$size")")
    bench_log "size $size rep $rep/$reps Gbit/s: bench ${bs[-1]} / ib_send_bw ${sb[-1]}, bench --bulk ${bb[-1]} / ib_write_bw ${wb[-1]}"
  done
  comparisons+=("$(bench_comparison "bench rdma:// vs ib_send_bw, $size-byte messages" Gbit/s true \
    "bench rdma://" "$(bench_samples "${bs[@]}")" ib_send_bw "$(bench_samples "${sb[@]}")" 0.9 "bench at least 0.9x ib_send_bw")")
  comparisons+=("$(bench_comparison "bench rdma:// --bulk vs ib_write_bw, $size-byte messages" Gbit/s true \
    "bench rdma:// --bulk" "$(bench_samples "${bb[@]}")" ib_write_bw "$(bench_samples "${wb[@]}")" 0.9 "bench --bulk at least 0.9x ib_write_bw")")
done

# rcopy, rdma:// vs tcp:// on the same address.
src=$work/src.bin
file_mb=$(bench_fit_mib "$file_mb" 3) || bench_skip "no room under $BENCH_WORK for the rcopy file"
bench_random_file "$src" "$file_mb"
declare -A rport
for scheme in rdma tcp; do
  "$rcopy" --server -q --root "$work/dst" --transport "$scheme" --bind "$addr" -p 0 --port-file "$work/rcopy.$scheme.port" \
    2> "$work/rcopy.$scheme.err" &
  pids+=($!)
  bench_wait_file "$work/rcopy.$scheme.port" 20 || { bench_log "rcopy server ($scheme) did not start: $(cat "$work/rcopy.$scheme.err")"; exit 1; }
  rport[$scheme]=$(cat "$work/rcopy.$scheme.port")
done
rcopy_once() {
  local scheme=$1 out
  out=$("$rcopy" --json --transport "$scheme" -p "${rport[$scheme]}" "$src" "$addr:copy") ||
    { bench_log "rcopy over $scheme:// failed: $out"; return 1; }
  rm -f "$work/dst/copy"
  jq -c --arg l "rcopy $scheme://" '{label: $l, rcopy: .}' <<<"$out" >> "$runs"
  jq -r '.gbit_per_s * 10000 | round / 10000' <<<"$out"
}
rr=() rt=()
for ((rep = 1; rep <= reps; rep++)); do
  rr+=("$(rcopy_once rdma)"); rt+=("$(rcopy_once tcp)")
  bench_log "rcopy rep $rep/$reps: rdma ${rr[-1]}, tcp ${rt[-1]} Gbit/s"
done
comparisons+=("$(bench_comparison "rcopy rdma:// vs rcopy tcp:// ($file_mb MiB, tmpfs -> tmpfs)" Gbit/s true \
  "rcopy rdma://" "$(bench_samples "${rr[@]}")" "rcopy tcp://" "$(bench_samples "${rt[@]}")")")

printf '%s\n' "${comparisons[@]}" | jq -s . > "$work/comparisons.json"
jq -n --slurpfile c "$work/comparisons.json" --slurpfile runs "$runs" --arg dev "$device" --arg addr "$addr" \
  --argjson secs "$secs" --argjson reps "$reps" --argjson file_mb "$file_mb" \
  --arg perftest "$(dpkg-query -W -f '${Version}' perftest 2> /dev/null || echo unknown)" '
  {scenario: "rdma_perftest",
   title: "RDMA: bench over rdma:// vs perftest, rcopy over rdma:// vs tcp://",
   path: ("RDMA device " + $dev + " at " + $addr + " (both ends on this host: through the device, loopback in the HCA / rxe)"),
   params: {device: $dev, address: $addr, seconds_per_sample: $secs, reps: $reps, rcopy_file_mib: $file_mb,
            metric: "decimal Gbit/s: bench bw_avg_gbps, perftest BW average (--report_gbits), rcopy gbit_per_s"},
   comparisons: $c[0],
   details: {perftest_version: $perftest, runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
