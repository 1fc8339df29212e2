#!/usr/bin/env bash
# Response time versus cluster size: commit latency (p50/p99) at QUORUM and
# read latency at ONE (a read is answered by the node asked) of canopy
# clusters of 1, 3 and 5 nodes on loopback (RF 3: a 1-node cluster has one
# owner, QUORUM = 1; 3 and 5 nodes: 3 owners, QUORUM = 2), the same
# sequential requests of the same size against each. The client talks to
# the tree's leader directly (no redirect hop), one request at a time.
#
#   bench/latency_by_nodes.sh [BUILD_DIR]
#   env: COUNT=2000 VALUE_BYTES=100 SIZES="1 3 5" DIR=/dev/shm (data dirs) FSYNC=always
#
# With DIR on tmpfs fsync costs nothing, so the figures show the replication
# path itself; on a disk every node of this one machine shares the same
# device and its fsyncs. Results: bench/results/latency_by_nodes.json.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
canopy="$build/tools/canopy/canopy"
count="${COUNT:-2000}"
value_bytes="${VALUE_BYTES:-100}"
sizes="${SIZES:-1 3 5}"
fsync="${FSYNC:-always}"
if [[ ! -x "$canopy" ]]; then
  echo "latency_by_nodes.sh: $canopy not found; build it with: cmake --build $build --target canopy" >&2
  exit 1
fi
work="$(mktemp -d "${DIR:-/dev/shm}/canopy-latency-bench.XXXXXX")"
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

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
echo "latency bench secret" > "$work/secret"
common=(--cluster latbench --secret-file "$work/secret")

results=()
for n in $sizes; do
  declare -A uri_of=()
  seeds=()
  first=""
  for i in $(seq "$n"); do
    uri="tcp://127.0.0.1:$(free_port)"
    "$canopy" node --listen "$uri" --data "$work/c$n-n$i" --node-id "$i" --fsync "$fsync" "${common[@]}" \
      "${seeds[@]}" --log warn > "$work/c$n-n$i.log" 2>&1 &
    pids+=($!)
    seeds+=(--seed "$uri")
    uri_of[$i]="$uri"
    [[ -z "$first" ]] && first="$uri"
  done
  for i in $(seq "$n"); do
    for _ in $(seq 100); do "$canopy" status --node "${uri_of[$i]}" "${common[@]}" > /dev/null 2>&1 && break; sleep 0.1; done
  done
  for _ in $(seq 100); do
    got=$("$canopy" status --node "$first" "${common[@]}" --json |
      python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))')
    [[ "$got" == "$n" ]] && break
    sleep 0.1
  done
  [[ "$got" == "$n" ]] || { echo "latency_by_nodes.sh: $n-node cluster did not form" >&2; exit 1; }
  # Creates a tree and prints its leader's URI ("created T on leader URI (owners ...)").
  leader_uri() {
    "$canopy" create-tree --node "$first" "${common[@]}" --tree "$1" | sed -n 's/^created .* on leader \([^ ]*\) .*/\1/p'
  }
  w=$(leader_uri lat-commit)
  r=$(leader_uri lat-read)
  # Warm-up: every replica subscribed and caught up.
  "$canopy" bench --node "$w" "${common[@]}" --tree lat-commit --cl ALL --count 10 --value-bytes "$value_bytes" > /dev/null
  commit=$("$canopy" bench --node "$w" "${common[@]}" --tree lat-commit --cl QUORUM --count "$count" \
    --value-bytes "$value_bytes" --json)
  # Reads of a root holding one attribute of VALUE_BYTES.
  read=$("$canopy" bench --node "$r" "${common[@]}" --tree lat-read --cl ALL --count 1 --value-bytes "$value_bytes" \
    --reads "$count" --json)
  results+=("$(python3 -c "
import json
c, r = json.loads('$commit'), json.loads('$read')
print(json.dumps({'nodes': $n, 'commit_cl': 'QUORUM', 'commit_p50_us': round(c['p50_us'], 1),
                  'commit_p99_us': round(c['p99_us'], 1), 'commits_per_s': round(c['commits_per_s'], 1),
                  'read_cl': 'ONE', 'read_p50_us': round(r['read_p50_us'], 1), 'read_p99_us': round(r['read_p99_us'], 1)}))")")
  echo "${results[-1]}"
  stop_nodes
  unset uri_of
done

mkdir -p "$here/results"
out="$here/results/latency_by_nodes.json"
printf '{"fsync":"%s","dir":"%s","count":%s,"value_bytes":%s,"runs":[%s]}\n' "$fsync" "${DIR:-/dev/shm}" "$count" \
  "$value_bytes" "$(IFS=,; echo "${results[*]}")" > "$out"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("loopback, %d sequential requests of %d bytes, fsync %s, data in %s" % (r["count"], r["value_bytes"], r["fsync"], r["dir"]))
print("%5s %16s %16s %14s %14s" % ("nodes", "commit p50 us", "commit p99 us", "read p50 us", "read p99 us"))
runs = r["runs"]
for x in runs:
    print("%5d %16.0f %16.0f %14.0f %14.0f" % (x["nodes"], x["commit_p50_us"], x["commit_p99_us"], x["read_p50_us"], x["read_p99_us"]))
one = [x for x in runs if x["nodes"] == 1]
big = max(runs, key=lambda x: x["nodes"])
if one and big["nodes"] > 1:
    o = one[0]
    print("%d-node / 1-node: commit p50 %.2f, p99 %.2f; read p50 %.2f, p99 %.2f" % (big["nodes"],
          big["commit_p50_us"] / o["commit_p50_us"], big["commit_p99_us"] / o["commit_p99_us"],
          big["read_p50_us"] / o["read_p50_us"], big["read_p99_us"] / o["read_p99_us"]))
three = [x for x in runs if x["nodes"] == 3]
if three and big["nodes"] > 3:
    t = three[0]
    print("%d-node / 3-node: commit p50 %.2f, p99 %.2f; read p50 %.2f, p99 %.2f" % (big["nodes"],
          big["commit_p50_us"] / t["commit_p50_us"], big["commit_p99_us"] / t["commit_p99_us"],
          big["read_p50_us"] / t["read_p50_us"], big["read_p99_us"] / t["read_p99_us"]))
PY
echo "json: $out"
