// The commit path under concurrency (replication/client.h, node_impl.h's
// CommitPipeline): many commits multiplexed on one connection, and the
// idempotent retry — a commit whose reply is lost is sent again with the same
// request id and lands once, on the same leader or on the one that took over.
#include <signal.h>

#include <atomic>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "tests/cluster_harness.h"
#include "tools/chaosproxy/chaos_proxy.h"

namespace canopy::testing {
namespace {

using replication::CommitRequest;
using replication::ConsistencyLevel;
using replication::Edit;

CommitRequest Put(const std::string& tree, const std::string& key, const std::string& value,
                  ConsistencyLevel level = ConsistencyLevel::kQuorum, uint32_t timeout_ms = 5000) {
  CommitRequest r;
  r.tree = tree;
  r.level = level;
  r.timeout_ms = timeout_ms;
  r.edits.push_back(Edit{Edit::Kind::kPutAttribute, {}, key, value, 0});
  return r;
}

uint16_t PortOf(const std::string& uri) { return static_cast<uint16_t>(std::stoi(uri.substr(uri.rfind(':') + 1))); }

// Starts `n` nodes (with a metadata raft when `raft`) and creates `tree`;
// returns the index of its leader, or n on failure.
size_t StartCluster(TestCluster& c, size_t n, bool raft, const std::string& tree) {
  if (raft) c.EnableRaft(n);
  for (size_t i = 0; i < n; ++i) {
    c.AddNode();
    if (!c.Start(i)) return n;
  }
  if (!c.WaitForMembers(n)) return n;
  std::string leader_uri;
  bool created = WaitUntil(
      [&] {
        auto client = replication::Client::Connect(c.node(0).uri, c.ClientOpts());
        if (!client.ok()) return false;
        auto r = (*client)->CreateTree(tree);
        if (!r.ok() || r->status.code != StatusCode::kOk) return false;
        leader_uri = r->leader;
        return true;
      },
      std::chrono::seconds(20));
  if (!created) return n;
  // Every replica follows before the test starts.
  size_t leader = c.IndexOfUri(leader_uri);
  bool all = WaitUntil(
      [&] {
        auto client = replication::Client::Connect(leader_uri, c.ClientOpts());
        if (!client.ok()) return false;
        auto r = (*client)->Commit(Put(tree, "ready", "1", ConsistencyLevel::kAll, 2000));
        return r.ok() && r->status.code == StatusCode::kOk;
      },
      std::chrono::seconds(20));
  return all ? leader : n;
}

TEST(ClusterCommitsTest, ManyCommitsInFlightOnOneConnectionAllLandOnce) {
  TestCluster c;
  const size_t leader = StartCluster(c, 3, false, "mux");
  ASSERT_LT(leader, 3u) << c.Log(0);
  auto client = c.Connect(leader);
  ASSERT_TRUE(client);
  auto before = client->Read(replication::ReadRequest{"mux", 0, {}});
  ASSERT_TRUE(before.ok());
  constexpr int kThreads = 32, kEach = 20;
  std::atomic<int> failures{0};
  std::mutex mu;
  std::set<uint64_t> versions;
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < kEach; ++i) {
        auto r = client->Commit(Put("mux", fmt::format("k{}/{}", k, i), "v"));
        if (!r.ok() || r->status.code != StatusCode::kOk || r->duplicate) {
          ++failures;
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        versions.insert(r->version);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // Each commit got its own version, in one gap-free run after the start.
  ASSERT_EQ(versions.size(), size_t{kThreads * kEach});
  EXPECT_EQ(*versions.begin(), before->version + 1);
  EXPECT_EQ(*versions.rbegin(), before->version + kThreads * kEach);
  auto after = client->Read(replication::ReadRequest{"mux", 0, {}});
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->version, before->version + kThreads * kEach);
  EXPECT_EQ(after->attributes.size(), before->attributes.size() + kThreads * kEach);
  EXPECT_EQ(client->retries(), 0u);
}

TEST(ClusterCommitsTest, ACommitWhoseReplyIsLostIsRetriedAndLandsOnce) {
  TestCluster c;
  const size_t leader = StartCluster(c, 3, false, "lost");
  ASSERT_LT(leader, 3u) << c.Log(0);
  const size_t paused = (leader + 1) % 3;
  // The client talks to the leader through a proxy whose connections the
  // test cuts; it knows the nodes' own URIs for the retry.
  chaos::ChaosOptions po;
  po.target_port = PortOf(c.node(leader).uri);
  auto proxy = chaos::ChaosProxy::Create(po);
  ASSERT_TRUE(proxy.ok()) << proxy.status().ToString();
  std::thread forwarder([p = proxy->get()] { (void)p->Run(); });
  struct Joiner {
    chaos::ChaosProxy* p;
    std::thread* t;
    ~Joiner() {
      p->Stop();
      t->join();
    }
  } joiner{proxy->get(), &forwarder};
  auto opts = c.ClientOpts();
  for (size_t i = 0; i < 3; ++i) opts.nodes.push_back(c.node(i).uri);
  auto client = replication::Client::Connect(fmt::format("tcp://127.0.0.1:{}", (*proxy)->port()), opts);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto direct = c.Connect(leader);
  ASSERT_TRUE(direct);
  auto before = direct->Read(replication::ReadRequest{"lost", 0, {}});
  ASSERT_TRUE(before.ok());

  // A replica stops answering: the ALL commit lands on the leader but waits
  // for its ACK, so its reply cannot have left when the link is cut.
  ASSERT_EQ(::kill(c.node(paused).pid, SIGSTOP), 0);
  Result<replication::CommitReply> result = Status::Internal("not run");
  std::thread committer(
      [&] { result = (*client)->Commit(Put("lost", "once", "x", ConsistencyLevel::kAll, 15000)); });
  bool landed = WaitUntil(
      [&] {
        auto r = direct->Read(replication::ReadRequest{"lost", 0, {}});
        return r.ok() && r->version == before->version + 1;
      },
      std::chrono::seconds(10));
  (*proxy)->CutAll();  // the reply is lost with the connection
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(::kill(c.node(paused).pid, SIGCONT), 0);
  committer.join();
  ASSERT_TRUE(landed) << c.Log(leader);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(result->status.code, StatusCode::kOk) << result->status.message;
  EXPECT_TRUE(result->duplicate);  // the retry found the first attempt's commit
  EXPECT_EQ(result->version, before->version + 1);
  EXPECT_EQ((*client)->retries(), 1u);
  EXPECT_EQ((*client)->connected_uri(), c.node(leader).uri);
  // Landed once: one version more, on every replica.
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (size_t i = 0; i < 3; ++i) {
          auto t = c.TreeState(i, "lost");
          if (!t || t->durable_version != before->version + 1) return false;
        }
        return true;
      },
      std::chrono::seconds(10)));
  auto after = direct->Read(replication::ReadRequest{"lost", 0, {}});
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->version, before->version + 1);
  EXPECT_EQ(after->attributes.at("once"), "x");
}

TEST(ClusterCommitsTest, ARetryOnTheNewLeaderAfterFailoverIsNotAppliedTwice) {
  TestCluster c;
  const size_t leader = StartCluster(c, 3, true, "dedup");
  ASSERT_LT(leader, 3u) << c.Log(0);
  CommitRequest req = Put("dedup", "counter", "1", ConsistencyLevel::kAll);
  req.client = "dedup-test-client";
  req.sequence = 41;
  uint64_t committed = 0;
  {
    auto client = c.Connect(leader);
    ASSERT_TRUE(client);
    auto r = client->Commit(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status.code, StatusCode::kOk) << r->status.message;
    EXPECT_FALSE(r->duplicate);
    committed = r->version;
  }
  // The leader dies before (as far as the client knows) it answered.
  c.Kill(leader);
  const size_t survivor = (leader + 1) % 3;
  size_t new_leader = 3;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto t = c.TreeState(survivor, "dedup");
        if (!t || t->leader == c.node(leader).node_id || t->epoch < 2) return false;
        new_leader = c.IndexOfId(t->leader);
        return new_leader < 3;
      },
      std::chrono::seconds(30)))
      << c.Log(survivor);
  auto client = c.Connect(new_leader);
  ASSERT_TRUE(client);
  // The same request id again, through another node: the new leader knows it
  // from the replicated delta.
  req.level = ConsistencyLevel::kQuorum;
  auto retry = client->Commit(req);
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  ASSERT_EQ(retry->status.code, StatusCode::kOk) << retry->status.message;
  EXPECT_TRUE(retry->duplicate);
  EXPECT_EQ(retry->version, committed);
  // A new sequence is a new commit.
  req.sequence = 42;
  req.edits[0].value = "2";
  auto next = client->Commit(req);
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(next->status.code, StatusCode::kOk) << next->status.message;
  EXPECT_FALSE(next->duplicate);
  EXPECT_EQ(next->version, committed + 1);
  auto read = client->Read(replication::ReadRequest{"dedup", 0, {}});
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->version, committed + 1);
  EXPECT_EQ(read->attributes.at("counter"), "2");
}

// CommitPipelined: one thread keeps many commits in flight. Started at a node
// that does not lead the tree, it follows the redirect; every commit lands
// once, with its own version; synchronous Commit calls on the same Client
// share the connection meanwhile.
TEST(ClusterCommitsTest, PipelinedCommitsFollowTheRedirectAndAllLandOnce) {
  TestCluster c;
  const size_t leader = StartCluster(c, 3, false, "pipe");
  ASSERT_LT(leader, 3u) << c.Log(0);
  auto client = c.Connect((leader + 1) % 3);  // not the leader
  ASSERT_TRUE(client);
  auto before = c.Connect(leader)->Read(replication::ReadRequest{"pipe", 0, {}});
  ASSERT_TRUE(before.ok());
  constexpr int kPipelined = 400, kSynchronous = 40;
  std::atomic<int> sync_failures{0};
  std::thread side([&] {
    for (int i = 0; i < kSynchronous; ++i) {
      auto r = client->Commit(Put("pipe", fmt::format("sync{}", i), "s"));
      if (!r.ok() || r->status.code != StatusCode::kOk || r->duplicate) ++sync_failures;
    }
  });
  int sent = 0;
  std::set<uint64_t> versions;
  std::set<std::string> keys;
  std::vector<std::string> failures;
  Status s = client->CommitPipelined(
      16,
      [&](CommitRequest* req) {
        if (sent == kPipelined) return false;
        *req = Put("pipe", fmt::format("p{}", sent++), "v");
        return true;
      },
      [&](const CommitRequest& req, Result<replication::CommitReply> r, std::chrono::nanoseconds latency) {
        if (!r.ok() || r->status.code != StatusCode::kOk || r->duplicate) {
          failures.push_back(r.ok() ? r->status.message : r.status().ToString());
          return;
        }
        EXPECT_GT(latency.count(), 0);
        versions.insert(r->version);
        keys.insert(req.edits.at(0).key);
      });
  side.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front();
  EXPECT_EQ(sync_failures.load(), 0);
  EXPECT_EQ(keys.size(), size_t{kPipelined});
  EXPECT_EQ(versions.size(), size_t{kPipelined});
  auto after = c.Connect(leader)->Read(replication::ReadRequest{"pipe", 0, {}});
  ASSERT_TRUE(after.ok());
  // Every commit, pipelined or not, made exactly one version.
  EXPECT_EQ(after->version, before->version + kPipelined + kSynchronous);
  EXPECT_EQ(after->attributes.size(), before->attributes.size() + kPipelined + kSynchronous);
  EXPECT_EQ(client->connected_uri(), c.node(leader).uri);
  EXPECT_EQ(client->retries(), 0u);
  EXPECT_EQ(client->CommitPipelined(0, [](CommitRequest*) { return false; }, {}).code(),
            StatusCode::kInvalidArgument);
}

// The leader dies under a pipeline: the pipeline returns the connection's
// failure, every commit it took is reported exactly once, and it takes no
// request after the failure.
TEST(ClusterCommitsTest, APipelineWhoseNodeDiesReportsEveryCommitOnce) {
  TestCluster c;
  const size_t leader = StartCluster(c, 3, false, "pipe");
  ASSERT_LT(leader, 3u) << c.Log(0);
  auto client = c.Connect(leader);
  ASSERT_TRUE(client);
  int taken = 0, reported = 0, ok = 0;
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    c.Kill(leader);
  });
  Status s = client->CommitPipelined(
      8,
      [&](CommitRequest* req) {
        if (taken == 1000000) return false;  // bounded: the kill comes long before
        *req = Put("pipe", fmt::format("p{}", taken++ % 1000), "v");
        return true;
      },
      [&](const CommitRequest&, Result<replication::CommitReply> r, std::chrono::nanoseconds) {
        ++reported;
        if (r.ok() && r->status.code == StatusCode::kOk) ++ok;
      });
  killer.join();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(reported, taken);
  EXPECT_GT(ok, 0);
  EXPECT_LT(taken, 1000000);
}

}  // namespace
}  // namespace canopy::testing
