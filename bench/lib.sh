# shellcheck shell=bash
# bench/lib.sh — shared shell helpers for bench/run and its scenarios.
# Source it; it defines functions only and changes no shell options.
#
# The scenario contract (bench/scenarios/<name>.sh, one per comparison group):
#   bench/run starts each scenario as an executable with this environment:
#     BENCH_MODE   tiny | quick | full   (tiny: seconds, for CI; quick: < 5 min for
#                                        the whole suite; full: the sizes in the issues)
#     BENCH_REPS   how many times each A/B pair is run, alternating A, B, A, B ...
#     BENCH_BUILD  absolute path of the build directory (tools under tools/...)
#     BENCH_WORK   an empty scratch directory on tmpfs, removed afterwards
#     BENCH_OUT    the path of the JSON fragment the scenario must write
#     BENCH_REPO   the repository root
#   Exit status: 0 = BENCH_OUT written; 77 = skipped (BENCH_OUT written with
#   "skipped": "<reason>", e.g. no root for netns); anything else = failed
#   (bench/run records the failure with the stderr tail and goes on).
#   Scenarios print progress on stderr only. They start and stop their own
#   servers (traps clean up on any exit) and talk only to loopback or to
#   network namespaces they create and delete.
#
#   The fragment (one JSON object):
#   { "scenario": "<name>", "title": "...",
#     "path": "which wire the bytes took, e.g. tcp://127.0.0.1 (kernel loopback,
#              no NIC: same-host TCP is short-circuited)",
#     "params": { sizes, counts, cores ... },
#     "comparisons": [ { "name": "...", "metric": "Gbit/s", "higher_is_better": true,
#         "a": {"label": "rcopy", "samples": [n, ...]},
#         "b": {"label": "cp",    "samples": [n, ...]},
#         "goal": {"ratio": 0.83, "text": "rcopy within 1.2x of cp's time"}   (optional) } ],
#     "sweeps": [ { "name": "...", "x_label": "...", "y_label": "...", "logscale_x": true,
#         "series": [ {"label": "...", "points": [[x, y], ...]} ] } ],       (optional)
#     "details": { anything else worth keeping: raw tool JSON, versions } }   (optional)
#   a and b samples are in run order and paired (a[i] ran next to b[i]).
#   bench/run derives, for every comparison: median and min/max of each side, and
#   ratio = median(a) / median(b) when higher_is_better, median(b) / median(a)
#   otherwise — so a ratio > 1 always means A did better — and whether the goal
#   ratio was met.

# Seconds since the epoch with nanoseconds, for wall-clock timing.
bench_now() { date +%s.%N; }

# bench_elapsed T0 T1 -> seconds between two bench_now values.
bench_elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f\n", b - a }'; }

# bench_gbps BYTES SECONDS -> decimal Gbit/s (1 Gbit = 1e9 bits).
bench_gbps() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.4f\n", (s > 0) ? n * 8 / s / 1e9 : 0 }'; }

# bench_pick tiny-value quick-value full-value -> the one for $BENCH_MODE.
bench_pick() {
  case "${BENCH_MODE:-quick}" in
    tiny) echo "$1" ;;
    quick) echo "$2" ;;
    *) echo "$3" ;;
  esac
}

# bench_log MESSAGE... -> stderr, prefixed with the scenario's name.
bench_log() { echo "[$(basename "${0%.sh}")] $*" >&2; }

# bench_free_port -> a TCP port on 127.0.0.1 nobody uses right now
# (there is a window between this and the bind: servers that can bind port 0
# and report it, like rcopy --port-file, should do that instead). The port is
# outside the kernel's ephemeral range (net.ipv4.ip_local_port_range), so that
# no outgoing connection of another process running meanwhile (the tests run
# beside bench_run_tiny) can be given it before our server binds it.
bench_free_port() {
  local port used tries=0 lo=32768 hi=60999 from to
  read -r lo hi < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  if ((lo > 12000)); then from=10000 to=$((lo - 1)); else from=$((hi + 1)) to=65535; fi
  ((to > from)) || { from=20000 to=59999; }  # the whole range is ephemeral: take our chances
  used=$(ss -Htan 2>/dev/null | awk '{ n = split($4, p, ":"); print p[n] }' | sort -u)
  while ((tries++ < 200)); do
    port=$((from + RANDOM % (to - from + 1)))
    grep -qx "$port" <<<"$used" || { echo "$port"; return 0; }
  done
  return 1
}

# bench_wait_port PORT [SECONDS] -> 0 once something listens on 127.0.0.1:PORT.
bench_wait_port() {
  local port=$1 deadline=$((SECONDS + ${2:-10}))
  while ((SECONDS < deadline)); do
    ss -Htln "sport = :$port" 2>/dev/null | grep -q . && return 0
    sleep 0.05
  done
  return 1
}

# bench_wait_file FILE [SECONDS] -> 0 once FILE exists and is not empty.
bench_wait_file() {
  local file=$1 deadline=$((SECONDS + ${2:-10}))
  while ((SECONDS < deadline)); do
    [[ -s $file ]] && return 0
    sleep 0.05
  done
  return 1
}

# bench_need_peer COMMAND PACKAGE... -> 0 when COMMAND exists, installing the
# Debian PACKAGEs with apt-get first if it does not (root only). Returns 1 with
# a message when it still is not there.
bench_need_peer() {
  local cmd=$1; shift
  command -v "$cmd" >/dev/null 2>&1 && return 0
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    bench_log "installing $* for $cmd"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 ||
      { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2; } || true
  fi
  command -v "$cmd" >/dev/null 2>&1 && return 0
  bench_log "peer $cmd missing (apt-get install $*)"
  return 1
}

# bench_samples VALUE... -> a JSON array of numbers.
bench_samples() {
  local out="[" sep="" v
  for v in "$@"; do out+="$sep$v"; sep=","; done
  echo "$out]"
}

# bench_comparison NAME METRIC HIGHER_IS_BETTER(true|false) LABEL_A SAMPLES_A LABEL_B SAMPLES_B [GOAL_RATIO GOAL_TEXT]
# -> one comparison object; SAMPLES_* are JSON arrays (bench_samples).
bench_comparison() {
  local goal='null'
  if (($# >= 9)); then
    goal=$(jq -cn --argjson r "$8" --arg t "$9" '{ratio: $r, text: $t}')
  fi
  jq -cn --arg name "$1" --arg metric "$2" --argjson hib "$3" \
    --arg la "$4" --argjson sa "$5" --arg lb "$6" --argjson sb "$7" --argjson goal "$goal" \
    '{name: $name, metric: $metric, higher_is_better: $hib,
      a: {label: $la, samples: $sa}, b: {label: $lb, samples: $sb}}
     + (if $goal == null then {} else {goal: $goal} end)'
}

# bench_skip REASON -> writes a skipped fragment to $BENCH_OUT and exits 77.
bench_skip() {
  jq -n --arg s "$(basename "${0%.sh}")" --arg r "$1" '{scenario: $s, skipped: $r}' > "$BENCH_OUT"
  bench_log "skipped: $1"
  exit 77
}

# --- helpers shared by several scenarios (appended by scen-a) ---

# bench_cpus -> the CPU ids this process may run on, one per line (cpuset
# aware: parsed from Cpus_allowed_list, e.g. "0-3,6" -> 0 1 2 3 6).
bench_cpus() {
  local list
  list=$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status 2>/dev/null)
  [[ -n $list ]] || list="0-$(($(nproc) - 1))"
  tr ',' '\n' <<<"$list" | awk -F- '{ hi = ($2 == "") ? $1 : $2; for (c = $1; c <= hi; c++) print c }'
}

# bench_cpu_seconds PID... -> the user + system CPU seconds the PIDs have used
# so far, summed (/proc/PID/stat fields 14 and 15); a PID that is gone counts 0.
bench_cpu_seconds() {
  local pid
  for pid in "$@"; do cat "/proc/$pid/stat" 2>/dev/null || true; done |
    awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); t += $12 + $13 } END { printf "%.3f\n", t / hz }'
}

# bench_median V... -> the median of the numbers (the mean of the middle two
# of an even count, as bench/run takes it); empty when there are none.
bench_median() {
  printf '%s\n' "$@" | grep -v '^$' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else if (NR) print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# bench_machine_cpu -> "BUSY TOTAL": CPU seconds of all CPUs so far (/proc/stat,
# user through steal); BUSY leaves out idle and iowait. Two readings give the
# machine's utilisation over an interval: (BUSY1 - BUSY0) / (TOTAL1 - TOTAL0).
bench_machine_cpu() {
  awk -v hz="$(getconf CLK_TCK)" '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i
    printf "%.3f %.3f\n", (t - $5 - $6) / hz, t / hz; exit }' /proc/stat
}

# bench_machine_cpu_used BEFORE AFTER [OPS] -> "BUSY_PCT US_PER_OP": from two
# bench_machine_cpu readings, how busy the machine was in between (% of all
# its CPUs) and its busy CPU microseconds per operation (0 without OPS > 0).
bench_machine_cpu_used() {
  awk -v before="$1" -v after="$2" -v ops="${3:-0}" 'BEGIN {
    split(before, a, " "); split(after, b, " ")
    busy = b[1] - a[1]; total = b[2] - a[2]
    printf "%.3f %.3f\n", (total > 0) ? 100 * busy / total : 0, (ops > 0) ? 1e6 * busy / ops : 0 }'
}

# bench_kill PID... -> stops each PID (TERM, then KILL after ~2 s) and reaps it;
# empty arguments are ignored, never fails. Sets BENCH_KILL_SIGNALLED to the
# "PID:STATUS" of each PID that died of a signal other than the TERM or KILL
# sent here (STATUS 128 + signal: 139 is SIGSEGV), whether before or during
# its stop: a crash, which a caller should report (empty when none).
bench_kill() {
  local pid i rc
  BENCH_KILL_SIGNALLED=""
  for pid in "$@"; do
    [[ -n $pid ]] || continue
    if kill "$pid" 2>/dev/null; then
      for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    ((rc > 128 && rc != 128 + 15 && rc != 128 + 9)) && BENCH_KILL_SIGNALLED+="${BENCH_KILL_SIGNALLED:+ }$pid:$rc"
  done
  return 0
}

# bench_nginx_start DIR ROOT CPU -> starts a private nginx (never the system
# service): config, pid file, logs and temp dirs under DIR, serving ROOT on
# 127.0.0.1, one worker, sendfile on, access_log off, daemon off, pinned with
# taskset -c CPU. Sets BENCH_NGINX_PID and BENCH_NGINX_PORT; returns 1 with a
# message when it did not come up (three ports are tried). Stop it with
# bench_kill "$BENCH_NGINX_PID".
bench_nginx_start() {
  local dir=$1 root=$2 cpu=$3 nginx port user=""
  nginx=$(command -v nginx) || { bench_log "nginx not found"; return 1; }
  mkdir -p "$dir"
  [[ $(id -u) -eq 0 ]] && user="user root;"
  BENCH_NGINX_PID="" BENCH_NGINX_PORT=""
  for _ in 1 2 3; do
    port=$(bench_free_port) || return 1
    cat > "$dir/nginx.conf" <<CONF
$user
worker_processes 1;
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 10240; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000000;
  keepalive_timeout 60s;
  default_type application/octet-stream;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  server {
    listen 127.0.0.1:$port;
    root $root;
  }
}
CONF
    taskset -c "$cpu" "$nginx" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" > "$dir/stdout" 2> "$dir/stderr" &
    BENCH_NGINX_PID=$!
    if bench_wait_port "$port" 10 && kill -0 "$BENCH_NGINX_PID" 2>/dev/null; then
      # shellcheck disable=SC2034  # read by the scenarios that source this file
      BENCH_NGINX_PORT=$port
      return 0
    fi
    bench_kill "$BENCH_NGINX_PID"
    BENCH_NGINX_PID=""
  done
  bench_log "nginx did not start: $(tail -n 5 "$dir/stderr" "$dir/error.log" 2>/dev/null)"
  return 1
}

# bench_fit_mib WANT_MIB COPIES -> WANT_MIB, or less when COPIES files of that
# size would not fit in BENCH_WORK's free space (logged); returns 1 (printing
# nothing) when not even 1 MiB fits.
bench_fit_mib() {
  local want=$1 copies=$2 avail fit
  avail=$(($(df -Pk "$BENCH_WORK" | awk 'NR == 2 { print $4 }') / 1024))
  ((want * copies <= avail)) && { echo "$want"; return 0; }
  fit=$((avail / copies))
  ((fit >= 1)) || { bench_log "no room under $BENCH_WORK (${avail} MiB free) for $copies x $want MiB"; return 1; }
  bench_log "only ${avail} MiB free under $BENCH_WORK: size shrunk from $want to $fit MiB"
  echo "$fit"
}

# bench_random_file PATH MIB -> PATH holds MIB MiB of random bytes (a random
# seed of up to 64 MiB, repeated: incompressible, and quick to make).
bench_random_file() {
  local path=$1 mib=$2 seed_mib bytes
  bytes=$((mib * 1024 * 1024))
  seed_mib=$((mib < 64 ? mib : 64))
  head -c $((seed_mib * 1024 * 1024)) /dev/urandom > "$path.seed"
  : > "$path"
  while (($(stat -c %s "$path") < bytes)); do cat "$path.seed" >> "$path"; done
  truncate -s "$bytes" "$path"
  rm -f "$path.seed"
}

# bench_split_cores -> sets server_cpu and client_cpu to the first two CPUs this
# process may run on, for servers and clients pinned apart with taskset;
# returns 1 (both set to the one CPU) when only one is allowed.
bench_split_cores() {
  local cpus
  mapfile -t cpus < <(bench_cpus)
  # shellcheck disable=SC2034  # read by the scenarios that source this file
  server_cpu=${cpus[0]}
  # shellcheck disable=SC2034
  client_cpu=${cpus[1]:-${cpus[0]}}
  ((${#cpus[@]} > 1))
}

# bench_tls_certs DIR -> a CA (DIR/ca.pem) and a server certificate for
# 127.0.0.1 it signs (DIR/server.pem, key DIR/server.key), EC P-256, valid
# two days, made with the openssl CLI for tls+tcp:// rows. 1 when it fails.
bench_tls_certs() {
  local d=$1
  command -v openssl >/dev/null 2>&1 || return 1
  mkdir -p "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/ca.key" -out "$d/ca.pem" \
      -days 2 -subj "/CN=canopy bench CA" >/dev/null 2>&1 &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$d/server.key" -out "$d/server.csr" \
      -subj "/CN=127.0.0.1" >/dev/null 2>&1 &&
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
      -out "$d/server.pem" -extfile <(printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n') \
      >/dev/null 2>&1
}

# bench_ktls_note -> one line: whether this kernel offers kernel TLS (the tls
# ULP), for the details of tls+tcp:// rows.
bench_ktls_note() {
  local ulps
  ulps=$(cat /proc/sys/net/ipv4/tcp_available_ulp 2>/dev/null || echo "?")
  if grep -qw tls <<<"$ulps"; then
    echo "kernel TLS available (tcp_available_ulp: $ulps); OpenSSL $(openssl version 2>/dev/null | awk '{print $2}') offloads TLS 1.3 sending only"
  else
    echo "no kernel TLS here (tcp_available_ulp: $ulps): tls+tcp runs in user space (SSL_read/SSL_write, no sendfile/splice)"
  fi
}
