#!/usr/bin/env bash
# canopy's main job, on an embedded default: installs what is missing, builds,
# then on this machine's loopback
#   1. starts a 3-node cluster (RF 3, fsync=always, WAL + data on tmpfs),
#      creates a tree and commits edits to it at QUORUM, printing commit
#      throughput and latency, and checks that all three replicas converged;
#   2. copies a file tmpfs -> tmpfs with rcopy over tcp:// and prints Gbit/s
#      (--verify: both sides hash the data, xxh3-64, and compare).
# Environment knobs: CANOPY_MAIN_COMMITS (default 2000), CANOPY_MAIN_FILE_MIB
# (default 1024), CANOPY_MAIN_DIR (default a fresh dir under /dev/shm).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
bash scripts/build.sh >/dev/null
bin=build/tools

commits=${CANOPY_MAIN_COMMITS:-2000}
file_mib=${CANOPY_MAIN_FILE_MIB:-1024}
shm=/dev/shm
[[ -d $shm && -w $shm ]] || shm=${TMPDIR:-/tmp}
work=${CANOPY_MAIN_DIR:-$(mktemp -d "$shm/canopy-main.XXXXXX")}
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ -n ${CANOPY_MAIN_KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT

wait_for_file() {  # wait_for_file PATH SECONDS
  for ((i = 0; i < $2 * 10; i++)); do [[ -s $1 ]] && return 0; sleep 0.1; done
  echo "run-main: timed out waiting for $1" >&2
  return 1
}

echo "== canopy main job: 3-node cluster on 127.0.0.1, data in $work"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
common=(--cluster main --secret-file "$work/secret" --fsync always)
for n in 1 2 3; do
  seed=()
  [[ $n -gt 1 ]] && seed=(--seed "$(cat "$work/node1.uri")")
  "$bin/canopy/canopy" node --listen tcp://127.0.0.1:0 --data "$work/node$n" --node-id "$n" "${common[@]}" \
    --uri-file "$work/node$n.uri" "${seed[@]}" --log warn >"$work/node$n.log" 2>&1 &
  pids+=($!)
  wait_for_file "$work/node$n.uri" 20
done
client=(--cluster main --secret-file "$work/secret")
node1=$(cat "$work/node1.uri")
# Wait until every node sees the other two (membership spreads by gossip).
for ((i = 0; i < 100; i++)); do
  alive=$("$bin/canopy/canopy" status --node "$node1" "${client[@]}" --json 2>/dev/null |
          grep -o '"alive":true' | wc -l || true)
  [[ $alive -ge 3 ]] && break
  sleep 0.2
done
echo "-- members alive: $alive"

"$bin/canopy/canopy" bench --node "$node1" "${client[@]}" --tree main --count "$commits" --cl QUORUM
out=$("$bin/canopy/canopy" commit --node "$node1" "${client[@]}" --tree main --cl ALL --put /:greeting=hello-from-canopy)
echo "$out"
version=$(printf '%s' "$out" | sed -n 's/^committed version \([0-9]*\).*/\1/p')
# Every replica's durable version and tree digest (xxh3 of the canonical
# encoding): after an ALL commit they must all be equal.
table=$("$bin/canopy/canopy" status --node "$node1" "${client[@]}" --all)
echo "$table" | grep '^main '
digests=$(echo "$table" | grep '^main ' | grep -o "version $version digest [0-9a-f]*" | sort -u)
if [[ $(echo "$table" | grep -c "^main .*version $version digest") -ne 3 || $(echo "$digests" | wc -l) -ne 1 ]]; then
  echo "run-main: the three replicas did not converge to one digest at version $version" >&2
  exit 1
fi
echo "-- all 3 replicas at version $version with one digest"
"$bin/canopy/canopy" status --node "$node1" "${client[@]}"

echo "== rcopy: ${file_mib} MiB tmpfs -> tmpfs over tcp://127.0.0.1"
mkdir -p "$work/rcopy-root"
head -c $((file_mib * 1024 * 1024)) /dev/urandom >"$work/payload.bin"
"$bin/rcopy/rcopy" --server --root "$work/rcopy-root" -p 0 --port-file "$work/rcopy.port" >"$work/rcopy-server.log" 2>&1 &
pids+=($!)
wait_for_file "$work/rcopy.port" 20
"$bin/rcopy/rcopy" -p "$(cat "$work/rcopy.port")" --verify "$work/payload.bin" 127.0.0.1:payload.bin
cmp -s "$work/payload.bin" "$work/rcopy-root/payload.bin" && echo "-- copy is byte-exact"
