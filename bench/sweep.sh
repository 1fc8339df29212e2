#!/usr/bin/env bash
# bench/sweep.sh — perftest-style message-size sweep (not a test) with the
# bench tool on tcp://127.0.0.1: bandwidth (peak / average), message rate and
# ping-pong latency (p50 / p99) from 2 B to 8 MiB, as JSON plus a PNG plot.
# Gbit/s are decimal (1 Gbit = 1e9 bits).
#
# usage: bench/sweep.sh [BUILD_DIR] [extra bench client args...]   (default BUILD_DIR: build)
# env:   SWEEP_SIZES (default 2:8M), SWEEP_ITERS (-n, default 1000), SWEEP_TIME (-t seconds, default 0.5)
#        SWEEP_TRANSPORT (default tcp), SWEEP_HOST (default 127.0.0.1)
# Output: bench/results/sweep-<UTC time>.json and .png (paths printed at the end).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build}
[[ $build = /* ]] || build=$repo/$build
shift || true
bench=$build/tools/bench/bench
[[ -x $bench ]] || { echo "sweep.sh: $bench not built (cmake --build $build --target canopy_bench_tool)" >&2; exit 1; }
command -v gnuplot >/dev/null || { echo "sweep.sh: gnuplot missing (apt-get install gnuplot-nox)" >&2; exit 1; }
sizes=${SWEEP_SIZES:-2:8M}
iters=${SWEEP_ITERS:-1000}
seconds=${SWEEP_TIME:-0.5}
transport=${SWEEP_TRANSPORT:-tcp}
host=${SWEEP_HOST:-127.0.0.1}

work=$(mktemp -d)
server_pid=""
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$bench" --server -q --transport "$transport" --bind "$host" -p 0 --port-file "$work/port" &
server_pid=$!
for _ in $(seq 100); do [[ -s $work/port ]] && break; sleep 0.05; done
port=$(cat "$work/port")

mkdir -p "$here/results"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
json=$here/results/sweep-$stamp.json
png=$here/results/sweep-$stamp.png
"$bench" --json --transport "$transport" -p "$port" --sizes "$sizes" -n "$iters" -t "$seconds" "$@" "$host" > "$json"
"$bench" --help > /dev/null  # the binary still runs (sanity)

# Table for gnuplot: size peak avg mmps p50 p99.
jq -r '.results[] | [.size, .bw_peak_gbps, .bw_avg_gbps, .msg_rate_mmps, .lat_p50_us, .lat_p99_us] | @tsv' "$json" \
  > "$work/sweep.tsv"
gnuplot -e "data='$work/sweep.tsv'; out='$png'; title='canopy bench over $transport://$host ($stamp)'" \
  "$here/plot_sweep.gp"

jq -r '"size\tBWpeak[Gb/s]\tBWavg[Gb/s]\tMmsg/s\tp50[us]\tp99[us]", (.results[] |
  [.size, (.bw_peak_gbps*1000|round/1000), (.bw_avg_gbps*1000|round/1000), (.msg_rate_mmps*10000|round/10000),
   (.lat_p50_us*100|round/100), (.lat_p99_us*100|round/100)] | @tsv)' "$json" | column -t
echo "$json"
echo "$png"
