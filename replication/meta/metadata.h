// MetadataService: canopy's cluster metadata (data-plane membership, per-tree
// leader + epoch, a small key-value map) kept consistent by an embedded raft
// group (Canonical's libraft with its libuv disk and TCP I/O). See README.md.
//
// Every canopy node runs one MetadataService. The services of a cluster form
// one raft group; each keeps its raft log, term/vote and snapshots in its own
// data dir, so a restarted node catches up from where it stopped.
//
//   MetaOptions o;
//   o.node_id = 1; o.raft_address = "127.0.0.1:7101"; o.data_dir = "/var/lib/canopy/meta";
//   o.initial_members = {{1, "127.0.0.1:7101"}, {2, "127.0.0.1:7102"}, {3, "127.0.0.1:7103"}};
//   CANOPY_ASSIGN_OR_RETURN(auto meta, MetadataService::Start(o));
//   auto epoch = meta->ProposeWithRetry(CasLeaderCmd{"t", 0, 1, 42}, Deadline::After(5s));
//
// Leader failover of a tree (the data path's job, using this service):
//   1. read the tree's TreeLeader {leader, epoch e};
//   2. pick the live replica with the newest durable version v;
//   3. CompareAndSetLeader(tree, e, that replica, v) -> e+1, or Conflict when
//      someone else already moved the tree to a newer epoch (re-read, stop).
// Epochs only grow, so a stale leader (epoch e) is fenced: replicas refuse
// its stream once they know e+1 and it must stop acknowledging writes.
//
// Proposals (every write) and linearizable reads are served by the raft
// leader. With MetaOptions::forward_address set on the nodes, a follower
// forwards them to the leader over a small TCP protocol (forward.h): each
// leader publishes its forward address under the reserved key
// "meta/forward/<id>" once elected. Without it (or before the leader's
// address is known) they fail on a follower with Unavailable whose message
// names the leader ("node 1 is not the metadata leader; leader is node 2 at
// 127.0.0.1:7102"), and RaftLeader() gives the same as data. Either way
// ProposeWithRetry rides out elections. Membership changes (AddMember,
// RemoveMember) are never forwarded: call them on the leader.
// Keys starting with "meta/" are reserved for the service itself.
//
// A Timeout on a proposal means "outcome unknown": the command may still be
// committed later. Every command here is safe to retry after re-reading
// (CAS commands fail with Conflict if the first attempt did land).
//
// Thread safety: all public methods may be called from any thread
// concurrently. libraft is single-threaded: it runs on one libuv loop thread
// owned by the service and calls from other threads are queued to it. Methods
// never block longer than their Deadline (plus a few ms of scheduling).
// Watch callbacks run on a separate notifier thread, never on the raft loop;
// forwarded requests are served on the forward server's threads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "base/status.h"
#include "replication/meta/cluster_state.h"

namespace canopy::replication::meta {

struct MetaOptions {
  uint64_t node_id = 0;      // > 0, unique in the cluster
  std::string raft_address;  // "IPv4:port" this node's raft listens on, e.g. "127.0.0.1:7101"
  std::string data_dir;      // created when missing; raft log, term/vote, snapshots
  // Bootstrap configuration (id -> raft address), identical on every founding
  // member. Applied only on the very first start of a member (empty data dir);
  // ignored later. Empty: this node joins an existing cluster and waits until
  // the leader adds it with AddMember.
  std::map<uint64_t, std::string> initial_members;
  uint32_t election_timeout_ms = 1000;  // raft randomizes it in [t, 2t)
  uint32_t heartbeat_timeout_ms = 100;
  uint32_t snapshot_threshold = 128;      // log entries between raft snapshots
  uint32_t snapshot_trailing = 64;        // entries kept behind a snapshot
  uint32_t connect_retry_delay_ms = 200;  // pause between reconnects to a down peer
  // The leader resends a snapshot to a lagging follower after this long
  // without an answer (e.g. when the follower was busy taking its own).
  uint32_t install_snapshot_timeout_ms = 5000;
  // "IPv4:port" (port 0: ephemeral) for follower -> leader forwarding of
  // proposals and linearizable reads; empty: no forwarding (see above).
  std::string forward_address;
};

struct RaftLeaderInfo {
  uint64_t id = 0;  // 0: no leader known right now (election in progress)
  std::string address;
};

struct RaftMember {
  uint64_t id = 0;
  std::string address;
  bool voter = false;  // false: spare/standby (being added)
};

class MetadataService {
 public:
  // Starts the raft loop thread. Returns once raft is running (not once a
  // leader is elected). Errors: InvalidArgument (bad options: id 0, address
  // not IPv4:port, self missing from a non-empty initial_members), IOError /
  // PermissionDenied (data dir), Unavailable (address in use), Internal.
  static Result<std::unique_ptr<MetadataService>> Start(const MetaOptions& options);

  // Start without waiting for raft: checks the options, creates the data
  // dir and starts the forward server and the threads, then returns while
  // raft starts on the loop thread (libraft's start probes the data dir's
  // file system, ~40 ms on some kernels). Until raft runs, the service
  // answers as a member that knows nothing yet: not the raft leader, no
  // leader or members known, ReadLocal() empty; requests wait in the queue
  // (within their deadlines) and run once it does. Errors: those of the
  // checks above. AwaitStarted() then reports the rest.
  static Result<std::unique_ptr<MetadataService>> StartInBackground(const MetaOptions& options);
  // Blocks until raft has started (Ok) or failed to (Start's errors; the
  // service then fails every request with Aborted). Any thread; idempotent.
  Status AwaitStarted();

  // Stops raft (flushing what it has), joins the threads. Idempotent; the
  // destructor calls it. Calls in flight or later fail with Aborted.
  // REQUIRES: not called from inside a watch callback.
  void Stop();
  ~MetadataService();
  MetadataService(const MetadataService&) = delete;
  MetadataService& operator=(const MetadataService&) = delete;

  uint64_t node_id() const;
  const std::string& raft_address() const;
  // The bound forward address ("" when forwarding is off).
  std::string forward_address() const;

  // ---- raft group ----
  bool IsRaftLeader() const;          // this node's latest known raft state
  RaftLeaderInfo RaftLeader() const;  // id 0 when unknown
  // Waits until some node (any) is known as leader; Timeout otherwise.
  Result<RaftLeaderInfo> WaitForRaftLeader(Deadline deadline) const;
  // This node's view of the raft configuration (committed or pending).
  std::vector<RaftMember> RaftMembers() const;
  // Adds a node to the raft group as a voter: raft_add (spare), then
  // raft_assign(RAFT_VOTER), which lets it catch up before it counts. The new
  // node must be running with empty initial_members. Leader only; Conflict
  // when the id/address is already in use, Unavailable on a follower,
  // Timeout, Aborted.
  Status AddMember(uint64_t id, const std::string& raft_address, Deadline deadline);
  // Removes a node from the raft group (raft_remove). Leader only. The data-
  // plane entry (members map) is separate: mark it kLeft with SetMember.
  Status RemoveMember(uint64_t id, Deadline deadline);
  // Hands raft leadership to voter `target` (raft_transfer: it is brought up
  // to date, then told to start an election at once). Used to move the raft
  // leader off a node whose death would also cost a tree failover. Leader
  // only. Returns once leadership left this node (Ok), or Unavailable when
  // this node is not the leader or is still the leader when raft gave up
  // (after one election timeout), InvalidArgument when `target` is not a
  // voter other than this node, Timeout, Aborted. Proposals arriving during
  // the transfer fail with Unavailable, which ProposeWithRetry rides out.
  Status TransferLeadership(uint64_t target, Deadline deadline);

  // ---- proposals (leader only) ----
  // Appends one command (forwarded to the leader when on a follower with
  // forwarding on), waits until it is committed and applied. The
  // Result fails with Unavailable (not the leader: nothing was appended; or
  // leadership lost before commit: outcome unknown, like Timeout), Timeout
  // (outcome unknown), Aborted (stopping), InvalidArgument
  // (command over the limits of cluster_state.h); otherwise the ApplyOutcome,
  // whose status may be Conflict/InvalidArgument (rejected by the state
  // machine, identical on every replica).
  Result<ApplyOutcome> Propose(const CommandBody& command, Deadline deadline);
  // Propose, retried (with a short pause) on Unavailable until the deadline;
  // covers elections and a leader that just changed. The last error is
  // returned when the deadline passes (Unavailable still names the leader).
  Result<ApplyOutcome> ProposeWithRetry(const CommandBody& command, Deadline deadline);

  // Typed helpers over Propose (no retry). State-machine rejections come back
  // as the returned Status (Conflict ...).
  Status Put(const std::string& key, const std::string& value, Deadline deadline);
  Status Delete(const std::string& key, Deadline deadline);
  Status CompareAndSet(const std::string& key, const std::optional<std::string>& expected,
                       const std::optional<std::string>& desired, Deadline deadline);
  Status SetMember(const MemberInfo& member, Deadline deadline);
  // Returns the new epoch (expected_epoch + 1), or Conflict naming the
  // current epoch when expected_epoch is stale.
  Result<uint64_t> CompareAndSetLeader(const std::string& tree, uint64_t expected_epoch, uint64_t new_leader,
                                       uint64_t leader_version, Deadline deadline);

  // ---- reads ----
  // This replica's applied state, right now, without network I/O. May be
  // stale (a follower can lag; a partitioned old leader can lag arbitrarily);
  // fine for routing hints, never for fencing decisions.
  ClusterState ReadLocal() const;
  // Linearizable: on the leader, commits a raft barrier (proving leadership
  // in the current term to a quorum) and returns the state with everything
  // committed before the call applied. On a follower: forwarded, or
  // Unavailable naming the leader. Timeout, Aborted.
  Result<ClusterState> ReadLinearizable(Deadline deadline);

  // ---- watch ----
  // change_count of the local state (grows with every applied change).
  uint64_t ChangeCount() const;
  // Blocks until the local change_count > seen_change_count, then returns
  // the state; Timeout when the deadline passes first, Aborted on Stop.
  Result<ClusterState> WaitForChange(uint64_t seen_change_count, Deadline deadline) const;
  // Calls `callback` on the notifier thread with the local state after it
  // changed (coalesced: intermediate states may be skipped; the latest is
  // always delivered, in order of change_count). The first call comes soon
  // after AddWatch with the current state. The callback may call any method
  // of this service but should return quickly. Returns an id for RemoveWatch.
  using WatchCallback = std::function<void(const ClusterState&)>;
  uint64_t AddWatch(WatchCallback callback);
  // After it returns the callback is not running and will not be called again
  // (unless called from inside that callback, where it only unregisters).
  void RemoveWatch(uint64_t watch_id);

 private:
  class Impl;
  explicit MetadataService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace canopy::replication::meta
