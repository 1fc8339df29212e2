// Leader failover (node_impl.h): a replica that finds its tree's leader dead
// asks the other owners for their state, and when a quorum of owners (itself
// included) no longer follows that leader and none holds newer data, takes
// the tree over through the metadata raft (compare-and-set on the epoch).
//
// Why a quorum that no longer follows: every QUORUM-acknowledged write is on
// owners/2+1 owners, the leader included, so on at least owners/2 replicas.
// A candidate that compared itself with owners/2+1 replicas meets at least
// one of them. Those replicas stay off the old leader's epoch while the
// candidate decides (hold_epoch), and an owner still following it vetoes,
// so the versions compared are final for that epoch: a cut between the
// candidate and a live leader, or a leader that restarts at once, cannot
// make the new leader miss an acknowledged write. The raft CAS on the epoch
// fences a deposed leader.

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "base/logging.h"
#include "replication/node_impl.h"
#include "transport/registry.h"

namespace canopy::replication {

bool Node::Impl::HeldLocked(const std::string& tree_name, const Leadership& l) const {
  auto it = trees.find(tree_name);
  return it != trees.end() && it->second.hold_epoch == l.epoch && Clock::now() < it->second.hold_until;
}

TreeStateReply Node::Impl::HandleTreeStateRequest(const TreeStateRequest& req) {
  TreeStateReply reply;
  reply.tree = req.tree;
  reply.node_id = node_id;
  std::lock_guard<std::mutex> lock(mu);
  auto& t = trees[req.tree];
  Leadership current = LeadershipLocked(req.tree);
  // Still streaming from that leader at that epoch (the follow loop checks
  // the hold under mu before applying anything, so "not following" here
  // means nothing of that epoch is being applied or will be): veto. So do
  // we when we know a newer leadership, or lead the tree ourselves.
  bool following = t.following && t.following_leader == req.leader && t.following_epoch == req.epoch;
  reply.leader_alive = following || current.epoch > req.epoch || current.leader == node_id;
  if (!reply.leader_alive) {
    t.hold_epoch = req.epoch;
    t.hold_until = Clock::now() + options.failure_timeout;
  }
  reply.data_epoch = t.data_epoch;
  reply.version = store->HasTree(req.tree) ? store->LatestVersion(req.tree).value_or(0) : 0;
  return reply;
}

Result<std::unique_ptr<transport::Connection>> Node::Impl::DialOwner(const std::string& owner) {
  std::string owner_uri;
  {
    std::lock_guard<std::mutex> lock(mu);
    owner_uri = UriOfLocked(owner);
  }
  if (owner_uri.empty()) return Status::NotFound("URI of node " + owner + " unknown");
  CANOPY_ASSIGN_OR_RETURN(auto conn, transport::Dial(owner_uri, topts));
  if (!Register(conn.get())) return Status::Aborted("stopping");
  auto id = DialerHandshake(*conn, hs, DialHandshakeDeadline());
  Status s = !id.ok() ? id.status()
             : id->node_id != owner
                 ? Status::Unavailable(fmt::format("{} answers as node {}", owner_uri, id->node_id))
                 : Status();
  if (!s.ok()) {
    conn->Close();
    Unregister(conn.get());
    return s;
  }
  return conn;
}

std::vector<Result<TreeStateReply>> Node::Impl::AskTreeStates(const std::vector<std::string>& asked,
                                                              const TreeStateRequest& req) {
  // Set-ups in parallel, each bounded like any dialled handshake: under
  // emulation an rdma:// set-up alone took longer than the exchange's bound
  // below, and a candidate that gave up on it never gathered its quorum.
  std::vector<Result<std::unique_ptr<transport::Connection>>> links;
  for (size_t i = 0; i < asked.size(); ++i) links.emplace_back(Status::Unavailable("not dialled"));
  {
    std::vector<std::thread> dialers;
    for (size_t i = 0; i < asked.size(); ++i)
      dialers.emplace_back([&, i] { links[i] = DialOwner(asked[i]); });
    for (auto& d : dialers) d.join();
  }
  // The exchanges together, within a few heartbeats: every answer, and the
  // hold it starts on its owner, falls in one short window.
  auto deadline = Deadline::After(
      std::max<std::chrono::milliseconds>(4 * options.heartbeat_interval, std::chrono::milliseconds(300)));
  std::vector<Result<TreeStateReply>> replies(asked.size(), Status::Unavailable("not asked"));
  std::vector<Status> sent(asked.size());
  for (size_t i = 0; i < asked.size(); ++i) {
    if (links[i].ok()) sent[i] = SendMessage(**links[i], req);
  }
  for (size_t i = 0; i < asked.size(); ++i) {
    if (!links[i].ok()) {
      replies[i] = links[i].status();
      continue;
    }
    transport::Connection& conn = **links[i];
    replies[i] = [&]() -> Result<TreeStateReply> {
      CANOPY_RETURN_IF_ERROR(sent[i]);
      CANOPY_ASSIGN_OR_RETURN(auto m, conn.Receive(deadline));
      if (m.type != static_cast<uint16_t>(MessageType::kTreeStateReply))
        return UnexpectedMessage(m, "TREE_STATE_REPLY");
      CANOPY_ASSIGN_OR_RETURN(TreeStateReply r, DecodeTreeStateReply(m.payload));
      if (r.tree != req.tree || r.node_id != asked[i])
        return Status::Corruption("TREE_STATE_REPLY for another tree or node");
      return r;
    }();
    conn.Close();
    Unregister(&conn);
    if (replies[i].ok()) Heard(asked[i]);
  }
  return replies;
}

// Takes over `tree` when its leader `dead.leader` is dead and we are, among
// a quorum of owners that no longer follow it, the one with the newest data.
void Node::Impl::MaybeFailover(const std::string& tree_name, const Leadership& dead) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!meta_synced || AliveLocked(dead.leader)) return;
    // A leader we have not heard from since we started and have no evidence
    // against (a refused or broken connection) is not known to be dead.
    if (!detector.LastHeard(dead.leader) && !detector.HasLossEvidence(dead.leader) &&
        Clock::now() - started_at < options.failure_timeout) {
      return;
    }
  }
  // Our own state is final: our follow loop is here, not streaming.
  uint64_t my_version = store->HasTree(tree_name) ? store->LatestVersion(tree_name).value_or(0) : 0;
  uint64_t my_epoch = 0;
  std::vector<std::string> owners;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping || !(LeadershipLocked(tree_name) == dead)) return;
    my_epoch = trees[tree_name].data_epoch;
    owners = OwnersLocked(tree_name);
  }
  auto better = [](uint64_t e1, uint64_t v1, const std::string& id1, uint64_t e2, uint64_t v2,
                   const std::string& id2) {
    if (e1 != e2) return e1 > e2;
    if (v1 != v2) return v1 > v2;
    return id1 < id2;
  };
  // Ask the other owners directly: no waiting for heartbeats to come round.
  const TreeStateRequest req{tree_name, dead.leader, dead.epoch};
  std::vector<std::string> asked;
  for (const auto& owner : owners) {
    if (owner != node_id && owner != dead.leader) asked.push_back(owner);
  }
  if (stopping) return;
  auto replies = AskTreeStates(asked, req);
  size_t compared = 1;  // ourselves
  for (size_t i = 0; i < asked.size(); ++i) {
    const std::string& owner = asked[i];
    const auto& r = replies[i];
    if (!r.ok()) {
      CANOPY_LOG(kDebug, "node {}: failover of {}: owner {} did not answer: {}", node_id, tree_name, owner,
                 r.status().ToString());
      continue;  // it counts toward no quorum
    }
    if (r->leader_alive) {
      CANOPY_LOG(kDebug, "node {}: failover of {}: owner {} still follows leader {} (epoch {})", node_id,
                 tree_name, owner, dead.leader, dead.epoch);
      return;
    }
    if (better(r->data_epoch, r->version, owner, my_epoch, my_version, node_id)) return;  // it takes over
    ++compared;
  }
  if (compared < owners.size() / 2 + 1) return;
  uint64_t expected = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping || !(LeadershipLocked(tree_name) == dead) || AliveLocked(dead.leader)) return;
    auto it = meta_trees.find(tree_name);
    if (it == meta_trees.end()) {
      // Created without the metadata service: its epoch-1 leader is not
      // registered, and a CAS from 0 would hand out epoch 1 a second time.
      CANOPY_LOG(kWarn, "node {}: {} has no leader in the metadata; no failover", node_id, tree_name);
      return;
    }
    expected = it->second.epoch;
  }
  CANOPY_LOG(kInfo, "node {}: leader {} of {} (epoch {}) is dead; taking over at version {} ({} of {} owners compared)",
             node_id, dead.leader, tree_name, dead.epoch, my_version, compared, owners.size());
  // The raft may be electing (its leader may have died with the tree's):
  // retry while it is unavailable. A CAS whose answer was lost may have
  // landed: a later Conflict is then checked against the metadata.
  const uint64_t me = std::stoull(node_id);
  Result<uint64_t> epoch = Status::Unavailable("not tried");
  bool ambiguous = false;
  auto deadline = Deadline::After(std::chrono::seconds(5));
  for (int attempt = 0; !stopping; ++attempt) {
    epoch = meta->CompareAndSetLeader(tree_name, expected, me, my_version, deadline);
    if (epoch.ok()) break;
    if (epoch.status().code() == StatusCode::kConflict && ambiguous) {
      auto state = meta->ReadLinearizable(Deadline::After(std::chrono::seconds(2)));
      if (state.ok()) {
        auto it = state->trees.find(tree_name);
        if (it != state->trees.end() && it->second.leader_node == me && it->second.epoch == expected + 1 &&
            it->second.leader_version == my_version) {
          epoch = it->second.epoch;
        }
      }
      break;
    }
    if (!epoch.status().IsUnavailable() && !epoch.status().IsTimeout()) break;
    if (deadline.expired()) break;
    ambiguous = ambiguous || epoch.status().IsTimeout();
    SleepFor(std::chrono::milliseconds(std::min(10 + 10 * attempt, 50)));
  }
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
  meta::TreeLeader tl{tree_name, me, *epoch, my_version};
  auto& cached = meta_trees[tree_name];
  if (cached.epoch < *epoch) cached = tl;
  cv.notify_all();
  CANOPY_LOG(kInfo, "node {}: now the leader of {} at epoch {} (version {})", node_id, tree_name, *epoch,
             my_version);
}

}  // namespace canopy::replication
