// Leader failover (node_impl.h): a replica that finds its tree's leader dead
// and itself the live owner with the newest data takes the tree over through
// the metadata raft (compare-and-set on the epoch).

#include <fmt/format.h>

#include "base/logging.h"
#include "replication/node_impl.h"

namespace canopy::replication {

// Takes over `tree` when its leader `dead.leader` has been silent long
// enough and we are the live owner with the newest data.
void Node::Impl::MaybeFailover(const std::string& tree_name, const Leadership& dead) {
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
  CANOPY_LOG(kInfo, "node {}: leader {} of {} (epoch {}) is dead; taking over at version {}", node_id,
             dead.leader, tree_name, dead.epoch, my_version);
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
  CANOPY_LOG(kInfo, "node {}: now the leader of {} at epoch {} (version {})", node_id, tree_name, *epoch,
             my_version);
}

}  // namespace canopy::replication
