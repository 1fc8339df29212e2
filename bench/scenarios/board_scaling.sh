#!/usr/bin/env bash
# bench/scenarios/board_scaling.sh — does the bulletin board slow down as it
# grows? One `canopy node --http` (a 1-node cluster, fsync none, data on
# tmpfs), one board; `load -c 4 -k` posts at cl=ONE. Each rep starts a fresh
# node, fills the board to SMALL messages, times WINDOW posts, fills it on to
# LARGE messages (untimed), and times WINDOW posts again: one paired sample
# (posts/s at LARGE, posts/s at SMALL). Every post is one commit inserting a
# child at index 0 of the board's root, so the root's child count is the
# board's size. Goal (issue 15): the rate at LARGE within 20% of the rate at
# SMALL (ratio >= 0.8). Sizes: tiny 1k / 10k, quick and full 1k / 100k.
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

canopy=$BENCH_BUILD/tools/canopy/canopy
load=$BENCH_BUILD/tools/load/load
for b in "$canopy" "$load"; do
  [[ -x $b ]] || { bench_log "$b not built (cmake --build $BENCH_BUILD --target canopy load)"; exit 1; }
done
reps=${BENCH_REPS:-3}
small=1000
large=$(bench_pick 10000 100000 100000)
window=$(bench_pick 1000 3000 5000)
conns=4

work=$BENCH_WORK/board_scaling
node_pid=""
cleanup() { bench_kill "$node_pid"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work"
echo "board scaling bench secret, loopback only" > "$work/secret"
body='{"author":"bench","text":"a bulletin board post of about one hundred bytes of text, as a person would write it."}'

# post N -> prints load's JSON for N posts to the board.
post() {
  "$load" -n "$1" -c "$conns" -t 1 -k --json --timeout 30 --method POST --body "$body" \
    -H 'Content-Type: application/json' "$base/boards/bench/messages?cl=ONE"
}

small_rates=() large_rates=()
for ((i = 1; i <= reps; i++)); do
  d=$work/rep$i
  mkdir -p "$d"
  "$canopy" node --listen tcp://127.0.0.1:0 --data "$d/data" --node-id 1 --cluster bench \
    --secret-file "$work/secret" --fsync none --uri-file "$d/uri" --http 127.0.0.1:0 \
    --http-port-file "$d/port" --log warn > "$d/log" 2>&1 &
  node_pid=$!
  bench_wait_file "$d/uri" 15 && bench_wait_file "$d/port" 15 || { bench_log "node did not start: $(tail -5 "$d/log")"; exit 1; }
  base=http://127.0.0.1:$(cat "$d/port")
  code=""
  for _ in $(seq 1 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d '{"name":"bench"}' "$base/boards" || true)
    [[ $code == 201 ]] && break
    sleep 0.1
  done
  [[ $code == 201 ]] || { bench_log "creating the board answered $code: $(tail -5 "$d/log")"; exit 1; }
  bench_log "rep $i/$reps: fill to $small, time $window posts"
  post "$small" > /dev/null
  s=$(post "$window" | jq '.requests_per_s')
  bench_log "rep $i/$reps: fill to $large, time $window posts"
  post $((large - small - window)) > /dev/null
  l=$(post "$window" | jq '.requests_per_s')
  bench_log "rep $i/$reps: $s posts/s at $small messages, $l at $large"
  small_rates+=("$s")
  large_rates+=("$l")
  bench_kill "$node_pid"
  node_pid=""
  rm -rf "$d"
done

comparisons=$(bench_comparison "board posts/s (load -c $conns -k, cl=ONE, 1 node, fsync none): at $large messages vs at $small" \
  "posts/s" true "at $large messages" "$(bench_samples "${large_rates[@]}")" \
  "at $small messages" "$(bench_samples "${small_rates[@]}")" 0.8 "the rate at $large within 20% of the rate at $small" | jq -s -c .)

jq -n --argjson comparisons "$comparisons" --argjson small "$small" --argjson large "$large" \
  --argjson window "$window" --argjson conns "$conns" --argjson reps "$reps" '
  { scenario: "board_scaling",
    title: "Bulletin board post rate as the board grows",
    path: "http://127.0.0.1 (kernel loopback) to one canopy node --http; the node commits to its own store on BENCH_WORK (tmpfs), fsync none",
    params: { small_messages: $small, large_messages: $large, timed_posts_per_window: $window,
              connections: $conns, reps: $reps, consistency: "ONE", nodes: 1,
              post: "one commit: insert child 0 of the board root + 3 attributes (author, text, time_ms)" },
    comparisons: $comparisons }' > "$BENCH_OUT"
bench_log "done"
