// node_impl.h: the state behind replication::Node, and the roles that share it.
// Private to canopy_replication; include only from replication/node*.cc.
//
// A Node is one object, Node::Impl, whose methods are grouped by role, one
// file per role:
//
//   node.cc           lifecycle (Init, Stop, threads), accept + message dispatch
//   node_cluster.cc   cluster view: members, ring, leadership, epochs,
//                     membership (SWIM probes, gossip, the failure detector),
//                     replica start-up
//   node_leader.cc    the leader's stream to one subscribed replica
//                     (snapshot, then deltas; ACKs in)
//   node_replica.cc   a replica's follow loop (SUBSCRIBE, apply, ACK)
//   node_failover.cc  taking over a tree whose leader died: asking the other
//                     owners for their state, and answering such asks
//   node_client.cc    client requests: COMMIT, READ, STATUS, CREATE_TREE
//   node_reads.cc     SLICE reads at ONE / LEADER / QUORUM (its own locks:
//                     fence_mu, read_pool_mu; see there)
//
// Lock discipline (the same in every file):
//   - `mu` guards the cluster view: every field below marked (mu). `cv`
//     (waited on with mu) is notified on membership or leadership changes
//     and on stop. Commits and ACKs wake only who waits for them (they come
//     thousands of times a second): a commit notifies its tree's
//     stream_cvs entry (the leader's streams), an ACK the commit_waiters it
//     may satisfy. Methods named ...Locked() expect mu held.
//   - `threads_mu` guards workers and open_conns only; never taken with mu held
//     (Stop closes connections under it, so a blocked Receive wakes up).
//   - `digest_mu` guards digest_cache only; never held with mu.
//   - The store (tree::Store) has its own locking: call it with or without mu,
//     but never block on the network while holding mu.
//   - Each connection has one receiving thread (the one serving or dialing
//     it). Senders may be several (Connection::Send is thread safe): a leader
//     stream's SendStream beside LeadStream's ACK receiver, a client
//     connection's CommitPipeline workers beside its reader.
#pragma once

#include <algorithm>
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
#include "replication/client.h"
#include "replication/failure_detector.h"
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
// Children one SLICE may return.
inline constexpr uint32_t kMaxSliceChildren = 4096;
// Idle connections kept per peer for QUORUM reads.
inline constexpr size_t kMaxIdlePeerClients = 16;
// Incoming connections served at once; more are refused with ERROR.
inline constexpr int kMaxServedConnections = 1024;
// COMMITs one connection may have queued or running at once; the
// connection's reader waits (stops reading) while that many are.
inline constexpr size_t kMaxCommitsInFlight = 256;

class CommitPipeline;

struct Node::Impl {
  explicit Impl(const NodeOptions& o) : options(o), detector(DetectorOptions(o)), ring(o.ring) {}
  static FailureDetectorOptions DetectorOptions(const NodeOptions& o) {
    FailureDetectorOptions d;
    d.expected_interval = o.heartbeat_interval;
    // Lenient on purpose: a closed or refused connection is the fast path
    // (SIGKILL, crash); phi covers silent peers, and a false suspicion of a
    // live leader on a starved machine costs a needless failover. With a
    // steady 100 ms rhythm phi reaches 8 after ~480 ms of silence.
    d.min_stddev = std::max<std::chrono::milliseconds>(o.heartbeat_interval / 2, std::chrono::milliseconds(5));
    d.acceptable_pause = o.heartbeat_interval;
    return d;
  }
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
  // Liveness of every peer: arrivals (any message) and loss evidence
  // (refused / closed / reset connections, unanswered probes).
  FailureDetector detector;
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
    // Replica: the leader and epoch our follow loop is streaming from right
    // now (following = subscribed and receiving), for TREE_STATE_REPLY.
    bool following = false;
    std::string following_leader;
    uint64_t following_epoch = 0;
    // Replica: we told a failover candidate that the leader of hold_epoch is
    // dead; until hold_until we do not follow that epoch again (so that the
    // version we reported stays our last from that epoch).
    uint64_t hold_epoch = 0;
    Clock::time_point hold_until{};
  };
  std::map<std::string, TreeReplication> trees;
  // Per tree, waited on (with mu) by the leader's streams of it: notified on
  // each commit of the tree and when one of its streams ends. Entries are
  // made on first use and never erased (map nodes do not move).
  std::map<std::string, std::condition_variable> stream_cvs;
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
  // Not suspected by the failure detector (always true for ourselves).
  bool AliveLocked(const std::string& id) const;
  // Any message from `id` arrived now / a connection to it was refused,
  // closed or reset, or a probe went unanswered.
  void HeardLocked(const std::string& id) { detector.Heard(id, Clock::now()); }
  void Heard(const std::string& id);
  void LostPeer(const std::string& id);
  // Dials and authenticates a peer; its node id and the connection.
  Result<std::pair<std::string, std::unique_ptr<transport::Connection>>> DialPeerWithId(
      const std::string& peer_uri);
  // Merges a HEARTBEAT (any kind): liveness, members, raft address, trees.
  void OnHeartbeat(const Heartbeat& hb);
  // This node's HEARTBEAT of `kind`; with full gossip sets when the peer's
  // digests (members, trees) differ from ours.
  Heartbeat MakeHeartbeatLocked(Heartbeat::Kind kind, uint64_t sequence, uint64_t peer_members_digest,
                                uint64_t peer_trees_digest);
  // A peer's PROBE on a served connection: merge it, answer with our ack.
  Status AnswerProbe(transport::Connection& conn, const Heartbeat& probe);
  // A peer's PROBE_REQUEST: probe the target ourselves, relay its ack.
  Status AnswerProbeRequest(transport::Connection& conn, const ProbeRequest& req);
  // Sends `probe` on `conn` and waits up to `timeout` for the ack of the
  // same sequence (merged on arrival).
  Result<Heartbeat> ProbeOn(transport::Connection& conn, const Heartbeat& probe, std::chrono::milliseconds timeout);
  // Resolves seeds, runs one SWIM round (probe one member, ping-req through
  // others when it does not answer, gossip piggybacked), hints unsubscribed
  // owners, starts replicas, reaps workers: once per heartbeat_interval.
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
  // A snapshot of the tree: its checkpoint file on the bulk path when it
  // has one the WAL continues from (or can write one now), else its blocks
  // as messages. `resume`: the replica's Subscribe, whose resume offer is
  // honoured when it names the file sent.
  Status SendSnapshot(transport::Connection& conn, const std::string& replica, const std::string& tree_name,
                      uint64_t epoch, uint64_t* sent, const Subscribe* resume = nullptr);

  // ================================================ node_snapshot_file.cc: join on the bulk path
  // Sends the newest checkpoint file of `tree_name` whole with SendWithBulk
  // (SNAPSHOT_FILE), writing a checkpoint first when none is usable. False
  // (nothing sent) when there is no file to send; an error only from the
  // connection.
  Result<bool> SendSnapshotFile(transport::Connection& conn, const std::string& replica,
                                const std::string& tree_name, uint64_t epoch, uint64_t* sent,
                                const Subscribe* resume);
  // Receives the bulk bytes of SNAPSHOT_FILE `m` straight into the store's
  // file (SnapshotFileInstaller), checking each block as it lands and
  // repeating `keepalive` (the last ACK) once per heartbeat. Returns the
  // installer, complete and ready for Finish(); the caller checks the epoch
  // first. ResourceExhausted (announced size refused, nothing written) or
  // Corruption end the stream.
  Result<std::unique_ptr<tree::SnapshotFileInstaller>> ReceiveSnapshotFile(
      transport::Connection& conn, const std::string& tree_name, const std::string& leader,
      const transport::Message& m, const SnapshotFile& f, const std::function<Status()>& keepalive);
  // Fills the resume offer of `sub` from the store's partial file of its tree.
  void OfferResume(Subscribe* sub);
  Status SendStream(transport::Connection& conn, const std::string& replica, const Subscribe& sub,
                    uint64_t epoch, bool force_snapshot, const std::atomic<bool>& done);

  // ================================================ node_replica.cc: replica follow
  // Follows `tree_name` from its leader while we own it and do not lead it.
  void ReplicaLoop(std::string tree_name);
  // One subscription; *reached is set once the leader answered the handshake
  // (so that a failure before it is evidence against the leader).
  Status FollowOnce(const std::string& tree_name, const Leadership& l, const std::string& leader_uri,
                    bool* reached);
  Status FollowOn(transport::Connection& conn, const std::string& tree_name, const Leadership& l, bool* reached);
  Status SendAck(transport::Connection& conn, const std::string& tree_name, uint64_t epoch,
                 uint64_t snapshots_installed, uint64_t* last_acked);

  // ================================================ node_failover.cc
  // Takes over `tree` when its leader `dead.leader` is dead (failure
  // detector) and, among a quorum of owners that answer TREE_STATE_REQUEST
  // and no longer follow that leader, we hold the newest data.
  void MaybeFailover(const std::string& tree_name, const Leadership& dead);
  // Asks `owner` for its state of the tree (a short, bounded exchange).
  Result<TreeStateReply> AskTreeState(const std::string& owner, const TreeStateRequest& req);
  // Answers a candidate's TREE_STATE_REQUEST (see protocol.h).
  TreeStateReply HandleTreeStateRequest(const TreeStateRequest& req);
  // True while we promised a candidate not to follow `l` (hold_epoch).
  bool HeldLocked(const std::string& tree_name, const Leadership& l) const;

  // ================================================ node_client.cc: client requests
  // Leader check for a request; fills a redirect (Unavailable + leader URI) when not.
  bool NotLeader(const std::string& tree_name, StatusReplyFields* status, std::string* leader_uri);
  uint32_t CountAcksLocked(const std::string& tree_name, uint64_t version,
                           const std::vector<std::string>& owners);
  CommitReply HandleCommit(const CommitRequest& req);
  // A HandleCommit waiting for its consistency level; woken (under mu) when
  // an owner's durable version may have reached `version`.
  struct CommitWaiter {
    uint64_t version = 0;
    std::vector<std::string> owners;
    std::condition_variable cv;
    bool woken = false;
  };
  std::map<std::string, std::multimap<uint64_t, CommitWaiter*>> commit_waiters;  // tree -> by version (mu)
  // The tree's replica set: the ring's owners, plus the leader while it is
  // not one of them (after a ring change, until leadership moves).
  std::vector<std::string> ReplicaSetLocked(const std::string& tree_name) const;
  // Waits (releasing mu meanwhile) until `need` of `owners` hold `version`
  // durably, or `deadline`, or stop; returns how many hold it.
  uint32_t WaitForDurableLocked(std::unique_lock<std::mutex>& lock, const std::string& tree_name, uint64_t version,
                                const std::vector<std::string>& owners, uint32_t need, Deadline deadline);
  // Wakes the waiters of `tree_name` that the durable versions known now
  // may satisfy (call after an ACK moved one).
  void WakeCommitWaitersLocked(const std::string& tree_name);
  // Commits `req` on the leader (once, whatever retries: the request id is
  // checked atomically by the store), or returns its status.
  Result<tree::CommitResult> ApplyCommit(const CommitRequest& req);
  ReadReply HandleRead(const ReadRequest& req);
  StatusReply HandleStatus();
  void FillStatusLocked(StatusReply* out, std::vector<tree::Version>* latest);
  CreateTreeReply HandleCreateTree(const CreateTreeRequest& req);

  // ================================================ node_reads.cc: SLICE reads
  SliceReply HandleSlice(const SliceRequest& req);
  // `req`'s node and child slice in version `v` (status set on a bad path).
  SliceReply SliceAt(const tree::Version& v, const SliceRequest& req);
  // ONE: this node's newest (or the retained req.version).
  SliceReply SliceLocal(const SliceRequest& req);
  SliceReply SliceAtLeader(const SliceRequest& req);
  SliceReply SliceAtQuorum(const SliceRequest& req);
  // The newest version a quorum of the tree's replica set holds durably.
  uint64_t QuorumDurableLocked(const std::string& tree_name, uint32_t* replicas);
  // The metadata state from a raft barrier that started after this call;
  // concurrent callers share one barrier (fence_mu).
  Result<std::shared_ptr<const meta::ClusterState>> MetaBarrier(Deadline deadline);
  // A pooled client connection to a peer (read_pool_mu), and its return.
  std::unique_ptr<Client> TakePeerClient(const std::string& peer_uri, Status* error);
  void ReturnPeerClient(const std::string& peer_uri, std::unique_ptr<Client> c);

  std::mutex fence_mu;  // never held with mu
  std::condition_variable fence_cv;
  uint64_t fence_started = 0;  // barriers begun (fence_mu)
  uint64_t fence_done = 0;     // the last one finished (fence_mu)
  bool fence_running = false;
  Result<std::shared_ptr<const meta::ClusterState>> fence_result = Status::Unavailable("no barrier yet");
  std::mutex read_pool_mu;  // never held with mu nor across a call
  std::map<std::string, std::vector<std::unique_ptr<Client>>> read_pool;  // peer URI -> idle clients
};

// The COMMITs in flight on one connection (node_client.cc). The
// connection's reader (ServeMessages) Submits each as it arrives; worker
// threads, started on demand up to kMaxCommitsInFlight, run HandleCommit
// and send each reply as it completes — in any order, each carrying its
// request's sequence — so a commit waiting for its consistency level never
// holds back the next one on the connection (and the leader's WAL group
// commit covers them together). Connection::Send is thread safe, so replies
// of other requests go out from the reader meanwhile.
// Thread safety: Submit from the reader thread only; the destructor (on the
// reader thread) waits for every queued and running commit.
class CommitPipeline {
 public:
  CommitPipeline(Node::Impl& node, transport::Connection& conn) : node_(node), conn_(conn) {}
  ~CommitPipeline();
  CommitPipeline(const CommitPipeline&) = delete;
  CommitPipeline& operator=(const CommitPipeline&) = delete;

  // Queues `req`; waits while kMaxCommitsInFlight are queued or running.
  // A failed reply send closes the connection (the reader then sees it).
  void Submit(CommitRequest req);

 private:
  void Work();

  Node::Impl& node_;
  transport::Connection& conn_;
  std::mutex mu_;
  std::condition_variable cv_;  // queue_ gained an item, a commit finished, or closing_
  std::list<CommitRequest> queue_;
  size_t running_ = 0;  // commits being handled
  size_t idle_ = 0;     // workers waiting for work
  bool closing_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace canopy::replication
