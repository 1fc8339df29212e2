// Node::Impl lifecycle (Init, StartMeta, Stop, worker threads) and the accept
// loop that authenticates peers and dispatches their messages to the roles
// (node_impl.h). Also the public Node API.

#include <fmt/format.h>

#include <random>
#include <sstream>

#include "base/logging.h"
#include "replication/node_impl.h"
#include "transport/registry.h"

namespace canopy::replication {

void Node::Impl::Spawn(std::function<void()> body) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::lock_guard<std::mutex> lock(threads_mu);
  if (stopping) return;
  workers.push_back(Worker{std::thread([body = std::move(body), done] {
                             body();
                             done->store(true);
                           }),
                           done});
}

void Node::Impl::ReapWorkers() {
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
bool Node::Impl::Register(transport::Connection* c) {
  std::lock_guard<std::mutex> lock(threads_mu);
  if (stopping) return false;
  open_conns.insert(c);
  return true;
}

void Node::Impl::Unregister(transport::Connection* c) {
  std::lock_guard<std::mutex> lock(threads_mu);
  open_conns.erase(c);
}

void Node::Impl::SleepFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, d, [&] { return stopping.load(); });
}

Status Node::Impl::Init() {
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
      return Status::InvalidArgument(
          fmt::format("data dir {} belongs to node {}, not {}", options.data_dir, stored, options.node_id));
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
  SliceForwarderOptions links;
  links.client.cluster = options.cluster;
  links.client.secret = options.secret;
  links.client.client_id = "node-" + node_id + "-quorum-reads";
  links.client.timeout = std::chrono::milliseconds(2000);
  links.reply_timeout = std::chrono::milliseconds(2000);  // as the pooled peer clients of SliceFromPeer
  quorum_links = std::make_unique<SliceForwarder>(std::move(links));
  return Status::Ok();
}

Status Node::Impl::StartMeta() {
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
  // Failover waits for the metadata raft when its leader died with the tree's
  // leader: elect within a few heartbeats, not raft's default second.
  mo.election_timeout_ms = static_cast<uint32_t>(options.raft_election_timeout.count());
  mo.heartbeat_timeout_ms = std::max<uint32_t>(1, mo.election_timeout_ms / 5);
  // Raft starts in the background: the node's own start-up and its first
  // gossip round (a joiner learning its trees) go on meanwhile, and
  // Node::Start waits for it (AwaitStarted) before it returns.
  CANOPY_ASSIGN_OR_RETURN(meta, meta::MetadataService::StartInBackground(mo));
  meta_watch = meta->AddWatch([this](const meta::ClusterState& state) {
    {
      std::lock_guard<std::mutex> lock(mu);
      meta_trees = state.trees;
      cv.notify_all();
    }
    // Leaders just became known (a joiner added to the raft group, a
    // failover): follow them now, not at the next maintenance round.
    StartReplicas();
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

void Node::Impl::StartThreads() {
  accept_thread = std::thread([this] { AcceptLoop(); });
  maintenance_thread = std::thread([this] { MaintenanceLoop(); });
}

void Node::Impl::Stop() {
  metrics_refresher.reset();  // no scrape reads the state being torn down
  {
    std::lock_guard<std::mutex> lock(threads_mu);
    if (stopping.exchange(true)) return;
    for (auto* c : open_conns) c->Close();
  }
  if (quorum_links) quorum_links->Shutdown();  // QUORUM reads in flight end (their callers fall back)
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

void Node::Impl::AcceptLoop() {
  while (!stopping) {
    // Stop() closes the listener, which wakes this wait.
    auto conn = listener->Accept(Deadline::After(std::chrono::seconds(5)));
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

void Node::Impl::ServeConnection(transport::Connection& conn) {
  if (!Register(&conn)) return;
  auto id = ListenerHandshake(conn, hs, Deadline::After(options.handshake_timeout));
  if (!id.ok()) {
    if (!stopping)
      CANOPY_LOG(kWarn, "node {}: refused {}: {}", node_id, conn.peer_uri(), id.status().ToString());
    conn.Close();
    Unregister(&conn);
    return;
  }
  if (id->role == PeerRole::kNode) {
    std::lock_guard<std::mutex> lock(mu);
    AddMemberLocked(id->node_id, id->listen_uri);
    HeardLocked(id->node_id);
  }
  Status s = ServeMessages(conn, *id);
  if (!s.ok() && !stopping && !s.IsClosed() && s.code() != StatusCode::kAborted) {
    CANOPY_LOG(kWarn, "node {}: dropping {} (node {}): {}", node_id, conn.peer_uri(), id->node_id,
               s.ToString());
    if (s.IsCorruption() || s.code() == StatusCode::kInvalidArgument) SendError(conn, s);
  }
  conn.Close();
  Unregister(&conn);
}

Status Node::Impl::ServeMessages(transport::Connection& conn, const PeerIdentity& peer) {
  CommitPipeline commits(*this, conn);  // COMMITs run concurrently, replies in completion order
  // COMMITs queued since the last Flush: they are applied together (one
  // store batch per tree) and go to the replicas together once no further
  // message is waiting (or after kCommitsPerFlush).
  uint32_t unflushed = 0;
  while (!stopping) {
    if (unflushed >= kCommitsPerFlush || (unflushed > 0 && !commits.unflushed())) {
      commits.Flush();
      unflushed = 0;
    }
    // Idle, this thread just waits: Stop() closes every registered
    // connection, which wakes it (Aborted). A short timeout here woke each
    // of a node's N - 1 inbound member links every second for nothing.
    auto m = conn.Receive(unflushed > 0 ? Deadline::After(std::chrono::nanoseconds(0))
                                        : Deadline::After(std::chrono::seconds(30)));
    if (!m.ok()) {
      if (m.status().IsTimeout()) {
        if (unflushed > 0) {
          commits.Flush();
          unflushed = 0;
        }
        continue;
      }
      return m.status();
    }
    if (m->bulk_bytes != 0) return Status::Corruption("unexpected bulk bytes from peer");
    auto type = static_cast<MessageType>(m->type);
    if (type != MessageType::kCommitRequest && unflushed > 0) {
      commits.Flush();  // before anything else (a LEADER read may wait for those commits)
      unflushed = 0;
    }
    if (peer.role == PeerRole::kNode) {
      if (type == MessageType::kHeartbeat) {
        metrics->MembershipReceived(m->payload.size());
        CANOPY_ASSIGN_OR_RETURN(Heartbeat hb, DecodeHeartbeat(m->payload));
        OnHeartbeat(hb);
        if (hb.kind == Heartbeat::Kind::kProbe) CANOPY_RETURN_IF_ERROR(AnswerProbe(conn, hb));
        continue;
      }
      if (type == MessageType::kProbeRequest) {
        metrics->MembershipReceived(m->payload.size());
        Heard(peer.node_id);
        CANOPY_ASSIGN_OR_RETURN(ProbeRequest req, DecodeProbeRequest(m->payload));
        CANOPY_RETURN_IF_ERROR(AnswerProbeRequest(conn, req));
        continue;
      }
      if (type == MessageType::kTreeStateRequest) {
        Heard(peer.node_id);
        CANOPY_ASSIGN_OR_RETURN(TreeStateRequest req, DecodeTreeStateRequest(m->payload));
        CANOPY_RETURN_IF_ERROR(SendMessage(conn, HandleTreeStateRequest(req)));
        continue;
      }
      if (type == MessageType::kSubscribe) {
        CANOPY_ASSIGN_OR_RETURN(Subscribe sub, DecodeSubscribe(m->payload));
        return LeadStream(conn, peer, sub);
      }
      if (type == MessageType::kCheckpointRequest) {
        CANOPY_ASSIGN_OR_RETURN(CheckpointRequest req, DecodeCheckpointRequest(m->payload));
        return ServeCheckpoint(conn, peer, req);
      }
    }
    switch (type) {
      case MessageType::kCommitRequest: {
        CANOPY_ASSIGN_OR_RETURN(CommitRequest req, DecodeCommitRequest(m->payload));
        commits.Submit(std::move(req));
        if (commits.unflushed()) ++unflushed;
        break;
      }
      case MessageType::kReadRequest: {
        CANOPY_ASSIGN_OR_RETURN(ReadRequest req, DecodeReadRequest(m->payload));
        CANOPY_RETURN_IF_ERROR(SendMessage(conn, HandleRead(req)));
        break;
      }
      case MessageType::kSliceRequest: {
        CANOPY_ASSIGN_OR_RETURN(SliceRequest req, DecodeSliceRequest(m->payload));
        CANOPY_RETURN_IF_ERROR(SendMessage(conn, HandleSlice(req)));
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
  if (impl->meta) {
    Status raft = impl->meta->AwaitStarted();
    if (!raft.ok()) {
      impl->Stop();
      return raft;
    }
    std::lock_guard<std::mutex> lock(impl->mu);
    impl->raft_listening = impl->raft_announce_due = true;
    impl->cv.notify_all();
  }
  CANOPY_LOG(kInfo, "node {}: serving cluster {} on {} (data {}, rf {}, vnodes {})", impl->node_id,
             options.cluster, impl->uri, options.data_dir, options.ring.replication_factor,
             options.ring.vnodes_per_node);
  return std::unique_ptr<Node>(new Node(std::move(impl)));
}

void Node::Stop() {
  if (impl_) impl_->Stop();
}

const std::string& Node::uri() const { return impl_->uri; }
const std::string& Node::node_id() const { return impl_->node_id; }
SliceReply Node::Slice(const SliceRequest& request) { return impl_->HandleSlice(request); }
bool Node::SliceAsync(const SliceRequest& request, std::function<void(std::optional<SliceReply>)> done) {
  return impl_->SliceQuorumAsync(request, std::move(done));
}
void Node::FlushSlices() {
  if (impl_->quorum_links) impl_->quorum_links->Flush();
}

}  // namespace canopy::replication
