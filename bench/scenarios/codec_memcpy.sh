#!/usr/bin/env bash
# bench/scenarios/codec_memcpy.sh — snapshot block format versus memcpy of the
# same bytes, measured by tree_bench --codec-only (one thread, thread CPU
# time, no disk I/O). The two goal comparisons (issue 15: each >= 0.5):
# - "send": producing the bytes to send. A source sends its checkpoint: the
#   tree it serves was opened in place from that file, and the stream is the
#   file's blocks, copied into the send buffer (SnapshotWriter over that tree;
#   the file's mapping touched once before the clock, as a server that has
#   served its tree has: the check at open reads by pread, not the mapping).
#   Its peer copies the same bytes in the same pieces (one block's size at a
#   time) into one reused buffer: what the sender does, minus the codec. Both
#   buffers are faulted in before the clock starts, as memcpy's destination
#   always was: on this kind of VM the first touch of a fresh page costs
#   ~10 us, and the first 1 MiB block once cost more than copying 16 MB;
# - "usable": making received bytes usable. The bytes are in one buffer as
#   they landed; OpenSnapshotImage checks every block CRC, every record and
#   child reference and the digest, then the first read (the root) is served.
#   Nothing per node is built: the rest of the tree decodes lazily on touch.
# Shown beside them, not goals: encode from the in-memory tree (what a
# checkpoint write costs), re-encode of an opened tree (untouched subtrees
# are copied) and decoding every node of an opened tree (a full walk). One tree_bench invocation measures encode, decode and
# memcpy back to back, so each invocation gives one paired sample; it runs
# BENCH_REPS times. Two trees: 1 KiB attribute per node (bulk bytes) and an
# 8-byte attribute per node (per-node overhead dominates). A sweep over the
# attribute size (about the same encoded bytes per point, one run per point)
# shows where the codec approaches memcpy. No goal ratio: memcpy is the
# ceiling, the ratio says how far below it the codec runs.
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

bin=$BENCH_BUILD/bench/tree_bench
[[ -x $bin ]] || { bench_log "$bin not built (cmake --build $BENCH_BUILD --target tree_bench)"; exit 1; }
"$bin" --help | grep -q -- --codec-only || { bench_log "$bin predates --codec-only: rebuild tree_bench"; exit 1; }
reps=${BENCH_REPS:-3}
nodes=$(bench_pick 20000 200000 500000)        # 1 KiB-value tree (about 1 KiB encoded per node)
small_nodes=$(bench_pick 20000 1000000 2000000) # 8-byte-value tree
sweep_bytes=$(bench_pick 4000000 64000000 256000000)
sweep_values=(16 64 256 1024 4096 16384)

work=$BENCH_WORK/codec_memcpy
trap 'rm -rf "$work"' EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
runs=$work/runs.jsonl
: > "$runs"

# One invocation -> one JSON line in $runs.
for ((i = 1; i <= reps; i++)); do
  bench_log "rep $i/$reps: tree_bench --codec-only --snapshot-nodes $nodes --memory-nodes $small_nodes"
  "$bin" --codec-only --json --dir "$work" --snapshot-nodes "$nodes" --memory-nodes "$small_nodes" \
    --value-bytes 1024 | jq -c . >> "$runs"
done

# col TREE FIELD -> JSON array of that field over all reps.
col() { jq -s -c --arg t "$1" --arg f "$2" 'map(.[$t][$f])' "$runs"; }

comparisons=$(
  for t in snapshot snapshot_small_nodes; do
    case $t in
      snapshot) what="1 KiB values, $nodes nodes" ;;
      *) what="8 B values, $small_nodes nodes" ;;
    esac
    bench_comparison "send (checkpoint blocks) vs memcpy in the same pieces ($what)" "GB/s" true send "$(col $t send_gbps)" "memcpy in pieces" "$(col $t memcpy_pieces_gbps)" 0.5 "issue 15: >= 0.5x memcpy"
    bench_comparison "usable (check + open in place) vs memcpy ($what)" "GB/s" true usable "$(col $t usable_gbps)" memcpy "$(col $t memcpy_gbps)" 0.5 "issue 15: >= 0.5x memcpy"
    bench_comparison "encode from memory vs memcpy ($what)" "GB/s" true encode "$(col $t encode_gbps)" memcpy "$(col $t memcpy_gbps)"
    bench_comparison "decode every node vs memcpy ($what)" "GB/s" true touch_all "$(col $t touch_all_gbps)" memcpy "$(col $t memcpy_gbps)"
  done | jq -s -c .
)

# Sweep over the attribute size, ~sweep_bytes encoded per point.
sweep=$work/sweep.jsonl
: > "$sweep"
for vb in "${sweep_values[@]}"; do
  n=$((sweep_bytes / (vb + 24)))
  ((n >= 2020)) || n=2020
  bench_log "sweep: value bytes $vb, $n nodes"
  "$bin" --codec-only --json --dir "$work" --snapshot-nodes "$n" --memory-nodes 2 --value-bytes "$vb" |
    jq -c --argjson vb "$vb" '{vb: $vb, s: .snapshot}' >> "$sweep"
done
sweeps=$(jq -s -c '[{name: "value_bytes", x_label: "attribute bytes per node (log)",
    y_label: "GB/s (1 GB = 1e9 bytes), thread CPU time", logscale_x: true,
    series: [ {label: "send", points: map([.vb, .s.send_gbps])},
              {label: "usable", points: map([.vb, .s.usable_gbps])},
              {label: "encode", points: map([.vb, .s.encode_gbps])},
              {label: "memcpy", points: map([.vb, .s.memcpy_gbps])},
              {label: "memcpy in pieces", points: map([.vb, .s.memcpy_pieces_gbps])} ]}]' "$sweep")

jq -n --argjson comparisons "$comparisons" --argjson sweeps "$sweeps" \
  --slurpfile runs "$runs" --slurpfile sweep "$sweep" \
  --argjson nodes "$nodes" --argjson small "$small_nodes" --argjson sb "$sweep_bytes" '
  { scenario: "codec_memcpy",
    title: "Snapshot block format (send, make usable) vs memcpy of the same bytes",
    path: "memory only: one thread, no I/O, timed by thread CPU time (tree_bench --codec-only)",
    params: { nodes_1k_values: $nodes, nodes_8b_values: $small, sweep_encoded_bytes: $sb,
              chunk_bytes: "tree_bench default", invocations: ($runs | length) },
    comparisons: $comparisons,
    sweeps: $sweeps,
    details: { runs: $runs, sweep: $sweep } }' > "$BENCH_OUT"
bench_log "done"
