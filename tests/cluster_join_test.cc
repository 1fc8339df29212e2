// Node join: a fourth node takes its share of the ring and streams exactly
// the trees it now owns from their leaders: each tree's checkpoint file whole
// on the bulk path (SNAPSHOT_FILE: sendfile, splice into the joiner's file,
// every block checked, served in place), then the WAL tail as deltas.
#include <set>

#include "replication/handshake.h"
#include "replication/protocol.h"
#include "replication/ring.h"
#include "tests/cluster_harness.h"
#include "transport/registry.h"

namespace canopy::testing {
namespace {

using replication::CommitRequest;
using replication::ConsistencyLevel;
using replication::Edit;

CommitRequest Put(const std::string& tree, const std::string& key, const std::string& value, ConsistencyLevel level) {
  CommitRequest r;
  r.tree = tree;
  r.level = level;
  r.timeout_ms = 5000;
  r.edits.push_back(Edit{Edit::Kind::kAppendChild, {}, "", "", 0});
  r.edits.push_back(Edit{Edit::Kind::kPutAttribute, {}, key, value, 0});
  return r;
}

size_t CountOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Creates `name` on node 0 (retrying until the cluster is ready) and commits
// `commits` edits; returns the last version, or 0 after a failure.
uint64_t CreateAndLoad(TestCluster& c, const std::string& name, int commits, ConsistencyLevel level) {
  bool created = WaitUntil(
      [&] {
        auto client = replication::Client::Connect(c.node(0).uri, c.ClientOpts());
        if (!client.ok()) return false;
        auto r = (*client)->CreateTree(name);
        return r.ok() && (r->status.code == StatusCode::kOk || r->status.code == StatusCode::kAlreadyExists);
      },
      std::chrono::seconds(20));
  EXPECT_TRUE(created) << name << "\n" << c.Log(0);
  if (!created) return 0;
  auto client = c.Connect(0);
  if (!client) return 0;
  uint64_t version = 0;
  for (int k = 0; k < commits; ++k) {
    std::optional<replication::CommitReply> reply;
    bool ok = WaitUntil(
        [&] {
          auto r = client->Commit(Put(name, "k" + std::to_string(k), std::string(2000, static_cast<char>('a' + k % 26)), level));
          if (r.ok() && r->status.code == StatusCode::kOk) reply = *r;
          return reply.has_value();
        },
        std::chrono::seconds(15));
    EXPECT_TRUE(ok) << name << " commit " << k;
    if (!ok) return 0;
    version = reply->version;
  }
  return version;
}

// Starts 3 raft nodes that checkpoint every 3 versions, and loads `trees`
// trees named PREFIX0.. with `commits` ALL commits each (so every owner
// holds every version, with checkpoints at 3 and 6); the trees' versions, or
// an empty map after a failure.
std::map<std::string, uint64_t> StartAndLoad(TestCluster& c, const std::string& prefix, int trees,
                                             int commits) {
  c.EnableRaft(3);
  if (!c.StartNodes(3, {"--checkpoint-every", "3"})) return {};
  std::map<std::string, uint64_t> versions;
  for (int t = 0; t < trees; ++t) {
    std::string name = prefix + std::to_string(t);
    versions[name] = CreateAndLoad(c, name, commits, ConsistencyLevel::kAll);
    if (versions[name] == 0) return {};
  }
  return versions;
}

// Adds node 4 (its own raft address; the raft leader adds it) and starts it;
// its index, or c.size() when it did not join.
size_t StartJoiner(TestCluster& c) {
  size_t joiner =
      c.AddNode({"--raft", "127.0.0.1:" + std::to_string(PickFreePort()), "--checkpoint-every", "3"});
  if (!c.Start(joiner)) return c.size();
  EXPECT_TRUE(c.WaitForMembers(4)) << c.Log(joiner);
  return joiner;
}

// The trees of `versions` that node 4 owns on the ring of nodes 1-4.
std::set<std::string> OwnedByJoiner(const std::map<std::string, uint64_t>& versions) {
  replication::Ring ring;
  for (const auto& id : {"1", "2", "3", "4"}) EXPECT_TRUE(ring.AddNode(id).ok());
  std::set<std::string> owned;
  for (const auto& [name, v] : versions) {
    if (ring.IsOwner(name, "4")) owned.insert(name);
  }
  return owned;
}

// True once node `joiner` holds every tree of `trees` at its version.
bool CaughtUp(TestCluster& c, size_t joiner, const std::set<std::string>& trees,
              const std::map<std::string, uint64_t>& versions) {
  for (const auto& name : trees) {
    auto t = c.TreeState(joiner, name);
    if (!t || t->durable_version != versions.at(name)) return false;
  }
  return true;
}

// Sends `request` to node 0 of `c` as node "9" (a node without a listen URI:
// not added to the ring, so node 0 keeps leading) over a connection of its
// own, and returns the answer as a status: the ERROR's, or Internal for any
// other answer or a failed exchange.
template <typename Request>
Status AnswerAsAnotherNode(TestCluster& c, const Request& request) {
  auto conn = transport::Dial(c.node(0).uri, transport::TransportOptions{});
  if (!conn.ok()) return Status::Internal("dial: " + conn.status().ToString());
  replication::HandshakeConfig hs{kClusterName, "9", kClusterSecret, replication::PeerRole::kNode, ""};
  auto id = replication::DialerHandshake(**conn, hs, Deadline::After(ScaledBound(std::chrono::seconds(10))));
  if (!id.ok()) return Status::Internal("handshake: " + id.status().ToString());
  if (Status s = replication::SendMessage(**conn, request); !s.ok())
    return Status::Internal("send: " + s.ToString());
  auto m = (*conn)->Receive(Deadline::After(ScaledBound(std::chrono::seconds(10))));
  (*conn)->Close();
  if (!m.ok()) return Status::Internal("receive: " + m.status().ToString());
  if (m->type != static_cast<uint16_t>(replication::MessageType::kError))
    return Status::Internal("answered " + replication::MessageTypeName(m->type));
  return replication::UnexpectedMessage(*m, "ERROR");
}

// Expects node `joiner`'s copy of each tree of `trees` to have the digest of
// its leader's (as node `asked` names the leader), and to be installed from
// exactly one snapshot.
void ExpectLeadersCopies(TestCluster& c, size_t joiner, size_t asked, const std::set<std::string>& trees) {
  for (const auto& name : trees) {
    auto lt = c.TreeState(asked, name);
    ASSERT_TRUE(lt) << name;
    size_t leader = c.IndexOfId(lt->leader);
    ASSERT_LT(leader, c.size()) << name;
    auto mine = c.TreeState(joiner, name);
    auto theirs = c.TreeState(leader, name);
    ASSERT_TRUE(mine && theirs) << name;
    EXPECT_FALSE(mine->digest.empty()) << name;
    EXPECT_EQ(mine->digest, theirs->digest) << name;
    EXPECT_EQ(mine->snapshots_received, 1u) << name << " (1: no resync by a second snapshot)";
  }
}

TEST(ClusterJoinTest, FourthNodeReceivesExactlyItsTrees) {
  TestCluster c;
  c.EnableRaft(3);
  ASSERT_TRUE(c.StartNodes(3));
  const int kTrees = 12;
  std::map<std::string, uint64_t> versions;
  for (int t = 0; t < kTrees; ++t) {
    std::string name = "tree" + std::to_string(t);
    ASSERT_TRUE(WaitUntil(
        [&] {
          auto client = replication::Client::Connect(c.node(0).uri, c.ClientOpts());
          if (!client.ok()) return false;
          auto r = (*client)->CreateTree(name);
          return r.ok() && (r->status.code == StatusCode::kOk || r->status.code == StatusCode::kAlreadyExists);
        },
        std::chrono::seconds(20)))
        << name << "\n" << c.Log(0);
    auto client = c.Connect(0);
    ASSERT_TRUE(client);
    for (int k = 0; k < 5; ++k) {
      auto level = k == 0 ? ConsistencyLevel::kAll : ConsistencyLevel::kQuorum;
      std::optional<replication::CommitReply> reply;
      ASSERT_TRUE(WaitUntil(
          [&] {
            auto r = client->Commit(Put(name, "k" + std::to_string(k), name + "-" + std::to_string(k), level));
            if (r.ok() && r->status.code == StatusCode::kOk) reply = *r;
            return reply.has_value();
          },
          std::chrono::seconds(15)));
      versions[name] = reply->version;
    }
  }

  // The joiner: its own raft address and no founding peers; the raft leader
  // adds it. Every file from the trees' leaders (the path before node join
  // from every owner).
  size_t joiner =
      c.AddNode({"--raft", "127.0.0.1:" + std::to_string(PickFreePort()), "--join-from-leader-only"});
  ASSERT_TRUE(c.Start(joiner));
  ASSERT_TRUE(c.WaitForMembers(4)) << c.Log(joiner);

  replication::Ring ring;
  for (const auto& id : {"1", "2", "3", "4"}) ASSERT_TRUE(ring.AddNode(id).ok());
  std::set<std::string> expected;
  for (const auto& [name, v] : versions) {
    if (ring.IsOwner(name, "4")) expected.insert(name);
  }
  ASSERT_FALSE(expected.empty());
  ASSERT_LT(expected.size(), versions.size());

  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const auto& name : expected) {
          auto t = c.TreeState(joiner, name);
          if (!t || t->durable_version != versions[name]) return false;
        }
        return true;
      },
      std::chrono::seconds(30)))
      << c.Log(joiner);
  auto status = c.GetStatus(joiner);
  ASSERT_TRUE(status);
  for (const auto& t : status->trees) {
    if (expected.count(t.tree)) {
      EXPECT_EQ(t.role == "replica" || t.role == "leader", true) << t.tree;
      EXPECT_GE(t.snapshots_received, 1u) << t.tree;  // streamed as a snapshot, bulk installed
    } else {
      EXPECT_EQ(t.role, "none") << t.tree;
      EXPECT_TRUE(t.digest.empty()) << t.tree << " was copied to a node that does not own it";
    }
  }
  // Reads from the joiner match the leader's.
  auto joiner_client = c.Connect(joiner);
  ASSERT_TRUE(joiner_client);
  for (const auto& name : expected) {
    auto lt = c.TreeState(0, name);
    ASSERT_TRUE(lt);
    size_t leader = c.IndexOfId(lt->leader);
    ASSERT_LT(leader, c.size());
    auto leader_client = c.Connect(leader);
    ASSERT_TRUE(leader_client);
    auto a = joiner_client->Read(replication::ReadRequest{name, 0, {}});
    auto b = leader_client->Read(replication::ReadRequest{name, 0, {}});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->status.code, StatusCode::kOk) << a->status.message;
    EXPECT_EQ(a->version, b->version);
    EXPECT_EQ(a->attributes, b->attributes);
    EXPECT_EQ(a->child_count, b->child_count);
    EXPECT_EQ(c.TreeState(joiner, name)->digest, c.TreeState(leader, name)->digest);
  }
  // No tree had a checkpoint: each leader wrote one and sent the file.
  EXPECT_EQ(CountOf(c.Log(joiner), "(checkpoint file, "), expected.size()) << c.Log(joiner);
  EXPECT_EQ(CountOf(c.Log(joiner), " from owner "), 0u) << c.Log(joiner);
  // New writes reach the joiner as deltas.
  const std::string& some = *expected.begin();
  auto client = c.Connect(0);
  ASSERT_TRUE(client);
  auto r = client->Commit(Put(some, "after-join", "yes", ConsistencyLevel::kAll));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->status.code, StatusCode::kOk) << r->status.message;
  ASSERT_TRUE(WaitUntil([&] {
    auto t = c.TreeState(joiner, some);
    return t && t->durable_version == r->version;
  }, std::chrono::seconds(10)));
}

// The trees have checkpoints (forced by --checkpoint-every) and WAL deltas
// after them: the joiner gets each checkpoint file whole, then the tail, and
// ends with the leaders' digests. Restarted after more commits, it keeps
// what it installed (nothing is fetched again) and catches up by deltas.
TEST(ClusterJoinTest, JoinerGetsCheckpointFilesThenTheWalTailAndKeepsThemOnRestart) {
  TestCluster c;
  std::map<std::string, uint64_t> versions =
      StartAndLoad(c, "ck", 8, 8);  // checkpoints at 3 and 6, then 7..8
  ASSERT_EQ(versions.size(), 8u);
  size_t joiner = StartJoiner(c);
  ASSERT_LT(joiner, c.size());
  std::set<std::string> expected = OwnedByJoiner(versions);
  ASSERT_FALSE(expected.empty());
  auto caught_up = [&] { return CaughtUp(c, joiner, expected, versions); };
  ASSERT_TRUE(WaitUntil(caught_up, std::chrono::seconds(30))) << c.Log(joiner);
  auto digests_match = [&] {
    for (const auto& name : expected) {
      auto lt = c.TreeState(0, name);
      if (!lt) return false;
      size_t leader = c.IndexOfId(lt->leader);
      auto mine = c.TreeState(joiner, name);
      auto theirs = c.TreeState(leader, name);
      EXPECT_TRUE(mine && theirs) << name;
      if (!mine || !theirs) return false;
      EXPECT_FALSE(mine->digest.empty()) << name;
      EXPECT_EQ(mine->digest, theirs->digest) << name;
      if (mine->digest != theirs->digest) return false;
    }
    return true;
  };
  EXPECT_TRUE(digests_match());
  std::string log = c.Log(joiner);
  EXPECT_EQ(CountOf(log, "(checkpoint file, "), expected.size()) << log;
  EXPECT_EQ(CountOf(log, "installed snapshot of "), expected.size()) << log;
  auto status = c.GetStatus(joiner);
  ASSERT_TRUE(status);
  for (const auto& t : status->trees) {
    if (expected.count(t.tree)) {
      EXPECT_EQ(t.snapshots_received, 1u) << t.tree;
    }
  }

  // Restart the joiner after more commits: what it installed is kept.
  c.Stop(joiner);
  for (const auto& name : expected) {
    auto client = c.Connect(0);
    ASSERT_TRUE(client);
    std::optional<replication::CommitReply> reply;
    ASSERT_TRUE(WaitUntil(
        [&] {
          auto r = client->Commit(Put(name, "while-away", "yes", ConsistencyLevel::kQuorum));
          if (r.ok() && r->status.code == StatusCode::kOk) reply = *r;
          return reply.has_value();
        },
        std::chrono::seconds(15)));
    versions[name] = reply->version;
  }
  ASSERT_TRUE(c.Start(joiner));
  ASSERT_TRUE(WaitUntil(caught_up, std::chrono::seconds(30))) << c.Log(joiner);
  EXPECT_TRUE(digests_match());
  status = c.GetStatus(joiner);
  ASSERT_TRUE(status);
  for (const auto& t : status->trees) {
    if (expected.count(t.tree)) {
      EXPECT_EQ(t.snapshots_received, 0u) << t.tree << " was fetched again";
    }
  }
  EXPECT_EQ(CountOf(c.Log(joiner), "(checkpoint file, "), expected.size()) << c.Log(joiner);
}

// Node join from every owner: the joiner takes each tree's checkpoint file
// from whichever owner is sending it the fewest, followers included, then
// the deltas after it from the leader. Several owners send files, some of
// them not the tree's leader, and every tree ends with its leader's digest.
TEST(ClusterJoinTest, JoinerFetchesCheckpointFilesFromEveryOwner) {
  TestCluster c;
  std::map<std::string, uint64_t> versions = StartAndLoad(c, "own", 9, 8);
  ASSERT_EQ(versions.size(), 9u);
  size_t joiner = StartJoiner(c);
  ASSERT_LT(joiner, c.size());
  std::set<std::string> expected = OwnedByJoiner(versions);
  ASSERT_GE(expected.size(), 3u);
  ASSERT_TRUE(WaitUntil([&] { return CaughtUp(c, joiner, expected, versions); }, std::chrono::seconds(30)))
      << c.Log(joiner);
  ExpectLeadersCopies(c, joiner, 0, expected);
  // Files went out from more than one owner, and some from an owner that
  // was not the tree's leader.
  std::string joiner_log = c.Log(joiner);
  size_t senders = 0;
  for (size_t i = 0; i < 3; ++i) {
    if (CountOf(c.Log(i), "to replica 4") > 0) ++senders;
  }
  EXPECT_GE(senders, 2u) << joiner_log;
  EXPECT_GE(CountOf(joiner_log, " from owner "), 1u) << joiner_log;
  EXPECT_EQ(CountOf(joiner_log, "installed snapshot of "), expected.size()) << joiner_log;
}

// After a failover the trees the dead node led are in epoch 2 under new
// leaders, while their followers' copies (idle since) still carry data epoch
// 1. A joiner fetching such a copy offers epoch 1 with the file's version,
// which the new leader trusts (its predecessor's epoch, at or below its
// takeover version): every tree is installed exactly once, with no resync by
// snapshot, and ends with its leader's digest.
TEST(ClusterJoinTest, FilesFromFollowersOfAnEarlierEpochNeedNoResync) {
  TestCluster c;
  std::map<std::string, uint64_t> versions = StartAndLoad(c, "fo", 9, 6);
  ASSERT_EQ(versions.size(), 9u);
  std::set<std::string> led_by_first;
  for (const auto& [name, v] : versions) {
    auto t = c.TreeState(1, name);
    ASSERT_TRUE(t);
    if (t->leader == c.node(0).node_id) led_by_first.insert(name);
  }
  ASSERT_FALSE(led_by_first.empty());  // (the ring is deterministic: node 1 leads some of fo0..fo8)
  c.Kill(0);
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const auto& [name, v] : versions) {
          auto t = c.TreeState(1, name);
          if (!t || t->leader.empty() || t->leader == c.node(0).node_id) return false;
        }
        return true;
      },
      std::chrono::seconds(30)))
      << c.Log(1) << c.Log(2);
  for (const auto& name : led_by_first) EXPECT_GE(c.TreeState(1, name)->epoch, 2u) << name;
  ASSERT_TRUE(c.Start(0));
  // Every copy converged (the restarted node follows the new leaders).
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (size_t i = 0; i < 3; ++i) {
          for (const auto& [name, v] : versions) {
            auto t = c.TreeState(i, name);
            if (!t || t->durable_version != v) return false;
          }
        }
        return true;
      },
      std::chrono::seconds(30)))
      << c.Log(0);
  size_t joiner = StartJoiner(c);
  ASSERT_LT(joiner, c.size());
  std::set<std::string> expected = OwnedByJoiner(versions);
  ASSERT_FALSE(expected.empty());
  ASSERT_TRUE(WaitUntil([&] { return CaughtUp(c, joiner, expected, versions); }, std::chrono::seconds(30)))
      << c.Log(joiner);
  ExpectLeadersCopies(c, joiner, 1, expected);
  std::string log = c.Log(joiner);
  for (const auto& name : expected)
    EXPECT_EQ(CountOf(log, "installed snapshot of " + name + " "), 1u) << name << "\n" << log;
}

// An owner asked for its checkpoint file when it cannot vouch for it (here:
// it leads the tree, which a joiner subscribes to instead) answers
// Unavailable and sends nothing.
TEST(ClusterJoinTest, CheckpointRequestToTheLeaderIsRefused) {
  TestCluster c;
  ASSERT_TRUE(c.StartNodes(1));
  ASSERT_GT(CreateAndLoad(c, "led", 3, ConsistencyLevel::kOne), 0u);
  auto tree = c.TreeState(0, "led");
  ASSERT_TRUE(tree);
  Status answer = AnswerAsAnotherNode(c, replication::CheckpointRequest{"led", tree->epoch, "9"});
  EXPECT_EQ(answer.code(), StatusCode::kUnavailable) << answer.ToString();
  EXPECT_NE(answer.message().find("leads it"), std::string::npos) << answer.ToString();
  EXPECT_EQ(CountOf(c.Log(0), "checkpoint file of led"), 0u) << c.Log(0);
}

// A SUBSCRIBE naming an older epoch than the leader's cannot work (the
// replica refuses every message of the leader's epoch, the leader its ACKs):
// it is refused with Conflict before a snapshot is prepared. (A joiner that
// guessed a tree's leader from the ring before the metadata gave it the
// epoch used to make the leader start a file on every retry.)
TEST(ClusterJoinTest, SubscribeWithAnOlderEpochIsRefusedBeforeASnapshotIsPrepared) {
  TestCluster c;
  ASSERT_TRUE(c.StartNodes(1));
  ASSERT_GT(CreateAndLoad(c, "stale", 3, ConsistencyLevel::kOne), 0u);
  // Epoch 0: older than any leader's (the first epoch is 1). Version 0: a
  // replica that would get the tree as a snapshot.
  Status answer = AnswerAsAnotherNode(c, replication::Subscribe{"stale", 0, 0, "9", 0});
  EXPECT_EQ(answer.code(), StatusCode::kConflict) << answer.ToString();
  EXPECT_EQ(CountOf(c.Log(0), "checkpoint file of stale"), 0u) << c.Log(0);
}

}  // namespace
}  // namespace canopy::testing
