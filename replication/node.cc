#include "replication/node.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "base/file.h"
#include "base/logging.h"
#include "replication/handshake.h"
#include "replication/meta/metadata.h"
#include "replication/node_metrics.h"
#include "replication/protocol.h"
#include "transport/registry.h"

namespace canopy::replication {

namespace {

// Without the metadata service every tree keeps its first leader: epoch 1.
// With it, 1 is also the epoch of a tree's first leader.
constexpr uint64_t kFirstEpoch = 1;
constexpr size_t kDeltaBatchBytes = 4u << 20;
// Incoming connections served at once; more are refused with ERROR.
constexpr int kMaxServedConnections = 1024;

std::string Hex64(uint64_t v) { return fmt::format("{:016x}", v); }

tree::NodePath ToNodePath(const std::vector<uint32_t>& path) { return tree::NodePath(path.begin(), path.end()); }

Result<tree::Op> ToOp(const Edit& e) {
  tree::NodePath path = ToNodePath(e.path);
  switch (e.kind) {
    case Edit::Kind::kPutAttribute: return tree::Op::PutAttribute(path, e.key, e.value);
    case Edit::Kind::kDeleteAttribute: return tree::Op::DeleteAttribute(path, e.key);
    case Edit::Kind::kAppendChild: return tree::Op::AppendChild(path);
    case Edit::Kind::kInsertChild: return tree::Op::InsertChild(path, e.index);
    case Edit::Kind::kDeleteChild: return tree::Op::DeleteChild(path, e.index);
  }
  return Status::InvalidArgument("unknown edit kind");
}

}  // namespace

struct Node::Impl {
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
  std::condition_variable cv;  // commits, acks, stop
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
  struct PeerTree {
    uint64_t data_epoch = 0;
    uint64_t version = 0;
    Clock::time_point at;
  };
  std::map<std::string, std::map<std::string, PeerTree>> peer_trees;  // peer -> tree -> state
  Clock::time_point started_at = Clock::now();

  // ---- metadata service (optional) ----
  std::unique_ptr<meta::MetadataService> meta;
  std::atomic<bool> meta_synced{false};
  uint64_t meta_watch = 0;
  std::map<std::string, meta::TreeLeader> meta_trees;  // guarded by mu
  std::map<std::string, std::string> peer_raft;        // node id -> raft address (mu)
  std::set<std::string> raft_adds_pending;             // (mu)
  std::map<std::string, TreeReplication> trees;
  std::vector<std::string> unresolved_seeds;

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

  explicit Impl(const NodeOptions& o) : options(o), ring(o.ring) {}
  ~Impl() { Stop(); }

  // ---------------------------------------------------------------- helpers

  void Spawn(std::function<void()> body) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::lock_guard<std::mutex> lock(threads_mu);
    if (stopping) return;
    workers.push_back(Worker{std::thread([body = std::move(body), done] {
                               body();
                               done->store(true);
                             }),
                             done});
  }

  void ReapWorkers() {
    std::list<Worker> finished;
    {
      std::lock_guard<std::mutex> lock(threads_mu);
      for (auto it = workers.begin(); it != workers.end();) {
        if (it->done->load()) {
          finished.splice(finished.end(), workers, it++);
        } else {
          ++it;
        }
      }
    }
    for (auto& w : finished) w.thread.join();
  }

  // Registers a connection so that Stop() can wake whoever blocks on it.
  bool Register(transport::Connection* c) {
    std::lock_guard<std::mutex> lock(threads_mu);
    if (stopping) return false;
    open_conns.insert(c);
    return true;
  }
  void Unregister(transport::Connection* c) {
    std::lock_guard<std::mutex> lock(threads_mu);
    open_conns.erase(c);
  }

  void SleepFor(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, d, [&] { return stopping.load(); });
  }

  std::string MembersPath() const { return JoinPath(options.data_dir, "members"); }

  void PersistMembersLocked() {
    std::string text;
    for (const auto& [id, u] : members) text += id + " " + u + "\n";
    Status s = WriteFileAtomic(MembersPath(), text);
    if (!s.ok()) CANOPY_LOG(kWarn, "node {}: cannot persist members: {}", node_id, s.ToString());
  }

  // Adds or updates a member; rebuilds the ring for new ids.
  void AddMemberLocked(const std::string& id, const std::string& member_uri) {
    if (id.empty() || member_uri.empty()) return;
    auto it = members.find(id);
    if (it != members.end() && it->second == member_uri) return;
    if (id == node_id && member_uri != uri) return;  // nobody moves us
    bool is_new = it == members.end();
    members[id] = member_uri;
    if (is_new) {
      (void)ring.AddNode(id);
      CANOPY_LOG(kInfo, "node {}: member {} at {} joined the ring ({} nodes)", node_id, id, member_uri,
                 ring.node_count());
    } else {
      CANOPY_LOG(kInfo, "node {}: member {} moved to {}", node_id, id, member_uri);
    }
    PersistMembersLocked();
    cv.notify_all();
  }

  void AddMember(const std::string& id, const std::string& member_uri) {
    std::lock_guard<std::mutex> lock(mu);
    AddMemberLocked(id, member_uri);
  }

  std::vector<std::string> OwnersLocked(const std::string& tree) const { return ring.Owners(tree); }

  struct Leadership {
    std::string leader;
    uint64_t epoch = 0;
    bool operator==(const Leadership&) const = default;
  };
  // The tree's leader and epoch: from the metadata service when it has an
  // entry, else the ring's first owner at the first epoch.
  Leadership LeadershipLocked(const std::string& tree) const {
    if (meta) {
      auto it = meta_trees.find(tree);
      if (it != meta_trees.end()) return {std::to_string(it->second.leader_node), it->second.epoch};
    }
    auto owners = ring.Owners(tree);
    return {owners.empty() ? std::string() : owners[0], kFirstEpoch};
  }
  std::string LeaderLocked(const std::string& tree) const { return LeadershipLocked(tree).leader; }
  // True when we lead `tree` (and, with metadata, know the current state).
  bool LeadsLocked(const std::string& tree, uint64_t* epoch) const {
    Leadership l = LeadershipLocked(tree);
    if (epoch) *epoch = l.epoch;
    return l.leader == node_id && (!meta || meta_synced);
  }

  std::string EpochsPath() const { return JoinPath(options.data_dir, "epochs"); }
  void PersistEpochsLocked() {
    std::string text;
    for (const auto& [name, t] : trees) {
      if (t.data_epoch == 0) continue;
      text += fmt::format("{} {} {} {}\n", name, t.data_epoch, t.predecessor_epoch, t.takeover_version);
    }
    Status s = WriteFileAtomic(EpochsPath(), text);
    if (!s.ok()) CANOPY_LOG(kWarn, "node {}: cannot persist epochs: {}", node_id, s.ToString());
  }
  void SetDataEpochLocked(const std::string& tree, uint64_t epoch) {
    auto& t = trees[tree];
    if (t.data_epoch == epoch) return;
    t.data_epoch = epoch;
    PersistEpochsLocked();
  }

  std::string UriOfLocked(const std::string& id) const {
    auto it = members.find(id);
    return it == members.end() ? std::string() : it->second;
  }

  bool AliveLocked(const std::string& id) const {
    if (id == node_id) return true;
    auto it = last_heard.find(id);
    return it != last_heard.end() && Clock::now() - it->second < options.failure_timeout;
  }

  Result<std::pair<std::string, std::unique_ptr<transport::Connection>>> DialPeerWithId(
      const std::string& peer_uri) {
    CANOPY_ASSIGN_OR_RETURN(auto conn, transport::Dial(peer_uri, topts));
    CANOPY_ASSIGN_OR_RETURN(PeerIdentity id, DialerHandshake(*conn, hs, Deadline::After(std::chrono::seconds(3))));
    return std::make_pair(id.node_id, std::move(conn));
  }

  // ---------------------------------------------------------------- start/stop

  Status Init() {
    CANOPY_RETURN_IF_ERROR(CreateDirs(options.data_dir));
    // Node id: given, or remembered, or generated once.
    const std::string id_path = JoinPath(options.data_dir, "node_id");
    std::string stored;
    if (PathExists(id_path)) {
      CANOPY_ASSIGN_OR_RETURN(stored, ReadFileToString(id_path, 1024));
      while (!stored.empty() && (stored.back() == '\n' || stored.back() == ' ')) stored.pop_back();
    }
    if (!options.node_id.empty()) {
      if (!stored.empty() && stored != options.node_id) {
        return Status::InvalidArgument(fmt::format("data dir {} belongs to node {}, not {}", options.data_dir, stored,
                                                   options.node_id));
      }
      node_id = options.node_id;
    } else if (!stored.empty()) {
      node_id = stored;
    } else {
      std::random_device rd;
      uint64_t v = (static_cast<uint64_t>(rd()) << 32 | rd()) & 0x7fffffffffffffffULL;
      node_id = std::to_string(v == 0 ? 1 : v);
    }
    if (stored.empty()) CANOPY_RETURN_IF_ERROR(WriteFileAtomic(id_path, node_id + "\n"));

    tree::StoreOptions so = options.store;
    so.snapshot_chunk_bytes = options.snapshot_chunk_bytes;
    CANOPY_ASSIGN_OR_RETURN(store, tree::Store::Open(JoinPath(options.data_dir, "store"), so));

    CANOPY_ASSIGN_OR_RETURN(listener, transport::ListenOn(options.listen_uri, topts));
    transport::Endpoint ep = listener->local_endpoint();
    uri = ep.ToUri();

    metrics = std::make_unique<NodeMetrics>(node_id);
    metrics_refresher = std::make_unique<canopy::metrics::Refresher>([this] { RefreshMetrics(); });
    hs.cluster = options.cluster;
    hs.node_id = node_id;
    hs.secret = options.secret;
    hs.role = PeerRole::kNode;
    hs.listen_uri = uri;

    std::lock_guard<std::mutex> lock(mu);
    members[node_id] = uri;
    CANOPY_RETURN_IF_ERROR(ring.AddNode(node_id));
    if (PathExists(MembersPath())) {
      CANOPY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(MembersPath(), 16 << 20));
      std::istringstream in(text);
      std::string id, member_uri;
      while (in >> id >> member_uri) {
        if (id != node_id) AddMemberLocked(id, member_uri);
      }
    }
    PersistMembersLocked();
    for (const auto& s : options.seeds) {
      if (s != uri) unresolved_seeds.push_back(s);
    }
    for (const auto& t : store->ListTrees()) known_trees.insert(t);
    if (PathExists(EpochsPath())) {
      CANOPY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(EpochsPath(), 64 << 20));
      std::istringstream in(text);
      std::string name;
      uint64_t de, pe, tv;
      while (in >> name >> de >> pe >> tv) {
        auto& t = trees[name];
        t.data_epoch = de;
        t.predecessor_epoch = pe;
        t.takeover_version = tv;
      }
    }
    return Status::Ok();
  }

  Status StartMeta() {
    if (options.raft_address.empty()) return Status::Ok();
    meta::MetaOptions mo;
    try {
      mo.node_id = std::stoull(node_id);
    } catch (const std::exception&) {
      return Status::InvalidArgument("with --raft the node id must be a decimal number, not '" + node_id + "'");
    }
    mo.raft_address = options.raft_address;
    mo.data_dir = JoinPath(options.data_dir, "meta");
    mo.initial_members = options.raft_members;
    if (!mo.initial_members.empty() && !mo.initial_members.count(mo.node_id)) {
      mo.initial_members[mo.node_id] = options.raft_address;
    }
    std::string host = options.raft_address.substr(0, options.raft_address.rfind(':'));
    mo.forward_address = host + ":0";
    CANOPY_ASSIGN_OR_RETURN(meta, meta::MetadataService::Start(mo));
    meta_watch = meta->AddWatch([this](const meta::ClusterState& state) {
      std::lock_guard<std::mutex> lock(mu);
      meta_trees = state.trees;
      cv.notify_all();
    });
    // Until a linearizable read succeeds the local metadata may be stale
    // (e.g. after a restart): do not act as a leader before that.
    Spawn([this] {
      while (!stopping && !meta_synced) {
        auto state = meta->ReadLinearizable(Deadline::After(std::chrono::seconds(2)));
        if (state.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          meta_trees = state->trees;
          meta_synced = true;
          cv.notify_all();
          CANOPY_LOG(kInfo, "node {}: metadata in sync ({} trees with leaders)", node_id, meta_trees.size());
          break;
        }
        SleepFor(std::chrono::milliseconds(100));
      }
    });
    return Status::Ok();
  }

  void StartThreads() {
    accept_thread = std::thread([this] { AcceptLoop(); });
    maintenance_thread = std::thread([this] { MaintenanceLoop(); });
  }

  // Sets the per-tree and per-replica gauges (metrics_refresher).
  void RefreshMetrics() {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [name, t] : trees) {
      uint64_t latest = store->HasTree(name) ? store->LatestVersion(name).value_or(0) : 0;
      Leadership l = LeadershipLocked(name);
      metrics->SetTree(name, l.epoch, latest);
      if (l.leader != node_id) continue;
      for (const auto& [replica, acked] : t.acked) metrics->SetReplica(name, replica, acked, latest);
    }
  }

  void Stop() {
    metrics_refresher.reset();  // no scrape reads the state being torn down
    {
      std::lock_guard<std::mutex> lock(threads_mu);
      if (stopping.exchange(true)) return;
      for (auto* c : open_conns) c->Close();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
    if (listener) listener->Close();
    if (meta) {
      meta->RemoveWatch(meta_watch);
      meta->Stop();
    }
    if (accept_thread.joinable()) accept_thread.join();
    if (maintenance_thread.joinable()) maintenance_thread.join();
    std::list<Worker> all;
    {
      std::lock_guard<std::mutex> lock(threads_mu);
      for (auto* c : open_conns) c->Close();
      all.swap(workers);
    }
    for (auto& w : all) w.thread.join();
    if (store) (void)store->SyncAll();
  }

  // ---------------------------------------------------------------- accept

  void AcceptLoop() {
    while (!stopping) {
      auto conn = listener->Accept(Deadline::After(std::chrono::milliseconds(250)));
      if (!conn.ok()) {
        if (conn.status().IsTimeout()) continue;
        if (stopping) break;
        CANOPY_LOG(kWarn, "node {}: accept: {}", node_id, conn.status().ToString());
        SleepFor(std::chrono::milliseconds(50));
        continue;
      }
      std::shared_ptr<transport::Connection> c(std::move(*conn));
      if (served_connections.load() >= kMaxServedConnections) {
        CANOPY_LOG(kWarn, "node {}: refusing {}: {} connections already", node_id, c->peer_uri(),
                   kMaxServedConnections);
        SendError(*c, Status::ResourceExhausted("too many connections"));
        c->Close();
        continue;
      }
      ++served_connections;
      Spawn([this, c] {
        ServeConnection(*c);
        --served_connections;
      });
    }
  }

  void ServeConnection(transport::Connection& conn) {
    if (!Register(&conn)) return;
    auto id = ListenerHandshake(conn, hs, Deadline::After(std::chrono::seconds(5)));
    if (!id.ok()) {
      if (!stopping) CANOPY_LOG(kWarn, "node {}: refused {}: {}", node_id, conn.peer_uri(), id.status().ToString());
      conn.Close();
      Unregister(&conn);
      return;
    }
    if (id->role == PeerRole::kNode) {
      std::lock_guard<std::mutex> lock(mu);
      AddMemberLocked(id->node_id, id->listen_uri);
      last_heard[id->node_id] = Clock::now();
    }
    Status s = ServeMessages(conn, *id);
    if (!s.ok() && !stopping && !s.IsClosed() && s.code() != StatusCode::kAborted) {
      CANOPY_LOG(kWarn, "node {}: dropping {} (node {}): {}", node_id, conn.peer_uri(), id->node_id, s.ToString());
      if (s.IsCorruption() || s.code() == StatusCode::kInvalidArgument) SendError(conn, s);
    }
    conn.Close();
    Unregister(&conn);
  }

  Status ServeMessages(transport::Connection& conn, const PeerIdentity& peer) {
    while (!stopping) {
      auto m = conn.Receive(Deadline::After(std::chrono::seconds(1)));
      if (!m.ok()) {
        if (m.status().IsTimeout()) continue;
        return m.status();
      }
      if (m->bulk_bytes != 0) return Status::Corruption("unexpected bulk bytes from peer");
      auto type = static_cast<MessageType>(m->type);
      if (peer.role == PeerRole::kNode) {
        if (type == MessageType::kHeartbeat) {
          CANOPY_ASSIGN_OR_RETURN(Heartbeat hb, DecodeHeartbeat(m->payload));
          OnHeartbeat(hb);
          continue;
        }
        if (type == MessageType::kSubscribe) {
          CANOPY_ASSIGN_OR_RETURN(Subscribe sub, DecodeSubscribe(m->payload));
          return LeadStream(conn, peer, sub);
        }
      }
      switch (type) {
        case MessageType::kCommitRequest: {
          CANOPY_ASSIGN_OR_RETURN(CommitRequest req, DecodeCommitRequest(m->payload));
          CANOPY_RETURN_IF_ERROR(SendMessage(conn, HandleCommit(req)));
          break;
        }
        case MessageType::kReadRequest: {
          CANOPY_ASSIGN_OR_RETURN(ReadRequest req, DecodeReadRequest(m->payload));
          CANOPY_RETURN_IF_ERROR(SendMessage(conn, HandleRead(req)));
          break;
        }
        case MessageType::kStatusRequest: {
          CANOPY_RETURN_IF_ERROR(DecodeStatusRequest(m->payload).status());
          CANOPY_RETURN_IF_ERROR(SendMessage(conn, HandleStatus()));
          break;
        }
        case MessageType::kCreateTreeRequest: {
          CANOPY_ASSIGN_OR_RETURN(CreateTreeRequest req, DecodeCreateTreeRequest(m->payload));
          CANOPY_RETURN_IF_ERROR(SendMessage(conn, HandleCreateTree(req)));
          break;
        }
        case MessageType::kError: {
          return UnexpectedMessage(*m, "a request");
        }
        default:
          return Status::Corruption(fmt::format("unexpected {} message", MessageTypeName(m->type)));
      }
    }
    return Status::Aborted("stopping");
  }

  void OnHeartbeat(const Heartbeat& hb) {
    std::lock_guard<std::mutex> lock(mu);
    last_heard[hb.node_id] = Clock::now();
    if (!hb.raft_address.empty()) peer_raft[hb.node_id] = hb.raft_address;
    for (const auto& [id, member_uri] : hb.members) AddMemberLocked(id, member_uri);
    for (const auto& t : hb.trees) {
      if (!tree::Store::ValidateTreeName(t.tree).ok()) continue;
      known_trees.insert(t.tree);
      peer_trees[hb.node_id][t.tree] = PeerTree{t.epoch, t.durable_version, Clock::now()};
    }
  }

  // ---------------------------------------------------------------- leader side

  // Streams `sub.tree` to the subscribing replica until it goes away or we
  // stop leading the tree.
  Status LeadStream(transport::Connection& conn, const PeerIdentity& peer, const Subscribe& sub) {
    uint64_t epoch = 0;
    bool trusted = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!LeadsLocked(sub.tree, &epoch)) {
        Leadership l = LeadershipLocked(sub.tree);
        SendError(conn, Status::Unavailable(fmt::format("node {} is not the leader of {}; leader is {} (epoch {})",
                                                        node_id, sub.tree, l.leader, l.epoch)));
        return Status::Ok();
      }
      const auto& t = trees[sub.tree];
      // The replica's history is ours when it came from our epoch, or from
      // the epoch we took over from, up to the version we took over at.
      trusted = sub.have_version == 0 || sub.data_epoch == epoch ||
                (t.predecessor_epoch != 0 && sub.data_epoch == t.predecessor_epoch &&
                 sub.have_version <= t.takeover_version);
    }
    if (!store->HasTree(sub.tree)) {
      SendError(conn, Status::NotFound("no tree " + sub.tree + " on its leader (yet)"));
      return Status::Ok();
    }
    if (sub.epoch > epoch) {
      SendError(conn, Status::Conflict(fmt::format("replica {} knows epoch {} of {}, newer than this leader's {}",
                                                   peer.node_id, sub.epoch, sub.tree, epoch)));
      return Status::Ok();
    }
    if (!trusted) {
      std::lock_guard<std::mutex> lock(mu);
      trees[sub.tree].acked.erase(peer.node_id);  // an earlier stream's claim is void too
    }
    CANOPY_LOG(kInfo, "node {}: replica {} subscribed to {} at version {} (data epoch {}, leader epoch {}{})",
               node_id, peer.node_id, sub.tree, sub.have_version, sub.data_epoch, epoch,
               trusted ? "" : ", history not ours: resync by snapshot");
    std::atomic<bool> done{false};
    Status sender_status;
    std::thread sender([&] {
      sender_status = SendStream(conn, peer.node_id, sub, epoch, !trusted, done);
      done = true;
      conn.Close();
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    });
    Status receive_status;
    while (!done && !stopping) {
      auto m = conn.Receive(Deadline::After(options.failure_timeout));
      if (!m.ok()) {
        receive_status = m.status();
        if (m.status().IsTimeout()) {
          receive_status = Status::Timeout(fmt::format("replica {} silent for {} ms", peer.node_id,
                                                       options.failure_timeout.count()));
        }
        break;
      }
      if (m->bulk_bytes != 0) {
        receive_status = Status::Corruption("unexpected bulk bytes from replica");
        break;
      }
      if (m->type == static_cast<uint16_t>(MessageType::kAck)) {
        auto ack = DecodeAck(m->payload);
        if (!ack.ok()) {
          receive_status = ack.status();
          break;
        }
        if (ack->tree != sub.tree || ack->epoch != epoch) {
          receive_status = Status::Conflict(fmt::format("ACK for {} epoch {}, streaming {} epoch {}", ack->tree,
                                                        ack->epoch, sub.tree, epoch));
          break;
        }
        std::lock_guard<std::mutex> lock(mu);
        // A replica whose history is not ours reports its own durable
        // version until our snapshot replaced it: liveness only, no claim.
        if (trusted || ack->snapshots_installed > 0) trees[sub.tree].acked[peer.node_id] = ack->durable_version;
        last_heard[peer.node_id] = Clock::now();
        cv.notify_all();
      } else if (m->type == static_cast<uint16_t>(MessageType::kHeartbeat)) {
        auto hb = DecodeHeartbeat(m->payload);
        if (!hb.ok()) {
          receive_status = hb.status();
          break;
        }
        OnHeartbeat(*hb);
      } else {
        receive_status = UnexpectedMessage(*m, "ACK");
        break;
      }
    }
    done = true;
    {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
    conn.Close();
    sender.join();
    if (!stopping) {
      CANOPY_LOG(kInfo, "node {}: stream of {} to replica {} ended: {} / {}", node_id, sub.tree, peer.node_id,
                 receive_status.ToString(), sender_status.ToString());
    }
    return Status::Ok();
  }

  Status SendSnapshot(transport::Connection& conn, const std::string& replica, const std::string& tree_name,
                      uint64_t epoch, uint64_t* sent) {
    CANOPY_ASSIGN_OR_RETURN(tree::Version v, store->Latest(tree_name));
    CANOPY_LOG(kInfo, "node {}: streaming snapshot of {} at version {} to replica {} (it has version {})", node_id,
               tree_name, v.number(), replica, *sent);
    CANOPY_RETURN_IF_ERROR(SendMessage(conn, SnapshotBegin{tree_name, epoch, v.number()}));
    tree::SnapshotWriter writer(v, options.snapshot_chunk_bytes);
    uint64_t index = 0;
    uint64_t bytes = 0;
    std::string chunk;  // one buffer for the whole stream, handed back after each send
    while (writer.NextInto(&chunk)) {
      bytes += chunk.size();
      SnapshotChunk c{tree_name, epoch, index++, std::move(chunk)};
      CANOPY_RETURN_IF_ERROR(SendMessage(conn, c));
      chunk = std::move(c.data);
    }
    CANOPY_RETURN_IF_ERROR(SendMessage(conn, SnapshotEnd{tree_name, epoch, v.number(), index}));
    *sent = v.number();
    metrics->SnapshotSent(bytes);
    std::lock_guard<std::mutex> lock(mu);
    ++trees[tree_name].snapshots_sent;
    return Status::Ok();
  }

  Status SendStream(transport::Connection& conn, const std::string& replica, const Subscribe& sub, uint64_t epoch,
                    bool force_snapshot, const std::atomic<bool>& done) {
    const std::string& tree_name = sub.tree;
    uint64_t sent = sub.have_version;
    CANOPY_ASSIGN_OR_RETURN(uint64_t latest, store->LatestVersion(tree_name));
    if (sent > latest) force_snapshot = true;  // it holds versions we never had
    if (sent == 0 && latest > 0) force_snapshot = true;  // a new replica (node join): bulk install
    if (force_snapshot) CANOPY_RETURN_IF_ERROR(SendSnapshot(conn, replica, tree_name, epoch, &sent));
    uint64_t heartbeat_seq = 0;
    auto still_leading = [&] {
      uint64_t e = 0;
      return LeadsLocked(tree_name, &e) && e == epoch;
    };
    while (!done && !stopping) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!still_leading()) return Status::Conflict(fmt::format("no longer the leader of {} at epoch {}", tree_name, epoch));
      }
      auto deltas = store->ReadDeltasSince(tree_name, sent, kDeltaBatchBytes);
      if (!deltas.ok()) {
        if (!deltas.status().IsNotFound()) return deltas.status();
        CANOPY_RETURN_IF_ERROR(SendSnapshot(conn, replica, tree_name, epoch, &sent));
        continue;
      }
      if (!deltas->empty()) {
        for (auto& d : *deltas) {
          Delta msg{tree_name, epoch, sent, sent + 1, std::move(d)};
          CANOPY_RETURN_IF_ERROR(SendMessage(conn, msg));
          ++sent;
        }
        continue;
      }
      // Idle: wait for the next commit, heartbeat meanwhile.
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, options.heartbeat_interval, [&] {
          if (done || stopping || !still_leading()) return true;
          auto l = store->LatestVersion(tree_name);
          return l.ok() && *l > sent;
        });
      }
      auto l = store->LatestVersion(tree_name);
      if (l.ok() && *l == sent && !done && !stopping) {
        Heartbeat hb;
        hb.node_id = node_id;
        hb.sequence = ++heartbeat_seq;
        hb.trees.push_back({tree_name, epoch, sent});
        CANOPY_RETURN_IF_ERROR(SendMessage(conn, hb));
      }
    }
    return Status::Ok();
  }

  // ---------------------------------------------------------------- replica side

  void ReplicaLoop(std::string tree_name) {
    CANOPY_LOG(kInfo, "node {}: replicating {}", node_id, tree_name);
    while (!stopping) {
      Leadership l;
      std::string leader_uri;
      {
        std::lock_guard<std::mutex> lock(mu);
        auto owners = OwnersLocked(tree_name);
        bool owner = std::find(owners.begin(), owners.end(), node_id) != owners.end();
        l = LeadershipLocked(tree_name);
        if (!owner || l.leader == node_id || l.leader.empty()) break;
        leader_uri = UriOfLocked(l.leader);
      }
      Status s = leader_uri.empty() ? Status::NotFound("leader URI unknown") : FollowOnce(tree_name, l, leader_uri);
      if (stopping) break;
      CANOPY_LOG(kDebug, "node {}: following {} from {}: {}", node_id, tree_name, l.leader, s.ToString());
      if (meta) MaybeFailover(tree_name, l);
      SleepFor(std::chrono::milliseconds(100));
    }
    std::lock_guard<std::mutex> lock(mu);
    trees[tree_name].replica_running = false;
  }

  // Takes over `tree` when its leader `dead.leader` has been silent long
  // enough and we are the live owner with the newest data.
  void MaybeFailover(const std::string& tree_name, const Leadership& dead) {
    auto detected = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!meta_synced || AliveLocked(dead.leader)) return;
      // Just started: we have not heard anyone yet.
      if (Clock::now() - started_at < 2 * options.failure_timeout) return;
    }
    // Let every live peer report its state after the leader stopped.
    SleepFor(3 * options.heartbeat_interval);
    uint64_t my_version = store->HasTree(tree_name) ? store->LatestVersion(tree_name).value_or(0) : 0;
    uint64_t my_epoch = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping || !(LeadershipLocked(tree_name) == dead) || AliveLocked(dead.leader)) return;
      my_epoch = trees[tree_name].data_epoch;
      auto better = [](uint64_t e1, uint64_t v1, const std::string& id1, uint64_t e2, uint64_t v2,
                       const std::string& id2) {
        if (e1 != e2) return e1 > e2;
        if (v1 != v2) return v1 > v2;
        return id1 < id2;
      };
      // Every QUORUM-acknowledged write is on owners/2+1 owners, so only a
      // candidate that has compared itself with a quorum of owners (itself
      // included) knows it holds them all. An owner we merely do not hear
      // from (cut link, just restarted) may hold newer acknowledged data:
      // without a quorum of fresh reports, wait.
      const auto owners = OwnersLocked(tree_name);
      size_t compared = 1;  // ourselves
      for (const auto& owner : owners) {
        if (owner == node_id || owner == dead.leader || !AliveLocked(owner)) continue;
        auto pit = peer_trees.find(owner);
        if (pit == peer_trees.end()) return;
        auto tit = pit->second.find(tree_name);
        if (tit == pit->second.end() || tit->second.at < detected) return;  // no fresh report yet
        if (better(tit->second.data_epoch, tit->second.version, owner, my_epoch, my_version, node_id)) return;
        ++compared;
      }
      if (compared < owners.size() / 2 + 1) return;
    }
    CANOPY_LOG(kInfo, "node {}: leader {} of {} (epoch {}) is dead; taking over at version {}", node_id, dead.leader,
               tree_name, dead.epoch, my_version);
    uint64_t expected = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = meta_trees.find(tree_name);
      if (it == meta_trees.end()) {
        // Created without the metadata service: its epoch-1 leader is not
        // registered, and a CAS from 0 would hand out epoch 1 a second time.
        CANOPY_LOG(kWarn, "node {}: {} has no leader in the metadata; no failover", node_id, tree_name);
        return;
      }
      expected = it->second.epoch;
    }
    auto epoch = meta->CompareAndSetLeader(tree_name, expected, std::stoull(node_id), my_version,
                                           Deadline::After(std::chrono::seconds(5)));
    if (!epoch.ok()) {
      CANOPY_LOG(kInfo, "node {}: takeover of {} failed: {}", node_id, tree_name, epoch.status().ToString());
      return;
    }
    metrics->Failover();
    std::lock_guard<std::mutex> lock(mu);
    auto& t = trees[tree_name];
    t.predecessor_epoch = my_epoch;
    t.takeover_version = my_version;
    t.data_epoch = *epoch;
    t.acked.clear();
    PersistEpochsLocked();
    meta::TreeLeader tl{tree_name, std::stoull(node_id), *epoch, my_version};
    auto& cached = meta_trees[tree_name];
    if (cached.epoch < *epoch) cached = tl;
    cv.notify_all();
    CANOPY_LOG(kInfo, "node {}: now the leader of {} at epoch {} (version {})", node_id, tree_name, *epoch, my_version);
  }

  Status SendAck(transport::Connection& conn, const std::string& tree_name, uint64_t epoch,
                 uint64_t snapshots_installed, uint64_t* last_acked) {
    uint64_t durable = store->HasTree(tree_name) ? store->DurableVersion(tree_name).value_or(0) : 0;
    *last_acked = durable;
    return SendMessage(conn, Ack{tree_name, epoch, durable, snapshots_installed});
  }

  Status FollowOnce(const std::string& tree_name, const Leadership& l, const std::string& leader_uri) {
    CANOPY_ASSIGN_OR_RETURN(auto conn, transport::Dial(leader_uri, topts));
    if (!Register(conn.get())) return Status::Aborted("stopping");
    Status s = FollowOn(*conn, tree_name, l);
    conn->Close();
    Unregister(conn.get());
    return s;
  }

  Status FollowOn(transport::Connection& conn, const std::string& tree_name, const Leadership& l) {
    const std::string& leader = l.leader;
    const uint64_t epoch = l.epoch;
    CANOPY_ASSIGN_OR_RETURN(PeerIdentity id, DialerHandshake(conn, hs, Deadline::After(std::chrono::seconds(3))));
    if (id.node_id != leader) {
      return Status::Unavailable(fmt::format("{} answers as node {}, expected leader {}", conn.peer_uri(), id.node_id,
                                             leader));
    }
    uint64_t have = store->HasTree(tree_name) ? store->LatestVersion(tree_name).value_or(0) : 0;
    uint64_t data_epoch = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      data_epoch = trees[tree_name].data_epoch;
    }
    CANOPY_RETURN_IF_ERROR(SendMessage(conn, Subscribe{tree_name, epoch, have, node_id, data_epoch}));
    uint64_t last_acked = 0;
    uint64_t snapshots_installed = 0;  // on this stream
    CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
    std::unique_ptr<tree::SnapshotInstaller> installer;
    uint64_t expected_chunk = 0;
    uint64_t snapshot_bytes = 0;  // of the snapshot being installed (metrics)
    auto last_message = Clock::now();
    auto last_keepalive = Clock::now();
    auto check_epoch = [&](uint64_t msg_epoch) -> Status {
      if (msg_epoch != epoch) {
        return Status::Conflict(fmt::format("message of epoch {} on a stream of epoch {}: refused", msg_epoch, epoch));
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!(LeadershipLocked(tree_name) == l)) {
        return Status::Conflict(fmt::format("leadership of {} moved past node {} epoch {}", tree_name, leader, epoch));
      }
      SetDataEpochLocked(tree_name, epoch);
      return Status::Ok();
    };
    while (!stopping) {
      auto m = conn.Receive(Deadline::After(options.heartbeat_interval));
      if (!m.ok()) {
        if (!m.status().IsTimeout()) return m.status();
        if (Clock::now() - last_message > options.failure_timeout) {
          return Status::Timeout(fmt::format("leader {} of {} silent", leader, tree_name));
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!(LeadershipLocked(tree_name) == l)) return Status::Conflict("leadership changed");
        }
        CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));  // keepalive + durable progress
        continue;
      }
      last_message = Clock::now();
      if (m->bulk_bytes != 0) return Status::Corruption("unexpected bulk bytes from leader");
      switch (static_cast<MessageType>(m->type)) {
        case MessageType::kDelta: {
          CANOPY_ASSIGN_OR_RETURN(Delta d, DecodeDelta(m->payload));
          if (d.tree != tree_name) return Status::Corruption("DELTA for another tree");
          CANOPY_RETURN_IF_ERROR(check_epoch(d.epoch));
          if (!store->HasTree(tree_name) && d.base_version == 0) {
            Status c = store->CreateTree(tree_name);
            if (!c.ok() && c.code() != StatusCode::kAlreadyExists) return c;
          }
          auto applied = store->ApplyEncodedDelta(d.delta);
          if (!applied.ok()) return applied.status().WithContext("applying delta " + std::to_string(d.new_version));
          if (applied->version != d.new_version) return Status::Corruption("delta version does not match its header");
          CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
          break;
        }
        case MessageType::kSnapshotBegin: {
          CANOPY_ASSIGN_OR_RETURN(SnapshotBegin b, DecodeSnapshotBegin(m->payload));
          if (b.tree != tree_name) return Status::Corruption("SNAPSHOT_BEGIN for another tree");
          if (b.epoch != epoch) return Status::Conflict("SNAPSHOT_BEGIN of another epoch: refused");
          CANOPY_LOG(kInfo, "node {}: receiving snapshot of {} at version {} from {}", node_id, tree_name, b.version,
                     leader);
          CANOPY_ASSIGN_OR_RETURN(installer, store->BeginSnapshotInstall(tree_name));
          expected_chunk = 0;
          snapshot_bytes = 0;
          break;
        }
        case MessageType::kSnapshotChunk: {
          CANOPY_ASSIGN_OR_RETURN(SnapshotChunk c, DecodeSnapshotChunk(m->payload));
          if (!installer) return Status::Corruption("SNAPSHOT_CHUNK without SNAPSHOT_BEGIN");
          if (c.epoch != epoch) return Status::Conflict("SNAPSHOT_CHUNK of another epoch: refused");
          if (c.index != expected_chunk++) return Status::Corruption("snapshot chunk out of order");
          CANOPY_RETURN_IF_ERROR(installer->AddChunk(c.data));
          snapshot_bytes += c.data.size();
          // While chunks keep arriving this loop never times out, so nothing
          // else tells the leader we are alive; a long snapshot would then be
          // dropped after failure_timeout and restarted from scratch. Repeat
          // the last ACK (no new durability claim) once per heartbeat.
          if (Clock::now() - last_keepalive >= options.heartbeat_interval) {
            CANOPY_RETURN_IF_ERROR(SendMessage(conn, Ack{tree_name, epoch, last_acked, snapshots_installed}));
            last_keepalive = Clock::now();
          }
          break;
        }
        case MessageType::kSnapshotEnd: {
          CANOPY_ASSIGN_OR_RETURN(SnapshotEnd e, DecodeSnapshotEnd(m->payload));
          if (!installer) return Status::Corruption("SNAPSHOT_END without SNAPSHOT_BEGIN");
          if (e.chunks != expected_chunk) return Status::Corruption("snapshot chunk count mismatch");
          CANOPY_RETURN_IF_ERROR(check_epoch(e.epoch));
          CANOPY_ASSIGN_OR_RETURN(tree::Version v, installer->Finish());
          installer.reset();
          if (v.number() != e.version) return Status::Corruption("installed snapshot version mismatch");
          {
            std::lock_guard<std::mutex> lock(mu);
            ++trees[tree_name].snapshots_received;
          }
          ++snapshots_installed;
          metrics->SnapshotInstalled(snapshot_bytes);
          CANOPY_LOG(kInfo, "node {}: installed snapshot of {} at version {}", node_id, tree_name, v.number());
          CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
          break;
        }
        case MessageType::kHeartbeat: {
          CANOPY_ASSIGN_OR_RETURN(Heartbeat hb, DecodeHeartbeat(m->payload));
          for (const auto& t : hb.trees) {
            if (t.tree == tree_name && t.epoch != epoch) return Status::Conflict("HEARTBEAT of another epoch: refused");
          }
          {
            std::lock_guard<std::mutex> lock(mu);
            last_heard[leader] = Clock::now();
            if (!(LeadershipLocked(tree_name) == l)) return Status::Conflict("leadership changed");
          }
          uint64_t durable = store->HasTree(tree_name) ? store->DurableVersion(tree_name).value_or(0) : 0;
          if (durable != last_acked) {
            CANOPY_RETURN_IF_ERROR(SendAck(conn, tree_name, epoch, snapshots_installed, &last_acked));
          }
          break;
        }
        default:
          return UnexpectedMessage(*m, "DELTA");
      }
    }
    return Status::Aborted("stopping");
  }

  // ---------------------------------------------------------------- maintenance

  void MaintenanceLoop() {
    std::map<std::string, std::unique_ptr<transport::Connection>> links;
    std::map<std::string, Clock::time_point> next_dial;
    uint64_t seq = 0;
    while (!stopping) {
      // Seeds whose id we do not know yet.
      std::vector<std::string> seeds;
      {
        std::lock_guard<std::mutex> lock(mu);
        seeds = unresolved_seeds;
      }
      for (const auto& s : seeds) {
        if (stopping) break;
        auto r = DialPeerWithId(s);
        if (!r.ok()) {
          CANOPY_LOG(kDebug, "node {}: seed {}: {}", node_id, s, r.status().ToString());
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        unresolved_seeds.erase(std::remove(unresolved_seeds.begin(), unresolved_seeds.end(), s),
                               unresolved_seeds.end());
        if (r->first != node_id) {
          AddMemberLocked(r->first, s);
          links[r->first] = std::move(r->second);
        }
      }
      // Heartbeat content.
      Heartbeat hb;
      hb.node_id = node_id;
      hb.sequence = ++seq;
      hb.raft_address = options.raft_address;
      std::vector<std::string> local_trees = store->ListTrees();
      std::vector<uint64_t> local_versions;
      for (const auto& t : local_trees) local_versions.push_back(store->LatestVersion(t).value_or(0));
      std::map<std::string, std::string> peers;
      {
        std::lock_guard<std::mutex> lock(mu);
        for (size_t k = 0; k < local_trees.size(); ++k) {
          hb.trees.push_back({local_trees[k], trees[local_trees[k]].data_epoch, local_versions[k]});
        }
        hb.members = members;
        peers = members;
      }
      peers.erase(node_id);
      std::string encoded = Encode(hb);
      for (const auto& [id, peer_uri] : peers) {
        if (stopping) break;
        auto it = links.find(id);
        if (it == links.end()) {
          if (Clock::now() < next_dial[id]) continue;
          next_dial[id] = Clock::now() + std::chrono::milliseconds(500);
          auto r = DialPeerWithId(peer_uri);
          if (!r.ok() || r->first != id) continue;
          it = links.emplace(id, std::move(r->second)).first;
        }
        Status s = it->second->Send(static_cast<uint16_t>(MessageType::kHeartbeat), encoded);
        if (!s.ok()) links.erase(it);
      }
      for (auto it = links.begin(); it != links.end();) {
        it = peers.count(it->first) ? std::next(it) : links.erase(it);
      }
      StartReplicas();
      AddRaftMembers();
      ReapWorkers();
      SleepFor(options.heartbeat_interval);
    }
    for (auto& [id, c] : links) c->Close();
  }

  // On the raft leader: adds members that announced a raft address but are
  // not in the raft group yet (a joining node started with --raft and no
  // --raft-peer).
  void AddRaftMembers() {
    if (!meta || !meta->IsRaftLeader()) return;
    std::set<uint64_t> in_group;
    for (const auto& m : meta->RaftMembers()) in_group.insert(m.id);
    std::vector<std::pair<std::string, std::string>> add;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [id, addr] : peer_raft) {
        uint64_t numeric = 0;
        try {
          numeric = std::stoull(id);
        } catch (const std::exception&) {
          continue;
        }
        if (in_group.count(numeric) || raft_adds_pending.count(id)) continue;
        raft_adds_pending.insert(id);
        add.emplace_back(id, addr);
      }
    }
    for (auto& member : add) {
      // Named copies: clang 14 cannot capture structured bindings.
      Spawn([this, id = member.first, addr = member.second] {
        Status s = meta->AddMember(std::stoull(id), addr, Deadline::After(std::chrono::seconds(20)));
        CANOPY_LOG(kInfo, "node {}: adding node {} ({}) to the metadata raft: {}", node_id, id, addr, s.ToString());
        std::lock_guard<std::mutex> lock(mu);
        raft_adds_pending.erase(id);
      });
    }
  }

  void StartReplicas() {
    std::vector<std::string> start;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& t : known_trees) {
        auto owners = OwnersLocked(t);
        if (owners.empty() || LeaderLocked(t) == node_id) continue;
        if (std::find(owners.begin(), owners.end(), node_id) == owners.end()) continue;
        auto& state = trees[t];
        if (state.replica_running) continue;
        state.replica_running = true;
        start.push_back(t);
      }
    }
    for (auto& t : start) Spawn([this, t] { ReplicaLoop(t); });
  }

  // ---------------------------------------------------------------- client requests

  // Leader check for a request; returns a redirect (Unavailable + leader URI) when not.
  bool NotLeader(const std::string& tree_name, StatusReplyFields* status, std::string* leader_uri) {
    std::lock_guard<std::mutex> lock(mu);
    if (LeadsLocked(tree_name, nullptr)) return false;
    Leadership l = LeadershipLocked(tree_name);
    if (l.leader == node_id) {
      *status = StatusReplyFields::From(
          Status::Unavailable("node " + node_id + " is not yet in sync with the cluster metadata; retry"));
      return true;
    }
    *leader_uri = UriOfLocked(l.leader);
    *status = StatusReplyFields::From(Status::Unavailable(fmt::format(
        "node {} is not the leader of {}; its leader is node {} at {} (epoch {})", node_id, tree_name, l.leader,
        *leader_uri, l.epoch)));
    return true;
  }

  uint32_t CountAcksLocked(const std::string& tree_name, uint64_t version, const std::vector<std::string>& owners) {
    uint32_t acks = 0;
    auto& acked = trees[tree_name].acked;
    for (const auto& o : owners) {
      if (o == node_id) {
        if (store->DurableVersion(tree_name).value_or(0) >= version) ++acks;
      } else {
        auto it = acked.find(o);
        if (it != acked.end() && it->second >= version) ++acks;
      }
    }
    return acks;
  }

  CommitReply HandleCommit(const CommitRequest& req) {
    CommitReply reply;
    if (NotLeader(req.tree, &reply.status, &reply.leader)) return reply;
    NodeMetrics::ScopedCommit observe_commit(*metrics, req.level, &reply.status);
    Result<tree::CommitResult> committed = Status::Internal("no attempt");
    for (int attempt = 0; attempt < 16; ++attempt) {
      auto txn = store->Begin(req.tree);
      if (!txn.ok()) {
        reply.status = StatusReplyFields::From(txn.status());
        return reply;
      }
      if (req.base_version != 0 && txn->base().number() != req.base_version) {
        reply.status = StatusReplyFields::From(Status::Conflict(fmt::format(
            "base version {} is stale: {} is at version {}", req.base_version, req.tree, txn->base().number())));
        return reply;
      }
      for (const Edit& e : req.edits) {
        auto op = ToOp(e);
        Status s = op.ok() ? txn->Apply(std::move(*op)) : op.status();
        if (!s.ok()) {
          reply.status = StatusReplyFields::From(s);
          return reply;
        }
      }
      committed = store->Commit(std::move(*txn));
      if (committed.ok() || !committed.status().IsConflict() || req.base_version != 0) break;
    }
    if (!committed.ok()) {
      reply.status = StatusReplyFields::From(committed.status());
      return reply;
    }
    reply.version = committed->version;
    std::unique_lock<std::mutex> lock(mu);
    cv.notify_all();
    // The replica set: the ring's owners, plus the leader while it is not
    // one of them (after a ring change, until leadership moves).
    auto owners = OwnersLocked(req.tree);
    std::string leader = LeaderLocked(req.tree);
    if (std::find(owners.begin(), owners.end(), leader) == owners.end()) owners.push_back(leader);
    uint32_t need = RequiredAcks(req.level, static_cast<uint32_t>(owners.size()));
    Deadline deadline = Deadline::After(std::chrono::milliseconds(req.timeout_ms));
    while (true) {
      reply.acks = CountAcksLocked(req.tree, reply.version, owners);
      if (reply.acks >= need || deadline.expired() || stopping) break;
      // Short slices: the leader's own durability under --fsync batch
      // advances without a notification.
      cv.wait_for(lock, std::min<std::chrono::milliseconds>(deadline.remaining(), std::chrono::milliseconds(5)));
    }
    if (reply.acks < need) {
      reply.status = StatusReplyFields::From(Status::Timeout(fmt::format(
          "version {} of {} is committed on the leader but only {} of the {} replicas needed for {} hold it", reply.version,
          req.tree, reply.acks, need, ConsistencyLevelName(req.level))));
    }
    return reply;
  }

  ReadReply HandleRead(const ReadRequest& req) {
    ReadReply reply;
    // Version 0 asks for the newest; any other is read from the retained
    // window (StoreOptions::retention), else NotFound naming what is held.
    auto v = req.version == 0 ? store->Latest(req.tree) : store->At(req.tree, req.version);
    if (!v.ok()) {
      Status s = v.status();
      if (req.version != 0 && store->HasTree(req.tree)) s = s.WithContext("node " + node_id);
      reply.status = StatusReplyFields::From(s);
      return reply;
    }
    reply.version = v->number();
    auto n = v->Find(ToNodePath(req.path));
    if (!n.ok()) {
      reply.status = StatusReplyFields::From(n.status());
      return reply;
    }
    (*n)->ForEachAttribute([&](tree::AttributeView a) { reply.attributes[std::string(a.key)] = std::string(a.value); });
    reply.child_count = static_cast<uint32_t>((*n)->child_count());
    return reply;
  }

  StatusReply HandleStatus() {
    StatusReply reply;
    reply.node_id = node_id;
    reply.replication_factor = options.ring.replication_factor;
    reply.vnodes = options.ring.vnodes_per_node;
    std::vector<tree::Version> latest;  // parallel to reply.trees; digests filled in after mu is released
    {
      std::lock_guard<std::mutex> lock(mu);
      FillStatusLocked(&reply, &latest);
    }
    std::lock_guard<std::mutex> lock(digest_mu);
    for (size_t i = 0; i < reply.trees.size(); ++i) {
      if (latest[i].tree().empty()) continue;
      auto& cached = digest_cache[reply.trees[i].tree];
      if (cached.second == 0 || cached.first != latest[i].number()) cached = {latest[i].number(), latest[i].Digest()};
      reply.trees[i].digest = Hex64(cached.second);
    }
    return reply;
  }

  void FillStatusLocked(StatusReply* out, std::vector<tree::Version>* latest) {
    StatusReply& reply = *out;
    for (const auto& [id, u] : members) reply.nodes.push_back({id, u, AliveLocked(id)});
    std::set<std::string> names = known_trees;
    for (const auto& t : store->ListTrees()) names.insert(t);
    for (const auto& name : names) {
      TreeStatus t;
      t.tree = name;
      t.owners = OwnersLocked(name);
      Leadership l = LeadershipLocked(name);
      t.leader = l.leader;
      t.epoch = l.epoch;
      bool owner = std::find(t.owners.begin(), t.owners.end(), node_id) != t.owners.end();
      t.role = t.leader == node_id ? "leader" : owner ? "replica" : "none";
      if (store->HasTree(name)) t.durable_version = store->DurableVersion(name).value_or(0);
      auto v = store->Latest(name);  // NotFound for a tree this node does not hold
      latest->push_back(v.ok() ? *v : tree::Version());
      auto it = trees.find(name);
      if (it != trees.end()) {
        t.replica_versions = it->second.acked;
        t.snapshots_received = it->second.snapshots_received;
        t.snapshots_sent = it->second.snapshots_sent;
      }
      reply.trees.push_back(std::move(t));
    }
  }

  CreateTreeReply HandleCreateTree(const CreateTreeRequest& req) {
    CreateTreeReply reply;
    Status valid = tree::Store::ValidateTreeName(req.tree);
    if (!valid.ok()) {
      reply.status = StatusReplyFields::From(valid);
      return reply;
    }
    if (NotLeader(req.tree, &reply.status, &reply.leader)) return reply;
    {
      // Peers already hold it (e.g. the ring's first owner moved to a node
      // without the data): creating an empty one here would wipe them.
      std::lock_guard<std::mutex> lock(mu);
      if (!store->HasTree(req.tree) && known_trees.count(req.tree)) {
        reply.status = StatusReplyFields::From(
            Status::AlreadyExists("tree " + req.tree + " already exists on other nodes of the cluster"));
        return reply;
      }
    }
    if (meta) {
      bool registered = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        registered = meta_trees.count(req.tree) > 0;
      }
      if (!registered) {
        auto epoch = meta->CompareAndSetLeader(req.tree, 0, std::stoull(node_id), 0,
                                               Deadline::After(std::chrono::seconds(10)));
        if (!epoch.ok()) {
          reply.status = StatusReplyFields::From(epoch.status().WithContext("registering the tree's leader"));
          return reply;
        }
        std::lock_guard<std::mutex> lock(mu);
        auto& cached = meta_trees[req.tree];
        if (cached.epoch < *epoch) cached = meta::TreeLeader{req.tree, std::stoull(node_id), *epoch, 0};
      }
    }
    reply.status = StatusReplyFields::From(store->CreateTree(req.tree));
    std::lock_guard<std::mutex> lock(mu);
    if (reply.status.code == StatusCode::kOk) SetDataEpochLocked(req.tree, LeadershipLocked(req.tree).epoch);
    reply.owners = OwnersLocked(req.tree);
    reply.leader = uri;
    known_trees.insert(req.tree);
    if (reply.status.code == StatusCode::kOk) {
      CANOPY_LOG(kInfo, "node {}: created tree {} (owners {})", node_id, req.tree, fmt::join(reply.owners, ","));
    }
    return reply;
  }
};

Node::Node(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Node::~Node() { Stop(); }

Result<std::unique_ptr<Node>> Node::Start(const NodeOptions& options) {
  if (options.cluster.empty()) return Status::InvalidArgument("a cluster name is required");
  if (options.secret.empty()) return Status::InvalidArgument("a cluster secret is required");
  if (options.data_dir.empty()) return Status::InvalidArgument("a data directory is required");
  if (options.ring.vnodes_per_node == 0 || options.ring.replication_factor == 0) {
    return Status::InvalidArgument("--vnodes and --rf must be at least 1");
  }
  auto impl = std::make_unique<Impl>(options);
  CANOPY_RETURN_IF_ERROR(impl->Init());
  CANOPY_RETURN_IF_ERROR(impl->StartMeta());
  impl->StartThreads();
  CANOPY_LOG(kInfo, "node {}: serving cluster {} on {} (data {}, rf {}, vnodes {})", impl->node_id, options.cluster,
             impl->uri, options.data_dir, options.ring.replication_factor, options.ring.vnodes_per_node);
  return std::unique_ptr<Node>(new Node(std::move(impl)));
}

void Node::Stop() {
  if (impl_) impl_->Stop();
}

const std::string& Node::uri() const { return impl_->uri; }
const std::string& Node::node_id() const { return impl_->node_id; }

}  // namespace canopy::replication
