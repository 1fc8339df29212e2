// Node: one canopy cluster member — a tree Store served to clients and
// replicated to/from peers.
//
// Placement: every node knows the cluster members (node id -> URI; from
// --seed URIs, HELLOs of peers that dial it and heartbeat gossip; persisted in
// DIR/members) and builds the same Ring from them. The owners of a tree are
// Ring::Owners(tree name); the first owner leads it (epoch 1).
//
// Replication: every replica (an owner that is not the leader) keeps one
// connection to the leader: SUBSCRIBE {tree, epoch, have = its latest version};
// the leader answers with deltas read from its WAL, or a streamed snapshot
// when the WAL no longer holds them, then streams every new DELTA as it is
// committed. The replica applies each (fsynced per --fsync) and ACKs its
// durable version. A COMMIT to the leader is written to its WAL, then the
// leader waits until RequiredAcks(level, owners) owners (itself included)
// hold the new version durably, and answers; on timeout the answer is
// Timeout naming the version (it stays committed on the leader and reaches
// the replicas later). A dead replica does not block ONE/QUORUM writes; on
// reconnect it catches up (deltas or snapshot).
//
// Failure detection: every heartbeat_interval a node probes one member
// (SWIM: a PROBE answered by an ack; when none comes, ping-req through two
// others), with membership and tree-name gossip piggybacked digest-first, so
// that an idle node's cost does not grow with the cluster. A leader streams
// heartbeats to its replicas. Liveness (STATUS) comes from a phi-accrual
// detector over every message a peer sends, and from loss evidence: a
// refused, closed or reset connection or an unanswered probe marks the peer
// dead until it is heard from again. A peer that is malformed or fails
// authentication gets ERROR, is dropped and logged; the node keeps serving.
//
// Leader failover (with the metadata service, NodeOptions::raft_address):
// the tree's leader and epoch live in the metadata raft; a replica whose
// stream from the leader broke and whose redial is refused (or whose leader
// went silent: phi, or failure_timeout) asks the other owners directly for
// their state (TREE_STATE_REQUEST). An owner still following that leader
// vetoes; one that no longer does reports its (data epoch, version) and
// stays off that leader's epoch for failure_timeout. With a quorum of owners
// compared, the one with the newest (data epoch, version) (lowest id on
// ties) takes over by CompareAndSetLeader on the epoch. Every
// stream message carries the epoch and replicas refuse any other than the
// one they follow; a deposed leader cannot gather acks any more. A replica
// whose data comes from an older epoch beyond the point the new leader took
// over (e.g. a restarted old leader with un-acked writes) is resynchronised
// by snapshot, which replaces its divergent suffix whole.
//
// Node join: every tree a node now owns streams to it from its leader, its
// newest checkpoint file whole on the bulk path, then deltas (README.md).
//
// Thread safety: Start/Stop from one thread; the node runs its own threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "replication/protocol.h"
#include "replication/ring.h"
#include "tree/store.h"

namespace canopy::replication {

struct NodeOptions {
  std::string listen_uri;   // e.g. tcp://127.0.0.1:7000 (port 0: pick one)
  std::string data_dir;     // store + node state
  std::string cluster;      // cluster name
  std::string node_id;      // empty: loaded from DIR/node_id or generated once
  std::string secret;       // shared cluster secret
  std::vector<std::string> seeds;  // URIs of other members
  RingOptions ring;
  tree::StoreOptions store;
  // Membership round (one SWIM probe) and leader-stream heartbeat interval.
  std::chrono::milliseconds heartbeat_interval{100};
  // A leader stream silent this long is dead whatever the phi-accrual
  // detector says; also how long an owner that answered a failover
  // candidate stays off the old leader.
  std::chrono::milliseconds failure_timeout{1500};
  // Metadata raft election timeout (raft randomizes it in [t, 2t)); its
  // heartbeat is a fifth of it.
  std::chrono::milliseconds raft_election_timeout{150};
  // Bound on the HELLO / authentication exchange of a connection this node
  // accepted; the node's own dials (to members, to a tree's leader) give up
  // after 3/5 of it, so that their timeout, not the peer's close, is what
  // they see. Raise it where the link or the machine is slow (emulated
  // guests): a handshake that loses the race is refused, never half-open.
  std::chrono::milliseconds handshake_timeout{5000};
  size_t snapshot_chunk_bytes = 1u << 20;
  // Metadata raft (leader failover). Empty raft_address: no metadata
  // service; every tree keeps its ring leader at epoch 1 and there is no
  // failover. Otherwise node_id must be a decimal number > 0 and
  // raft_members the founding raft members (id -> IPv4:port), the same on
  // every founding node (used on the first start only).
  std::string raft_address;
  std::map<uint64_t, std::string> raft_members;
  // On the metadata raft leader: when this node leads more trees than some
  // other live voter, hand raft leadership to the voter leading the fewest
  // (at most once per this interval; zero: never). A node that leads both a
  // tree and the raft costs a failover a raft election too when it dies.
  std::chrono::milliseconds raft_leader_rebalance_interval{1000};
  // Replication streams over one-sided RDMA (replication/one_sided.h): as a
  // replica on an rdma:// connection, ask the leader for a log ring of
  // one_sided_ring_bytes; as a leader, accept such requests. Off: neither
  // (a request is declined, the stream stays messages).
  bool one_sided_replication = false;
  uint64_t one_sided_ring_bytes = 256u << 10;
  // A one-sided stream's receiver spins briefly, then sleeps in steps that
  // double up to this while its ring stays empty (the latency an idle
  // stream's next message may pay; raise it on emulated machines, where
  // every wake-up is costly).
  std::chrono::microseconds one_sided_poll_max{1000};
  // Node join from every owner: a tree this node owns but does not hold yet
  // is fetched as a checkpoint file from whichever of its owners, leader
  // included, is sending the fewest of this node's files, then followed
  // from the leader (the deltas after the file). Off: every file comes from
  // the tree's leader. Either way a failed fetch falls back to the leader.
  bool join_from_every_owner = true;
};

class Node {
 public:
  // Opens the store, starts listening and the background threads.
  static Result<std::unique_ptr<Node>> Start(const NodeOptions& options);
  ~Node();  // Stop()
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Closes the listener and every connection, joins the threads. Idempotent.
  void Stop();

  // The URI peers and clients reach this node at (real port filled in).
  const std::string& uri() const;
  const std::string& node_id() const;

  // Serves a SLICE read in-process, exactly as the same request arriving
  // over the wire would be (see SliceRequest in protocol.h for the levels):
  // a front end running in the node's process (the bulletin board) skips the
  // loopback round trip. Thread safe; LEADER and QUORUM may block up to
  // request.timeout_ms.
  SliceReply Slice(const SliceRequest& request);
  // Starts a QUORUM `request` without blocking: the owners' SLICEs at ONE go
  // out on pipelined peer links (replication/slice_forwarder.h) once
  // FlushSlices runs, and the last answer settles it. Returns true when the
  // read started: `done` is then called once, on a link's reader thread (or
  // before SliceAsync returns), with the reply Slice would give, or with
  // nullopt when the answers cannot settle it without blocking (an owner
  // failed, or copies disagree across a failover): call Slice then. Returns
  // false, never calling `done`, for any other level, when an owner it
  // needs is down or has no open link yet (Slice at QUORUM opens the
  // links), or while stopping. Thread safe.
  bool SliceAsync(const SliceRequest& request, std::function<void(std::optional<SliceReply>)> done);
  // Sends the SLICEs SliceAsync queued (one batch per peer link).
  void FlushSlices();

  struct Impl;

 private:
  explicit Node(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace canopy::replication
