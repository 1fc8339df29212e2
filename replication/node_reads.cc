// Reads with a stated consistency level (node_impl.h): SLICE at ONE, LEADER
// and QUORUM. Locks: mu for the cluster view as everywhere; fence_mu only
// around the shared metadata barrier (never with mu); read_pool_mu only
// around the pool of peer clients (never with mu, never across a call).
//
// LEADER is linearizable by a quorum check, not a lease: before answering,
// the leader proves through the metadata raft (one ReadLinearizable, i.e. a
// raft barrier committed by a raft quorum, shared by every read that arrived
// before it started) that the tree's leader entry still names it at the epoch
// it serves. Why that is enough: another node can acknowledge a write of the
// tree only after its CompareAndSetLeader moved the entry to a higher epoch,
// and replicas refuse our stream once they know that epoch. So if a barrier
// that began after the read arrived still shows (us, epoch e), every write
// acknowledged before the read arrived was acknowledged by us, at epoch e,
// and is in our store. The reply is the newest version a quorum of owners
// holds durably, once that covers every version we held on arrival: never a
// write that a failover could still discard (no dirty read), and every write
// this client got acknowledged at any level, since it was on the leader
// before the read came (read-your-writes). No clock is trusted, so the
// faster failure detection of issue 18 cannot break it; the price is one
// raft barrier per batch of LEADER reads. Without the metadata service there
// is no failover: the ring's first owner leads at epoch 1 until the ring
// changes, and the check is the local leadership test alone.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "base/logging.h"
#include "replication/client.h"
#include "replication/node_impl.h"

namespace canopy::replication {

namespace {

void CopyAttributes(const tree::Node& n, std::map<std::string, std::string>* out) {
  n.ForEachAttribute([&](tree::AttributeView a) { (*out)[std::string(a.key)] = std::string(a.value); });
}

}  // namespace

uint64_t Node::Impl::DataEpoch(const std::string& tree) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = trees.find(tree);
  return it == trees.end() ? 0 : it->second.data_epoch;
}

SliceReply Node::Impl::SliceAt(const tree::Version& v, const SliceRequest& req, uint64_t data_epoch) {
  SliceReply reply;
  reply.version = v.number();
  reply.answered_by = node_id;
  reply.data_epoch = data_epoch;
  auto n = v.Find(tree::NodePath(req.path.begin(), req.path.end()));
  if (!n.ok()) {
    reply.status = StatusReplyFields::From(n.status());
    return reply;
  }
  const tree::Node& node = **n;
  CopyAttributes(node, &reply.attributes);
  reply.child_count = static_cast<uint32_t>(node.child_count());
  const uint64_t n_children = node.child_count();
  uint64_t begin = req.child_from;
  uint64_t end = begin + req.child_limit;
  if (req.from_end) {
    end = n_children > req.child_from ? n_children - req.child_from : 0;
    begin = end > req.child_limit ? end - req.child_limit : 0;
  }
  end = std::min(end, n_children);
  begin = std::min(begin, end);
  reply.child_start = static_cast<uint32_t>(begin);
  for (uint64_t i = begin; i < end; ++i) {
    SliceChild c;
    const tree::Node& child = *node.child(static_cast<size_t>(i));
    CopyAttributes(child, &c.attributes);
    c.child_count = static_cast<uint32_t>(child.child_count());
    reply.children.push_back(std::move(c));
  }
  return reply;
}

SliceReply Node::Impl::SliceLocal(const SliceRequest& req) {
  const uint64_t data_epoch = DataEpoch(req.tree);  // before the version: see SliceAt
  auto v = req.version == 0 ? store->Latest(req.tree) : store->At(req.tree, req.version);
  if (!v.ok()) {
    SliceReply reply;
    reply.answered_by = node_id;
    Status s = v.status();
    if (req.version != 0 && store->HasTree(req.tree)) s = s.WithContext("node " + node_id);
    reply.status = StatusReplyFields::From(s);
    return reply;
  }
  return SliceAt(*v, req, data_epoch);
}

SliceReply Node::Impl::HandleSlice(const SliceRequest& req) {
  if (req.child_limit > kMaxSliceChildren) {
    SliceReply reply;
    reply.status = StatusReplyFields::From(Status::InvalidArgument(
        fmt::format("a slice returns at most {} children, not {}", kMaxSliceChildren, req.child_limit)));
    return reply;
  }
  if (req.version != 0 && req.level != ReadLevel::kOne) {
    SliceReply reply;
    reply.status = StatusReplyFields::From(
        Status::InvalidArgument("a past version is read at ONE only (LEADER and QUORUM read the newest)"));
    return reply;
  }
  switch (req.level) {
    case ReadLevel::kOne: return SliceLocal(req);
    case ReadLevel::kLeader: return SliceAtLeader(req);
    case ReadLevel::kQuorum: return SliceAtQuorum(req);
  }
  return SliceLocal(req);
}

Result<std::shared_ptr<const meta::ClusterState>> Node::Impl::MetaBarrier(Deadline deadline) {
  std::unique_lock<std::mutex> lock(fence_mu);
  // A barrier that starts after this call: the next one to be started.
  const uint64_t need = fence_started + 1;
  while (fence_done < need) {
    if (stopping) return Status::Unavailable("node is stopping");
    if (!fence_running) {
      fence_running = true;
      uint64_t mine = ++fence_started;
      lock.unlock();
      auto r = meta->ReadLinearizable(deadline);
      lock.lock();
      fence_running = false;
      fence_done = mine;
      fence_result = r.ok() ? Result<std::shared_ptr<const meta::ClusterState>>(
                                  std::make_shared<const meta::ClusterState>(std::move(*r)))
                            : Result<std::shared_ptr<const meta::ClusterState>>(r.status());
      fence_cv.notify_all();
      continue;
    }
    if (fence_cv.wait_until(lock, deadline.at()) == std::cv_status::timeout && fence_done < need) {
      return Status::Timeout("waiting for the metadata barrier that confirms leadership");
    }
  }
  return fence_result;
}

uint64_t Node::Impl::QuorumDurableLocked(const std::string& tree_name, uint32_t* replicas) {
  const std::vector<std::string> owners = ReplicaSetLocked(tree_name);
  std::vector<uint64_t> durable;
  auto& acked = trees[tree_name].acked;
  for (const auto& o : owners) {
    if (o == node_id) {
      durable.push_back(store->DurableVersion(tree_name).value_or(0));
    } else {
      auto it = acked.find(o);
      durable.push_back(it == acked.end() ? 0 : it->second);
    }
  }
  if (replicas) *replicas = static_cast<uint32_t>(owners.size());
  uint32_t need = RequiredAcks(ConsistencyLevel::kQuorum, static_cast<uint32_t>(owners.size()));
  std::sort(durable.begin(), durable.end(), std::greater<>());
  return durable.size() >= need ? durable[need - 1] : 0;
}

SliceReply Node::Impl::SliceAtLeader(const SliceRequest& req) {
  SliceReply reply;
  reply.answered_by = node_id;
  if (NotLeader(req.tree, &reply.status, &reply.leader)) return reply;
  auto arrived = store->LatestVersion(req.tree);
  if (!arrived.ok()) {
    reply.status = StatusReplyFields::From(arrived.status());
    return reply;
  }
  Leadership served;
  {
    std::lock_guard<std::mutex> lock(mu);
    served = LeadershipLocked(req.tree);
  }
  Deadline deadline = Deadline::After(std::chrono::milliseconds(req.timeout_ms));
  if (meta) {
    auto state = MetaBarrier(deadline);
    if (!state.ok()) {
      reply.status = StatusReplyFields::From(
          state.status().WithContext("confirming leadership of " + req.tree + " for a LEADER read"));
      return reply;
    }
    const meta::TreeLeader* t = (*state)->FindTree(req.tree);
    bool still = t == nullptr ? served.epoch == kFirstEpoch
                              : std::to_string(t->leader_node) == node_id && t->epoch == served.epoch;
    if (!still) {
      reply.status = StatusReplyFields::From(Status::Unavailable(fmt::format(
          "node {} no longer leads {} at epoch {} (the metadata names node {} at epoch {}); retry at the leader",
          node_id, req.tree, served.epoch, t ? t->leader_node : 0, t ? t->epoch : 0)));
      return reply;
    }
  }
  uint64_t committed = 0;
  uint32_t replicas = 0;
  {
    std::unique_lock<std::mutex> lock(mu);
    // Woken by the ACKs that may bring a quorum to `arrived`, as a commit is.
    const std::vector<std::string> owners = ReplicaSetLocked(req.tree);
    (void)WaitForDurableLocked(lock, req.tree, *arrived, owners,
                               RequiredAcks(ConsistencyLevel::kQuorum, static_cast<uint32_t>(owners.size())),
                               deadline);
    committed = QuorumDurableLocked(req.tree, &replicas);
    if (!LeadsLocked(req.tree, nullptr) || LeadershipLocked(req.tree) != served) {
      reply.status = StatusReplyFields::From(
          Status::Unavailable(fmt::format("node {} lost the leadership of {} during a LEADER read", node_id, req.tree)));
      return reply;
    }
  }
  if (committed < *arrived) {
    reply.status = StatusReplyFields::From(Status::Timeout(fmt::format(
        "version {} of {} is not yet durable on a quorum of its {} replicas (quorum holds {}) after {} ms",
        *arrived, req.tree, replicas, committed, req.timeout_ms)));
    return reply;
  }
  const uint64_t data_epoch = DataEpoch(req.tree);  // before the version: see SliceAt
  auto v = store->At(req.tree, committed);
  if (!v.ok()) {
    reply.status = StatusReplyFields::From(v.status().WithContext("node " + node_id));
    return reply;
  }
  reply = SliceAt(*v, req, data_epoch);
  return reply;
}

std::unique_ptr<Client> Node::Impl::TakePeerClient(const std::string& peer_uri, Status* error) {
  {
    std::lock_guard<std::mutex> lock(read_pool_mu);
    auto& idle = read_pool[peer_uri];
    if (!idle.empty()) {
      auto c = std::move(idle.back());
      idle.pop_back();
      return c;
    }
  }
  ClientOptions o;
  o.cluster = options.cluster;
  o.secret = options.secret;
  o.client_id = "node-" + node_id + "-reads";
  o.timeout = std::chrono::milliseconds(2000);
  auto c = Client::Connect(peer_uri, o);
  if (!c.ok()) {
    *error = c.status();
    return nullptr;
  }
  return std::move(*c);
}

Result<SliceReply> Node::Impl::SliceFromPeer(const std::string& peer_uri, const SliceRequest& req) {
  Status error;
  auto c = TakePeerClient(peer_uri, &error);
  if (!c) return error;
  auto got = c->Slice(req);
  if (got.ok()) ReturnPeerClient(peer_uri, std::move(c));  // a failed connection is not reused
  return got;
}

void Node::Impl::ReturnPeerClient(const std::string& peer_uri, std::unique_ptr<Client> c) {
  std::lock_guard<std::mutex> lock(read_pool_mu);
  auto& idle = read_pool[peer_uri];
  if (idle.size() < kMaxIdlePeerClients && !stopping) idle.push_back(std::move(c));
}

std::vector<std::pair<std::string, std::string>> Node::Impl::QuorumOwnersLocked(const std::string& tree,
                                                                               size_t* alive) {
  std::vector<std::pair<std::string, std::string>> owners;  // id, URI
  for (const auto& o : OwnersLocked(tree)) owners.emplace_back(o, UriOfLocked(o));
  auto rank = [&](const std::string& id) { return id == node_id ? 0 : AliveLocked(id) ? 1 : 2; };
  std::stable_sort(owners.begin(), owners.end(),
                   [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
  *alive = 0;
  while (*alive < owners.size() && rank(owners[*alive].first) < 2) ++*alive;
  return owners;
}

void Node::Impl::QuorumMerge::Add(const std::string& id, SliceReply r) {
  if (r.status.code == StatusCode::kOk) {
    ++answered;
    newest_version = std::max(newest_version, r.version);
    if (!best || std::make_pair(r.data_epoch, r.version) > std::make_pair(best->data_epoch, best->version)) {
      best = std::move(r);
    }
  } else if (r.status.code == StatusCode::kNotFound) {
    ++answered;
    if (not_found.empty()) not_found = r.status.message;
  } else {
    failures += fmt::format("; node {}: {}", id, r.status.message);
  }
}

void Node::Impl::QuorumMerge::Fail(const std::string& id, const Status& why) {
  failures += fmt::format("; node {}: {}", id, why.ToString());
}

std::optional<SliceReply> Node::Impl::QuorumMerge::Settle(const SliceRequest& req, uint32_t need,
                                                          const std::string& self, std::string* why) {
  if (answered < need) {
    SliceReply reply;
    reply.answered_by = self;
    reply.status = StatusReplyFields::From(Status::Unavailable(fmt::format(
        "QUORUM read of {}: {} of the {} owners needed answered{}", req.tree, answered, need, failures)));
    return reply;
  }
  if (!best) {
    SliceReply reply;
    reply.answered_by = self;
    reply.status = StatusReplyFields::From(Status::NotFound(fmt::format(
        "none of a quorum of owners holds {} at path /{}: {}", req.tree, fmt::join(req.path, "/"), not_found)));
    return reply;
  }
  if (newest_version > best->version) {
    // The copies disagree across a failover: the newest epoch's copy is
    // behind another copy of an older epoch. A replica takes a new leader's
    // epoch only once it holds that leader's takeover version (FollowOn), so
    // the older epoch's newer versions should be the dead leader's
    // unacknowledged suffix; but a tag persisted in DIR/epochs before that
    // rule, or a bug, could make them acknowledged writes. Rather than
    // trust either copy, the tree's leader decides, at LEADER level
    // (linearizable).
    *why = fmt::format("node {} holds version {} at epoch {}, another owner version {}", best->answered_by,
                       best->version, best->data_epoch, newest_version);
    return std::nullopt;
  }
  return std::move(*best);
}

SliceReply Node::Impl::SliceAtQuorum(const SliceRequest& req) {
  std::vector<std::pair<std::string, std::string>> owners;  // id, URI
  {
    std::lock_guard<std::mutex> lock(mu);
    size_t alive = 0;
    owners = QuorumOwnersLocked(req.tree, &alive);
  }
  const uint32_t need = RequiredAcks(ConsistencyLevel::kQuorum, static_cast<uint32_t>(owners.size()));
  SliceRequest one = req;
  one.level = ReadLevel::kOne;
  Deadline deadline = Deadline::After(std::chrono::milliseconds(req.timeout_ms));
  QuorumMerge merge;
  for (const auto& [id, peer_uri] : owners) {
    if (merge.answered >= need || deadline.expired()) break;
    if (id == node_id) {
      merge.Add(id, SliceLocal(one));
      continue;
    }
    auto got = SliceFromPeer(peer_uri, one);
    if (!got.ok()) {
      merge.Fail(id, got.status());
      continue;
    }
    merge.Add(id, std::move(*got));
    // The next QUORUM read started without blocking can use this peer.
    if (quorum_links) (void)quorum_links->Connect(peer_uri);
  }
  std::string why;
  auto settled = merge.Settle(req, need, node_id, &why);
  if (!settled) return QuorumReadFromLeader(req, why);
  return std::move(*settled);
}

namespace {

// A QUORUM read started by SliceQuorumAsync: the owners' answers as they
// come, settled once the last one is in.
struct QuorumGather {
  std::mutex mu;
  Node::Impl::QuorumMerge merge;  // (mu)
  size_t remaining = 0;           // answers still to come (mu)
  bool abandoned = false;         // the read was not started after all (mu)
  SliceRequest request;
  uint32_t need = 0;
  std::string self;
  std::function<void(std::optional<SliceReply>)> done;

  // Counts one answer; the last one settles the read (outside mu).
  void Answer(const std::string& id, Result<SliceReply> reply) {
    std::optional<SliceReply> settled;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (abandoned) return;
      if (reply.ok()) {
        merge.Add(id, std::move(*reply));
      } else {
        merge.Fail(id, reply.status());
      }
      if (--remaining > 0) return;
      // A failure or a disagreement: the blocking path (SliceAtQuorum)
      // tries the other owners, or asks the leader.
      std::string why;
      if (merge.failures.empty()) settled = merge.Settle(request, need, self, &why);
    }
    done(std::move(settled));
  }
};

class QuorumAnswer : public SliceForwarder::Waiter {
 public:
  QuorumAnswer(std::shared_ptr<QuorumGather> gather, std::string id) : gather_(std::move(gather)), id_(std::move(id)) {}
  void Done(Result<SliceReply> reply) override { gather_->Answer(id_, std::move(reply)); }

 private:
  std::shared_ptr<QuorumGather> gather_;
  std::string id_;
};

}  // namespace

bool Node::Impl::SliceQuorumAsync(const SliceRequest& req, std::function<void(std::optional<SliceReply>)> done) {
  if (!quorum_links || stopping || req.level != ReadLevel::kQuorum || req.version != 0 ||
      req.child_limit > kMaxSliceChildren) {
    return false;  // the blocking path answers (or refuses) these
  }
  std::vector<std::pair<std::string, std::string>> owners;
  size_t alive = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    owners = QuorumOwnersLocked(req.tree, &alive);
  }
  const uint32_t need = RequiredAcks(ConsistencyLevel::kQuorum, static_cast<uint32_t>(owners.size()));
  if (need == 0 || alive < need) return false;
  auto gather = std::make_shared<QuorumGather>();
  gather->remaining = need;
  gather->request = req;
  gather->need = need;
  gather->self = node_id;
  gather->done = std::move(done);
  SliceRequest one = req;
  one.level = ReadLevel::kOne;
  bool self_asked = false;
  for (size_t k = 0; k < need; ++k) {
    const auto& [id, peer_uri] = owners[k];
    if (id == node_id) {
      self_asked = true;
      continue;
    }
    std::unique_ptr<SliceForwarder::Waiter> waiter = std::make_unique<QuorumAnswer>(gather, id);
    if (!quorum_links->TrySend(peer_uri, one, waiter)) {
      // Answers to what was already queued are dropped.
      std::lock_guard<std::mutex> lock(gather->mu);
      gather->abandoned = true;
      return false;
    }
  }
  if (self_asked) gather->Answer(node_id, SliceLocal(one));
  return true;
}

SliceReply Node::Impl::QuorumReadFromLeader(const SliceRequest& req, const std::string& why) {
  SliceRequest at_leader = req;
  at_leader.level = ReadLevel::kLeader;
  std::string leader, leader_uri;
  {
    std::lock_guard<std::mutex> lock(mu);
    leader = LeadershipLocked(req.tree).leader;
    leader_uri = UriOfLocked(leader);
  }
  if (leader == node_id) return SliceAtLeader(at_leader);
  Status error = Status::Unavailable("no leader known");
  if (!leader.empty() && !leader_uri.empty()) {
    auto got = SliceFromPeer(leader_uri, at_leader);
    if (got.ok()) return std::move(*got);
    error = got.status();
  }
  SliceReply reply;
  reply.answered_by = node_id;
  reply.status = StatusReplyFields::From(Status::Unavailable(
      fmt::format("QUORUM read of {}: the owners' copies disagree across a failover ({}), and the leader {} could "
                  "not settle it: {}",
                  req.tree, why, leader.empty() ? "(none)" : leader, error.ToString())));
  return reply;
}

}  // namespace canopy::replication
