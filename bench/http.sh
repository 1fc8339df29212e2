#!/usr/bin/env bash
# bench/http.sh — HTTP benchmark (not a test): canopy's httpd + get next to
# nginx + wget on one large file on tmpfs, and canopy's load next to wrk
# against nginx. The servers are pinned to one core (taskset -c $SERVER_CPU),
# the clients to another. Results: bench/results/http-<UTC time>.json.
#
# usage: bench/http.sh [BUILD_DIR]          (default BUILD_DIR: build)
# env:   HTTP_BENCH_SIZE_MB  file size in MiB (default 2048 = 2 GiB)
#        HTTP_BENCH_DIR      where the file lives (default /dev/shm, tmpfs)
#        HTTP_BENCH_OUT      where clients write (default /dev/null; a tmpfs path
#                            adds tmpfs page allocation to what is measured)
#        HTTP_BENCH_REPS     downloads per pairing, best one kept (default 3)
#        SERVER_CPU / CLIENT_CPU  cores for taskset (default 0 / 1)
#        LOAD_C / LOAD_T     connections / threads for load and wrk (default 64 / 1)
#        LOAD_SECONDS        wrk duration; load gets as many requests as wrk did (default 5)
# Needs root for apt-get (nginx-light, wget, wrk are installed when missing).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build}
[[ $build = /* ]] || build=$repo/$build
httpd=$build/tools/httpd/httpd
get=$build/tools/get/get
load=$build/tools/load/load
for b in "$httpd" "$get" "$load"; do
  [[ -x $b ]] || { echo "http.sh: $b not built (cmake --build $build --target httpd get load)" >&2; exit 1; }
done

size_mb=${HTTP_BENCH_SIZE_MB:-2048}
data_dir=${HTTP_BENCH_DIR:-/dev/shm}
sink=${HTTP_BENCH_OUT:-/dev/null}
reps=${HTTP_BENCH_REPS:-3}
server_cpu=${SERVER_CPU:-0}
client_cpu=${CLIENT_CPU:-1}
load_c=${LOAD_C:-64}
load_t=${LOAD_T:-1}
load_seconds=${LOAD_SECONDS:-5}

need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v wget >/dev/null || need+=(wget)
command -v wrk >/dev/null || need+=(wrk)
if ((${#need[@]})); then
  echo "http.sh: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
nginx_bin=$(command -v nginx)

work=$(mktemp -d "$data_dir/canopy-http-bench.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

root=$work/root
mkdir -p "$root" "$work/nginx"
echo "http.sh: writing a ${size_mb} MiB file in $root"
dd if=/dev/zero of="$root/big.bin" bs=1M count="$size_mb" status=none
head -c 1024 /dev/urandom > "$root/small.bin"
chmod 644 "$root"/*.bin
bytes=$(stat -c %s "$root/big.bin")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# canopy httpd, pinned.
taskset -c "$server_cpu" "$httpd" --root "$root" --port 0 --max-connections 10000 > "$work/httpd.out" 2> "$work/httpd.err" &
pids+=($!)
for _ in $(seq 100); do grep -q listening "$work/httpd.out" 2>/dev/null && break; sleep 0.05; done
httpd_port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/httpd.out")
[[ -n $httpd_port ]] || { echo "http.sh: httpd did not start: $(cat "$work/httpd.err")" >&2; exit 1; }

# nginx with a private config, one worker, sendfile on, pinned.
nginx_port=$(free_port)
cat > "$work/nginx/nginx.conf" <<CONF
user root;
worker_processes 1;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 10240; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000000;
  keepalive_timeout 60s;
  default_type application/octet-stream;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server {
    listen 127.0.0.1:$nginx_port;
    root $root;
  }
}
CONF
taskset -c "$server_cpu" "$nginx_bin" -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log" 2> "$work/nginx/stderr" &
pids+=($!)
for _ in $(seq 100); do
  curl_ok=$(python3 - "$nginx_port" <<'PY' 2>/dev/null || true
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.2); print("up")
PY
)
  [[ $curl_ok == up ]] && break
  sleep 0.05
done
[[ ${curl_ok:-} == up ]] || { echo "http.sh: nginx did not start: $(cat "$work/nginx/stderr" "$work/nginx/error.log" 2>/dev/null)" >&2; exit 1; }

now() { date +%s.%N; }
gbps() { python3 -c "print(round($1*8/($2)/1e9, 3))"; }

# timed_gbps CMD...: one download, prints Gbit/s by wall clock.
timed_gbps() {
  local t0 t1
  [[ $sink == /dev/null ]] || rm -f "$sink"
  t0=$(now)
  "$@" > /dev/null 2>> "$work/client.err"
  t1=$(now)
  gbps "$bytes" "$t1 - $t0"
}
max() { python3 -c "print(max($1, $2))"; }

# The pairings run round-robin, $reps rounds, best of each kept, so that noise
# from other work on the machine hits all of them alike.
echo "http.sh: downloads of $bytes bytes to $sink, best of $reps rounds"
ours=0 peer=0 x_get_nginx=0 x_wget_httpd=0
for round in $(seq "$reps"); do
  ours=$(max "$ours" "$(timed_gbps taskset -c "$client_cpu" "$get" -q -O "$sink" "http://127.0.0.1:$httpd_port/big.bin")")
  peer=$(max "$peer" "$(timed_gbps taskset -c "$client_cpu" wget -q -O "$sink" "http://127.0.0.1:$nginx_port/big.bin")")
  x_get_nginx=$(max "$x_get_nginx" "$(timed_gbps taskset -c "$client_cpu" "$get" -q -O "$sink" "http://127.0.0.1:$nginx_port/big.bin")")
  x_wget_httpd=$(max "$x_wget_httpd" "$(timed_gbps taskset -c "$client_cpu" wget -q -O "$sink" "http://127.0.0.1:$httpd_port/big.bin")")
  echo "  round $round: httpd+get $ours, nginx+wget $peer, nginx+get $x_get_nginx, httpd+wget $x_wget_httpd (best so far, Gbit/s)"
done
echo "  httpd + get   : $ours Gbit/s"
echo "  nginx + wget  : $peer Gbit/s"
echo "  nginx + get   : $x_get_nginx Gbit/s"
echo "  httpd + wget  : $x_wget_httpd Gbit/s"
dl_ratio=$(python3 -c "print(round($ours/$peer, 3) if $peer > 0 else 0)")
echo "  ratio (httpd+get)/(nginx+wget) = $dl_ratio (goal >= 1)"

small_url="http://127.0.0.1:$nginx_port/small.bin"
rps_of() { python3 -c "import json,sys; print(round(json.loads(sys.argv[1])['requests_per_s'], 1))" "$1"; }
echo "http.sh: wrk vs load against nginx, $load_c connections, $load_t threads, keep-alive, 1 KiB file, best of $reps rounds"
wrk_rps=0 load_rps=0 load_httpd_rps=0 load_json='{}'
for round in $(seq "$reps"); do
  wrk_out=$(taskset -c "$client_cpu" wrk -t "$load_t" -c "$load_c" -d "${load_seconds}s" "$small_url")
  r=$(awk '/Requests\/sec:/ {print $2}' <<< "$wrk_out")
  wrk_requests=$(awk '/requests in/ {print $1}' <<< "$wrk_out")
  wrk_rps=$(max "$wrk_rps" "$r")
  j=$(taskset -c "$client_cpu" "$load" -n "$wrk_requests" -c "$load_c" -t "$load_t" -k \
    --duration $((load_seconds * 3)) --json "$small_url" || true)
  r=$(rps_of "$j")
  if python3 -c "import sys; sys.exit(0 if $r > $load_rps else 1)"; then load_rps=$r; load_json=$j; fi
  j=$(taskset -c "$client_cpu" "$load" -n "$wrk_requests" -c "$load_c" -t "$load_t" -k \
    --duration $((load_seconds * 3)) --json "http://127.0.0.1:$httpd_port/small.bin" || true)
  load_httpd_rps=$(max "$load_httpd_rps" "$(rps_of "$j")")
  echo "  round $round: wrk $wrk_rps, load $load_rps, load->httpd $load_httpd_rps (best so far, req/s)"
done
rps_ratio=$(python3 -c "print(round($load_rps/$wrk_rps, 3) if $wrk_rps > 0 else 0)")
echo "  wrk : $wrk_rps req/s"
echo "  load: $load_rps req/s"
echo "  load against httpd (for reference): $load_httpd_rps req/s"
echo "  ratio load/wrk = $rps_ratio (goal: within 10%, i.e. >= 0.9)"

mkdir -p "$here/results"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=$here/results/http-$stamp.json
python3 - "$out" <<PY
import json, sys
doc = {
  "benchmark": "http",
  "time_utc": "$stamp",
  "host": "$(hostname)",
  "cores": $(nproc),
  "server_cpu": $server_cpu, "client_cpu": $client_cpu,
  "file_bytes": $bytes, "file_dir": "$data_dir", "client_sink": "$sink", "reps": $reps, "load_avg_at_end": "$(cut -d" " -f1-3 /proc/loadavg)",
  "download_gbit_per_s": {
    "httpd_get": $ours, "nginx_wget": $peer, "nginx_get": $x_get_nginx, "httpd_wget": $x_wget_httpd,
  },
  "download_ratio_ours_vs_nginx_wget": $dl_ratio,
  "requests_per_s": {"wrk_nginx": $wrk_rps, "load_nginx": $load_rps, "load_httpd": $load_httpd_rps},
  "requests_ratio_load_vs_wrk": $rps_ratio,
  "load_connections": $load_c, "load_threads": $load_t, "wrk_seconds": $load_seconds,
  "nginx_version": "$("$nginx_bin" -v 2>&1 | sed 's/.*\///')",
  "load_nginx_report": json.loads('''$load_json'''),
}
json.dump(doc, open(sys.argv[1], "w"), indent=2)
print("http.sh: wrote", sys.argv[1])
PY
