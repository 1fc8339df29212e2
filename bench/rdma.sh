#!/usr/bin/env bash
# bench/rdma.sh — RDMA benchmark (not a test), for a host with an InfiniBand /
# RoCE device (or Soft-RoCE, hw/soft-roce.sh). Runs on one host over the
# device's own address (loopback through the HCA), or set RDMA_BENCH_PEER to
# measure across the link to a second host that runs the same script with
# RDMA_BENCH_ROLE=server.
#
#   1. perftest ib_write_bw / ib_send_bw at several message sizes: what the
#      verbs layer itself reaches on this link (the reference);
#   2. canopy's `bench` tool (tools/bench) sweeping the same sizes over rdma://
#      when it is built;
#   3. rcopy tmpfs -> tmpfs over rdma:// (and over tcp:// on the same address
#      for comparison), best of RDMA_BENCH_REPS;
# and prints everything in Gbit/s (1 Gbit = 10^9 bits), ratios against
# perftest measured in the same run. Results: bench/results/rdma-<UTC>.json.
#
# usage: bench/rdma.sh [BUILD_DIR]              (default BUILD_DIR: build)
# env:   RDMA_BENCH_DEVICE   verbs device (default: the first ibv_devices lists)
#        RDMA_BENCH_ADDR     IPv4 address of that device's netdev (default: found via sysfs)
#        RDMA_BENCH_SIZES    message sizes in bytes (default "65536 1048576 4194304")
#        RDMA_BENCH_SECONDS  seconds per perftest / bench run (default 5)
#        RDMA_BENCH_FILE_MB  rcopy file size in MiB (default 2048)
#        RDMA_BENCH_DIR      tmpfs directory for the rcopy files (default /dev/shm)
#        RDMA_BENCH_REPS     rcopy repetitions, best kept (default 3)
#        RDMA_BENCH_PORT     first TCP/RDMA-CM port used (default 18515)
#        BENCH_ARGS          extra arguments for tools/bench, e.g. --transport-arg=cq_mode=poll
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build}
[[ $build = /* ]] || build=$repo/$build

no_device() {
  echo "bench/rdma.sh: no RDMA device found (ibv_get_device_list returned none); create Soft-RoCE with:" \
       "rdma link add rxe0 type rxe netdev IFACE — see hw/RDMA.md" >&2
  exit 2
}

command -v ibv_devices >/dev/null 2>&1 || { echo "bench/rdma.sh: ibv_devices not found (apt-get install ibverbs-utils)" >&2; exit 1; }
devices=$(ibv_devices 2>/dev/null | awk 'NR>2 {print $1}' || true)
[[ -n $devices ]] || no_device
device=${RDMA_BENCH_DEVICE:-$(echo "$devices" | head -n1)}
echo "$devices" | grep -qx "$device" || { echo "bench/rdma.sh: device $device not found; devices: $devices" >&2; exit 1; }

addr=${RDMA_BENCH_ADDR:-}
if [[ -z $addr ]]; then
  for n in /sys/class/infiniband/"$device"/ports/1/gid_attrs/ndevs/0 /sys/class/infiniband/"$device"/device/net/*; do
    [[ -e $n ]] || continue
    if [[ -f $n ]]; then ifname=$(cat "$n"); else ifname=$(basename "$n"); fi
    addr=$(ip -4 -o addr show dev "$ifname" 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n1)
    [[ -n $addr ]] && break
  done
fi
[[ -n $addr ]] || { echo "bench/rdma.sh: no IPv4 address on $device's netdev; set RDMA_BENCH_ADDR" >&2; exit 1; }

sizes=${RDMA_BENCH_SIZES:-"65536 1048576 4194304"}
seconds=${RDMA_BENCH_SECONDS:-5}
file_mb=${RDMA_BENCH_FILE_MB:-2048}
data_dir=${RDMA_BENCH_DIR:-/dev/shm}
reps=${RDMA_BENCH_REPS:-3}
port=${RDMA_BENCH_PORT:-18515}
rcopy=$build/tools/rcopy/rcopy
bench=$build/tools/bench/bench
[[ -x $rcopy ]] || { echo "bench/rdma.sh: $rcopy not built (cmake --build $build --target canopy_rcopy_tool)" >&2; exit 1; }
for t in ib_write_bw ib_send_bw; do
  command -v $t >/dev/null 2>&1 || { echo "bench/rdma.sh: $t not found (apt-get install perftest)" >&2; exit 1; }
done
echo "bench/rdma.sh: device $device, address $addr, memlock $(ulimit -l), $(nproc) cores"
[[ $(ulimit -l) == unlimited || $(id -u) -eq 0 ]] || echo "bench/rdma.sh: warning: ulimit -l is $(ulimit -l) KiB; registration of large buffers may fail (ulimit -l unlimited)" >&2

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp" "$data_dir/rdma-bench-src" "$data_dir/rdma-bench-dst"
}
trap cleanup EXIT

declare -A result
json_rows=()

# perftest: server in the background, client against the device address.
# Prints the average bandwidth in Gbit/s.
perftest() {
  local tool=$1 size=$2 p=$3
  "$tool" -d "$device" -s "$size" -D "$seconds" -F --report_gbits -p "$p" >"$tmp/srv.$p" 2>&1 &
  local srv=$!
  pids+=("$srv")
  sleep 1
  local out
  out=$("$tool" -d "$device" -s "$size" -D "$seconds" -F --report_gbits -p "$p" "$addr" 2>&1) || {
    echo "bench/rdma.sh: $tool -s $size failed:" >&2; echo "$out" >&2; kill "$srv" 2>/dev/null || true; echo 0; return; }
  wait "$srv" 2>/dev/null || true
  echo "$out" | awk -v s="$size" '$1 == s {print $4; exit}'
}

echo
echo "== perftest (verbs reference) =="
for size in $sizes; do
  for tool in ib_write_bw ib_send_bw; do
    gbit=$(perftest "$tool" "$size" "$port"); port=$((port + 1))
    result["$tool/$size"]=${gbit:-0}
    printf "%-12s %10s bytes  %8s Gbit/s\n" "$tool" "$size" "${gbit:-?}"
    json_rows+=("{\"tool\":\"$tool\",\"size\":$size,\"gbit_per_s\":${gbit:-0}}")
  done
done

echo
echo "== canopy bench over rdma:// =="
if [[ -x $bench ]]; then
  # tools/bench: a sink/echo server, then one bandwidth run per size on the
  # message path and on the bulk path (SendWithBulk: RDMA READ above eager_bulk).
  "$bench" --server --transport rdma --bind "$addr" --port 0 --port-file "$tmp/port.bench" --quiet ${BENCH_ARGS:-} &
  pids+=("$!")
  for _ in $(seq 100); do [[ -s $tmp/port.bench ]] && break; sleep 0.1; done
  [[ -s $tmp/port.bench ]] || { echo "bench/rdma.sh: bench server did not start" >&2; exit 1; }
  bport=$(cat "$tmp/port.bench")
  for size in $sizes; do
    for path in message bulk; do
      flag=""; [[ $path == bulk ]] && flag="--bulk"
      out=$("$bench" "$addr" --transport rdma --port "$bport" -s "$size" -t "$seconds" --test bw --json $flag \
              ${BENCH_ARGS:-} 2>/dev/null) || true
      gbit=$(echo "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["results"][0]["bw_avg_gbps"] if j.get("ok") else 0)' 2>/dev/null || echo 0)
      [[ $gbit == 0 ]] && echo "bench/rdma.sh: bench -s $size ($path) failed: $out" >&2
      ref=${result["ib_send_bw/$size"]:-0}
      ratio=$(python3 -c "print(f'{$gbit / $ref:.2f}' if $ref > 0 else '-')")
      printf "bench %-7s %9s bytes  %8s Gbit/s  (%s x ib_send_bw)\n" "$path" "$size" "$gbit" "$ratio"
      json_rows+=("{\"tool\":\"canopy-bench\",\"path\":\"$path\",\"size\":$size,\"gbit_per_s\":$gbit}")
    done
  done
else
  echo "(skipped: $bench not built — cmake --build $build --target canopy_bench_tool)"
fi

echo
echo "== rcopy tmpfs -> tmpfs (${file_mb} MiB) =="
src=$data_dir/rdma-bench-src
dst=$data_dir/rdma-bench-dst
mkdir -p "$dst"
dd if=/dev/urandom of="$src" bs=1M count="$file_mb" status=none
for scheme in rdma tcp; do
  "$rcopy" --server --root "$dst" --transport "$scheme" --bind "$addr" --port 0 --port-file "$tmp/port.$scheme" --quiet &
  pids+=("$!")
  for _ in $(seq 100); do [[ -s $tmp/port.$scheme ]] && break; sleep 0.1; done
  [[ -s $tmp/port.$scheme ]] || { echo "bench/rdma.sh: rcopy server ($scheme) did not start" >&2; exit 1; }
  p=$(cat "$tmp/port.$scheme")
  best=0
  for _ in $(seq "$reps"); do
    out=$("$rcopy" --json "$src" "$addr:copy" --transport "$scheme" --port "$p" 2>&1 | tail -n1) || true
    g=$(echo "$out" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["gbit_per_s"] if j.get("ok") else 0)' 2>/dev/null || echo 0)
    [[ $g == 0 ]] && echo "bench/rdma.sh: rcopy over $scheme failed: $out" >&2
    best=$(python3 -c "print(max($best, $g))")
    rm -f "$dst/copy"
  done
  result["rcopy/$scheme"]=$best
  printf "rcopy %-6s %8s Gbit/s (best of %s)\n" "$scheme://" "$best" "$reps"
  json_rows+=("{\"tool\":\"rcopy\",\"transport\":\"$scheme\",\"file_mib\":$file_mb,\"gbit_per_s\":$best}")
done
ref=${result["ib_write_bw/4194304"]:-0}
[[ $ref != 0 ]] && python3 -c "print(f'rcopy rdma:// / ib_write_bw 4 MiB = {${result[rcopy/rdma]} / $ref:.2f}')"

mkdir -p "$repo/bench/results"
out_json=$repo/bench/results/rdma-$(date -u +%Y%m%dT%H%M%SZ).json
{
  echo "{\"device\":\"$device\",\"address\":\"$addr\",\"gbit_definition\":\"1 Gbit = 1e9 bits\",\"results\":["
  (IFS=,; echo "${json_rows[*]}")
  echo "]}"
} >"$out_json"
echo "bench/rdma.sh: results in $out_json"
