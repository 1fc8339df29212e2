#!/usr/bin/env bash
# Runs tree_bench (commit throughput per fsync policy, snapshot codec GB/s next
# to memcpy, memory per node), prints the figures and keeps the JSON in
# bench/results/tree.json.
#   bench/tree.sh [BUILD_DIR] [tree_bench options, e.g. --dir /dev/shm --seconds 2]
# TREE_BENCH=/path/to/tree_bench overrides the binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
shift || true
bin="${TREE_BENCH:-$build/bench/tree_bench}"
if [[ ! -x "$bin" ]]; then
  echo "tree.sh: $bin not found; build it with: cmake --build $build --target tree_bench" >&2
  exit 1
fi
mkdir -p "$here/results"
out="$here/results/tree.json"
"$bin" --json "$@" > "$out"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["memory"]
print("memory per node: %.1f B (%d nodes with an 8-byte attribute, RSS +%.1f MiB)"
      % (m["bytes_per_node"], m["nodes"], m["rss_delta_bytes"] / 2**20))
for k in ("snapshot", "snapshot_small_nodes"):
    s = r[k]
    print("%s: %.0f MB, %d nodes, %d blocks: send %.2f GB/s (memcpy in the same pieces %.2f), usable %.2f GB/s,"
          " memcpy %.2f GB/s (encode %.2f, decode every node %.2f GB/s; same run)"
          % (k, s["bytes"] / 1e6, s["nodes"], s["chunks"], s["send_gbps"], s["memcpy_pieces_gbps"], s["usable_gbps"],
             s["memcpy_gbps"],
             s["encode_gbps"], s["touch_all_gbps"]))
i = r["install"]
print("snapshot install: %.2f GB/s; writing the same %.0f MB + one fsync: %.2f GB/s (same run, on %s)"
      % (i["install_gbps"], i["bytes"] / 1e6, i["raw_write_fsync_gbps"], r["dir"]))
for c in r["commit"]:
    print("commit fsync=%-6s threads=%d: %8.0f commits/s on %s"
          % (c["policy"], c["threads"], c["commits_per_s"], r["dir"]))
PY
echo "json: $out"
