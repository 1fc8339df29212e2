#!/usr/bin/env bash
# bench/scenarios/rcopy_iperf3.sh — network only: `rcopy --sink` (the server
# discards what it receives) versus iperf3, plain and with -Z (zero-copy
# sendfile), single stream and -P 4, the same number of bytes each time, over
# tcp://127.0.0.1. Samples are receiver-side decimal Gbit/s: rcopy's own report
# (bytes / time until the server confirmed every byte), iperf3's sum_received.
# Goal: rcopy --sink >= 0.9x iperf3. Also rcopy --sink over tls+tcp://
# (TLS 1.3, certificates made here with the openssl CLI) against rcopy --sink
# over tcp://, paired in the same reps: goal >= 0.7x, meant for kernel TLS
# (see details.ktls for this host). Contract: bench/lib.sh.
set -euo pipefail
source "$BENCH_REPO/bench/lib.sh"

rcopy=$BENCH_BUILD/tools/rcopy/rcopy
[[ -x $rcopy ]] || { bench_log "$rcopy not built"; exit 1; }
bench_need_peer iperf3 iperf3 || bench_skip "iperf3 missing and cannot be installed (apt-get install iperf3 needs root)"
reps=${BENCH_REPS:-3}
streams=4
chunk=4M
# iperf3 3.12 under-reports sum_received for -P runs of a few tens of MiB, so
# even tiny mode sends 128 MiB (a fraction of a second on loopback).
size_mb=$(bench_pick 128 1024 2048)

work=$BENCH_WORK/rcopy_iperf3
server_pid="" iperf_pid="" tls_pid=""
cleanup() { bench_kill "$server_pid" "$iperf_pid" "$tls_pid"; rm -rf "$work"; }
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
mkdir -p "$work/dst"

size_mb=$(bench_fit_mib "$size_mb" 2) || bench_skip "no room under $BENCH_WORK for the source file"
bytes=$((size_mb * 1024 * 1024))
src=$work/src.bin
bench_log "creating a $size_mb MiB source file"
bench_random_file "$src" "$size_mb"

"$rcopy" --server -q --root "$work/dst" --bind 127.0.0.1 -p 0 --port-file "$work/port" \
  2> "$work/server.err" &
server_pid=$!
bench_wait_file "$work/port" 10 || { bench_log "rcopy server did not start: $(cat "$work/server.err")"; exit 1; }
port=$(cat "$work/port")

bench_need_peer openssl openssl || bench_skip "openssl (CLI) missing, needed to make the tls+tcp certificates"
bench_tls_certs "$work/pki" || { bench_log "could not make test certificates with openssl"; exit 1; }
"$rcopy" --server -q --root "$work/dst" --bind 127.0.0.1 -p 0 --port-file "$work/tls.port" --transport tls+tcp \
  --transport-arg "cert=$work/pki/server.pem key=$work/pki/server.key" 2> "$work/tls-server.err" &
tls_pid=$!
bench_wait_file "$work/tls.port" 10 || { bench_log "rcopy tls server did not start: $(cat "$work/tls-server.err")"; exit 1; }
tls_port=$(cat "$work/tls.port")

iperf_port=$(bench_free_port)
iperf3 -s -B 127.0.0.1 -p "$iperf_port" > "$work/iperf3.out" 2>&1 &
iperf_pid=$!
bench_wait_port "$iperf_port" 10 || { bench_log "iperf3 server did not start: $(cat "$work/iperf3.out")"; exit 1; }

runs=$work/runs.jsonl
: > "$runs"

# sink_sample REP PARALLEL [tls] -> rcopy --sink receiver-side Gbit/s.
sink_sample() {
  local rep=$1 p=$2 out label args=(-p "$port")
  label="rcopy --sink -P $p"
  if [[ ${3:-} == tls ]]; then
    args=(-p "$tls_port" --transport tls+tcp --transport-arg "ca=$work/pki/ca.pem")
    label="rcopy --sink tls+tcp -P $p"
  fi
  out=$("$rcopy" --json "${args[@]}" --chunk "$chunk" --sink -P "$p" "$src" "127.0.0.1:sink" 2> "$work/client.err") ||
    { bench_log "$label failed: $out $(cat "$work/client.err")"; return 1; }
  [[ $(jq -r .ok <<<"$out") == true ]] || { bench_log "$label failed: $out"; return 1; }
  jq -c --arg l "$label" --argjson r "$rep" '{label: $l, rep: $r, rcopy: .}' <<<"$out" >> "$runs"
  jq -r '.gbit_per_s * 10000 | round / 10000' <<<"$out"
}

# iperf_sample REP PARALLEL [-Z] -> iperf3 receiver-side Gbit/s.
iperf_sample() {
  local rep=$1 p=$2 out; shift 2
  out=$(iperf3 -c 127.0.0.1 -p "$iperf_port" -n "$bytes" -P "$p" "$@" -J) ||
    { bench_log "iperf3${*:+ $*} -P $p failed: $(jq -r '.error // empty' <<<"$out" 2>/dev/null)"; return 1; }
  jq -c --arg l "iperf3${*:+ $*} -P $p" --argjson r "$rep" \
    '{label: $l, rep: $r, received: .end.sum_received, sent: .end.sum_sent,
      cpu: .end.cpu_utilization_percent}' <<<"$out" >> "$runs"
  jq -r '.end.sum_received.bits_per_second / 1e9 * 10000 | round / 10000' <<<"$out"
}

s1=() i1=() s1z=() i1z=() sp=() ip=() spz=() ipz=() t1=() tp=()
for ((rep = 1; rep <= reps; rep++)); do
  s1+=("$(sink_sample "$rep" 1)"); i1+=("$(iperf_sample "$rep" 1)")
  s1z+=("$(sink_sample "$rep" 1)"); i1z+=("$(iperf_sample "$rep" 1 -Z)")
  sp+=("$(sink_sample "$rep" "$streams")"); ip+=("$(iperf_sample "$rep" "$streams")")
  spz+=("$(sink_sample "$rep" "$streams")"); ipz+=("$(iperf_sample "$rep" "$streams" -Z)")
  t1+=("$(sink_sample "$rep" 1 tls)"); tp+=("$(sink_sample "$rep" "$streams" tls)")
  bench_log "rep $rep/$reps Gbit/s: sink ${s1[-1]} / iperf3 ${i1[-1]}, sink ${s1z[-1]} / iperf3 -Z ${i1z[-1]}," \
    "sink -P $streams ${sp[-1]} / iperf3 -P $streams ${ip[-1]}, sink -P $streams ${spz[-1]} / iperf3 -Z -P $streams ${ipz[-1]}," \
    "sink tls+tcp ${t1[-1]}, sink tls+tcp -P $streams ${tp[-1]}"
done
ktls=$(bench_ktls_note)
bench_log "$ktls"
tls_goal="tls+tcp at least 0.7x plain TCP (goal under kernel TLS)"

goal_text="rcopy --sink at least 0.9x iperf3"
cmp() {  # name label-a samples-a label-b samples-b
  bench_comparison "$1 ($size_mb MiB)" Gbit/s true "$2" "$(bench_samples $3)" "$4" "$(bench_samples $5)" 0.9 "$goal_text"
}
comparisons=$(jq -s . <<EOC
$(cmp "rcopy --sink vs iperf3" "rcopy --sink" "${s1[*]}" iperf3 "${i1[*]}")
$(cmp "rcopy --sink vs iperf3 -Z" "rcopy --sink" "${s1z[*]}" "iperf3 -Z" "${i1z[*]}")
$(cmp "rcopy --sink -P $streams vs iperf3 -P $streams" "rcopy --sink -P $streams" "${sp[*]}" "iperf3 -P $streams" "${ip[*]}")
$(cmp "rcopy --sink -P $streams vs iperf3 -Z -P $streams" "rcopy --sink -P $streams" "${spz[*]}" "iperf3 -Z -P $streams" "${ipz[*]}")
$(bench_comparison "rcopy --sink tls+tcp vs tcp ($size_mb MiB)" Gbit/s true "rcopy --sink tls+tcp" \
  "$(bench_samples ${t1[*]})" "rcopy --sink tcp" "$(bench_samples ${s1[*]})" 0.7 "$tls_goal")
$(bench_comparison "rcopy --sink tls+tcp -P $streams vs tcp -P $streams ($size_mb MiB)" Gbit/s true \
  "rcopy --sink tls+tcp -P $streams" "$(bench_samples ${tp[*]})" "rcopy --sink tcp -P $streams" \
  "$(bench_samples ${sp[*]})" 0.7 "$tls_goal")
EOC
)

jq -n --argjson comparisons "$comparisons" --slurpfile runs "$runs" \
  --argjson bytes "$bytes" --argjson reps "$reps" --argjson streams "$streams" --arg chunk "$chunk" \
  --argjson cpus "$(nproc)" --arg iperf "$(iperf3 --version | head -n 1)" --arg ktls "$ktls" \
  --arg sslv "$(openssl version)" \
  '{scenario: "rcopy_iperf3",
    title: "rcopy --sink vs iperf3: network only",
    path: "tcp://127.0.0.1 and tls+tcp://127.0.0.1 (TLS 1.3) kernel loopback (same-host TCP, no NIC)",
    params: {bytes_per_run: $bytes, reps: $reps, parallel_streams: $streams, rcopy_chunk: $chunk,
             iperf3_block: "default (128 KiB)", cpus: $cpus,
             order: "per rep: sink, iperf3, sink, iperf3 -Z, sink -P, iperf3 -P, sink -P, iperf3 -Z -P, sink tls+tcp, sink tls+tcp -P",
             metric: "receiver-side decimal Gbit/s: rcopy --json gbit_per_s, iperf3 end.sum_received.bits_per_second",
             copies: "rcopy --sink: the client sendfile()s from tmpfs, the server splice()s socket -> pipe -> /dev/null, so neither side copies the bytes into user memory; iperf3 writes from and reads into user buffers (-Z: sendfile on the sending side only, the receiver still copies). Compare with iperf3 -Z for the closest pairing."},
    comparisons: $comparisons,
    details: {iperf3_version: $iperf, ktls: $ktls, openssl: $sslv,
              tls: "tls+tcp rows pair with the first plain rcopy --sink samples of the same rep; without kernel TLS the sender reads the file into user memory and encrypts it (no sendfile), the receiver decrypts with SSL_read (no splice)",
              runs: $runs}}' > "$BENCH_OUT"
bench_log "wrote $BENCH_OUT"
