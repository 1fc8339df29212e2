// Multi-process cluster on 127.0.0.1: past versions stay readable on the
// leader and on every replica (canopy node --keep-versions), through the
// client API and `canopy read --version`, across a replica's restart; reads
// past the retention are NotFound naming the oldest version held.
#include <string>

#include "tests/cluster_harness.h"

namespace canopy::testing {
namespace {

using replication::CommitRequest;
using replication::ConsistencyLevel;
using replication::Edit;
using replication::ReadRequest;

constexpr uint64_t kKeep = 20;
constexpr uint64_t kCommits = 30;

// Version v of tree "hist" has root attribute k = "v<v>" and v children.
CommitRequest Numbered(uint64_t v) {
  CommitRequest r;
  r.tree = "hist";
  r.level = ConsistencyLevel::kAll;
  r.timeout_ms = 8000;
  r.edits.push_back(Edit{Edit::Kind::kPutAttribute, {}, "k", "v" + std::to_string(v), 0});
  r.edits.push_back(Edit{Edit::Kind::kAppendChild, {}, "", "", 0});
  return r;
}

// Every version in the window reads back as committed; older ones are NotFound naming the oldest held.
void ExpectWindow(TestCluster& c, size_t i) {
  auto client = c.Connect(i);
  ASSERT_TRUE(client);
  const uint64_t oldest = kCommits - kKeep + 1;
  for (uint64_t v = oldest; v <= kCommits; ++v) {
    auto r = client->Read(ReadRequest{"hist", v, {}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status.code, StatusCode::kOk) << "node " << i + 1 << " version " << v << ": " << r->status.message;
    EXPECT_EQ(r->version, v);
    EXPECT_EQ(r->attributes["k"], "v" + std::to_string(v));
    EXPECT_EQ(r->child_count, v);
  }
  auto child = client->Read(ReadRequest{"hist", oldest, {static_cast<uint32_t>(oldest - 1)}});
  ASSERT_TRUE(child.ok());
  EXPECT_EQ(child->status.code, StatusCode::kOk) << child->status.message;
  auto missing_child = client->Read(ReadRequest{"hist", oldest, {static_cast<uint32_t>(oldest)}});
  ASSERT_TRUE(missing_child.ok());
  EXPECT_EQ(missing_child->status.code, StatusCode::kNotFound);  // that child came later
  for (uint64_t v : {uint64_t{1}, oldest - 1}) {
    auto r = client->Read(ReadRequest{"hist", v, {}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status.code, StatusCode::kNotFound) << r->status.message;
    EXPECT_NE(r->status.message.find("oldest version held is " + std::to_string(oldest)), std::string::npos)
        << r->status.message;
  }
  auto ahead = client->Read(ReadRequest{"hist", kCommits + 1, {}});
  ASSERT_TRUE(ahead.ok());
  EXPECT_EQ(ahead->status.code, StatusCode::kNotFound);
}

TEST(ClusterVersionsTest, EveryReplicaKeepsPastVersionsReadable) {
  TestCluster c;
  for (size_t i = 0; i < 3; ++i) {
    c.AddNode({"--keep-versions", std::to_string(kKeep)});
    ASSERT_TRUE(c.Start(i));
  }
  ASSERT_TRUE(c.WaitForMembers(3)) << c.Log(0);
  auto admin = c.Connect(0);
  ASSERT_TRUE(admin);
  auto created = admin->CreateTree("hist");
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ASSERT_EQ(created->status.code, StatusCode::kOk) << created->status.message;
  size_t leader = c.IndexOfUri(created->leader);
  ASSERT_LT(leader, c.size());
  auto writer = c.Connect(leader);
  ASSERT_TRUE(writer);
  for (uint64_t v = 1; v <= kCommits; ++v) {
    auto r = writer->Commit(Numbered(v));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status.code, StatusCode::kOk) << r->status.message;
    ASSERT_EQ(r->version, v);
  }
  // ALL: every owner holds version 30 durably.
  for (size_t i = 0; i < c.size(); ++i) ASSERT_NO_FATAL_FAILURE(ExpectWindow(c, i)) << "node " << i + 1;

  // The same through the CLI.
  const std::string cli = BinaryPath("tools/canopy/canopy") + " read --node " + c.node((leader + 1) % 3).uri +
                          " --cluster " + kClusterName + " --secret-file " + c.secret_file() + " --tree hist";
  std::string out;
  EXPECT_EQ(RunCommand(cli + " --version 15 --json", &out), 0) << out;
  EXPECT_NE(out.find("\"version\":15"), std::string::npos) << out;
  EXPECT_NE(out.find("\"k\":\"v15\""), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunCommand(cli + " --version 3", &out), 1) << out;
  EXPECT_NE(out.find("NotFound"), std::string::npos) << out;
  EXPECT_NE(out.find("oldest version held is 11"), std::string::npos) << out;

  // A replica keeps its window across a restart.
  size_t replica = (leader + 2) % 3;
  c.Stop(replica);
  ASSERT_TRUE(c.Start(replica));
  ASSERT_NO_FATAL_FAILURE(ExpectWindow(c, replica)) << "restarted node " << replica + 1;
}

}  // namespace
}  // namespace canopy::testing
