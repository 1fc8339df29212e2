#!/usr/bin/env bash
# bench/scenarios/load_wrk.sh — HTTP request rate: canopy `load` versus `wrk`
# against the same nginx (pinned to one core) serving a 1 KiB file, keep-alive,
# the same connections and threads and the same duration per sample, both
# clients pinned to another core. Samples are requests/s: load's --json
# requests_per_s, wrk's "Requests/sec" line. p50/p99 latency of both are kept
# in details. Goal: load >= 0.9x wrk. Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

load=$BENCH_BUILD/tools/load/load
[[ -x $load ]] || { bench_log "$load not built"; exit 1; }
bench_need_peer nginx nginx-light || bench_skip "nginx missing and cannot be installed (apt-get install nginx-light needs root)"
bench_need_peer wrk wrk || bench_skip "wrk missing and cannot be installed (apt-get install wrk needs root)"
reps=${BENCH_REPS:-3}
seconds=$(bench_pick 1 3 10)
conns=64
threads=1

if bench_split_cores; then
  cores_note="nginx on core $server_cpu, clients on core $client_cpu"
else
  cores_note="only one CPU: nginx and clients share core $server_cpu"
fi

work=$BENCH_WORK/load_wrk
BENCH_NGINX_PID=""
cleanup() { bench_kill "$BENCH_NGINX_PID"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work/root"
head -c 1024 /dev/urandom > "$work/root/small.bin"
chmod 755 "$work" "$work/root"
chmod 644 "$work/root/small.bin"

bench_nginx_start "$work/nginx" "$work/root" "$server_cpu" || exit 1
url="http://127.0.0.1:$BENCH_NGINX_PORT/small.bin"
bench_log "$reps x ($seconds s load, $seconds s wrk), $conns connections, $threads thread(s); $cores_note"

# wrk_us VALUE -> microseconds from a wrk duration such as 118.00us, 1.20ms, 2.00s.
wrk_us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
    f = (u == "us") ? 1 : (u == "ms") ? 1e3 : (u == "s") ? 1e6 : (u == "m") ? 6e7 : -1
    if (f < 0) print "null"; else printf "%.3f\n", n * f }'
}

runs=$work/runs.jsonl
: > "$runs"

load_sample() {
  local rep=$1 out
  # A run by time, as wrk's (-d without -n): exit 0 means no request failed.
  out=$(taskset -c "$client_cpu" "$load" -c "$conns" -t "$threads" -k -d "$seconds" --json "$url") ||
    { bench_log "load failed: $out"; return 1; }
  jq -e '.ok and .errors.total == 0 and .completed > 0' <<<"$out" > /dev/null 2>&1 ||
    { bench_log "load failed: $out"; return 1; }
  jq -c --argjson r "$rep" '{label: "load", rep: $r, requests_per_s, completed, errors: .errors.total,
    p50_us: (.latency_ms.p50 * 1000), p99_us: (.latency_ms.p99 * 1000), load: .}' <<<"$out" >> "$runs"
  jq -r '.requests_per_s * 10 | round / 10' <<<"$out"
}

wrk_sample() {
  local rep=$1 out rps
  out=$(taskset -c "$client_cpu" wrk -t "$threads" -c "$conns" -d "${seconds}s" --latency "$url") ||
    { bench_log "wrk failed: $out"; return 1; }
  rps=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
  [[ -n $rps ]] || { bench_log "no Requests/sec in wrk output: $out"; return 1; }
  jq -cn --argjson r "$rep" --argjson rps "$rps" \
    --argjson requests "$(awk '/ requests in / { print $1 }' <<<"$out")" \
    --argjson p50 "$(wrk_us "$(awk '$1 == "50%" { print $2 }' <<<"$out")")" \
    --argjson p99 "$(wrk_us "$(awk '$1 == "99%" { print $2 }' <<<"$out")")" \
    --arg out "$out" \
    '{label: "wrk", rep: $r, requests_per_s: $rps, completed: $requests, p50_us: $p50, p99_us: $p99, wrk_output: $out}' >> "$runs"
  echo "$rps"
}

a=() b=()
for ((rep = 1; rep <= reps; rep++)); do
  a+=("$(load_sample "$rep")")
  b+=("$(wrk_sample "$rep")")
  bench_log "rep $rep/$reps: load ${a[-1]}, wrk ${b[-1]} requests/s"
done

comparisons=$(jq -s . <<EOC
$(bench_comparison "load vs wrk against nginx (1 KiB, $conns connections, keep-alive)" requests/s true \
  load "$(bench_samples "${a[@]}")" wrk "$(bench_samples "${b[@]}")" 0.9 "load within 10% of wrk's request rate")
EOC
)

jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" \
  --argjson reps "$reps" --argjson secs "$seconds" --argjson conns "$conns" --argjson threads "$threads" \
  --argjson cpus "$(nproc)" --argjson scpu "$server_cpu" --argjson ccpu "$client_cpu" --arg cores "$cores_note" \
  --arg nginx "$(nginx -v 2>&1)" --arg wrk "$(wrk -v 2>&1 | head -n 1)" \
  '{scenario: "load_wrk",
    title: "load vs wrk: requests/s against nginx",
    path: "http://127.0.0.1 over tcp kernel loopback (same-host TCP, no NIC)",
    params: {file_bytes: 1024, seconds_per_sample: $secs, connections: $conns, threads: $threads, keep_alive: true,
             reps: $reps, cpus: $cpus, server_cpu: $scpu, client_cpu: $ccpu, cores: $cores,
             order: "per rep: load, wrk",
             metric: "requests/s as each tool reports it (load --json requests_per_s, wrk Requests/sec)"},
    comparisons: $comparisons,
    details: {nginx_version: $nginx, wrk_version: $wrk,
              latency_us: [$runs[] | {"label": .label, rep, p50_us, p99_us}], runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
