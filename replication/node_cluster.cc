// Cluster view (node_impl.h): members and the ring, tree leadership and
// epochs, heartbeats sent (MaintenanceLoop) and received, starting replicas.

#include <fmt/format.h>

#include <algorithm>

#include "base/logging.h"
#include "replication/node_impl.h"
#include "transport/registry.h"

namespace canopy::replication {

void Node::Impl::PersistMembersLocked() {
  std::string text;
  for (const auto& [id, u] : members) text += id + " " + u + "\n";
  Status s = WriteFileAtomic(MembersPath(), text);
  if (!s.ok()) CANOPY_LOG(kWarn, "node {}: cannot persist members: {}", node_id, s.ToString());
}

// Adds or updates a member; rebuilds the ring for new ids.
void Node::Impl::AddMemberLocked(const std::string& id, const std::string& member_uri) {
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

void Node::Impl::AddMember(const std::string& id, const std::string& member_uri) {
  std::lock_guard<std::mutex> lock(mu);
  AddMemberLocked(id, member_uri);
}

// The tree's leader and epoch: from the metadata service when it has an
// entry, else the ring's first owner at the first epoch.
Node::Impl::Leadership Node::Impl::LeadershipLocked(const std::string& tree) const {
  if (meta) {
    auto it = meta_trees.find(tree);
    if (it != meta_trees.end()) return {std::to_string(it->second.leader_node), it->second.epoch};
  }
  auto owners = ring.Owners(tree);
  return {owners.empty() ? std::string() : owners[0], kFirstEpoch};
}

// True when we lead `tree` (and, with metadata, know the current state).
bool Node::Impl::LeadsLocked(const std::string& tree, uint64_t* epoch) const {
  Leadership l = LeadershipLocked(tree);
  if (epoch) *epoch = l.epoch;
  return l.leader == node_id && (!meta || meta_synced);
}

void Node::Impl::PersistEpochsLocked() {
  std::string text;
  for (const auto& [name, t] : trees) {
    if (t.data_epoch == 0) continue;
    text += fmt::format("{} {} {} {}\n", name, t.data_epoch, t.predecessor_epoch, t.takeover_version);
  }
  Status s = WriteFileAtomic(EpochsPath(), text);
  if (!s.ok()) CANOPY_LOG(kWarn, "node {}: cannot persist epochs: {}", node_id, s.ToString());
}

void Node::Impl::SetDataEpochLocked(const std::string& tree, uint64_t epoch) {
  auto& t = trees[tree];
  if (t.data_epoch == epoch) return;
  t.data_epoch = epoch;
  PersistEpochsLocked();
}

std::string Node::Impl::UriOfLocked(const std::string& id) const {
  auto it = members.find(id);
  return it == members.end() ? std::string() : it->second;
}

bool Node::Impl::AliveLocked(const std::string& id) const {
  if (id == node_id) return true;
  auto it = last_heard.find(id);
  return it != last_heard.end() && Clock::now() - it->second < options.failure_timeout;
}

Result<std::pair<std::string, std::unique_ptr<transport::Connection>>> Node::Impl::DialPeerWithId(
    const std::string& peer_uri) {
  CANOPY_ASSIGN_OR_RETURN(auto conn, transport::Dial(peer_uri, topts));
  CANOPY_ASSIGN_OR_RETURN(PeerIdentity id,
                          DialerHandshake(*conn, hs, Deadline::After(std::chrono::seconds(3))));
  return std::make_pair(id.node_id, std::move(conn));
}

// Sets the per-tree and per-replica gauges (metrics_refresher).
void Node::Impl::RefreshMetrics() {
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [name, t] : trees) {
    uint64_t latest = store->HasTree(name) ? store->LatestVersion(name).value_or(0) : 0;
    Leadership l = LeadershipLocked(name);
    metrics->SetTree(name, l.epoch, latest);
    if (l.leader != node_id) continue;
    for (const auto& [replica, acked] : t.acked) metrics->SetReplica(name, replica, acked, latest);
  }
}

void Node::Impl::OnHeartbeat(const Heartbeat& hb) {
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

void Node::Impl::MaintenanceLoop() {
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
void Node::Impl::AddRaftMembers() {
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
      CANOPY_LOG(kInfo, "node {}: adding node {} ({}) to the metadata raft: {}", node_id, id, addr,
                 s.ToString());
      std::lock_guard<std::mutex> lock(mu);
      raft_adds_pending.erase(id);
    });
  }
}

void Node::Impl::StartReplicas() {
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

}  // namespace canopy::replication
