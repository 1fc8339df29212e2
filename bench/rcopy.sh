#!/usr/bin/env bash
# bench/rcopy.sh — rcopy benchmark (not a test), on tcp://127.0.0.1, tmpfs -> tmpfs.
#
#  1. File copy: rcopy (client + server on this host) versus `cp` of the same
#     file on the same tmpfs, alternating, REPS times each. Both write a fresh
#     file each time (tmpfs first-write cost is in both). Goal: rcopy <= 1.2x cp.
#  2. Network only: rcopy --sink (server discards) versus iperf3 over the same
#     loopback, single stream and with -P STREAMS, the same number of bytes.
#     Goal: rcopy --sink >= 0.9x iperf3.
# Times are wall-clock seconds of the whole command (process start included);
# Gbit/s are decimal (1 Gbit = 1e9 bits). Best of REPS is compared (the machine
# is shared and noisy); every run is kept in the JSON.
#
# usage: bench/rcopy.sh [SIZE_MB] [BUILD_DIR]     (defaults: 2048 = 2 GiB, build)
# env:   RCOPY_BENCH_SIZE_MB (same as SIZE_MB), RCOPY_BENCH_REPS (default 3),
#        RCOPY_BENCH_STREAMS (-P for the parallel runs, default 4),
#        RCOPY_BENCH_CHUNK (rcopy --chunk, default 4M), RCOPY_BENCH_DIR (default /dev/shm)
# Output: bench/results/rcopy-<UTC time>.json (path printed at the end).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
size_mb=${1:-${RCOPY_BENCH_SIZE_MB:-2048}}
build=${2:-$repo/build}
[[ $build = /* ]] || build=$repo/$build
rcopy=$build/tools/rcopy/rcopy
[[ -x $rcopy ]] || { echo "rcopy.sh: $rcopy not built (cmake --build $build --target canopy_rcopy_tool)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "rcopy.sh: iperf3 missing (apt-get install iperf3)" >&2; exit 1; }
reps=${RCOPY_BENCH_REPS:-3}
streams=${RCOPY_BENCH_STREAMS:-4}
chunk=${RCOPY_BENCH_CHUNK:-4M}
base=${RCOPY_BENCH_DIR:-/dev/shm}

work=$(mktemp -d "$base/canopy-rcopy-bench.XXXXXX")
server_pid=""
iperf_pid=""
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  [[ -n $iperf_pid ]] && kill "$iperf_pid" 2>/dev/null && wait "$iperf_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/dst" "$work/cp"
src=$work/src.bin
bytes=$((size_mb * 1024 * 1024))
echo "rcopy.sh: creating $size_mb MiB file on $base" >&2
head -c $((64 * 1024 * 1024)) /dev/urandom > "$work/seed"
: > "$src"
while (( $(stat -c %s "$src") < bytes )); do cat "$work/seed" >> "$src"; done
truncate -s "$bytes" "$src"
rm -f "$work/seed"

"$rcopy" --server -q --root "$work/dst" --bind 127.0.0.1 -p 0 --port-file "$work/port" &
server_pid=$!
for _ in $(seq 100); do [[ -s $work/port ]] && break; sleep 0.05; done
port=$(cat "$work/port")

now() { date +%s.%N; }
runs=$work/runs.jsonl
: > "$runs"
record() {  # kind rep seconds [rcopy-json]
  python3 - "$@" >> "$runs" <<'PY'
import json, sys
kind, rep, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
row = {"kind": kind, "rep": rep, "wall_seconds": seconds}
if len(sys.argv) > 4 and sys.argv[4]:
    row["rcopy"] = json.loads(sys.argv[4])
print(json.dumps(row))
PY
}

rcopy_run() {  # kind rep dst extra-args...
  local kind=$1 rep=$2 dst=$3; shift 3
  local t0 t1 out
  t0=$(now)
  out=$("$rcopy" --json -p "$port" --chunk "$chunk" "$@" "$src" "127.0.0.1:$dst")
  t1=$(now)
  [[ $(echo "$out" | jq -r .ok) == true ]] || { echo "rcopy.sh: rcopy failed: $out" >&2; exit 1; }
  record "$kind" "$rep" "$(echo "$t1 - $t0" | bc -l)" "$out"
  rm -f "$work/dst/$dst"
}

iperf_run() {  # kind rep parallel
  local kind=$1 rep=$2 parallel=$3 out
  out=$(iperf3 -c 127.0.0.1 -p "$iperf_port" -n "$bytes" -P "$parallel" -J)
  python3 - "$kind" "$rep" "$out" >> "$runs" <<'PY'
import json, sys
kind, rep, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
s = out["end"]["sum_received"]
print(json.dumps({"kind": kind, "rep": rep, "wall_seconds": s["seconds"], "bytes": s["bytes"],
                  "gbit_per_s": s["bits_per_second"] / 1e9}))
PY
}

echo "rcopy.sh: file copy, $reps x (cp, rcopy, rcopy -P $streams)" >&2
for rep in $(seq "$reps"); do
  t0=$(now); cp "$src" "$work/cp/copy"; t1=$(now)
  record cp "$rep" "$(echo "$t1 - $t0" | bc -l)"
  rm -f "$work/cp/copy"
  rcopy_run rcopy "$rep" copy
  rcopy_run rcopy_parallel "$rep" copy -P "$streams"
done

iperf_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iperf3 -s -B 127.0.0.1 -p "$iperf_port" >/dev/null 2>&1 &
iperf_pid=$!
sleep 0.5
echo "rcopy.sh: network only, $reps x (iperf3, rcopy --sink) single and -P $streams" >&2
for rep in $(seq "$reps"); do
  iperf_run iperf3 "$rep" 1
  rcopy_run rcopy_sink "$rep" sink --sink
  iperf_run iperf3_parallel "$rep" "$streams"
  rcopy_run rcopy_sink_parallel "$rep" sink --sink -P "$streams"
done

mkdir -p "$here/results"
out_file=$here/results/rcopy-$(date -u +%Y%m%dT%H%M%SZ).json
python3 - "$runs" "$out_file" "$bytes" "$reps" "$streams" "$chunk" "$base" <<'PY'
import json, sys, platform, os
runs_path, out_path, nbytes, reps, streams, chunk, base = sys.argv[1:8]
nbytes = int(nbytes)
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
def best(kind, key="wall_seconds"):
    xs = [r[key] for r in runs if r["kind"] == kind]
    return min(xs) if xs else None
def gbit(kind):
    xs = [r["gbit_per_s"] if "gbit_per_s" in r else r["rcopy"]["gbit_per_s"] for r in runs if r["kind"] == kind]
    return max(xs) if xs else None
def wall_gbit(kind):
    t = best(kind)
    return nbytes * 8 / t / 1e9 if t else None
cp, rc, rcp = best("cp"), best("rcopy"), best("rcopy_parallel")
summary = {
    "file_bytes": nbytes,
    "cp_best_seconds": cp, "cp_gbit_per_s": wall_gbit("cp"),
    "rcopy_best_seconds": rc, "rcopy_gbit_per_s_wall": wall_gbit("rcopy"), "rcopy_gbit_per_s_reported": gbit("rcopy"),
    "rcopy_parallel_best_seconds": rcp, "rcopy_parallel_gbit_per_s_wall": wall_gbit("rcopy_parallel"),
    "rcopy_over_cp_time_ratio": rc / cp, "rcopy_parallel_over_cp_time_ratio": rcp / cp,
    "goal_rcopy_within_1_2x_cp": rc / cp <= 1.2,
    "iperf3_gbit_per_s": gbit("iperf3"), "rcopy_sink_gbit_per_s": gbit("rcopy_sink"),
    "iperf3_parallel_gbit_per_s": gbit("iperf3_parallel"), "rcopy_sink_parallel_gbit_per_s": gbit("rcopy_sink_parallel"),
}
summary["sink_over_iperf3"] = summary["rcopy_sink_gbit_per_s"] / summary["iperf3_gbit_per_s"]
summary["sink_parallel_over_iperf3_parallel"] = summary["rcopy_sink_parallel_gbit_per_s"] / summary["iperf3_parallel_gbit_per_s"]
summary["goal_sink_at_least_0_9x_iperf3"] = summary["sink_over_iperf3"] >= 0.9
# Medians as well: on a shared machine one lucky or unlucky run moves the best.
import statistics
def median(kind, key):
    xs = [r.get(key, r.get("rcopy", {}).get(key)) for r in runs if r["kind"] == kind]
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
summary["median"] = {
    "cp_seconds": median("cp", "wall_seconds"), "rcopy_seconds": median("rcopy", "wall_seconds"),
    "rcopy_parallel_seconds": median("rcopy_parallel", "wall_seconds"),
    "iperf3_gbit_per_s": median("iperf3", "gbit_per_s"), "rcopy_sink_gbit_per_s": median("rcopy_sink", "gbit_per_s"),
    "iperf3_parallel_gbit_per_s": median("iperf3_parallel", "gbit_per_s"),
    "rcopy_sink_parallel_gbit_per_s": median("rcopy_sink_parallel", "gbit_per_s"),
}
m = summary["median"]
m["rcopy_over_cp_time_ratio"] = m["rcopy_seconds"] / m["cp_seconds"]
m["sink_over_iperf3"] = m["rcopy_sink_gbit_per_s"] / m["iperf3_gbit_per_s"]
m["sink_parallel_over_iperf3_parallel"] = m["rcopy_sink_parallel_gbit_per_s"] / m["iperf3_parallel_gbit_per_s"]
doc = {
    "benchmark": "bench/rcopy.sh", "transport": "tcp://127.0.0.1", "storage": base + " (tmpfs -> tmpfs)",
    "gbit_definition": "1 Gbit = 1e9 bits", "reps": int(reps), "parallel_streams": int(streams), "chunk": chunk,
    "host": {"kernel": platform.release(), "cpus": os.cpu_count()},
    "comparison": "best of reps; cp/rcopy times are wall-clock of the whole command; iperf3 is its receiver-side rate",
    "summary": summary, "runs": runs,
}
json.dump(doc, open(out_path, "w"), indent=1)
s = summary
print(f"file {nbytes} bytes: cp {s['cp_best_seconds']:.3f} s ({s['cp_gbit_per_s']:.2f} Gbit/s), "
      f"rcopy {s['rcopy_best_seconds']:.3f} s ({s['rcopy_gbit_per_s_wall']:.2f} Gbit/s) -> {s['rcopy_over_cp_time_ratio']:.2f}x cp time, "
      f"rcopy -P {streams} {s['rcopy_parallel_best_seconds']:.3f} s -> {s['rcopy_parallel_over_cp_time_ratio']:.2f}x")
print(f"network: iperf3 {s['iperf3_gbit_per_s']:.2f} Gbit/s, rcopy --sink {s['rcopy_sink_gbit_per_s']:.2f} -> {s['sink_over_iperf3']:.2f}x; "
      f"-P {streams}: iperf3 {s['iperf3_parallel_gbit_per_s']:.2f}, rcopy --sink {s['rcopy_sink_parallel_gbit_per_s']:.2f} -> "
      f"{s['sink_parallel_over_iperf3_parallel']:.2f}x")
print(f"medians: rcopy/cp time {m['rcopy_over_cp_time_ratio']:.2f}x, sink/iperf3 {m['sink_over_iperf3']:.2f}x, "
      f"-P {streams} sink/iperf3 {m['sink_parallel_over_iperf3_parallel']:.2f}x")
print(out_path)
PY
