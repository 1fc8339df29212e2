// node_impl.h: the state behind replication::Node, and the roles that share it.
// Private to canopy_replication; include only from replication/node*.cc.
//
// A Node is one object, Node::Impl, whose methods are grouped by role, one
// file per role:
//
//   node.cc           lifecycle (Init, Stop, threads), accept + message dispatch
//   node_cluster.cc   cluster view: members, ring, leadership, epochs,
//                     heartbeats sent and received, replica start-up
//   node_leader.cc    the leader's stream to one subscribed replica
//                     (snapshot, then deltas; ACKs in)
//   node_replica.cc   a replica's follow loop (SUBSCRIBE, apply, ACK)
//   node_failover.cc  taking over a tree whose leader went silent
//   node_client.cc    client requests: COMMIT, READ, STATUS, CREATE_TREE
//
// Lock discipline (the same in every file):
//   - `mu` guards the cluster view: every field below marked (mu). `cv`
//     (waited on with mu) is notified on every commit, ACK, membership or
//     leadership change and on stop. Methods named ...Locked() expect mu held.
//   - `threads_mu` guards workers and open_conns only; never taken with mu held
//     (Stop closes connections under it, so a blocked Receive wakes up).
//   - `digest_mu` guards digest_cache only; never held with mu.
//   - The store (tree::Store) has its own locking: call it with or without mu,
//     but never block on the network while holding mu.
//   - Each connection is owned by one thread (the one serving or dialing it);
//     a leader stream uses two (LeadStream receives ACKs, SendStream sends),
//     which the transport allows (one sender and one receiver at a time).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/file.h"
#include "base/metrics.h"
#include "base/result.h"
#include "replication/handshake.h"
#include "replication/meta/metadata.h"
#include "replication/node.h"
#include "replication/node_metrics.h"
#include "replication/protocol.h"
#include "replication/ring.h"
#include "transport/transport.h"
#include "tree/store.h"

namespace canopy::replication {

// Without the metadata service every tree keeps its first leader: epoch 1.
// With it, 1 is also the epoch of a tree's first leader.
inline constexpr uint64_t kFirstEpoch = 1;
// Deltas read from the WAL per batch on a leader stream.
inline constexpr size_t kDeltaBatchBytes = 4u << 20;
// Incoming connections served at once; more are refused with ERROR.
inline constexpr int kMaxServedConnections = 1024;

struct Node::Impl {
  explicit Impl(const NodeOptions& o) : options(o), ring(o.ring) {}
  ~Impl() { Stop(); }

  // ---- identity and resources, set by Init() and constant afterwards ----
  NodeOptions options;
  std::string node_id;
  std::string uri;
  transport::TransportOptions topts;
  HandshakeConfig hs;
  std::unique_ptr<tree::Store> store;
  std::unique_ptr<transport::Listener> listener;

  std::atomic<bool> stopping{false};
  std::atomic<int> served_connections{0};

  // ---- cluster view, guarded by mu ----
  std::mutex mu;
  std::condition_variable cv;                  // commits, acks, membership, leadership, stop
  std::map<std::string, std::string> members;  // node id -> URI, self included
  std::map<std::string, Clock::time_point> last_heard;
  Ring ring;
  std::set<std::string> known_trees;
  struct TreeReplication {
    std::map<std::string, uint64_t> acked;  // replica -> durable version
    uint64_t snapshots_sent = 0;
    uint64_t snapshots_received = 0;
    bool replica_running = false;
    // Persisted in DIR/epochs: epoch of the leader our data came from; when
    // we took over: the epoch our data had then and our version then.
    uint64_t data_epoch = 0;
    uint64_t predecessor_epoch = 0;
    uint64_t takeover_version = 0;
  };
  std::map<std::string, TreeReplication> trees;
  struct PeerTree {
    uint64_t data_epoch = 0;
    uint64_t version = 0;
    Clock::time_point at;
  };
  std::map<std::string, std::map<std::string, PeerTree>> peer_trees;  // peer -> tree -> state
  std::vector<std::string> unresolved_seeds;  // --seed URIs whose node id we do not know yet
  Clock::time_point started_at = Clock::now();

  // ---- metadata service (optional; with --raft) ----
  std::unique_ptr<meta::MetadataService> meta;
  std::atomic<bool> meta_synced{false};
  uint64_t meta_watch = 0;
  std::map<std::string, meta::TreeLeader> meta_trees;  // (mu)
  std::map<std::string, std::string> peer_raft;        // node id -> raft address (mu)
  std::set<std::string> raft_adds_pending;             // (mu)

  // ---- STATUS digests, guarded by digest_mu (never held with mu) ----
  // Digest() walks the whole tree; STATUS is polled, so each tree's digest
  // is computed once per version, outside mu.
  std::mutex digest_mu;
  std::map<std::string, std::pair<uint64_t, uint64_t>> digest_cache;  // tree -> (version, digest)

  // ---- threads and connections, guarded by threads_mu ----
  std::mutex threads_mu;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Worker> workers;
  std::set<transport::Connection*> open_conns;
  std::thread accept_thread;
  std::thread maintenance_thread;

  // ---- metrics (node_metrics.h): hooks, and a refresher run when scraped ----
  std::unique_ptr<NodeMetrics> metrics;
  std::unique_ptr<canopy::metrics::Refresher> metrics_refresher;

  // ================================================ node.cc: lifecycle, dispatch
  Status Init();
  Status StartMeta();
  void StartThreads();
  void Stop();
  // Runs `body` on a worker thread that Stop() joins; nothing once stopping.
  void Spawn(std::function<void()> body);
  // Joins workers that finished (called from the maintenance loop).
  void ReapWorkers();
  // Registers a connection so that Stop() can wake whoever blocks on it;
  // false once stopping (the caller then drops the connection).
  bool Register(transport::Connection* c);
  void Unregister(transport::Connection* c);
  // Sleeps up to `d`, less when stopping.
  void SleepFor(std::chrono::milliseconds d);
  void AcceptLoop();
  void ServeConnection(transport::Connection& conn);
  // Serves one authenticated peer's requests until it goes away; a SUBSCRIBE
  // turns the connection into a leader stream.
  Status ServeMessages(transport::Connection& conn, const PeerIdentity& peer);

  // ================================================ node_cluster.cc: cluster view
  struct Leadership {
    std::string leader;
    uint64_t epoch = 0;
    bool operator==(const Leadership&) const = default;
  };
  std::string MembersPath() const { return JoinPath(options.data_dir, "members"); }
  std::string EpochsPath() const { return JoinPath(options.data_dir, "epochs"); }
  void PersistMembersLocked();
  // Adds or updates a member; rebuilds the ring for new ids.
  void AddMemberLocked(const std::string& id, const std::string& member_uri);
  void AddMember(const std::string& id, const std::string& member_uri);
  std::vector<std::string> OwnersLocked(const std::string& tree) const { return ring.Owners(tree); }
  // The tree's leader and epoch: from the metadata service when it has an
  // entry, else the ring's first owner at the first epoch.
  Leadership LeadershipLocked(const std::string& tree) const;
  std::string LeaderLocked(const std::string& tree) const { return LeadershipLocked(tree).leader; }
  // True when we lead `tree` (and, with metadata, know the current state).
  bool LeadsLocked(const std::string& tree, uint64_t* epoch) const;
  void PersistEpochsLocked();
  void SetDataEpochLocked(const std::string& tree, uint64_t epoch);
  std::string UriOfLocked(const std::string& id) const;
  // Heard from within failure_timeout (always true for ourselves).
  bool AliveLocked(const std::string& id) const;
  // Dials and authenticates a peer; its node id and the connection.
  Result<std::pair<std::string, std::unique_ptr<transport::Connection>>> DialPeerWithId(
      const std::string& peer_uri);
  void OnHeartbeat(const Heartbeat& hb);
  // Resolves seeds, heartbeats every member, starts replicas, reaps workers:
  // once per heartbeat_interval until stopping.
  void MaintenanceLoop();
  // On the raft leader: adds members that announced a raft address but are
  // not in the raft group yet (a joining node started with --raft and no
  // --raft-peer).
  void AddRaftMembers();
  // Starts a ReplicaLoop for every tree we own but do not lead.
  void StartReplicas();
  // Sets the per-tree and per-replica gauges (metrics_refresher).
  void RefreshMetrics();

  // ================================================ node_leader.cc: leader streams
  // Streams `sub.tree` to the subscribing replica until it goes away or we
  // stop leading the tree.
  Status LeadStream(transport::Connection& conn, const PeerIdentity& peer, const Subscribe& sub);
  Status SendSnapshot(transport::Connection& conn, const std::string& replica, const std::string& tree_name,
                      uint64_t epoch, uint64_t* sent);
  Status SendStream(transport::Connection& conn, const std::string& replica, const Subscribe& sub,
                    uint64_t epoch, bool force_snapshot, const std::atomic<bool>& done);

  // ================================================ node_replica.cc: replica follow
  // Follows `tree_name` from its leader while we own it and do not lead it.
  void ReplicaLoop(std::string tree_name);
  Status FollowOnce(const std::string& tree_name, const Leadership& l, const std::string& leader_uri);
  Status FollowOn(transport::Connection& conn, const std::string& tree_name, const Leadership& l);
  Status SendAck(transport::Connection& conn, const std::string& tree_name, uint64_t epoch,
                 uint64_t snapshots_installed, uint64_t* last_acked);

  // ================================================ node_failover.cc
  // Takes over `tree` when its leader `dead.leader` has been silent long
  // enough and we are the live owner with the newest data.
  void MaybeFailover(const std::string& tree_name, const Leadership& dead);

  // ================================================ node_client.cc: client requests
  // Leader check for a request; fills a redirect (Unavailable + leader URI) when not.
  bool NotLeader(const std::string& tree_name, StatusReplyFields* status, std::string* leader_uri);
  uint32_t CountAcksLocked(const std::string& tree_name, uint64_t version,
                           const std::vector<std::string>& owners);
  CommitReply HandleCommit(const CommitRequest& req);
  ReadReply HandleRead(const ReadRequest& req);
  StatusReply HandleStatus();
  void FillStatusLocked(StatusReply* out, std::vector<tree::Version>* latest);
  CreateTreeReply HandleCreateTree(const CreateTreeRequest& req);
};

}  // namespace canopy::replication
