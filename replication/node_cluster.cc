// Cluster view (node_impl.h): members and the ring, tree leadership and
// epochs, membership (MaintenanceLoop: SWIM-style probes with piggybacked,
// digest-first gossip; the failure detector), starting replicas.
//
// Membership cost per node and round (one round per heartbeat_interval) does
// not grow with the cluster: one probe and its ack out, on average one probe
// in and its ack back, gossip sets only when digests differ; ping-reqs only
// when a probe goes unanswered. Leader streams carry their own heartbeats,
// and failover asks the other owners directly (node_failover.cc).

#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <utility>

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
    if (id != node_id) member_round_due = true;
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
    auto hint = hinted_leaders.find(tree);
    if (hint != hinted_leaders.end()) return hint->second;
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
  if (epoch != 0) t.fetched_data_epoch = 0;
  if (t.data_epoch == epoch) return;
  t.data_epoch = epoch;
  PersistEpochsLocked();
}

std::string Node::Impl::UriOfLocked(const std::string& id) const {
  auto it = members.find(id);
  return it == members.end() ? std::string() : it->second;
}

bool Node::Impl::AliveLocked(const std::string& id) const {
  return id == node_id || !detector.Suspected(id, Clock::now());
}

void Node::Impl::Heard(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu);
  HeardLocked(id);
}

void Node::Impl::LostPeer(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu);
  bool was_alive = !detector.Suspected(id, Clock::now());
  detector.Lost(id, Clock::now());
  if (was_alive) CANOPY_LOG(kDebug, "node {}: lost contact with {}", node_id, id);
  cv.notify_all();
}

Result<std::pair<std::string, std::unique_ptr<transport::Connection>>> Node::Impl::DialPeerWithId(
    const std::string& peer_uri) {
  CANOPY_ASSIGN_OR_RETURN(auto conn, transport::Dial(peer_uri, topts));
  CANOPY_ASSIGN_OR_RETURN(PeerIdentity id,
                          DialerHandshake(*conn, hs, DialHandshakeDeadline()));
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
  bool new_raft_address = false;
  bool new_hint = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (hb.node_id == node_id) return;
    HeardLocked(hb.node_id);
    if (!hb.raft_address.empty()) {
      std::string& known = peer_raft[hb.node_id];
      new_raft_address = known != hb.raft_address;
      known = hb.raft_address;
    }
    for (const auto& [id, member_uri] : hb.members) AddMemberLocked(id, member_uri);
    for (const auto& t : hb.trees) {
      if (!tree::Store::ValidateTreeName(t.tree).ok()) continue;
      known_trees.insert(t.tree);
      // The sender leads t (every HEARTBEAT that lists trees is a leader's).
      if (!meta || meta_trees.count(t.tree)) continue;
      auto [hint, inserted] = hinted_leaders.try_emplace(t.tree, Leadership{hb.node_id, t.epoch});
      if (!inserted && t.epoch > hint->second.epoch) hint->second = {hb.node_id, t.epoch};
      new_hint |= inserted;
    }
    for (const auto& name : hb.tree_names) {
      if (tree::Store::ValidateTreeName(name).ok()) known_trees.insert(name);
    }
  }
  // A joining node announced its raft address: the raft leader adds it now,
  // not at the end of its next maintenance round (the joiner learns its
  // trees' leaders and epochs only once it is in the group).
  if (new_raft_address) AddRaftMembers();
  // Trees whose leader just became known: follow them now.
  if (new_hint) StartReplicas();
}

Heartbeat Node::Impl::MakeHeartbeatLocked(Heartbeat::Kind kind, uint64_t sequence, uint64_t peer_members_digest,
                                          uint64_t peer_trees_digest) {
  Heartbeat hb;
  hb.node_id = node_id;
  hb.sequence = sequence;
  hb.kind = kind;
  if (raft_listening) hb.raft_address = options.raft_address;
  hb.members_digest = GossipDigest(members);
  hb.trees_digest = GossipDigest(known_trees);
  if (kind != Heartbeat::Kind::kProbe) {
    if (peer_members_digest != hb.members_digest) hb.members = members;
    if (peer_trees_digest != hb.trees_digest) hb.tree_names.assign(known_trees.begin(), known_trees.end());
  }
  return hb;
}

Status Node::Impl::AnswerProbe(transport::Connection& conn, const Heartbeat& probe) {
  Heartbeat ack;
  {
    std::lock_guard<std::mutex> lock(mu);
    ack = MakeHeartbeatLocked(Heartbeat::Kind::kProbeAck, probe.sequence, probe.members_digest,
                              probe.trees_digest);
  }
  std::string encoded = Encode(ack);
  metrics->MembershipSent(encoded.size());
  return conn.Send(static_cast<uint16_t>(MessageType::kHeartbeat), encoded);
}

Result<Heartbeat> Node::Impl::ProbeOn(transport::Connection& conn, const Heartbeat& probe,
                                      std::chrono::milliseconds timeout) {
  std::string encoded = Encode(probe);
  metrics->MembershipSent(encoded.size());
  CANOPY_RETURN_IF_ERROR(conn.Send(static_cast<uint16_t>(MessageType::kHeartbeat), encoded));
  Deadline deadline = Deadline::After(timeout);
  while (true) {
    CANOPY_ASSIGN_OR_RETURN(auto m, conn.Receive(deadline));
    metrics->MembershipReceived(m.payload.size());
    if (m.type == static_cast<uint16_t>(MessageType::kError)) {
      auto e = DecodeError(m.payload);
      return e.ok() ? e->ToStatus() : e.status();
    }
    if (m.type != static_cast<uint16_t>(MessageType::kHeartbeat) || m.bulk_bytes != 0) {
      return UnexpectedMessage(m, "HEARTBEAT (probe ack)");
    }
    CANOPY_ASSIGN_OR_RETURN(Heartbeat ack, DecodeHeartbeat(m.payload));
    OnHeartbeat(ack);  // a late ack of an earlier probe still proves liveness
    if (ack.kind == Heartbeat::Kind::kProbeAck && ack.sequence == probe.sequence) return ack;
  }
}

Status Node::Impl::AnswerProbeRequest(transport::Connection& conn, const ProbeRequest& req) {
  auto timeout = std::chrono::milliseconds(std::clamp<uint32_t>(req.timeout_ms, 1, 10'000));
  Status result;
  auto dialed = DialPeerWithId(req.target_uri);
  if (!dialed.ok()) {
    result = dialed.status();
  } else if (dialed->first != req.target_id) {
    result = Status::Unavailable(fmt::format("{} answers as node {}", req.target_uri, dialed->first));
  } else {
    Heartbeat probe;
    {
      std::lock_guard<std::mutex> lock(mu);
      probe = MakeHeartbeatLocked(Heartbeat::Kind::kProbe, req.sequence, 0, 0);
    }
    auto ack = ProbeOn(*dialed->second, probe, timeout);
    dialed->second->Close();
    if (ack.ok()) {
      std::string encoded = Encode(*ack);
      metrics->MembershipSent(encoded.size());
      return conn.Send(static_cast<uint16_t>(MessageType::kHeartbeat), encoded);
    }
    result = ack.status();
  }
  LostPeer(req.target_id);
  return SendMessage(conn, ErrorMessage{StatusCode::kUnavailable,
                                        fmt::format("node {} did not answer a probe: {}", req.target_id,
                                                    result.ToString())});
}

// One SWIM-style member list: probe targets in a shuffled round-robin order
// (every member is probed once per N rounds, as SWIM does), one per round.
void Node::Impl::MaintenanceLoop() {
  std::map<std::string, std::unique_ptr<transport::Connection>> links;
  std::map<std::string, Clock::time_point> next_dial;
  std::vector<std::string> order;
  size_t next = 0;
  std::mt19937_64 rng(std::random_device{}());
  uint64_t seq = 0;
  const auto interval = options.heartbeat_interval;
  // Ping-req helpers per failed probe (SWIM's k).
  constexpr size_t kIndirectProbes = 2;

  // The link to a member, dialed when missing (at most once per interval).
  auto link_to = [&](const std::string& id, const std::string& peer_uri) -> transport::Connection* {
    auto it = links.find(id);
    if (it != links.end()) return it->second.get();
    if (Clock::now() < next_dial[id]) return nullptr;
    next_dial[id] = Clock::now() + std::max<std::chrono::milliseconds>(interval, std::chrono::milliseconds(50));
    auto r = DialPeerWithId(peer_uri);
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kPermissionDenied) LostPeer(id);
      return nullptr;
    }
    if (r->first != id) return nullptr;
    return links.emplace(id, std::move(r->second)).first->second.get();
  };
  // After an exchange: push our full sets when the peer's digests still differ.
  auto push_gossip = [&](transport::Connection* conn, const Heartbeat& peer) -> Status {
    Heartbeat hb;
    {
      std::lock_guard<std::mutex> lock(mu);
      hb = MakeHeartbeatLocked(Heartbeat::Kind::kOneWay, ++seq, peer.members_digest, peer.trees_digest);
    }
    if (hb.members.empty() && hb.tree_names.empty()) return Status::Ok();
    std::string encoded = Encode(hb);
    metrics->MembershipSent(encoded.size());
    return conn->Send(static_cast<uint16_t>(MessageType::kHeartbeat), encoded);
  };

  // Our full view (members, trees, the raft address once raft listens),
  // sent unasked to member `id` on `conn`: a joiner is added to the
  // metadata raft, and so learns its trees' leaders, as soon as the raft
  // leader hears it. A failed send drops the link.
  auto introduce = [&](const std::string& id, transport::Connection* conn) {
    Heartbeat hb;
    {
      std::lock_guard<std::mutex> lock(mu);
      hb = MakeHeartbeatLocked(Heartbeat::Kind::kOneWay, ++seq, 0, 0);
    }
    std::string encoded = Encode(hb);
    metrics->MembershipSent(encoded.size());
    if (!conn->Send(static_cast<uint16_t>(MessageType::kHeartbeat), encoded).ok()) links.erase(id);
  };

  while (!stopping) {
    const auto round_start = Clock::now();
    // Seeds whose id we do not know yet.
    std::vector<std::string> seeds;
    {
      std::lock_guard<std::mutex> lock(mu);
      seeds = unresolved_seeds;
    }
    std::vector<std::string> resolved;
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
        HeardLocked(r->first);
        links[r->first] = std::move(r->second);
        resolved.push_back(r->first);
      }
    }
    // Introduce ourselves to every seed at once (members, trees, the raft
    // address once raft listens), not one probe target per round.
    for (const auto& id : resolved) {
      if (stopping) break;
      auto it = links.find(id);
      if (it != links.end()) introduce(id, it->second.get());
    }
    std::map<std::string, std::string> peers;
    bool announce_raft = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      peers = members;
      announce_raft = std::exchange(raft_announce_due, false);
    }
    peers.erase(node_id);
    // Raft just started listening: tell every member its address now (the
    // raft leader adds a joiner as soon as it hears it), not one probe
    // target per round.
    if (announce_raft) {
      for (const auto& [id, peer_uri] : peers) {
        if (stopping) break;
        if (auto* conn = link_to(id, peer_uri)) introduce(id, conn);
      }
    }
    for (auto it = links.begin(); it != links.end();) {
      it = peers.count(it->first) ? std::next(it) : links.erase(it);
    }

    // ---- SWIM: probe one member; ping-req through others on no answer ----
    while (next < order.size() && !peers.count(order[next])) ++next;
    if (next >= order.size()) {
      order.clear();
      for (const auto& [id, u] : peers) order.push_back(id);
      std::shuffle(order.begin(), order.end(), rng);
      next = 0;
    }
    if (next < order.size() && !stopping) {
      const std::string target = order[next++];
      const std::string target_uri = peers[target];
      bool answered = false;
      if (auto* conn = link_to(target, target_uri)) {
        Heartbeat probe;
        {
          std::lock_guard<std::mutex> lock(mu);
          probe = MakeHeartbeatLocked(Heartbeat::Kind::kProbe, ++seq, 0, 0);
        }
        auto ack = ProbeOn(*conn, probe, interval);
        if (ack.ok()) {
          answered = true;
          if (!push_gossip(conn, *ack).ok()) links.erase(target);
        } else if (!ack.status().IsTimeout()) {
          links.erase(target);  // closed, reset: evidence, but ask others first
        }
      }
      if (!answered && !stopping) {
        // Indirect probes (ping-req) through up to k other members.
        std::vector<std::string> helpers;
        for (const auto& [id, u] : peers) {
          if (id != target) helpers.push_back(id);
        }
        std::shuffle(helpers.begin(), helpers.end(), rng);
        if (helpers.size() > kIndirectProbes) helpers.resize(kIndirectProbes);
        ProbeRequest req{target, target_uri, ++seq, static_cast<uint32_t>(interval.count())};
        std::string encoded = Encode(req);
        std::vector<transport::Connection*> asked;
        for (const auto& h : helpers) {
          auto* conn = link_to(h, peers[h]);
          if (!conn) continue;
          metrics->MembershipSent(encoded.size());
          if (conn->Send(static_cast<uint16_t>(MessageType::kProbeRequest), encoded).ok()) {
            asked.push_back(conn);
          } else {
            links.erase(h);
          }
        }
        Deadline deadline = Deadline::After(2 * interval);
        transport::Connection* answered_by = nullptr;
        for (auto* conn : asked) {
          if (answered) break;
          while (true) {
            auto m = conn->Receive(deadline);
            if (!m.ok()) break;
            metrics->MembershipReceived(m->payload.size());
            if (m->type != static_cast<uint16_t>(MessageType::kHeartbeat)) break;  // ERROR: no answer
            auto hb = DecodeHeartbeat(m->payload);
            if (!hb.ok()) break;
            OnHeartbeat(*hb);
            if (hb->node_id == target) {
              answered = true;
              answered_by = conn;
              break;
            }
          }
        }
        // A helper that has not answered yet would answer later, on a link
        // the next exchange expects something else on: drop those links.
        for (const auto& h : helpers) {
          auto it = links.find(h);
          if (it == links.end() || it->second.get() == answered_by) continue;
          if (std::find(asked.begin(), asked.end(), it->second.get()) != asked.end()) links.erase(it);
        }
        if (!answered) LostPeer(target);
      }
    }

    // ---- Owners of trees we lead that have not subscribed: tell them ----
    std::map<std::string, Heartbeat> hints;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [name, t] : trees) {
        uint64_t epoch = 0;
        if (!LeadsLocked(name, &epoch) || !store->HasTree(name)) continue;
        for (const auto& owner : OwnersLocked(name)) {
          if (owner == node_id || t.acked.count(owner) || !peers.count(owner)) continue;
          auto& hb = hints[owner];
          hb.node_id = node_id;
          hb.kind = Heartbeat::Kind::kOneWay;
          hb.trees.push_back({name, epoch, store->LatestVersion(name).value_or(0)});
        }
      }
    }
    for (auto& [owner, hb] : hints) {
      if (stopping) break;
      auto* conn = link_to(owner, peers[owner]);
      if (!conn) continue;
      hb.sequence = ++seq;
      hb.members_digest = hb.trees_digest = 0;
      std::string encoded = Encode(hb);
      metrics->MembershipSent(encoded.size());
      if (!conn->Send(static_cast<uint16_t>(MessageType::kHeartbeat), encoded).ok()) links.erase(owner);
    }

    StartReplicas();
    AddRaftMembers();
    RebalanceRaftLeadership();
    ReapWorkers();
    auto elapsed = Clock::now() - round_start;
    if (elapsed < interval) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, interval - elapsed,
                  [&] { return stopping.load() || raft_announce_due || member_round_due; });
      member_round_due = false;
    }
  }
  for (auto& [id, c] : links) c->Close();
}

// On the raft leader: adds members that announced a raft address but are
// not voters of the raft group yet (a joining node started with --raft and
// no --raft-peer). A member that is in the group but not a voter is one
// whose addition was cut short, typically by a change of raft leader
// between AddMember's two steps (raft_add as a spare, then the promotion):
// a spare receives no log, so it would wait for its metadata forever unless
// this leader finishes the promotion (AddMember assigns an existing spare).
void Node::Impl::AddRaftMembers() {
  if (!meta || !meta->IsRaftLeader()) return;
  std::set<uint64_t> in_group;
  for (const auto& m : meta->RaftMembers()) {
    if (m.voter) in_group.insert(m.id);
  }
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

// On the raft leader: when this node leads more trees than a live voter
// does, moves raft leadership to the voter that leads the fewest, so that
// the death of a tree leader rarely also takes the raft leader with it (its
// failover would wait for a raft election before the epoch CAS). Strictly
// fewer, so leadership never bounces between equals; rate-limited against
// churn of the tree leaders themselves.
void Node::Impl::RebalanceRaftLeadership() {
  auto interval = options.raft_leader_rebalance_interval;
  if (!meta || interval.count() <= 0 || !meta->IsRaftLeader()) return;
  uint64_t me = 0;
  try {
    me = std::stoull(node_id);
  } catch (const std::exception&) {
    return;
  }
  std::vector<uint64_t> voters;
  for (const auto& m : meta->RaftMembers()) {
    if (m.voter && m.id != me) voters.push_back(m.id);
  }
  uint64_t target = 0;
  size_t mine = 0, fewest = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto now = Clock::now();
    // Not while a member is being added either: the transfer would cut its
    // addition short (AddRaftMembers finishes it, but only a round later).
    if (raft_transfer_pending || !raft_adds_pending.empty() || now - last_raft_transfer < interval) return;
    std::map<uint64_t, size_t> led;
    for (const auto& [name, t] : meta_trees) ++led[t.leader_node];
    mine = led[me];
    if (mine == 0) return;
    for (uint64_t v : voters) {
      if (!AliveLocked(std::to_string(v))) continue;
      size_t n = led[v];
      if (n < mine && (target == 0 || n < fewest)) {
        target = v;
        fewest = n;
      }
    }
    if (target == 0) return;
    raft_transfer_pending = true;
    last_raft_transfer = now;
  }
  Spawn([this, target, mine, fewest] {
    Status s = meta->TransferLeadership(target, Deadline::After(std::chrono::seconds(5)));
    if (s.ok()) {
      CANOPY_LOG(kInfo, "node {}: handed metadata raft leadership to node {} (it leads {} trees, this node {})",
                 node_id, target, fewest, mine);
    } else {
      CANOPY_LOG(kWarn, "node {}: metadata raft leadership to node {}: {}", node_id, target, s.ToString());
    }
    std::lock_guard<std::mutex> lock(mu);
    raft_transfer_pending = false;
  });
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
