#!/usr/bin/env bash
# Node-join time: a 4th node joins a loaded 3-node canopy cluster (RF 3, metadata
# raft) on loopback and receives the trees it now owns (about RF/N = 3/4 of
# them) as snapshots, bulk installed. Compared with dd writing the same number of
# GiB to the same file system with one fsync at the end (conv=fsync), per file
# system: tmpfs (/dev/shm) and the disk (/tmp on this machine's root block device).
# Each file system is measured with the default install (one fsync per tree
# file, once it is complete: --install-fsync finish) and with an fsync after
# every received 1 MiB chunk (--install-fsync each-chunk), to show what
# per-piece fsync costs.
#
#   bench/join.sh [BUILD_DIR]
#   env: JOIN_GIB=1      about this many GiB reach the joiner (the cluster holds 4/3 of it)
#        TREE_MIB=16     size of each tree (TREE_MIB attributes of 1 MiB in its root)
#        TMPFS_DIR=/dev/shm DISK_DIR=/tmp   where the joiner's data dir and the dd file go
#        FSYNC_MODES="finish each-chunk"   FILESYSTEMS="tmpfs disk"
#
# The three source nodes always keep their data on tmpfs (they are loaded
# once, stopped and copied afresh before each join), so what differs between
# runs is only where the joiner writes. Join time runs from the joiner's start
# until the last snapshot is installed (its log line), checked with
# `canopy status --json`: node 1 sees 4 members and every tree that lists the
# joiner among its owners is at the leader's version on the joiner. Bytes = size of the joiner's data
# dir afterwards. Results: bench/results/join.json.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
canopy="$build/tools/canopy/canopy"
gib="${JOIN_GIB:-1}"
tree_mib="${TREE_MIB:-16}"
tmpfs_dir="${TMPFS_DIR:-/dev/shm}"
disk_dir="${DISK_DIR:-/tmp}"
fsync_modes="${FSYNC_MODES:-finish each-chunk}"
filesystems="${FILESYSTEMS:-tmpfs disk}"
# --failure-ms of every node (the node's default). Replicas repeat their last
# ACK once per heartbeat while a snapshot streams in, so a long install is not
# taken for a dead replica (before that fix a 1 GiB join never finished at
# 1500 ms).
failure_ms="${FAILURE_MS:-1500}"
log_level="${LOG:-warn}"   # node log level; KEEP=1 keeps the data dirs and logs
if [[ ! -x "$canopy" ]]; then
  echo "join.sh: $canopy not found; build it with: cmake --build $build --target canopy" >&2
  exit 1
fi
# trees = ceil(gib * 1024 * 4/3 / tree_mib): the joiner takes about 3/4 of them.
trees=$(python3 -c "import math; print(math.ceil($gib * 1024 * 4 / 3 / $tree_mib))")
dd_mib=$(python3 -c "print(max(1, round($gib * 1024)))")
src="$(mktemp -d "$tmpfs_dir/canopy-join-src.XXXXXX")"
declare -A jroot=([tmpfs]="$(mktemp -d "$tmpfs_dir/canopy-join-dst.XXXXXX")"
                  [disk]="$(mktemp -d "$disk_dir/canopy-join-dst.XXXXXX")")
pids=()
stop_nodes() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() {
  stop_nodes
  if [[ "${KEEP:-0}" == 1 ]]; then
    echo "join.sh: kept $src ${jroot[tmpfs]} ${jroot[disk]}" >&2
  else
    rm -rf "$src" "${jroot[tmpfs]}" "${jroot[disk]}"
  fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
echo "join bench secret" > "$src/secret"
common=(--cluster joinbench --secret-file "$src/secret")
uris=() rafts=() peers=()
for i in 1 2 3 4; do
  uris[$i]="tcp://127.0.0.1:$(free_port)"
  rafts[$i]="127.0.0.1:$(free_port)"
done
for i in 1 2 3; do peers+=(--raft-peer "$i=${rafts[$i]}"); done

# start_source I DATA_ROOT
start_source() {
  local i=$1 root=$2 seeds=()
  for k in 1 2 3; do [[ $k != "$i" ]] && seeds+=(--seed "${uris[$k]}"); done
  "$canopy" node --listen "${uris[$i]}" --data "$root/n$i" --node-id "$i" --fsync none --failure-ms "$failure_ms" "${common[@]}" \
    --raft "${rafts[$i]}" "${peers[@]}" "${seeds[@]}" --log "$log_level" >> "$root/n$i.log" 2>&1 &
  pids+=($!)
}
members() {  # number of members node 1 knows, 0 if it does not answer
  "$canopy" status --node "${uris[1]}" "${common[@]}" --json 2>/dev/null |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))' 2>/dev/null || echo 0
}
wait_members() {
  for _ in $(seq 300); do [[ "$(members)" == "$1" ]] && return 0; sleep 0.1; done
  echo "join.sh: cluster did not reach $1 members" >&2
  return 1
}

# ---- load: 3 nodes, $trees trees of $tree_mib MiB, every write on all 3 (ALL)
load_start=$(date +%s.%N)
for i in 1 2 3; do start_source "$i" "$src"; done
wait_members 3
for t in $(seq "$trees"); do
  for attempt in $(seq 50); do
    if "$canopy" bench --node "${uris[1]}" "${common[@]}" --tree "jt$t" --cl ALL --count "$tree_mib" \
      --value-bytes 1048576 --timeout-ms 20000 > /dev/null 2> "$src/load.err"; then
      break
    fi
    [[ $attempt == 50 ]] && { cat "$src/load.err" >&2; exit 1; }
    sleep 0.2  # e.g. no raft leader yet right after the start
  done
done
load_s=$(python3 -c "import time; print(round(time.time() - $load_start, 1))")
echo "loaded $trees trees of $tree_mib MiB on 3 nodes in $load_s s"
stop_nodes
mkdir -p "$src/pristine"
for i in 1 2 3; do mv "$src/n$i" "$src/pristine/n$i"; done

results=()
for fs in $filesystems; do
  root="${jroot[$fs]}"
  # dd: JOIN_GIB GiB (dd_mib MiB), one fsync at the end, same file system as the joiner.
  dd_out=$(dd if=/dev/zero of="$root/dd.bin" bs=1M count="$dd_mib" conv=fsync 2>&1 | tail -1)
  rm -f "$root/dd.bin"
  dd_mbps=$(echo "$dd_out" | python3 -c 'import re,sys; l=sys.stdin.read(); b=int(l.split()[0]); s=float(re.search(r", ([0-9.]+) s,", l).group(1)); print(round(b / s / 1e6, 1))')
  for mode in $fsync_modes; do
    rm -rf "$src/n1" "$src/n2" "$src/n3" "$root/joiner"
    cp -a "$src/pristine/n1" "$src/pristine/n2" "$src/pristine/n3" "$src/"
    for i in 1 2 3; do start_source "$i" "$src"; done
    wait_members 3
    # Every tree's expected version, from node 1 (all are at their final version: loaded with ALL).
    for _ in $(seq 100); do
      "$canopy" status --node "${uris[1]}" "${common[@]}" --json > "$src/before.json" 2>/dev/null &&
        python3 -c "import json,sys; sys.exit(len(json.load(open('$src/before.json'))['trees']) != $trees)" && break
      sleep 0.1
    done
    sync
    t0=$(date +%s.%N)
    "$canopy" node --listen "${uris[4]}" --data "$root/joiner" --node-id 4 --raft "${rafts[4]}" \
      --install-fsync "$mode" --failure-ms "$failure_ms" "${common[@]}" --seed "${uris[1]}" --seed "${uris[2]}" --seed "${uris[3]}" \
      --log info > "$root/joiner.log" 2>&1 &
    pids+=($!)
    perf_pid=""
    if [[ "${PERF:-0}" == 1 ]]; then  # system-wide profile of the join (sources and joiner share the CPUs)
      perf record -a -g -F 499 -o "$root/perf.data" > /dev/null 2>&1 &
      perf_pid=$!
    fi
    r=$(python3 - "$canopy" "${uris[1]}" "${uris[4]}" "$src/secret" "$src/before.json" "$t0" "$root/joiner.log" <<'PY'
import datetime, json, re, subprocess, sys, time
canopy, uri1, uri4, secret, before, t0, log = sys.argv[1:8]
t0 = float(t0)
expected = {t["tree"]: t["durable_version"] for t in json.load(open(before))["trees"]}
# STATUS is not cheap (each node hashes every tree it holds for the digest), so
# it is asked only once the joiner's log shows every snapshot it began installed;
# the join's end is the time of the last "installed snapshot" line.
def status(uri):
    r = subprocess.run([canopy, "status", "--node", uri, "--cluster", "joinbench", "--secret-file", secret,
                        "--json", "--timeout-ms", "5000"], capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else None
ts = lambda l: datetime.datetime.strptime(l.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
last_check = 0
while time.time() - t0 < 240:
    time.sleep(0.05)
    lines = open(log).read().splitlines()
    begun = {m.group(1) for l in lines for m in [re.search(r"receiving snapshot of (\S+) ", l)] if m}
    done = {m.group(1): ts(l) for l in lines for m in [re.search(r"installed snapshot of (\S+) ", l)] if m}
    if not begun or begun != set(done) or time.time() - last_check < 0.5:
        continue
    last_check = time.time()
    s1, s4 = status(uri1), status(uri4)
    if s1 and s4 and len(s1["nodes"]) == 4:
        mine = [t["tree"] for t in s1["trees"] if "4" in t["owners"]]
        have = {t["tree"]: t for t in s4["trees"]}
        if mine and all(n in have and have[n]["durable_version"] == expected[n] and have[n]["snapshots_received"] >= 1
                        for n in mine):
            print(json.dumps({"seconds": max(done.values()) - t0, "trees": len(mine)}))
            sys.exit(0)
print("null")
PY
)
    if [[ "$r" == "null" ]]; then
      echo "join.sh: the joiner did not catch up within 240 s ($fs, $mode); its log:" >&2
      tail -20 "$root/joiner.log" >&2
      exit 1
    fi
    if [[ -n "$perf_pid" ]]; then
      kill -INT "$perf_pid"; wait "$perf_pid" || true
      perf report -i "$root/perf.data" --no-children -g none --sort comm,dso,symbol --stdio 2> /dev/null | grep -v "^#" | sed "s/ *$//" |
        grep '%' | head -40 > "$here/results/join-perf-$fs-$mode.txt" || true
      echo "profile: $here/results/join-perf-$fs-$mode.txt"
    fi
    bytes=$(du -sb "$root/joiner" | cut -f1)
    # Streaming alone: first snapshot begun .. last one installed (joiner log, ms resolution).
    stream_s=$(python3 - "$root/joiner.log" <<'PY'
import datetime, sys
ts = lambda l: datetime.datetime.strptime(l.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
lines = open(sys.argv[1]).read().splitlines()
begun = [ts(l) for l in lines if "receiving snapshot" in l]
done = [ts(l) for l in lines if "installed snapshot" in l]
print(round(max(done) - min(begun), 3) if begun and done else "null")
PY
)
    stop_nodes
    results+=("$(python3 -c "
import json
r = json.loads('$r')
print(json.dumps({'filesystem': '$fs', 'dir': '$root', 'install_fsync': '$mode', 'trees': r['trees'],
                  'bytes': $bytes, 'seconds': round(r['seconds'], 3), 'streaming_seconds': $stream_s,
                  'mb_per_s': round($bytes / r['seconds'] / 1e6, 1), 'dd_mb_per_s': $dd_mbps,
                  'ratio_to_dd': round($bytes / r['seconds'] / 1e6 / $dd_mbps, 3)}))")")
    echo "${results[-1]}"
  done
done

mkdir -p "$here/results"
out="$here/results/join.json"
printf '{"join_gib":%s,"failure_ms":%s,"tree_mib":%s,"trees_in_cluster":%s,"load_seconds":%s,"runs":[%s]}\n' "$gib" "$failure_ms" "$tree_mib" \
  "$trees" "$load_s" "$(IFS=,; echo "${results[*]}")" > "$out"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("4th node joins 3 (RF 3): %d trees of %d MiB in the cluster" % (r["trees_in_cluster"], r["tree_mib"]))
print("%-6s %-11s %6s %12s %8s %11s %9s %9s %6s" % ("fs", "install", "trees", "bytes", "s", "streaming s", "MB/s",
      "dd MB/s", "ratio"))
for x in r["runs"]:
    print("%-6s %-11s %6d %12d %8.2f %11.2f %9.1f %9.1f %6.2f" % (x["filesystem"], x["install_fsync"], x["trees"],
          x["bytes"], x["seconds"], x["streaming_seconds"] or 0, x["mb_per_s"], x["dd_mb_per_s"], x["ratio_to_dd"]))
PY
echo "json: $out"
