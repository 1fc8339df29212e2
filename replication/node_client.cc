// Client requests (node_impl.h): COMMIT (apply at the leader, wait for the
// consistency level's acks), READ, STATUS and CREATE_TREE.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

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

CommitReply Node::Impl::HandleCommit(const CommitRequest& req) {
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
      reply.status = StatusReplyFields::From(
          Status::Conflict(fmt::format("base version {} is stale: {} is at version {}", req.base_version,
                                       req.tree, txn->base().number())));
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
    cv.wait_for(lock,
                std::min<std::chrono::milliseconds>(deadline.remaining(), std::chrono::milliseconds(5)));
  }
  if (reply.acks < need) {
    reply.status = StatusReplyFields::From(Status::Timeout(fmt::format(
        "version {} of {} is committed on the leader but only {} of the {} replicas needed for {} hold it",
        reply.version, req.tree, reply.acks, need, ConsistencyLevelName(req.level))));
  }
  return reply;
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
