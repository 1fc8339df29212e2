#!/usr/bin/env bash
# bench/scenarios/rcopy_cp.sh — file copy: rcopy (client and server on this
# host, tcp://127.0.0.1) versus `cp` of the same file, both tmpfs -> tmpfs under
# BENCH_WORK. Each sample is the wall time of the whole command (process start
# included) turned into decimal Gbit/s; both write a fresh file every time, so
# tmpfs page allocation is in both. Goal: rcopy within 1.2x of cp's time.
# Also rcopy over tls+tcp:// (TLS 1.3, certificates made here with the
# openssl CLI) against rcopy over tcp://, paired in the same reps: goal
# >= 0.7x, which is meant for kernel TLS (see details.ktls for this host).
# Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

rcopy=$BENCH_BUILD/tools/rcopy/rcopy
[[ -x $rcopy ]] || { bench_log "$rcopy not built"; exit 1; }
reps=${BENCH_REPS:-3}
streams=4
chunk=4M
size_mb=$(bench_pick 16 512 2048)

work=$BENCH_WORK/rcopy_cp
server_pid="" tls_pid=""
cleanup() { bench_kill "$server_pid" "$tls_pid"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work/dst" "$work/cp"

# src + the copy being written + room: shrink if the tmpfs is short.
size_mb=$(bench_fit_mib "$size_mb" 3) || bench_skip "no room under $BENCH_WORK for the file and its copies"
bytes=$((size_mb * 1024 * 1024))

bench_log "creating a $size_mb MiB file (random bytes)"
src=$work/src.bin
bench_random_file "$src" "$size_mb"

"$rcopy" --server -q --root "$work/dst" --bind 127.0.0.1 -p 0 --port-file "$work/port" \
  2> "$work/server.err" &
server_pid=$!
bench_wait_file "$work/port" 10 || { bench_log "rcopy server did not start: $(cat "$work/server.err")"; exit 1; }
port=$(cat "$work/port")

# The same server over tls+tcp:// (TLS 1.3).
bench_need_peer openssl openssl || bench_skip "openssl (CLI) missing, needed to make the tls+tcp certificates"
bench_tls_certs "$work/pki" || { bench_log "could not make test certificates with openssl"; exit 1; }
mkdir -p "$work/dst-tls"
"$rcopy" --server -q --root "$work/dst-tls" --bind 127.0.0.1 -p 0 --port-file "$work/tls.port" --transport tls+tcp \
  --transport-arg "cert=$work/pki/server.pem key=$work/pki/server.key" 2> "$work/tls-server.err" &
tls_pid=$!
bench_wait_file "$work/tls.port" 10 || { bench_log "rcopy tls server did not start: $(cat "$work/tls-server.err")"; exit 1; }
tls_port=$(cat "$work/tls.port")
tls_args=(--transport tls+tcp --transport-arg "ca=$work/pki/ca.pem")

runs=$work/runs.jsonl
: > "$runs"

# rcopy_sample REP LABEL PORT ARGS... -> Gbit/s by wall clock; the JSON goes to runs.
rcopy_sample() {
  local rep=$1 label=$2 p=$3 t0 t1 out secs; shift 3
  t0=$(bench_now)
  out=$("$rcopy" --json -p "$p" --chunk "$chunk" "$@" "$src" "127.0.0.1:copy" 2> "$work/client.err") ||
    { bench_log "rcopy $label failed: $out $(cat "$work/client.err")"; return 1; }
  t1=$(bench_now)
  [[ $(jq -r .ok <<<"$out") == true ]] || { bench_log "rcopy $label failed: $out"; return 1; }
  secs=$(bench_elapsed "$t0" "$t1")
  jq -c --arg l "$label" --argjson r "$rep" --argjson s "$secs" \
    '{label: $l, rep: $r, wall_seconds: $s, rcopy: .}' <<<"$out" >> "$runs"
  rm -f "$work/dst/copy" "$work/dst-tls/copy"
  bench_gbps "$bytes" "$secs"
}

cp_sample() {
  local rep=$1 t0 t1 secs
  t0=$(bench_now)
  cp "$src" "$work/cp/copy"
  t1=$(bench_now)
  secs=$(bench_elapsed "$t0" "$t1")
  jq -cn --argjson r "$rep" --argjson s "$secs" '{label: "cp", rep: $r, wall_seconds: $s}' >> "$runs"
  rm -f "$work/cp/copy"
  bench_gbps "$bytes" "$secs"
}

rc=() cp1=() rcp=() cp2=() tl=() tlp=()
for ((rep = 1; rep <= reps; rep++)); do
  rc+=("$(rcopy_sample "$rep" rcopy "$port")")
  cp1+=("$(cp_sample "$rep")")
  rcp+=("$(rcopy_sample "$rep" "rcopy -P $streams" "$port" -P "$streams")")
  cp2+=("$(cp_sample "$rep")")
  tl+=("$(rcopy_sample "$rep" "rcopy tls+tcp" "$tls_port" "${tls_args[@]}")")
  tlp+=("$(rcopy_sample "$rep" "rcopy tls+tcp -P $streams" "$tls_port" "${tls_args[@]}" -P "$streams")")
  bench_log "rep $rep/$reps: rcopy ${rc[-1]}, cp ${cp1[-1]}, rcopy -P $streams ${rcp[-1]}, cp ${cp2[-1]}," \
    "rcopy tls+tcp ${tl[-1]}, rcopy tls+tcp -P $streams ${tlp[-1]} Gbit/s"
done
ktls=$(bench_ktls_note)
bench_log "$ktls"

goal_text="rcopy within 1.2x of cp's time"
comparisons=$(jq -s . <<EOC
$(bench_comparison "rcopy vs cp ($size_mb MiB, tmpfs -> tmpfs)" Gbit/s true \
  rcopy "$(bench_samples "${rc[@]}")" cp "$(bench_samples "${cp1[@]}")" 0.83 "$goal_text")
$(bench_comparison "rcopy -P $streams vs cp ($size_mb MiB, tmpfs -> tmpfs)" Gbit/s true \
  "rcopy -P $streams" "$(bench_samples "${rcp[@]}")" cp "$(bench_samples "${cp2[@]}")" 0.83 "$goal_text")
$(bench_comparison "rcopy tls+tcp vs rcopy tcp ($size_mb MiB, tmpfs -> tmpfs)" Gbit/s true \
  "rcopy tls+tcp" "$(bench_samples "${tl[@]}")" "rcopy tcp" "$(bench_samples "${rc[@]}")" 0.7 \
  "tls+tcp at least 0.7x plain TCP (goal under kernel TLS)")
$(bench_comparison "rcopy tls+tcp -P $streams vs rcopy tcp -P $streams ($size_mb MiB, tmpfs -> tmpfs)" Gbit/s true \
  "rcopy tls+tcp -P $streams" "$(bench_samples "${tlp[@]}")" "rcopy tcp -P $streams" "$(bench_samples "${rcp[@]}")" 0.7 \
  "tls+tcp at least 0.7x plain TCP (goal under kernel TLS)")
EOC
)

jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" \
  --argjson bytes "$bytes" --argjson reps "$reps" --argjson streams "$streams" --arg chunk "$chunk" \
  --argjson cpus "$(nproc)" --arg fs "$(df -PT "$BENCH_WORK" | awk 'NR == 2 { print $2 " " $7 }')" \
  --arg cpv "$(cp --version | head -n 1)" --arg ktls "$ktls" --arg sslv "$(openssl version)" \
  '{scenario: "rcopy_cp",
    title: "rcopy vs cp: one file, tmpfs -> tmpfs",
    path: "rcopy: tcp://127.0.0.1 and tls+tcp://127.0.0.1 (TLS 1.3) kernel loopback (same-host TCP, no NIC), tmpfs -> tmpfs; cp: tmpfs -> tmpfs, no network",
    params: {file_bytes: $bytes, reps: $reps, parallel_streams: $streams, chunk: $chunk, cpus: $cpus,
             filesystem: $fs, order: "per rep: rcopy, cp, rcopy -P, cp, rcopy tls+tcp, rcopy tls+tcp -P",
             metric: "file bytes * 8 / wall seconds of the whole command / 1e9 (process start included)"},
    comparisons: $comparisons,
    details: {cp_version: $cpv, ktls: $ktls, openssl: $sslv,
              tls: "tls+tcp rows pair with the plain rcopy samples of the same rep (a[i] ran next to b[i])",
              runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
