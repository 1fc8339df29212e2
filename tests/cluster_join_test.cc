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

  // The joiner: its own raft address and no founding peers; the raft leader adds it.
  size_t joiner = c.AddNode({"--raft", "127.0.0.1:" + std::to_string(PickFreePort())});
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
  c.EnableRaft(3);
  const std::vector<std::string> every3 = {"--checkpoint-every", "3"};
  ASSERT_TRUE(c.StartNodes(3, every3));
  const int kTrees = 8;
  std::map<std::string, uint64_t> versions;
  for (int t = 0; t < kTrees; ++t) {
    std::string name = "ck" + std::to_string(t);
    versions[name] = CreateAndLoad(c, name, 8, ConsistencyLevel::kAll);  // checkpoints at 3 and 6, then 7..8
    ASSERT_GT(versions[name], 0u);
  }
  size_t joiner = c.AddNode({"--raft", "127.0.0.1:" + std::to_string(PickFreePort()), "--checkpoint-every", "3"});
  ASSERT_TRUE(c.Start(joiner));
  ASSERT_TRUE(c.WaitForMembers(4)) << c.Log(joiner);
  replication::Ring ring;
  for (const auto& id : {"1", "2", "3", "4"}) ASSERT_TRUE(ring.AddNode(id).ok());
  std::set<std::string> expected;
  for (const auto& [name, v] : versions) {
    if (ring.IsOwner(name, "4")) expected.insert(name);
  }
  ASSERT_FALSE(expected.empty());
  auto caught_up = [&] {
    for (const auto& name : expected) {
      auto t = c.TreeState(joiner, name);
      if (!t || t->durable_version != versions[name]) return false;
    }
    return true;
  };
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

// A SUBSCRIBE naming an older epoch than the leader's cannot work (the
// replica refuses every message of the leader's epoch, the leader its ACKs):
// it is refused with Conflict before a snapshot is prepared. (A joiner that
// guessed a tree's leader from the ring before the metadata gave it the
// epoch used to make the leader start a file on every retry.)
TEST(ClusterJoinTest, SubscribeWithAnOlderEpochIsRefusedBeforeASnapshotIsPrepared) {
  TestCluster c;
  ASSERT_TRUE(c.StartNodes(1));
  ASSERT_GT(CreateAndLoad(c, "stale", 3, ConsistencyLevel::kOne), 0u);
  auto conn = transport::Dial(c.node(0).uri, transport::TransportOptions{});
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  // A node without a listen URI: not added to the ring, so node 1 stays the leader.
  replication::HandshakeConfig hs{kClusterName, "9", kClusterSecret, replication::PeerRole::kNode, ""};
  auto id = replication::DialerHandshake(**conn, hs, Deadline::After(ScaledBound(std::chrono::seconds(10))));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  // Epoch 0: older than any leader's (the first epoch is 1). Version 0: a
  // replica that would get the tree as a snapshot.
  ASSERT_TRUE(replication::SendMessage(**conn, replication::Subscribe{"stale", 0, 0, "9", 0}).ok());
  auto m = (*conn)->Receive(Deadline::After(ScaledBound(std::chrono::seconds(10))));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Status answer = replication::UnexpectedMessage(*m, "ERROR");
  EXPECT_EQ(answer.code(), StatusCode::kConflict) << answer.ToString();
  (*conn)->Close();
  EXPECT_EQ(CountOf(c.Log(0), "checkpoint file of stale"), 0u) << c.Log(0);
}

}  // namespace
}  // namespace canopy::testing
