// Client requests (node_impl.h): COMMIT (apply at the leader, wait for the
// consistency level's acks), READ, STATUS and CREATE_TREE.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "base/logging.h"
#include "replication/node_impl.h"

namespace canopy::replication {

namespace {

std::string Hex64(uint64_t v) { return fmt::format("{:016x}", v); }

tree::NodePath ToNodePath(const std::vector<uint32_t>& path) {
  return tree::NodePath(path.begin(), path.end());
}

Result<tree::Op> ToOp(const Edit& e) {
  tree::NodePath path = ToNodePath(e.path);
  switch (e.kind) {
    case Edit::Kind::kPutAttribute:
      return tree::Op::PutAttribute(path, e.key, e.value);
    case Edit::Kind::kDeleteAttribute:
      return tree::Op::DeleteAttribute(path, e.key);
    case Edit::Kind::kAppendChild:
      return tree::Op::AppendChild(path);
    case Edit::Kind::kInsertChild:
      return tree::Op::InsertChild(path, e.index);
    case Edit::Kind::kDeleteChild:
      return tree::Op::DeleteChild(path, e.index);
  }
  return Status::InvalidArgument("unknown edit kind");
}

}  // namespace

// Leader check for a request; returns a redirect (Unavailable + leader URI) when not.
bool Node::Impl::NotLeader(const std::string& tree_name, StatusReplyFields* status, std::string* leader_uri) {
  std::lock_guard<std::mutex> lock(mu);
  if (LeadsLocked(tree_name, nullptr)) return false;
  Leadership l = LeadershipLocked(tree_name);
  if (l.leader == node_id) {
    *status = StatusReplyFields::From(
        Status::Unavailable("node " + node_id + " is not yet in sync with the cluster metadata; retry"));
    return true;
  }
  *leader_uri = UriOfLocked(l.leader);
  *status = StatusReplyFields::From(Status::Unavailable(
      fmt::format("node {} is not the leader of {}; its leader is node {} at {} (epoch {})", node_id,
                  tree_name, l.leader, *leader_uri, l.epoch)));
  return true;
}

uint32_t Node::Impl::CountAcksLocked(const std::string& tree_name, uint64_t version,
                                     const std::vector<std::string>& owners) {
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

Result<tree::Store::OpsCommit> Node::Impl::ToOpsCommit(const CommitRequest& req) {
  if (req.client.size() > tree::kMaxRequestClientBytes) {
    return Status::InvalidArgument(fmt::format("request client id of {} bytes (at most {})", req.client.size(),
                                               tree::kMaxRequestClientBytes));
  }
  tree::Store::OpsCommit c;
  c.ops.reserve(req.edits.size());
  for (const Edit& e : req.edits) {
    CANOPY_ASSIGN_OR_RETURN(tree::Op op, ToOp(e));
    c.ops.push_back(std::move(op));
  }
  c.request = tree::RequestId{req.client, req.sequence};
  c.base_version = req.base_version;
  return c;
}

std::vector<std::string> Node::Impl::ReplicaSetLocked(const std::string& tree_name) const {
  std::vector<std::string> owners = OwnersLocked(tree_name);
  std::string leader = LeaderLocked(tree_name);
  if (std::find(owners.begin(), owners.end(), leader) == owners.end()) owners.push_back(leader);
  return owners;
}

uint32_t Node::Impl::WaitForDurableLocked(std::unique_lock<std::mutex>& lock, const std::string& tree_name,
                                          uint64_t version, const std::vector<std::string>& owners, uint32_t need,
                                          Deadline deadline) {
  uint32_t acks = CountAcksLocked(tree_name, version, owners);
  if (acks >= need) return acks;
  CommitWaiter waiter;
  waiter.version = version;
  waiter.owners = owners;
  // The leader's own durability under --fsync batch advances without a
  // notification: poll it in short slices then; otherwise ACKs wake us.
  const auto slice = store->options().fsync == tree::FsyncPolicy::kBatch ? std::chrono::milliseconds(5)
                                                                        : std::chrono::milliseconds(100);
  auto& waiting = commit_waiters[tree_name];
  auto slot = waiting.emplace(version, &waiter);
  while (true) {
    acks = CountAcksLocked(tree_name, version, owners);
    if (acks >= need || deadline.expired() || stopping) break;
    waiter.woken = false;
    waiter.cv.wait_for(lock, std::min<std::chrono::milliseconds>(deadline.remaining(), slice),
                       [&] { return waiter.woken || stopping.load(); });
  }
  waiting.erase(slot);
  if (waiting.empty()) commit_waiters.erase(tree_name);
  return acks;
}

void Node::Impl::WakeCommitWaitersLocked(const std::string& tree_name, PendingCommits* satisfied) {
  // No waiter above the newest version any owner holds can be satisfied.
  uint64_t highest = store->DurableVersion(tree_name).value_or(0);
  for (const auto& [replica, v] : trees[tree_name].acked) highest = std::max(highest, v);
  if (auto it = commit_waiters.find(tree_name); it != commit_waiters.end()) {
    for (auto& [version, waiter] : it->second) {
      if (version > highest) break;
      waiter->woken = true;
      waiter->cv.notify_one();
    }
  }
  auto it = pending_commits.find(tree_name);
  if (it == pending_commits.end()) return;
  // Levels differ (ONE, QUORUM, ALL): every one up to `highest` is checked,
  // against the durable versions read once (as CountAcksLocked counts).
  const uint64_t own = store->DurableVersion(tree_name).value_or(0);
  const auto& acked = trees[tree_name].acked;
  std::vector<std::pair<std::shared_ptr<PendingCommit>, uint32_t>> ready;
  for (auto& [version, p] : it->second) {
    if (version > highest) break;
    uint32_t acks = 0;
    for (const auto& o : p->owners) {
      if (o == node_id) {
        acks += own >= version;
      } else if (auto a = acked.find(o); a != acked.end() && a->second >= version) {
        ++acks;
      }
    }
    if (acks >= p->need) ready.emplace_back(p, acks);
  }
  for (auto& [p, acks] : ready) {
    ClaimPendingLocked(p, acks);
    satisfied->push_back(std::move(p));
  }
}

void Node::Impl::ClaimPendingLocked(std::shared_ptr<PendingCommit> p, std::optional<uint32_t> acks) {
  p->acks = acks ? *acks : CountAcksLocked(p->tree, p->reply.version, p->owners);
  auto it = pending_commits.find(p->tree);
  it->second.erase(p->in_tree);
  if (it->second.empty()) pending_commits.erase(it);
  p->pipeline->by_deadline_.erase(p->in_pipeline);
  ++p->pipeline->answering_;
}

void Node::Impl::FinishCommits(PendingCommits& claimed) {
  // One write per connection for the replies this ACK completed.
  std::vector<PendingCommit*> same;
  for (size_t i = 0; i < claimed.size(); ++i) {
    CommitPipeline* pipeline = claimed[i]->pipeline;
    bool first = true;
    for (size_t j = 0; j < i && first; ++j) first = claimed[j]->pipeline != pipeline;
    if (!first) continue;
    same.clear();
    for (size_t j = i; j < claimed.size(); ++j) {
      if (claimed[j]->pipeline == pipeline) same.push_back(claimed[j].get());
    }
    pipeline->AnswerAll(same);
  }
  std::lock_guard<std::mutex> lock(mu);
  for (auto& p : claimed) {
    CommitPipeline& pipeline = *p->pipeline;
    if (--pipeline.answering_ == 0) pipeline.timer_cv_.notify_all();  // a destructor may wait for it
  }
  claimed.clear();
}

// ---- CommitPipeline (node_impl.h)

CommitPipeline::~CommitPipeline() {
  // Queued commits are dropped: never applied nor answered, their client is
  // gone (a retry elsewhere carries the same request id). Pending commits:
  // answered now with the acks they have (as a stopping node did before),
  // and replies other threads are sending waited for.
  queued_.clear();
  PendingCommits orphans;
  {
    std::unique_lock<std::mutex> lock(node_.mu);
    timer_closing_ = true;
    while (!by_deadline_.empty()) {
      auto p = by_deadline_.begin()->second;
      node_.ClaimPendingLocked(p);
      --answering_;  // answered right here, below
      orphans.push_back(std::move(p));
    }
    timer_cv_.notify_all();
  }
  std::vector<PendingCommit*> orphaned;
  for (auto& p : orphans) orphaned.push_back(p.get());
  AnswerAll(orphaned);
  {
    std::unique_lock<std::mutex> lock(node_.mu);
    timer_cv_.wait(lock, [&] { return answering_ == 0; });
  }
  if (timer_.joinable()) timer_.join();
}

void CommitPipeline::Submit(CommitRequest req) {
  if (in_flight_.load() >= kMaxCommitsInFlight) {
    Flush();  // what we wait for may need them
    std::unique_lock<std::mutex> lock(mu_);
    room_cv_.wait(lock, [&] { return in_flight_.load() < kMaxCommitsInFlight; });
  }
  ++in_flight_;
  const auto timeout = std::chrono::milliseconds(req.timeout_ms);
  queued_.push_back(Queued{std::move(req), Clock::now(), Deadline::After(timeout)});
}

void CommitPipeline::Flush() {
  if (queued_.empty()) return;
  std::vector<Queued> batch;
  batch.swap(queued_);
  // Per tree, in arrival order (clients expect their own commits in order).
  std::vector<std::pair<std::string, std::vector<Queued*>>> trees;
  for (Queued& q : batch) {
    auto it = std::find_if(trees.begin(), trees.end(), [&](const auto& t) { return t.first == q.req.tree; });
    if (it == trees.end()) {
      trees.emplace_back(q.req.tree, std::vector<Queued*>{});
      it = std::prev(trees.end());
    }
    it->second.push_back(&q);
  }
  for (auto& [tree_name, commits] : trees) FlushTree(tree_name, commits);
}

void CommitPipeline::FlushTree(const std::string& tree_name, std::vector<Queued*>& commits) {
  PendingCommits answer_now;  // decided without acks to wait for
  PendingCommits applied;     // parallel to `ops`
  std::vector<tree::Store::OpsCommit> ops;
  StatusReplyFields not_leader;
  std::string leader_uri;
  const bool redirect = node_.NotLeader(tree_name, &not_leader, &leader_uri);
  for (Queued* q : commits) {
    auto p = std::make_shared<PendingCommit>();
    p->pipeline = this;
    p->started = q->arrived;
    p->reply.sequence = q->req.sequence;
    p->tree = tree_name;
    p->level = q->req.level;
    p->deadline = q->deadline;
    if (redirect) {
      p->reply.status = not_leader;
      p->reply.leader = leader_uri;
      answer_now.push_back(std::move(p));
      continue;
    }
    auto c = node_.ToOpsCommit(q->req);
    if (!c.ok()) {
      p->reply.status = StatusReplyFields::From(c.status());
      answer_now.push_back(std::move(p));
      continue;
    }
    ops.push_back(std::move(*c));
    applied.push_back(std::move(p));
  }
  bool pushed_any = false;
  if (!ops.empty()) {
    auto results = node_.store->CommitOpsBatch(tree_name, std::move(ops));
    for (size_t i = 0; i < applied.size(); ++i) {
      PendingCommit& p = *applied[i];
      if (!results[i].ok()) {
        p.reply.status = StatusReplyFields::From(results[i].status());
        continue;
      }
      p.reply.version = results[i]->version;
      p.reply.duplicate = results[i]->duplicate;
      pushed_any |= !results[i]->duplicate;
    }
  }
  std::vector<std::pair<std::shared_ptr<StreamSender>, uint64_t>> streams;
  if (!applied.empty()) {
    std::lock_guard<std::mutex> lock(node_.mu);
    if (pushed_any) streams = node_.DirectStreamsLocked(tree_name);
    const std::vector<std::string> owners = node_.ReplicaSetLocked(tree_name);
    bool new_earliest = false;
    for (auto& p : applied) {
      if (p->reply.status.code != StatusCode::kOk) {
        answer_now.push_back(std::move(p));
        continue;
      }
      p->owners = owners;
      p->need = RequiredAcks(p->level, static_cast<uint32_t>(owners.size()));
      p->acks = node_.CountAcksLocked(tree_name, p->reply.version, owners);
      if (p->acks >= p->need || p->deadline.expired() || node_.stopping || timer_closing_) {
        answer_now.push_back(std::move(p));
        continue;
      }
      // Answered by the ACK that satisfies it, or by the timer.
      p->in_tree = node_.pending_commits[tree_name].emplace(p->reply.version, p);
      p->in_pipeline = by_deadline_.emplace(p->deadline.at(), p);
      new_earliest |= p->in_pipeline == by_deadline_.begin();
    }
    if (!by_deadline_.empty()) {
      if (!timer_.joinable()) {
        timer_ = std::thread([this] { TimerLoop(); });
      } else if (new_earliest || node_.store->options().fsync == tree::FsyncPolicy::kBatch) {
        timer_cv_.notify_one();  // a new earliest deadline (or a batch policy to poll)
      }
    }
  }
  // Out to the replicas from this thread where the stream is idle (one
  // frame per replica for the whole batch), then the decided replies.
  if (pushed_any) node_.PushCommit(tree_name, streams);
  std::vector<PendingCommit*> decided;
  for (auto& p : answer_now) {
    if (p->reply.status.code != StatusCode::kOk) p->need = 0;
    decided.push_back(p.get());
  }
  AnswerAll(decided);
}

void CommitPipeline::AnswerAll(const std::vector<PendingCommit*>& commits) {
  if (commits.empty()) return;
  std::vector<std::string> encoded;
  encoded.reserve(commits.size());
  const auto now = Clock::now();
  for (PendingCommit* p : commits) {
    CommitReply& reply = p->reply;
    if (reply.status.code == StatusCode::kOk) {
      reply.acks = p->acks;
      if (p->acks < p->need) {
        reply.status = StatusReplyFields::From(Status::Timeout(fmt::format(
            "version {} of {} is committed on the leader but only {} of the {} replicas needed for {} hold it",
            reply.version, p->tree, p->acks, p->need, ConsistencyLevelName(p->level))));
      }
    }
    node_.metrics->Commit(p->level, reply.status.code, now - p->started);
    encoded.push_back(Encode(reply));
  }
  std::vector<std::string_view> payloads(encoded.begin(), encoded.end());
  if (!conn_.SendBatch(static_cast<uint16_t>(MessageType::kCommitReply), payloads).ok()) {
    conn_.Close();  // the reader sees it and ends the connection
  }
  if (in_flight_.fetch_sub(commits.size()) >= kMaxCommitsInFlight) {  // the reader may wait for room
    std::lock_guard<std::mutex> lock(mu_);
    room_cv_.notify_one();
  }
}

void CommitPipeline::TimerLoop() {
  // The leader's own durability under --fsync batch advances without a
  // notification: poll it in short slices then; otherwise ACKs answer.
  const bool poll = node_.store->options().fsync == tree::FsyncPolicy::kBatch;
  std::unique_lock<std::mutex> lock(node_.mu);
  while (!timer_closing_) {
    PendingCommits done;
    const auto now = Clock::now();
    const bool stopping = node_.stopping.load();
    for (auto it = by_deadline_.begin(); it != by_deadline_.end();) {
      std::shared_ptr<PendingCommit> p = it->second;  // a copy: claiming erases the entry
      ++it;
      if (stopping || p->deadline.at() <= now ||
          (poll && node_.CountAcksLocked(p->tree, p->reply.version, p->owners) >= p->need)) {
        node_.ClaimPendingLocked(p);
        done.push_back(p);
      } else if (!poll) {
        break;  // ordered by deadline
      }
    }
    if (!done.empty()) {
      lock.unlock();
      node_.FinishCommits(done);  // takes node_.mu itself
      lock.lock();
      continue;
    }
    auto wake = now + std::chrono::milliseconds(poll ? 5 : 100);  // 100: notice a stop
    if (!by_deadline_.empty()) wake = std::min(wake, by_deadline_.begin()->first);
    timer_cv_.wait_until(lock, wake);
  }
}

ReadReply Node::Impl::HandleRead(const ReadRequest& req) {
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
  (*n)->ForEachAttribute(
      [&](tree::AttributeView a) { reply.attributes[std::string(a.key)] = std::string(a.value); });
  reply.child_count = static_cast<uint32_t>((*n)->child_count());
  return reply;
}

StatusReply Node::Impl::HandleStatus() {
  StatusReply reply;
  reply.node_id = node_id;
  reply.replication_factor = options.ring.replication_factor;
  reply.vnodes = options.ring.vnodes_per_node;
  if (meta) {
    uint64_t raft_leader = meta->RaftLeader().id;
    if (raft_leader != 0) reply.raft_leader = std::to_string(raft_leader);
  }
  std::vector<tree::Version> latest;  // parallel to reply.trees; digests filled in after mu is released
  {
    std::lock_guard<std::mutex> lock(mu);
    FillStatusLocked(&reply, &latest);
  }
  std::lock_guard<std::mutex> lock(digest_mu);
  for (size_t i = 0; i < reply.trees.size(); ++i) {
    if (latest[i].tree().empty()) continue;
    auto& cached = digest_cache[reply.trees[i].tree];
    if (cached.second == 0 || cached.first != latest[i].number())
      cached = {latest[i].number(), latest[i].Digest()};
    reply.trees[i].digest = Hex64(cached.second);
  }
  return reply;
}

void Node::Impl::FillStatusLocked(StatusReply* out, std::vector<tree::Version>* latest) {
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

CreateTreeReply Node::Impl::HandleCreateTree(const CreateTreeRequest& req) {
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
    CANOPY_LOG(kInfo, "node {}: created tree {} (owners {})", node_id, req.tree,
               fmt::join(reply.owners, ","));
  }
  return reply;
}

}  // namespace canopy::replication
