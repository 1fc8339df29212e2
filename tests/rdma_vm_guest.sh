#!/usr/bin/env bash
# What the rdma_vm tests run inside the Soft-RoCE guests of hw/rdma-vm.sh
# (driven by tests/rdma_vm_test.sh; every wait is bounded).
#
# usage (in a guest): rdma_vm_guest.sh single BUILD_DIR    (one guest: both local suites in turn)
#                     rdma_vm_guest.sh pair-a BUILD_DIR    (guest A: clients, cluster nodes 1 and 2)
#                     rdma_vm_guest.sh pair-b BUILD_DIR    (guest B: rcopy server, cluster node 3;
#                                                           powers itself off at the end)
# One boot does everything; a pair runs in three phases:
# 1. each guest over its own rxe0 at once (2 host cores: both busy): A the rdma:// conformance
#    suite (event mode, busy-poll with small slots), the one-sided log ring and stream tests and
#    a cluster with --one-sided-replication (replication over the rings), B the cluster tests with every node on
#    rdma:// (QUORUM commits, a killed replica caught up by delta and by snapshot, a killed
#    leader with failover, no acknowledged write lost), then the suite over fault+rdma://
#    without faults;
# 2. between the guests: rcopy A -> B over rdma:// byte-exact (empty, 1 byte, a few MiB, -P 2,
#    --verify, --resume after the server is stopped half way), a 3-node cluster split over the
#    guests on rdma:// (QUORUM commits, the replica on B SIGKILLed, commits on without it,
#    restarted and caught up, ALL commit, one digest, every acknowledged write present);
# 3. guest B powers off while A copies to it: A's copy must fail with Unavailable within its
#    --timeout (io_timeout) of B vanishing.
# Guests share $CANOPY_VM_OUT (9p): a and b write only their own subdirectory, and signal each
# other with files there. CANOPY_VM_FULL=1 runs the whole conformance suite (64 MiB cases too).
set -euo pipefail

mode=$1
build=$2
rcopy=$build/tools/rcopy/rcopy
canopy=$build/tools/canopy/canopy
out=${CANOPY_VM_OUT:?not in a hw/rdma-vm.sh guest}
a_dir=$out/a
b_dir=$out/b
self=${CANOPY_VM_SELF:?}
peer=${CANOPY_VM_PEER:-}
work=/tmp/rdma-vm-work-$mode
mkdir -p "$work"
start=$(date +%s)
step() { echo "=== [$(($(date +%s) - start)) s] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
case $mode in pair-a) mine=$a_dir other=$b_dir ;; *) mine=$b_dir other=$a_dir ;; esac
# wait_for PATH SECONDS: a file appears (non-empty); gives up early when the other guest's
# script has ended (it leaves "finished"), so that one failure does not stall both guests.
wait_for() {
  wait_until "[[ -s $1 ]]" "$2" "$1"
}
# wait_until CONDITION SECONDS WHAT: the bash CONDITION holds (wall clock bound; TCG is slow).
wait_until() {
  local deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    eval "$1" && return 0
    [[ $mode != single && -e $other/finished ]] && fail "the other guest finished while this one waited for $3"
    sleep 0.1
  done
  fail "timed out after $2 s waiting for $3"
}
pids=()
finish() {
  local rc=$?
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if ((rc != 0)); then
    for log in "$work"/*.log; do [[ -f $log ]] && { echo "--- $log" >&2; tail -15 "$log" >&2; }; done
  fi
  [[ $mode == single ]] || echo finished >"$mine/finished"
}
trap finish EXIT

ulimit -l unlimited 2>/dev/null || echo "note: memlock limit stays $(ulimit -l)" >&2

# ------------------------------------------------------------------ suites within one guest

# conformance VARIANTS: the conformance suite over this guest's rxe0 (both ends in one process)
# for the instantiations matching VARIANTS (a gtest pattern).
conformance() {
  # Left out by default, for time under TCG (2 host cores for both guests): every 64 MiB case
  # (the same slot and READ paths carry the 8 MiB bulk cases; on hardware all of them run), and
  # the busy-poll variant's concurrent connections (its spinning threads outnumber the vCPUs).
  local filter=$1
  if [[ -z ${CANOPY_VM_FULL:-} ]]; then
    filter+=':-*CarriesPayloadsFromOneByteTo64MiB/*:*PeerClosingMidBulk*/*:*SlowReceiverBlocksTheSender/*'
    filter+=':*ServesSeveralConnectionsConcurrently/busy_poll_small_slots'
  fi
  step "rdma_transport_test: conformance $1 on rdma://$self"
  "$build/tests/rdma_transport_test" --gtest_brief=1 --gtest_filter="$filter"
  step "conformance passed"
}

# The one-sided log ring (transport/rdma/log_ring.h) between two connection ends over rxe0:
# order across wraparound, a full ring holding the writer, revocation fencing a stale writer;
# the one-sided stream over two rings (transport/rdma/one_sided_stream.h): order across ring,
# stream and bulk, a vanished peer seen as Unavailable, a destroyed end fencing its writer;
# then a 3-node cluster on rdma://self with --one-sided-replication (QUORUM commits, a killed
# replica caught up over the rings, equal digests, every stream over a ring).
log_ring_tests() {
  step "rdma_transport_test: one-sided log ring and stream on rdma://$self"
  "$build/tests/rdma_transport_test" --gtest_brief=1 --gtest_filter='RdmaLogRing.*:RdmaOneSidedStream.*'
  step "log ring tests passed"
  step "cluster with --one-sided-replication on rdma://$self"
  CANOPY_TEST_CLUSTER_LISTEN="rdma://$self:0" "$build/tests/cluster_replication_test" --gtest_brief=1 \
    --gtest_filter='ClusterReplicationTest.OneSidedReplicationOptionReplicatesAndCatchesUp'
  step "one-sided cluster test passed"
}

# The cluster tests with every node listening on rdma://self.
cluster_tests() {
  step "cluster tests with every node on rdma://$self"
  CANOPY_TEST_CLUSTER_LISTEN="rdma://$self:0" "$build/tests/cluster_replication_test" --gtest_brief=1 \
    --gtest_filter='ClusterReplicationTest.QuorumWritesSurviveKilledReplicaWhichCatchesUp:ClusterReplicationTest.ReplicaBehindTruncatedWalGetsSnapshot'
  CANOPY_TEST_CLUSTER_LISTEN="rdma://$self:0" "$build/tests/cluster_failover_test" --gtest_brief=1 \
    --gtest_filter='ClusterFailoverTest.LeaderKilledDuringQuorumWritesLosesNoAcknowledgedWrite'
  step "cluster tests passed"
}

if [[ $mode == single ]]; then
  conformance '*Conformance*'
  log_ring_tests
  cluster_tests
  step "done"
  exit 0
fi

# Phase 1 in both guests at once; each then waits for the other's verdict.
# (The conformance variants are split so that both guests take about as long.)
case $mode in
  pair-a) conformance 'Rdma/*Conformance*'; log_ring_tests ;;
  pair-b) cluster_tests; conformance 'FaultRdma/*Conformance*' ;;
  *) fail "unknown mode $mode" ;;
esac
echo ok >"$mine/phase1"
wait_for "$other/phase1" 900

# ------------------------------------------------------------------ guest pair

port=7471
secret=$out/cluster.secret
cluster=(--cluster vm --secret-file "$secret")

if [[ $mode == pair-b ]]; then
  mkdir -p "$work/in"
  server() {  # server LOG: rcopy server on rdma://self:7471, listening once $work/rcopy.port exists
    rm -f "$work/rcopy.port"
    "$rcopy" --server --root "$work/in" --transport rdma --bind "$self" --port "$port" \
      --idle-timeout 30 --connect-timeout 30 --port-file "$work/rcopy.port" >"$1" 2>&1 &
    pids+=($!)
    server_pid=$!
    wait_until "[[ -s $work/rcopy.port ]] || ! kill -0 $server_pid 2>/dev/null" 60 "the rcopy server"
    [[ -s $work/rcopy.port ]] || { cat "$1" >&2; fail "rcopy server did not start"; }
  }
  step "rcopy server on rdma://$self:$port"
  server "$work/server1.log"
  echo "$port" >"$b_dir/rcopy.ready"
  # --resume: stop the server (SIGTERM: it keeps what arrived as .big.bin.rcopy-partial; after a
  # SIGKILL only its .tmp file remains, which --resume does not use) once over 1 MiB of the big
  # file has arrived, then restart it. The .tmp file has its final size from the start (a hole);
  # its allocated blocks tell what arrived, up to one 256 KiB chunk ahead (rdma:// READs straight
  # into the pages of a tmpfs file, which registering the chunk allocates): wait for 2 MiB.
  arrived() { stat -c '%b %B' "$work"/in/.big.bin.rcopy-*.tmp 2>/dev/null | head -1 | awk '{print $1 * $2}'; }
  wait_until '[[ $(arrived) -ge 2097152 ]] 2>/dev/null' 120 "2 MiB of big.bin"
  kill -TERM "$server_pid"
  wait "$server_pid" 2>/dev/null || true
  partial=$work/in/.big.bin.rcopy-partial
  [[ -f $partial ]] || fail "the stopped server left no $partial"
  step "rcopy server stopped with $(stat -c %s "$partial") bytes of big.bin kept; restarted"
  server "$work/server2.log"
  echo "$port" >"$b_dir/rcopy.restarted"
  wait_for "$a_dir/rcopy.done" 240
  (cd "$work/in" && sha256sum empty.bin one.bin mid.bin par.bin big.bin) >"$b_dir/sums"
  step "received files hashed"

  step "cluster node 3 on rdma://$self"
  wait_for "$a_dir/node1.uri" 120
  node3() {
    "$canopy" node --listen "${1:-rdma://$self:0}" --data "$work/node3" --node-id 3 "${cluster[@]}" \
      --seed "$(cat "$a_dir/node1.uri")" --uri-file "$b_dir/node3.uri" --heartbeat-ms 100 --failure-ms 3000 \
      --log warn >>"$work/node3.log" 2>&1 &
    pids+=($!)
    node3_pid=$!
  }
  node3
  wait_for "$b_dir/node3.uri" 60
  wait_until "[[ -e $a_dir/kill-node3 || -e $a_dir/cluster.done ]]" 300 "the cluster checks"
  if [[ -e $a_dir/kill-node3 ]]; then
    kill -9 "$node3_pid"
    wait "$node3_pid" 2>/dev/null || true
    echo killed >"$b_dir/node3.killed"
    step "node 3 SIGKILLed"
    wait_for "$a_dir/restart-node3" 240
    rm -f "$b_dir/node3.uri"
    node3 "$(cat "$a_dir/node3.uri.first" 2>/dev/null || true)"
    wait_for "$b_dir/node3.uri" 60
    step "node 3 restarted"
  fi
  wait_for "$a_dir/cluster.done" 240

  step "powering off while guest A copies to this guest"
  wait_for "$a_dir/vanish.started" 120
  # Let the copy run, then vanish: no orderly shutdown, no disconnect reaches A.
  wait_until '[[ -n $(ls "$work"/in/.vanish.bin.rcopy-*.tmp 2>/dev/null) ]]' 60 "the copy of vanish.bin"
  sleep 2
  echo 0 >"$b_dir/rc"
  echo gone >"$b_dir/vanished"
  sync
  echo o >/proc/sysrq-trigger
  sleep 30
  fail "still running after sysrq power-off"
fi

[[ $mode == pair-a ]] || fail "unknown mode $mode"

# --- rcopy between the guests, byte-exact
step "rcopy to rdma://$peer:$port"
wait_for "$b_dir/rcopy.ready" 120
: >"$work/empty.bin"
printf 'x' >"$work/one.bin"
head -c $((3 * 1024 * 1024 + 12345)) /dev/urandom >"$work/mid.bin"
head -c $((2 * 1024 * 1024 + 7)) /dev/urandom >"$work/par.bin"
head -c $((8 * 1024 * 1024)) /dev/urandom >"$work/big.bin"
# Connection set-up between TCG guests takes seconds (connection manager exchange over rxe).
copy() { "$rcopy" --transport rdma --port "$port" --connect-timeout 30 "$@"; }
# The first rdma_cm connection from one TCG guest to the other fails with
# RDMA_CM_EVENT_CONNECT_ERROR (seen every time; later ones succeed; not yet understood, see
# hw/RDMA.md): the first copy may take up to three attempts, every later one must succeed at once.
for attempt in 1 2 3; do
  copy --timeout 20 --verify "$work/empty.bin" "$peer:empty.bin" && break
  ((attempt < 3)) || fail "the first copy failed three times"
  echo "first connection, attempt $attempt failed; again"
done
copy --timeout 20 --verify "$work/one.bin" "$peer:one.bin"
copy --timeout 20 --verify --chunk 1M "$work/mid.bin" "$peer:mid.bin"
copy --timeout 20 --verify -P 2 --chunk 256K "$work/par.bin" "$peer:par.bin"
step "rcopy --resume after the server is stopped half way"
# Slow enough (16 Mbit/s: 4 s for 8 MiB) that B stops its server half way.
if copy --timeout 20 --verify --rate 16M --chunk 256K "$work/big.bin" "$peer:big.bin" >"$work/big1.log" 2>&1; then
  cat "$work/big1.log"; fail "the copy survived its server being stopped"
fi
wait_for "$b_dir/rcopy.restarted" 60
copy --timeout 20 --verify --resume --json --chunk 1M "$work/big.bin" "$peer:big.bin" >"$work/resume.json" ||
  { cat "$work/resume.json"; fail "resume failed"; }
skipped=$(jq -r '.. | objects | select(has("bytes_skipped")) | .bytes_skipped' "$work/resume.json" | head -1)
echo "resume: $skipped bytes skipped"
[[ $skipped -ge 1048576 ]] || { cat "$work/resume.json"; fail "resume skipped $skipped bytes, expected >= 1 MiB"; }
echo done >"$a_dir/rcopy.done"
wait_for "$b_dir/sums" 120
(cd "$work" && sha256sum -c "$b_dir/sums") || fail "received files differ from the sources"
step "rcopy: 5 files byte-exact on guest B"

# --- 3-node cluster over rdma://, nodes 1 and 2 here, node 3 on guest B
step "cluster: nodes 1, 2 on rdma://$self, node 3 on rdma://$peer"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$secret"
for n in 1 2; do
  seed=()
  [[ $n -gt 1 ]] && seed=(--seed "$(cat "$a_dir/node1.uri")")
  "$canopy" node --listen "rdma://$self:0" --data "$work/node$n" --node-id "$n" "${cluster[@]}" "${seed[@]}" \
    --uri-file "$work/node$n.uri.tmp" --heartbeat-ms 100 --failure-ms 3000 --log warn >"$work/node$n.log" 2>&1 &
  pids+=($!)
  wait_for "$work/node$n.uri.tmp" 60
  cp "$work/node$n.uri.tmp" "$a_dir/node$n.uri"
done
wait_for "$b_dir/node3.uri" 120
cp "$b_dir/node3.uri" "$a_dir/node3.uri.first"
node1=$(cat "$a_dir/node1.uri")
alive() { "$canopy" status --node "$node1" "${cluster[@]}" --json 2>/dev/null | grep -o '"alive":true' | wc -l || true; }
deadline=$((SECONDS + 120)); while ((SECONDS < deadline)); do [[ $(alive) -ge 3 ]] && break; sleep 0.2; done
[[ $(alive) -ge 3 ]] || fail "the three nodes do not see each other"
created=""
for attempt in 1 2 3; do
  created=$("$canopy" create-tree --node "$node1" "${cluster[@]}" --tree vm 2>&1) && break
  echo "create-tree attempt $attempt: $created" >&2
  # A retried create of a tree the first attempt made: ask who leads it.
  grep -qi 'exist' <<<"$created" && break
done
echo "$created"
leader=$(sed -n 's/^created vm on leader \([^ ]*\) .*/\1/p' <<<"$created")
[[ -n $leader ]] || fail "no leader in: $created"
# A commit that failed before it was acknowledged may be sent again (puts are idempotent): under
# TCG on a loaded host a CLI process can miss the node's 5 s handshake bound ("refused ...:
# receive deadline passed", the client sees the connection closed). Only acknowledged commits
# count; none of them may be lost.
commit() {
  local attempt out
  for attempt in 1 2 3; do
    if out=$("$canopy" commit --node "$leader" "${cluster[@]}" --tree vm --cl "$1" --put "/:$2=$3" 2>&1); then
      echo "$out"; return 0
    fi
    echo "commit $2 attempt $attempt: $out" >&2
    grep -Eq 'Closed|Unavailable|Timeout|deadline|refused' <<<"$out" || return 1
  done
  return 1
}
acked=()
# Few CLI processes: each costs seconds under TCG (start, connection set-up); the bulk of the
# commits goes through one `canopy bench`.
for i in $(seq 1 5); do commit QUORUM "k$i" "v$i" >/dev/null && acked+=("k$i"); done
((${#acked[@]} == 5)) || fail "only ${#acked[@]} of 5 QUORUM commits acknowledged"
for attempt in 1 2 3; do
  "$canopy" bench --node "$leader" "${cluster[@]}" --tree vm --count 30 --cl QUORUM && break
  ((attempt < 3)) || fail "canopy bench failed three times"
done
# The replica to kill: node 3 on guest B, unless it leads the tree (then node 2, here).
if [[ $leader == "$(cat "$a_dir/node3.uri.first")" ]]; then victim=2; else victim=3; fi
step "SIGKILL replica node $victim, commit on without it"
if ((victim == 3)); then
  echo kill >"$a_dir/kill-node3"
  wait_for "$b_dir/node3.killed" 60
else
  kill -9 "${pids[1]}"
  wait "${pids[1]}" 2>/dev/null || true
fi
for i in $(seq 6 10); do commit QUORUM "k$i" "v$i" >/dev/null && acked+=("k$i"); done
((${#acked[@]} == 10)) || fail "QUORUM commits failed with one replica down (${#acked[@]} of 10 acknowledged)"
if ((victim == 3)); then
  echo restart >"$a_dir/restart-node3"
else
  "$canopy" node --listen "$(cat "$a_dir/node2.uri")" --data "$work/node2" --node-id 2 "${cluster[@]}" \
    --seed "$node1" --uri-file "$work/node2.uri.again" --heartbeat-ms 100 --failure-ms 3000 --log warn \
    >>"$work/node2.log" 2>&1 &
  pids+=($!)
fi
step "node $victim restarting; ALL commit once it caught up"
ok=0
deadline=$((SECONDS + 120))
while ((SECONDS < deadline)); do
  if out_all=$(commit ALL final done 2>&1); then ok=1; break; fi
  sleep 1
done
((ok)) || fail "no ALL commit after node 3 restarted: $out_all"
version=$(sed -n 's/^committed version \([0-9]*\).*/\1/p' <<<"$out_all")
converged=0
deadline=$((SECONDS + 60))
while ((SECONDS < deadline)); do
  table=$("$canopy" status --node "$node1" "${cluster[@]}" --all 2>/dev/null || true)
  n=$(grep -c "^vm .*version $version digest" <<<"$table" || true)
  d=$(grep "^vm " <<<"$table" | grep -o "version $version digest [0-9a-f]*" | sort -u | wc -l)
  if [[ $n -eq 3 && $d -eq 1 ]]; then converged=1; break; fi
  sleep 0.2
done
echo "$table" | grep '^vm ' || true
((converged)) || fail "the three replicas did not converge to one digest at version $version"
tree_json=$("$canopy" read --node "$node1" "${cluster[@]}" --tree vm --json)
for k in "${acked[@]}"; do grep -q "\"$k\"" <<<"$tree_json" || fail "acknowledged write $k lost"; done
step "cluster: 3 replicas at version $version, one digest, ${#acked[@]} acknowledged writes present"
echo done >"$a_dir/cluster.done"

# --- guest B powers off during a copy: seen as Unavailable within the timeout
step "guest B powers off during a copy"
head -c $((16 * 1024 * 1024)) /dev/urandom >"$work/vanish.bin"
echo started >"$a_dir/vanish.started"
timeout_s=8
copy --timeout "$timeout_s" --rate 8M --chunk 256K "$work/vanish.bin" "$peer:vanish.bin" >"$work/vanish.log" 2>&1 &
copy_pid=$!
pids+=($copy_pid)
# B announces (shared directory) the moment before it powers off; A notes when it saw that.
wait_until "[[ -e $b_dir/vanished ]] || ! kill -0 $copy_pid 2>/dev/null" 120 "guest B to power off"
[[ -e $b_dir/vanished ]] || { cat "$work/vanish.log"; fail "the copy ended before guest B powered off"; }
t0=$(date +%s.%N)
copy_rc=0
wait "$copy_pid" || copy_rc=$?
t1=$(date +%s.%N)
elapsed=$(echo "$t1 - $t0" | bc)
((copy_rc != 0)) || fail "the copy to a powered-off guest succeeded"
echo "copy failed ${elapsed} s after guest B powered off: $(tail -1 "$work/vanish.log")"
# The keepalive probe (transport/rdma/keepalive.h) makes a vanished peer Unavailable (QP retries
# exhausted) within about 3/4 of io_timeout, whether the copy was sending or blocked on credits.
grep -q 'Unavailable' "$work/vanish.log" ||
  { cat "$work/vanish.log"; fail "the vanished peer was not reported as Unavailable"; }
# + 2 s: polling and the shared directory's delay between B's note and its power-off.
echo "$elapsed <= $timeout_s + 2" | bc | grep -q 1 || fail "the vanished peer was noticed only after $elapsed s"
step "done"
