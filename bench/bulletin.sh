#!/usr/bin/env bash
# bench/bulletin.sh — bulletin-board benchmark (not a test): `canopy node
# --http` clusters of 1, 3 and 5 nodes on 127.0.0.1; tools/load posts
# messages (POST /boards/bench/messages?cl=CL) and lists them
# (GET /boards/bench/messages?limit=L) through node 1's HTTP API.
# Throughput and latency by node count go to bench/results/bulletin-<UTC time>.json.
#
# usage: bench/bulletin.sh [BUILD_DIR]            (default BUILD_DIR: build)
# env:   BOARD_NODES    node counts (default "1 3 5")
#        BOARD_WRITES   POSTs per node count (default 2000)
#        BOARD_READS    GETs per node count (default 2000)
#        BOARD_C        concurrent connections (default 8)
#        BOARD_CL       consistency level of the writes (default QUORUM)
#        BOARD_LIMIT    messages per list (default 10)
#        BOARD_FSYNC    --fsync of the nodes: always|batch|none (default always)
#        BOARD_TEXT_BYTES  message text size (default 100)
#        BOARD_READ_CL  consistency level of the reads: ONE|LEADER|QUORUM (default ONE)
# Posts and reads that may block run on the board's worker threads, so
# concurrent posts to one node wait for their level side by side (see
# tools/canopy/board.h). For 64 connections spread over 1, 3 and 5 nodes and
# nginx beside it, see bench/scenarios/board_nodes.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build}
[[ $build = /* ]] || build=$repo/$build
canopy=$build/tools/canopy/canopy
load=$build/tools/load/load
for b in "$canopy" "$load"; do
  [[ -x $b ]] || { echo "bulletin.sh: $b not built (cmake --build $build --target canopy load)" >&2; exit 1; }
done
command -v curl >/dev/null || { echo "bulletin.sh: needs curl" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bulletin.sh: needs python3" >&2; exit 1; }

node_counts=${BOARD_NODES:-"1 3 5"}
writes=${BOARD_WRITES:-2000}
reads=${BOARD_READS:-2000}
conns=${BOARD_C:-8}
cl=${BOARD_CL:-QUORUM}
limit=${BOARD_LIMIT:-10}
fsync=${BOARD_FSYNC:-always}
text_bytes=${BOARD_TEXT_BYTES:-100}
read_cl=${BOARD_READ_CL:-ONE}

work=$(mktemp -d /tmp/canopy-bulletin-bench.XXXXXX)
pids=()
stop_nodes() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() {
  stop_nodes
  rm -rf "$work"
}
trap cleanup EXIT

echo "a long shared bench secret" > "$work/secret"
common=(--cluster bench --secret-file "$work/secret")
text=$(head -c "$text_bytes" /dev/zero | tr '\0' 'x')
body="{\"author\":\"bench\",\"text\":\"$text\"}"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=$repo/bench/results/bulletin-$stamp.json
mkdir -p "$repo/bench/results"
runs=()

wait_file() {  # path, seconds
  for _ in $(seq 1 $(($2 * 20))); do [[ -s $1 ]] && return 0; sleep 0.05; done
  echo "bulletin.sh: $1 did not appear" >&2
  return 1
}

for n in $node_counts; do
  echo "== $n node(s)"
  seeds=()
  for i in $(seq 1 "$n"); do
    d=$work/n$n-$i
    "$canopy" node --listen tcp://127.0.0.1:0 --data "$d" --node-id "$i" "${common[@]}" --fsync "$fsync" \
      --uri-file "$d.uri" --http 127.0.0.1:0 --http-port-file "$d.port" --log warn "${seeds[@]}" \
      > "$d.log" 2>&1 &
    pids+=($!)
    wait_file "$d.uri" 15
    wait_file "$d.port" 15
    seeds+=(--seed "$(cat "$d.uri")")
  done
  uri1=$(cat "$work/n$n-1.uri")
  port1=$(cat "$work/n$n-1.port")
  # Every node must see all members before the board is placed.
  for _ in $(seq 1 300); do
    members=$("$canopy" status --node "$uri1" "${common[@]}" --json 2>/dev/null |
      python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))' 2>/dev/null || echo 0)
    [[ $members == "$n" ]] && break
    sleep 0.1
  done
  [[ $members == "$n" ]] || { echo "bulletin.sh: only $members of $n members joined" >&2; exit 1; }
  base=http://127.0.0.1:$port1
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d '{"name":"bench"}' "$base/boards")
  [[ $code == 201 ]] || { echo "bulletin.sh: creating the board answered $code" >&2; exit 1; }
  w=$("$load" -n "$writes" -c "$conns" -t 1 -k --json --method POST --body "$body" \
    -H 'Content-Type: application/json' "$base/boards/bench/messages?cl=$cl")
  r=$("$load" -n "$reads" -c "$conns" -t 1 -k --json "$base/boards/bench/messages?after=0&limit=$limit&cl=$read_cl")
  runs+=("$(python3 - "$n" "$w" "$r" <<'EOF'
import json, sys
n, w, r = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
def pick(j):
    return {"requests": j["requests"], "completed": j["completed"], "status_codes": j["status_codes"],
            "errors": j["errors"]["total"], "requests_per_s": round(j["requests_per_s"], 1),
            "latency_ms": {k: round(v, 3) for k, v in j["latency_ms"].items()}}
print(json.dumps({"nodes": n, "write": pick(w), "read": pick(r)}))
EOF
)")
  echo "${runs[-1]}"
  stop_nodes
done

python3 - "$out" "$cl" "$fsync" "$conns" "$limit" "$text_bytes" "${runs[@]}" <<'EOF'
import json, os, sys
out, cl, fsync, conns, limit, text_bytes = sys.argv[1:7]
runs = [json.loads(a) for a in sys.argv[7:]]
doc = {"benchmark": "bulletin", "write_cl": cl, "fsync": fsync, "connections": int(conns),
       "list_limit": int(limit), "text_bytes": int(text_bytes), "cpus": os.cpu_count(),
       "note": "load against node 1's HTTP API; the board's leader is the ring's first owner", "runs": runs}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print("results:", out)
EOF
