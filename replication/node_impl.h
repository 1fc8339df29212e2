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
//   - A client's COMMIT does not keep a thread waiting for its acks: once
//     applied it is a PendingCommit in pending_commits (mu) and in its
//     CommitPipeline's deadline index (mu too). Whoever first sees it
//     satisfied (the ACK receiver in LeadStream), expired (the pipeline's
//     timer) or orphaned (the pipeline's destructor) claims it under mu —
//     removes it from both indexes and counts a reply in flight — and sends
//     its reply after releasing mu; the pipeline outlives those sends
//     (its destructor waits for them).
//   - Each leader stream's StreamSender::send_mu is held while sending on
//     that stream (by its SendStream thread, or by a committer that found it
//     free); taken before mu, never with mu held.
//   - `threads_mu` guards workers and open_conns only; never taken with mu held
//     (Stop closes connections under it, so a blocked Receive wakes up).
//   - `digest_mu` guards digest_cache only; never held with mu.
//   - The store (tree::Store) has its own locking: call it with or without mu,
//     but never block on the network while holding mu.
//   - Each connection has one receiving thread (the one serving or dialing
//     it). Senders may be several (Connection::Send is thread safe): a leader
//     stream's SendStream and the tree's committers (under the stream's
//     send_mu) beside LeadStream's ACK receiver, a client
//     connection's reader (or CommitPipeline workers) beside the ACK
//     receivers and the pipeline timer that complete its commits.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
#include "replication/slice_forwarder.h"
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
// COMMITs one connection may have queued or waiting for acks at once; the
// connection's reader waits (stops reading) while that many are.
inline constexpr size_t kMaxCommitsInFlight = 256;

// Bulk bytes a stream lands (a checkpoint file, a run of WAL records) are
// pulled in pieces of at most this size, so that the receiver can check,
// grow or keep its stream alive between them.
inline constexpr uint64_t kBulkPieceBytes = 2u << 20;

// Receives the bulk bytes [from, to) of the message just received on `conn`,
// piece by piece: `sink_at(offset, length)` gives where the piece of
// `length` bytes that starts at `offset` goes (it may make room first), and `landed(end)` runs once every
// byte before `end` is in; a non-OK status from it stops the receive and is
// returned. Each piece is bounded by `io_timeout`, the transport's own
// no-progress limit (a peer that dies mid-way is seen at once, by reset or
// close).
template <typename SinkAt, typename Landed>
Status ReceiveBulkInPieces(transport::Connection& conn, uint64_t from, uint64_t to,
                           std::chrono::milliseconds io_timeout, SinkAt&& sink_at, Landed&& landed) {
  for (uint64_t at = from; at < to;) {
    const uint64_t piece = std::min(kBulkPieceBytes, to - at);
    CANOPY_RETURN_IF_ERROR(conn.ReceiveBulk(sink_at(at, piece), piece, Deadline::After(io_timeout)));
    at += piece;
    CANOPY_RETURN_IF_ERROR(landed(at));
  }
  return Status::Ok();
}

// A committer sends its commit on the tree's leader streams itself (no
// wake-up of their threads) while a stream is idle and the bytes sent on it
// that its replica has not acked yet, these included, stay within
// kDirectUnackedBytes (less than a loopback socket's buffers), reading at
// most kDirectSendBytes of deltas; otherwise it leaves the sending to the
// stream's thread. So a stalled replica never blocks a committer.
inline constexpr size_t kDirectSendBytes = 16u << 10;
inline constexpr uint64_t kDirectUnackedBytes = 64u << 10;

// A connection's reader queues the COMMITs that arrive together and applies
// them (one Store::CommitOpsBatch per tree: one lock hold, one WAL write, one
// sync) and sends them to the replicas (one frame per replica) once no
// further message is waiting, or after this many.
inline constexpr uint32_t kCommitsPerFlush = 32;
// A replica ACKs once no further message is waiting, or after this many
// applied DELTA / DELTA_BATCH messages.
inline constexpr uint32_t kDeltasPerAck = 8;

class CommitPipeline;

// The send side of one leader stream (node_leader.cc). Its SendStream
// thread sends the snapshot, heartbeats and deltas; a committer of the tree
// that finds send_mu free sends the new deltas itself. Whoever holds
// send_mu and sent something checks again after releasing it whether more
// came (a committer that found send_mu taken relies on that).
// Lock order: send_mu before mu (never take send_mu with mu held).
struct StreamSender {
  StreamSender(transport::Connection& c, std::string r, std::string t, uint64_t e, uint64_t s)
      : conn(c), replica(std::move(r)), tree(std::move(t)), epoch(e), sent(s) {}
  // The stream's connection, owned by LeadStream: use it only with send_mu
  // held and `open` true.
  transport::Connection& conn;
  const std::string replica;
  const std::string tree;
  const uint64_t epoch;
  std::mutex send_mu;
  std::atomic<uint64_t> sent;  // the newest version sent; written with send_mu held
  bool open = true;            // (send_mu) false once SendStream ended: nobody sends any more
  // (send_mu) Delta bytes sent, and per frame not known to be acked yet its
  // end version and the byte count after it.
  uint64_t bytes_sent = 0;
  uint64_t bytes_acked = 0;
  std::deque<std::pair<uint64_t, uint64_t>> unacked_frames;
  // (send_mu) Forgets the frames `acked` covers; the bytes still unacked.
  uint64_t UnackedBytes(uint64_t acked) {
    while (!unacked_frames.empty() && unacked_frames.front().first <= acked) {
      bytes_acked = unacked_frames.front().second;
      unacked_frames.pop_front();
    }
    return bytes_sent - bytes_acked;
  }
  // (send_mu) A snapshot up to `sent` went out: a full window until acked.
  void NoteSnapshot() {
    bytes_sent += kDirectUnackedBytes;
    unacked_frames.emplace_back(sent.load(), bytes_sent);
  }
};

// A commit applied on the leader and waiting for its consistency level
// (node_impl.h lock discipline). All fields but the indexes are set before
// it is registered and read by its claimer only.
struct PendingCommit {
  CommitPipeline* pipeline = nullptr;
  std::string tree;
  ConsistencyLevel level = ConsistencyLevel::kQuorum;
  std::vector<std::string> owners;
  uint32_t need = 0;
  Deadline deadline = Deadline::Infinite();
  Clock::time_point started{};
  CommitReply reply;
  uint32_t acks = 0;  // set by the claimer
  std::multimap<uint64_t, std::shared_ptr<PendingCommit>>::iterator in_tree;
  std::multimap<Clock::time_point, std::shared_ptr<PendingCommit>>::iterator in_pipeline;
};
using PendingCommits = std::vector<std::shared_ptr<PendingCommit>>;

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
    // Joiner: the data epoch of the owner whose checkpoint file we installed
    // untagged (FetchCheckpoint), offered in SUBSCRIBE instead of data_epoch
    // while that is 0, for the leader's trust rule; not a claim for reads or
    // failover. Cleared once data_epoch is set or a snapshot replaces the copy.
    uint64_t fetched_data_epoch = 0;
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
  // a commit of the tree that its committer did not send itself, and when
  // one of its streams ends. Entries are made on first use and never erased
  // (map nodes do not move).
  std::map<std::string, std::condition_variable> stream_cvs;
  // Per tree, the send sides of its leader streams (registered by
  // SendStream once its snapshot, if any, is out).
  std::map<std::string, std::vector<std::shared_ptr<StreamSender>>> stream_senders;
  std::vector<std::string> unresolved_seeds;  // --seed URIs whose node id we do not know yet
  Clock::time_point started_at = Clock::now();

  // ---- metadata service (optional; with --raft) ----
  std::unique_ptr<meta::MetadataService> meta;
  std::atomic<bool> meta_synced{false};
  // Raft started (meta->AwaitStarted): heartbeats carry options.raft_address
  // from then on, never before, so that the raft leader adding this node
  // finds it listening (a failed dial waits libraft's retry delay).
  bool raft_listening = false;     // (mu)
  bool raft_announce_due = false;  // (mu) the maintenance loop tells every member now
  // A new member joined: the maintenance loop runs a round now, so that the
  // trees this node leads and the newcomer owns are hinted to it at once.
  bool member_round_due = false;  // (mu)
  uint64_t meta_watch = 0;
  std::map<std::string, meta::TreeLeader> meta_trees;  // (mu)
  std::map<std::string, std::string> peer_raft;        // node id -> raft address (mu)
  std::set<std::string> raft_adds_pending;             // (mu)
  bool raft_transfer_pending = false;                  // (mu)
  Clock::time_point last_raft_transfer{};              // (mu)

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
  // Leaders' own claims (a HEARTBEAT's trees: "I lead t at
  // epoch e"), used for a tree the metadata does not know yet (a joiner
  // before its raft caught up), before the ring's guess. A stale claim only
  // costs a refused SUBSCRIBE; the metadata, once it knows the tree, wins.
  std::map<std::string, Leadership> hinted_leaders;  // (mu)
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
  // Deadline of a handshake on a connection this node dialed.
  Deadline DialHandshakeDeadline() const { return Deadline::After(options.handshake_timeout * 3 / 5); }
  void RebalanceRaftLeadership();
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
  // as messages. `resume`: the replica's resume offer (its SUBSCRIBE's),
  // honoured when it names the file sent.
  Status SendSnapshot(transport::Connection& conn, const std::string& replica, const std::string& tree_name,
                      uint64_t epoch, uint64_t* sent, const ResumeOffer& resume = {});

  // ================================================ node_snapshot_file.cc: join on the bulk path
  // Sends the newest checkpoint file of `tree_name` whole with SendWithBulk
  // (SNAPSHOT_FILE), writing a checkpoint first when none is usable. False
  // (nothing sent) when there is no file to send; an error only from the
  // connection.
  // `resume` is the replica's offer to continue a file it holds part of
  // (Subscribe, CheckpointRequest). A file older than `min_version` counts
  // as stale; `data_epoch` goes into the SNAPSHOT_FILE (CheckpointRequest).
  Result<bool> SendSnapshotFile(transport::Connection& conn, const std::string& replica,
                                const std::string& tree_name, uint64_t epoch, uint64_t* sent,
                                const ResumeOffer& resume, uint64_t min_version = 0, uint64_t data_epoch = 0);
  // Receives the bulk bytes of SNAPSHOT_FILE `m` straight into the store's
  // file (SnapshotFileInstaller), checking each block as it lands and
  // repeating `keepalive` (the last ACK) once per heartbeat. Returns the
  // installer, complete and ready for Finish(); the caller checks the epoch
  // first. ResourceExhausted (announced size refused, nothing written) or
  // Corruption end the stream.
  Result<std::unique_ptr<tree::SnapshotFileInstaller>> ReceiveSnapshotFile(
      transport::Connection& conn, const std::string& tree_name, const std::string& leader,
      const transport::Message& m, const SnapshotFile& f, const std::function<Status()>& keepalive);
  // The resume offer for `tree_name`: the store's partial file of it (all 0: none).
  ResumeOffer PartialFileOffer(const std::string& tree_name);
  // Node join from every owner (NodeOptions::join_from_every_owner).
  // As an owner that is not the leader: answers a CHECKPOINT_REQUEST with
  // our checkpoint file while we follow its epoch's leader (protocol.h),
  // else ERROR.
  Status ServeCheckpoint(transport::Connection& conn, const PeerIdentity& peer, const CheckpointRequest& req);
  // As the joiner: the owner to fetch `tree_name`'s file from, the one
  // (leader `l.leader` included, preferred on a tie) that is sending us the
  // fewest files; recorded in checkpoint_sources. REQUIRES mu.
  std::string PickCheckpointSourceLocked(const std::string& tree_name, const Leadership& l);
  // Fetches and installs `source`'s checkpoint file of `tree_name` (an owner
  // that is not its leader). Tagged with l.epoch when the owner's copy was
  // of that epoch and the file holds what the leader held at takeover; else
  // untagged, with fetched_data_epoch set. Any error leaves the tree to the
  // leader.
  Status FetchCheckpoint(const std::string& tree_name, const Leadership& l, const std::string& source);
  std::map<std::string, std::string> checkpoint_sources;  // (mu) tree -> the owner we fetch its file from
  // At most snapshot_file_slots checkpoint files are prepared by this node
  // at once (a checkpoint written on demand holds a whole block in memory);
  // the other streams wait for a slot, heartbeating. Bounds the leader's
  // memory and disk/CPU contention when many trees join at once, and lets
  // the first files go out while later ones are prepared. Sends are not
  // capped: each holds only socket buffers (and the replica's pace).
  std::mutex snapshot_slots_mu;
  std::condition_variable snapshot_slots_cv;
  unsigned snapshot_slots_used = 0;
  const unsigned snapshot_file_slots = std::clamp(std::thread::hardware_concurrency(), 4u, 16u);
  Status SendStream(transport::Connection& conn, const std::string& replica, const Subscribe& sub,
                    uint64_t epoch, bool force_snapshot, const std::atomic<bool>& done);
  Status StreamLoop(StreamSender& s, const std::atomic<bool>& done);
  // Sends the deltas after s.sent (up to max_bytes of them) as one DELTA or
  // DELTA_BATCH; *any says whether some went out. A committer passes its
  // replica's acked version as `direct_acked`: deltas that would take the
  // unacked bytes past kDirectUnackedBytes are then left for the stream's
  // thread (nothing sent, *deferred set). NotFound when the WAL no longer
  // holds them (a snapshot is needed). REQUIRES s.send_mu held.
  Status SendDeltasLocked(StreamSender& s, size_t max_bytes, bool* any, const uint64_t* direct_acked = nullptr,
                          bool* deferred = nullptr);
  // The streams of `tree_name` a committer may send on itself now, each
  // with its replica's acked version. REQUIRES mu held.
  std::vector<std::pair<std::shared_ptr<StreamSender>, uint64_t>> DirectStreamsLocked(const std::string& tree_name);
  // After a commit of `tree_name`: sends the new deltas on those streams
  // that are idle; wakes the stream threads for the rest. Without mu.
  void PushCommit(const std::string& tree_name,
                  const std::vector<std::pair<std::shared_ptr<StreamSender>, uint64_t>>& streams);

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
  // A connection to `owner`, registered and past its handshake (bounded by
  // DialHandshakeDeadline); the caller closes and unregisters it.
  Result<std::unique_ptr<transport::Connection>> DialOwner(const std::string& owner);
  // Asks every owner in `asked` for its state of the tree: the connections
  // are set up in parallel, then the requests go out together and every
  // answer must come within a few heartbeats (an owner starts holding off
  // the old leader when it answers, so the answers fall in one short
  // window). One result per owner, in order.
  std::vector<Result<TreeStateReply>> AskTreeStates(const std::vector<std::string>& asked,
                                                    const TreeStateRequest& req);
  // Answers a candidate's TREE_STATE_REQUEST (see protocol.h).
  TreeStateReply HandleTreeStateRequest(const TreeStateRequest& req);
  // True while we promised a candidate not to follow `l` (hold_epoch).
  bool HeldLocked(const std::string& tree_name, const Leadership& l) const;

  // ================================================ node_client.cc: client requests
  // Leader check for a request; fills a redirect (Unavailable + leader URI) when not.
  bool NotLeader(const std::string& tree_name, StatusReplyFields* status, std::string* leader_uri);
  uint32_t CountAcksLocked(const std::string& tree_name, uint64_t version,
                           const std::vector<std::string>& owners);
  // A LEADER read (node_reads.cc) waiting for its consistency level; woken (under mu) when
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
  // may satisfy (call after an ACK moved one), and claims into `satisfied`
  // the pending commits they do satisfy: the caller sends those replies
  // with FinishCommits once it released mu.
  void WakeCommitWaitersLocked(const std::string& tree_name, PendingCommits* satisfied);
  std::map<std::string, std::multimap<uint64_t, std::shared_ptr<PendingCommit>>> pending_commits;  // (mu)
  // Removes `p` from pending_commits and its pipeline's index, records its
  // acks now (counted, unless given) and counts its reply as in flight (the
  // pipeline waits for it). Takes `p` by value: a caller's reference into
  // one of those indexes would dangle once its entry is erased.
  void ClaimPendingLocked(std::shared_ptr<PendingCommit> p, std::optional<uint32_t> acks = std::nullopt);
  // Sends the replies of claimed commits (without mu).
  void FinishCommits(PendingCommits& claimed);
  // `req` as the store's commit of it (its edits as ops, its request id), or
  // InvalidArgument. Applied with Store::CommitOpsBatch, which checks the
  // request id atomically (once, whatever retries).
  Result<tree::Store::OpsCommit> ToOpsCommit(const CommitRequest& req);
  ReadReply HandleRead(const ReadRequest& req);
  StatusReply HandleStatus();
  void FillStatusLocked(StatusReply* out, std::vector<tree::Version>* latest);
  CreateTreeReply HandleCreateTree(const CreateTreeRequest& req);

  // ================================================ node_reads.cc: SLICE reads
  SliceReply HandleSlice(const SliceRequest& req);
  // `req`'s node and child slice in version `v` (status set on a bad path).
  // `data_epoch` is the tree's data epoch read BEFORE `v` was taken (see
  // DataEpoch): a copy is tagged with an epoch only once it holds that
  // epoch's takeover version, so a tag read first never outranks `v`.
  SliceReply SliceAt(const tree::Version& v, const SliceRequest& req, uint64_t data_epoch);
  uint64_t DataEpoch(const std::string& tree);
  // ONE: this node's newest (or the retained req.version).
  SliceReply SliceLocal(const SliceRequest& req);
  SliceReply SliceAtLeader(const SliceRequest& req);
  SliceReply SliceAtQuorum(const SliceRequest& req);
  // One QUORUM read's answers at ONE from the owners, merged as they come
  // (SliceAtQuorum and SliceQuorumAsync share it). Not thread safe.
  struct QuorumMerge {
    uint32_t answered = 0;           // OK and NotFound answers
    std::optional<SliceReply> best;  // highest (data epoch, version)
    uint64_t newest_version = 0;     // over every OK answer
    std::string not_found;           // the first NotFound's message
    std::string failures;            // "; node N: why" for each failure
    // An owner's answer: OK counts, NotFound counts holding nothing (an
    // owner without a copy yet), anything else is a failure.
    void Add(const std::string& id, SliceReply r);
    void Fail(const std::string& id, const Status& why);
    // The reply once the answers are in: Unavailable (fewer than `need`
    // answered), NotFound (no answer holds it), or the best copy; nullopt
    // when copies of different epochs disagree (`*why`: how), for the
    // leader to settle (QuorumReadFromLeader).
    std::optional<SliceReply> Settle(const SliceRequest& req, uint32_t need, const std::string& self,
                                     std::string* why);
  };
  // The tree's owners (id, URI), this node first, then live peers, then the
  // rest; `*alive` how many lead the list being this node or live. mu held.
  std::vector<std::pair<std::string, std::string>> QuorumOwnersLocked(const std::string& tree, size_t* alive);
  // Node::SliceAsync for a QUORUM read: the owners' SLICEs at ONE go out on
  // quorum_links; false (nothing answered, `done` dropped) when it cannot
  // start that way. `done` gets nullopt when the answers cannot settle it
  // without blocking.
  bool SliceQuorumAsync(const SliceRequest& req, std::function<void(std::optional<SliceReply>)> done);
  // A QUORUM read the owners' answers cannot settle (copies of different
  // epochs disagree, `why`), answered by the tree's leader at LEADER level;
  // Unavailable naming `why` when the leader cannot be asked.
  SliceReply QuorumReadFromLeader(const SliceRequest& req, const std::string& why);
  // The newest version a quorum of the tree's replica set holds durably.
  uint64_t QuorumDurableLocked(const std::string& tree_name, uint32_t* replicas);
  // The metadata state from a raft barrier that started after this call;
  // concurrent callers share one barrier (fence_mu).
  Result<std::shared_ptr<const meta::ClusterState>> MetaBarrier(Deadline deadline);
  // A pooled client connection to a peer (read_pool_mu), and its return.
  std::unique_ptr<Client> TakePeerClient(const std::string& peer_uri, Status* error);
  void ReturnPeerClient(const std::string& peer_uri, std::unique_ptr<Client> c);
  // `req` sent to a peer on a pooled client (returned to the pool when the
  // call succeeded); the connection's or the call's error otherwise.
  Result<SliceReply> SliceFromPeer(const std::string& peer_uri, const SliceRequest& req);

  std::mutex fence_mu;  // never held with mu
  std::condition_variable fence_cv;
  uint64_t fence_started = 0;  // barriers begun (fence_mu)
  uint64_t fence_done = 0;     // the last one finished (fence_mu)
  bool fence_running = false;
  Result<std::shared_ptr<const meta::ClusterState>> fence_result = Status::Unavailable("no barrier yet");
  // Pipelined SLICE links to peers for SliceQuorumAsync (opened by the
  // blocking QUORUM path, which Node::SliceAsync's callers fall back to).
  // Shut down in Stop; thread safe.
  std::unique_ptr<SliceForwarder> quorum_links;
  std::mutex read_pool_mu;  // never held with mu nor across a call
  std::map<std::string, std::vector<std::unique_ptr<Client>>> read_pool;  // peer URI -> idle clients
};

// The COMMITs in flight on one connection (node_client.cc). The
// connection's reader Submits each as it arrives and Flushes once no
// further message is waiting: the queued commits are applied together, per
// tree in arrival order with one Store::CommitOpsBatch (one hold of the
// tree's lock, one WAL write, one sync; a slow disk's sync thus covers every
// commit that arrived meanwhile), and pushed to the replicas together. Then
// a commit whose consistency level is not reached yet becomes a
// PendingCommit and no thread waits for it: the ACK that satisfies it sends
// its reply from the ACK receiver's thread, and the pipeline's timer thread
// answers those whose time runs out (Timeout with the acks they have) — in
// any order, each reply carrying its request's sequence. Connection::Send is
// thread safe, so replies of other requests go out from the reader
// meanwhile.
// Thread safety: Submit and Flush from the reader thread only; the
// destructor (on the reader thread) drops queued commits (never applied nor
// answered: their client is gone), answers pending ones with what they have,
// and waits for every reply in flight.
class CommitPipeline {
 public:
  CommitPipeline(Node::Impl& node, transport::Connection& conn) : node_(node), conn_(conn) {}
  ~CommitPipeline();
  CommitPipeline(const CommitPipeline&) = delete;
  CommitPipeline& operator=(const CommitPipeline&) = delete;

  // Queues `req` until the next Flush; first, while kMaxCommitsInFlight
  // are in flight, flushes and waits for replies. A failed reply send closes
  // the connection (the reader then sees it).
  void Submit(CommitRequest req);
  // True while Submitted commits wait for Flush.
  bool unflushed() const { return !queued_.empty(); }
  // Applies the queued commits (one store batch per tree), answers those
  // already decided, registers the others as pending and sends the new
  // deltas to the trees' replicas (reader only; call before waiting for
  // the next message).
  void Flush();

 private:
  friend struct Node::Impl;
  struct Queued {
    CommitRequest req;
    Clock::time_point arrived;
    Deadline deadline;  // from its arrival
  };
  // Flush for the queued commits of one tree.
  void FlushTree(const std::string& tree_name, std::vector<Queued*>& commits);
  // Sets the outcome of each of `commits` from its acks, sends their replies
  // at once (Connection::SendBatch) and releases their slots.
  void AnswerAll(const std::vector<PendingCommit*>& commits);
  void TimerLoop();

  Node::Impl& node_;
  transport::Connection& conn_;
  std::atomic<size_t> in_flight_{0};  // submitted, not yet answered
  std::vector<Queued> queued_;        // reader only: submitted, not flushed yet

  std::mutex mu_;                    // for room_cv_; never held with node_.mu
  std::condition_variable room_cv_;  // in_flight_ dropped below the limit

  // Guarded by node_.mu:
  std::multimap<Clock::time_point, std::shared_ptr<PendingCommit>> by_deadline_;  // registered ones
  size_t answering_ = 0;  // claimed replies being sent by other threads
  bool timer_closing_ = false;
  std::condition_variable timer_cv_;  // (node_.mu) a new earliest deadline, answering_ reached 0, closing
  std::thread timer_;
};

}  // namespace canopy::replication
