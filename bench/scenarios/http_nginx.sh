#!/usr/bin/env bash
# bench/scenarios/http_nginx.sh — one large file downloaded over HTTP/1.1 from
# tmpfs: canopy httpd + get versus nginx + wget, the servers pinned to one core
# and the clients to another (taskset). Each sample is file bytes / wall time
# of the whole client command (process start included), decimal Gbit/s; the
# clients write to /dev/null. Two cross pairings (same server, same client)
# show which side any difference comes from. Goal: httpd+get >= nginx+wget.
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

httpd=$BENCH_BUILD/tools/httpd/httpd
get=$BENCH_BUILD/tools/get/get
for b in "$httpd" "$get"; do [[ -x $b ]] || { bench_log "$b not built"; exit 1; }; done
bench_need_peer nginx nginx-light || bench_skip "nginx missing and cannot be installed (apt-get install nginx-light needs root)"
bench_need_peer wget wget || bench_skip "wget missing and cannot be installed (apt-get install wget needs root)"
reps=${BENCH_REPS:-3}
size_mb=$(bench_pick 16 512 2048)

if bench_split_cores; then
  cores_note="servers on core $server_cpu, clients on core $client_cpu"
else
  cores_note="only one CPU: servers and clients share core $server_cpu"
fi

work=$BENCH_WORK/http_nginx
httpd_pid="" BENCH_NGINX_PID=""
cleanup() { bench_kill "$httpd_pid" "$BENCH_NGINX_PID"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work/root"

size_mb=$(bench_fit_mib "$size_mb" 2) || bench_skip "no room under $BENCH_WORK for the file"
bench_log "writing a $size_mb MiB file; $cores_note"
dd if=/dev/zero of="$work/root/big.bin" bs=1M count="$size_mb" status=none
chmod 755 "$work" "$work/root"
chmod 644 "$work/root/big.bin"
bytes=$(stat -c %s "$work/root/big.bin")

taskset -c "$server_cpu" "$httpd" --root "$work/root" --port 0 > "$work/httpd.out" 2> "$work/httpd.err" &
httpd_pid=$!
bench_wait_file "$work/httpd.out" 10 || true
httpd_port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/httpd.out")
[[ -n $httpd_port ]] || { bench_log "httpd did not start: $(cat "$work/httpd.err")"; exit 1; }
bench_nginx_start "$work/nginx" "$work/root" "$server_cpu" || exit 1
nginx_port=$BENCH_NGINX_PORT

runs=$work/runs.jsonl
: > "$runs"

# sample REP LABEL CLIENT PORT -> Gbit/s by wall clock of the client command.
sample() {
  local rep=$1 label=$2 client=$3 url="http://127.0.0.1:$4/big.bin" t0 t1 secs out=""
  t0=$(bench_now)
  if [[ $client == get ]]; then
    out=$(taskset -c "$client_cpu" "$get" -q --json -O /dev/null "$url") ||
      { bench_log "$label failed: $out"; return 1; }
  else
    taskset -c "$client_cpu" wget -q -O /dev/null "$url" || { bench_log "$label: wget failed ($?)"; return 1; }
  fi
  t1=$(bench_now)
  secs=$(bench_elapsed "$t0" "$t1")
  jq -cn --arg l "$label" --argjson r "$rep" --argjson s "$secs" --arg out "$out" \
    '{label: $l, rep: $r, wall_seconds: $s} + (if $out == "" then {} else {get: ($out | fromjson)} end)' >> "$runs"
  bench_gbps "$bytes" "$secs"
}

ours=() peer1=() get_nginx=() peer2=() wget_httpd=() peer3=()
for ((rep = 1; rep <= reps; rep++)); do
  ours+=("$(sample "$rep" "httpd + get" get "$httpd_port")")
  peer1+=("$(sample "$rep" "nginx + wget" wget "$nginx_port")")
  get_nginx+=("$(sample "$rep" "nginx + get" get "$nginx_port")")
  peer2+=("$(sample "$rep" "nginx + wget" wget "$nginx_port")")
  wget_httpd+=("$(sample "$rep" "httpd + wget" wget "$httpd_port")")
  peer3+=("$(sample "$rep" "nginx + wget" wget "$nginx_port")")
  bench_log "rep $rep/$reps Gbit/s: httpd+get ${ours[-1]} / nginx+wget ${peer1[-1]}," \
    "nginx+get ${get_nginx[-1]} / ${peer2[-1]}, httpd+wget ${wget_httpd[-1]} / ${peer3[-1]}"
done

comparisons=$(jq -s . <<EOC
$(bench_comparison "httpd + get vs nginx + wget ($size_mb MiB)" Gbit/s true \
  "httpd + get" "$(bench_samples "${ours[@]}")" "nginx + wget" "$(bench_samples "${peer1[@]}")" \
  1.0 "httpd + get at least as fast as nginx + wget")
$(bench_comparison "get vs wget, both from nginx ($size_mb MiB)" Gbit/s true \
  "nginx + get" "$(bench_samples "${get_nginx[@]}")" "nginx + wget" "$(bench_samples "${peer2[@]}")")
$(bench_comparison "httpd vs nginx, both to wget ($size_mb MiB)" Gbit/s true \
  "httpd + wget" "$(bench_samples "${wget_httpd[@]}")" "nginx + wget" "$(bench_samples "${peer3[@]}")")
EOC
)

jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" \
  --argjson bytes "$bytes" --argjson reps "$reps" --argjson cpus "$(nproc)" \
  --argjson scpu "$server_cpu" --argjson ccpu "$client_cpu" --arg cores "$cores_note" \
  --arg nginx "$(nginx -v 2>&1)" --arg wget "$(wget --version | head -n 1)" \
  --arg conf "$(cat "$work/nginx/nginx.conf")" \
  '{scenario: "http_nginx",
    title: "httpd + get vs nginx + wget: one large file",
    path: "http://127.0.0.1 over tcp kernel loopback (same-host TCP, no NIC); file on tmpfs, clients write to /dev/null",
    params: {file_bytes: $bytes, reps: $reps, cpus: $cpus, server_cpu: $scpu, client_cpu: $ccpu, cores: $cores,
             client_output: "/dev/null",
             order: "per rep: httpd+get, nginx+wget, nginx+get, nginx+wget, httpd+wget, nginx+wget",
             metric: "file bytes * 8 / wall seconds of the whole client command / 1e9 (process start included)"},
    comparisons: $comparisons,
    details: {nginx_version: $nginx, wget_version: $wget, nginx_conf: $conf, runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
