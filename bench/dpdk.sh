#!/usr/bin/env bash
# bench/dpdk.sh — dpdk:// benchmark (not a test): canopy's `bench` tool
# (tools/bench) over dpdk:// between two processes joined by a net_memif
# shared-memory port pair (--no-huge, no NIC needed), next to tcp:// over
# loopback measured in the same run: bulk bandwidth at several message sizes
# and small-message round-trip latency. Prints Gbit/s (1 Gbit = 10^9 bits) and
# microseconds, ratios dpdk/tcp; results in bench/results/dpdk-<UTC>.json.
#
# On a host with a NIC bound to DPDK (hw/DPDK.md), set DPDK_BENCH_SERVER_ARGS /
# DPDK_BENCH_CLIENT_ARGS to that port's EAL arguments instead of memif.
#
# usage: bench/dpdk.sh [BUILD_DIR]            (default BUILD_DIR: build)
# env:   DPDK_BENCH_SIZES     bandwidth message sizes (default "65536 1048576 4194304")
#        DPDK_BENCH_SECONDS   seconds per size (default 3)
#        DPDK_BENCH_LAT_SIZE  latency message size (default 64)
#        DPDK_BENCH_SERVER_ARGS / DPDK_BENCH_CLIENT_ARGS   backend args (default: memif pair)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build}
[[ $build = /* ]] || build=$repo/$build
bench=$build/tools/bench/bench
[[ -x $bench ]] || { echo "bench/dpdk.sh: $bench not built (cmake --build $build --target canopy_bench_tool)" >&2; exit 1; }

sizes=${DPDK_BENCH_SIZES:-"65536 1048576 4194304"}
seconds=${DPDK_BENCH_SECONDS:-3}
lat_size=${DPDK_BENCH_LAT_SIZE:-64}
tmp=$(mktemp -d)
sock=$tmp/memif.sock
server_args=${DPDK_BENCH_SERVER_ARGS:-"--no-huge -m 512 --no-pci --log-level=lib.eal:warning --file-prefix=bench-srv-$$ --vdev=net_memif0,role=server,socket=$sock"}
client_args=${DPDK_BENCH_CLIENT_ARGS:-"--no-huge -m 512 --no-pci --log-level=lib.eal:warning --file-prefix=bench-cli-$$ --vdev=net_memif0,role=client,socket=$sock ip=10.0.0.2"}

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# start_server SCHEME BIND ARGS: the server's port lands in $tmp/port.SCHEME
start_server() {
  local scheme=$1 bind=$2 args=$3
  "$bench" --server --transport "$scheme" --bind "$bind" --port 0 --port-file "$tmp/port.$scheme" --quiet \
    --transport-arg "$args" >"$tmp/server.$scheme.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [[ -s $tmp/port.$scheme ]] && break; sleep 0.1; done
  [[ -s $tmp/port.$scheme ]] || { echo "bench/dpdk.sh: $scheme bench server did not start:" >&2; cat "$tmp/server.$scheme.log" >&2; exit 1; }
}

# run SCHEME HOST PORT ARGS TEST SIZE FIELD -> value
run() {
  local scheme=$1 host=$2 port=$3 args=$4 test=$5 size=$6 field=$7 out
  out=$("$bench" "$host" --transport "$scheme" --port "$port" -s "$size" -t "$seconds" --test "$test" --json \
        --transport-arg "$args" 2>"$tmp/client.log") || true
  echo "$out" | python3 -c "import json,sys; j=json.load(sys.stdin); print(round(j['results'][0]['$field'], 2) if j.get('ok') else 0)" \
    2>/dev/null || { echo "bench/dpdk.sh: $scheme $test -s $size failed: $out $(tail -3 "$tmp/client.log")" >&2; echo 0; }
}

echo "bench/dpdk.sh: $(nproc) cores; dpdk:// = two processes over net_memif (shared memory), tcp:// = 127.0.0.1"
start_server dpdk 10.0.0.1 "$server_args"
start_server tcp 127.0.0.1 ""
dport=$(cat "$tmp/port.dpdk")
tport=$(cat "$tmp/port.tcp")
rows=()
printf "%-10s %10s %12s %12s %8s\n" test size dpdk tcp ratio
for size in $sizes; do
  d=$(run dpdk 10.0.0.1 "$dport" "$client_args" bw "$size" bw_avg_gbps)
  t=$(run tcp 127.0.0.1 "$tport" "" bw "$size" bw_avg_gbps)
  ratio=$(python3 -c "print(f'{$d/$t:.2f}' if $t > 0 else 'n/a')")
  printf "%-10s %10s %9s Gb/s %7s Gb/s %8s\n" bandwidth "$size" "$d" "$t" "$ratio"
  rows+=("{\"test\":\"bw\",\"size\":$size,\"dpdk_gbit_per_s\":$d,\"tcp_gbit_per_s\":$t}")
done
d=$(run dpdk 10.0.0.1 "$dport" "$client_args" lat "$lat_size" lat_avg_us)
t=$(run tcp 127.0.0.1 "$tport" "" lat "$lat_size" lat_avg_us)
printf "%-10s %10s %10s us %9s us\n" latency "$lat_size" "$d" "$t"
rows+=("{\"test\":\"lat\",\"size\":$lat_size,\"dpdk_avg_us\":$d,\"tcp_avg_us\":$t}")

mkdir -p "$here/results"
result=$here/results/dpdk-$(date -u +%Y%m%dT%H%M%SZ).json
(IFS=,; echo "{\"bench\":\"dpdk\",\"cores\":$(nproc),\"seconds_per_size\":$seconds,\"rows\":[${rows[*]}]}") > "$result"
echo "results: $result"
