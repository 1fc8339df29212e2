#!/usr/bin/env bash
# Replicated commit throughput and latency (p50/p99) of a 3-node canopy
# cluster on loopback at ONE / QUORUM / ALL, next to a 3-member etcd 3.4
# cluster on loopback doing the same sequential puts of the same size (etcd
# writes always go through its raft quorum). One client, one request at a
# time, both with fsync on every write (canopy --fsync always, etcd default).
#
#   bench/replication.sh [BUILD_DIR]
#   env: COUNT=2000 VALUE_BYTES=100 DIR=/tmp (data dirs) FSYNC=always
#
# The etcd client is a small Python loop over etcd's HTTP/JSON gateway with
# one keep-alive connection; canopy's is `canopy bench` (C++, one
# connection). Results: bench/results/replication.json. Needs etcd-server
# and etcd-client (apt-get install etcd-server etcd-client) for the peer run;
# without them only canopy is measured.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
canopy="$build/tools/canopy/canopy"
count="${COUNT:-2000}"
value_bytes="${VALUE_BYTES:-100}"
fsync="${FSYNC:-always}"
if [[ ! -x "$canopy" ]]; then
  echo "replication.sh: $canopy not found; build it with: cmake --build $build --target canopy" >&2
  exit 1
fi
work="$(mktemp -d "${DIR:-/tmp}/canopy-repl-bench.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# ---- canopy: 3 nodes, RF 3
echo "replication bench secret" > "$work/secret"
common=(--cluster bench --secret-file "$work/secret")
seeds=()
uris=()
for i in 1 2 3; do
  port=$(free_port)
  uri="tcp://127.0.0.1:$port"
  "$canopy" node --listen "$uri" --data "$work/canopy$i" --node-id "$i" --fsync "$fsync" "${common[@]}" \
    "${seeds[@]}" --log warn > "$work/canopy$i.log" 2>&1 &
  pids+=($!)
  seeds+=(--seed "$uri")
  uris+=("$uri")
done
for i in 0 1 2; do
  for _ in $(seq 100); do "$canopy" status --node "${uris[$i]}" "${common[@]}" > /dev/null 2>&1 && break; sleep 0.1; done
done
for _ in $(seq 100); do
  n=$("$canopy" status --node "${uris[0]}" "${common[@]}" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))')
  [[ "$n" == 3 ]] && break
  sleep 0.1
done
results=()
for cl in ONE QUORUM ALL; do
  # Warm-up (replicas subscribe), then the measured run on a fresh tree.
  "$canopy" bench --node "${uris[0]}" "${common[@]}" --tree "bench-$cl" --cl ALL --count 10 --value-bytes "$value_bytes" > /dev/null
  results+=("$("$canopy" bench --node "${uris[0]}" "${common[@]}" --tree "bench-$cl" --cl "$cl" --count "$count" \
    --value-bytes "$value_bytes" --json)")
done

# ---- etcd: 3 members
etcd_json="null"
if command -v etcd > /dev/null; then
  cluster=""
  declare -a cports pports
  for i in 1 2 3; do
    cports[$i]=$(free_port)
    pports[$i]=$(free_port)
    cluster+="${cluster:+,}e$i=http://127.0.0.1:${pports[$i]}"
  done
  for i in 1 2 3; do
    etcd --name "e$i" --data-dir "$work/etcd$i" \
      --listen-client-urls "http://127.0.0.1:${cports[$i]}" --advertise-client-urls "http://127.0.0.1:${cports[$i]}" \
      --listen-peer-urls "http://127.0.0.1:${pports[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${pports[$i]}" \
      --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token canopy-bench \
      > "$work/etcd$i.log" 2>&1 &
    pids+=($!)
  done
  etcd_json=$(python3 - "${cports[1]}" "$count" "$value_bytes" <<'PY'
import base64, http.client, json, sys, time
port, count, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def connect():
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10)
def put(conn, key, value):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(), "value": base64.b64encode(value).decode()})
    conn.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError("etcd put: %d %s" % (r.status, data[:200]))
conn = None
for _ in range(200):  # wait for a leader
    try:
        conn = connect()
        put(conn, "warmup", b"x")
        break
    except Exception:
        conn = None
        time.sleep(0.1)
if conn is None:
    print("null"); sys.exit(0)
value = b"v" * size
for i in range(10):
    put(conn, "w%d" % i, value)
lat = []
start = time.perf_counter()
for i in range(count):
    t0 = time.perf_counter()
    put(conn, "k%d" % (i % 1000), value)
    lat.append((time.perf_counter() - t0) * 1e6)
secs = time.perf_counter() - start
lat.sort()
pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
print(json.dumps({"system": "etcd", "count": count, "value_bytes": size, "seconds": secs,
                  "commits_per_s": count / secs, "p50_us": pct(0.5), "p99_us": pct(0.99)}))
PY
)
else
  echo "replication.sh: etcd not installed (apt-get install etcd-server etcd-client); measuring canopy only" >&2
fi

mkdir -p "$here/results"
out="$here/results/replication.json"
printf '{"fsync":"%s","count":%s,"value_bytes":%s,"canopy":[%s],"etcd":%s}\n' "$fsync" "$count" "$value_bytes" \
  "$(IFS=,; echo "${results[*]}")" "$etcd_json" > "$out"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("3 nodes on loopback, %d sequential puts of %d bytes, fsync %s" % (r["count"], r["value_bytes"], r["fsync"]))
for c in r["canopy"]:
    print("canopy %-6s %8.0f commits/s  p50 %7.0f us  p99 %7.0f us" % (c["cl"], c["commits_per_s"], c["p50_us"], c["p99_us"]))
e = r["etcd"]
if e:
    print("etcd   quorum %8.0f puts/s     p50 %7.0f us  p99 %7.0f us" % (e["commits_per_s"], e["p50_us"], e["p99_us"]))
PY
echo "json: $out"
