// Multi-process clusters on 127.0.0.1: replication, catch-up, security.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <set>

#include "tests/tls_test_util.h"
#include "transport/auth.h"
#include "replication/handshake.h"
#include "tests/cluster_harness.h"
#include "transport/frame.h"
#include "transport/registry.h"

namespace canopy::testing {
namespace {

using replication::CommitRequest;
using replication::ConsistencyLevel;
using replication::Edit;

CommitRequest PutRoot(const std::string& tree, const std::string& key, const std::string& value,
                      ConsistencyLevel level = ConsistencyLevel::kQuorum) {
  CommitRequest r;
  r.tree = tree;
  r.level = level;
  r.timeout_ms = static_cast<uint32_t>(ScaledBound(std::chrono::milliseconds(8000)).count());
  r.edits.push_back(Edit{Edit::Kind::kPutAttribute, {}, key, value, 0});
  return r;
}

// Starts n nodes (RF 3) and waits until they all know each other.
void StartCluster(TestCluster& c, size_t n, std::vector<std::string> extra = {}) {
  for (size_t i = 0; i < n; ++i) {
    c.AddNode(extra);
    ASSERT_TRUE(c.Start(i));
  }
  ASSERT_TRUE(c.WaitForMembers(n)) << c.Log(0);
}

// Creates `tree` and returns the index of its leader.
size_t CreateTree(TestCluster& c, const std::string& tree) {
  auto client = c.Connect(0);
  EXPECT_TRUE(client);
  if (!client) return 0;
  auto r = client->CreateTree(tree);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return 0;
  EXPECT_EQ(r->status.code, StatusCode::kOk) << r->status.message;
  EXPECT_EQ(r->owners.size(), std::min<size_t>(3, c.size()));
  size_t leader = c.IndexOfUri(r->leader);
  EXPECT_LT(leader, c.size());
  return leader;
}

// Waits until node i holds `tree` durably at `version`.
bool WaitForVersion(TestCluster& c, size_t i, const std::string& tree, uint64_t version,
                    std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
  return WaitUntil(
      [&] {
        auto t = c.TreeState(i, tree);
        return t && t->durable_version == version;
      },
      timeout);
}

std::set<std::string> Digests(TestCluster& c, const std::string& tree) {
  std::set<std::string> d;
  for (size_t i = 0; i < c.size(); ++i) {
    auto t = c.TreeState(i, tree);
    d.insert(t ? t->digest : "unreachable");
  }
  return d;
}

std::string AllLogs(TestCluster& c) {
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) out += "--- node " + std::to_string(i + 1) + ":\n" + c.Log(i);
  return out;
}

// The value of key "k<i>" in QuorumWritesSurviveKilledReplica: 4 KB each, so
// that the 30 commits a killed replica misses are more than its leader keeps
// in memory, and its catch-up reads the WAL and sends its records on the
// transport's bulk path (DELTA_RECORDS), whichever transport the cluster uses.
std::string AwayValue(int i) { return "v" + std::to_string(i) + std::string(4000, static_cast<char>('a' + i % 26)); }

// 3 nodes with `node_args`: ALL, a replica killed, 30 QUORUM commits, its
// restart and catch-up by delta, equal digests. *leader_out: the leader's index.
void QuorumWritesSurviveKilledReplica(TestCluster& c, const std::vector<std::string>& node_args,
                                      size_t* leader_out = nullptr) {
  StartCluster(c, 3, node_args);
  if (::testing::Test::HasFatalFailure()) return;
  size_t leader = CreateTree(c, "docs");
  if (leader_out != nullptr) *leader_out = leader;
  size_t victim = (leader + 1) % 3;
  auto client = c.Connect(leader);
  ASSERT_TRUE(client);
  // ALL: every replica has subscribed and holds version 1.
  auto first = client->Commit(PutRoot("docs", "k0", "v0", ConsistencyLevel::kAll));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->status.code, StatusCode::kOk) << first->status.message << "\n" << AllLogs(c);
  EXPECT_EQ(first->acks, 3u);

  c.Kill(victim);
  uint64_t last = first->version;
  for (int i = 1; i <= 30; ++i) {
    auto r = client->Commit(PutRoot("docs", "k" + std::to_string(i), AwayValue(i)));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status.code, StatusCode::kOk) << r->status.message;
    EXPECT_GE(r->acks, 2u);
    EXPECT_EQ(r->version, last + 1);
    last = r->version;
  }
  // ALL cannot be reached with a replica down: a Timeout that names the version.
  auto all = client->Commit([&] {
    auto r = PutRoot("docs", "k31", "v31", ConsistencyLevel::kAll);
    r.timeout_ms = 500;
    return r;
  }());
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->status.code, StatusCode::kTimeout);
  last = all->version;

  ASSERT_TRUE(c.Start(victim));
  ASSERT_TRUE(WaitForVersion(c, victim, "docs", last)) << c.Log(victim);
  auto reader = c.Connect(victim);
  ASSERT_TRUE(reader);
  auto read = reader->Read(replication::ReadRequest{"docs", 0, {}});
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->status.code, StatusCode::kOk) << read->status.message;
  EXPECT_EQ(read->version, last);
  EXPECT_EQ(read->attributes["k0"], "v0");
  for (int i = 1; i <= 30; ++i) EXPECT_EQ(read->attributes["k" + std::to_string(i)], AwayValue(i)) << i;
  EXPECT_EQ(read->attributes["k31"], "v31");
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(WaitForVersion(c, i, "docs", last));
  auto digests = Digests(c, "docs");
  EXPECT_EQ(digests.size(), 1u);
  EXPECT_NE(*digests.begin(), "");
  // The leader saw every replica acknowledge the last version.
  auto lt = c.TreeState(leader, "docs");
  ASSERT_TRUE(lt);
  EXPECT_EQ(lt->role, "leader");
  EXPECT_EQ(lt->replica_versions.size(), 2u);
  for (const auto& [id, v] : lt->replica_versions) EXPECT_EQ(v, last) << id;
}

TEST(ClusterReplicationTest, QuorumWritesSurviveKilledReplicaWhichCatchesUp) {
  TestCluster c;
  QuorumWritesSurviveKilledReplica(c, {});
}

// The same with --one-sided-replication: where the nodes listen on rdma://
// (the Soft-RoCE guests, CANOPY_TEST_CLUSTER_LISTEN), every stream runs over
// one-sided log rings, the catch-up after the restart included; elsewhere
// the replicas do not ask and the streams stay messages.
TEST(ClusterReplicationTest, OneSidedReplicationOptionReplicatesAndCatchesUp) {
  TestCluster c;
  size_t leader = 0;
  // An idle ring is polled at least every ms (every 10 ms in emulated guests, where each
  // wake-up is costly).
  const auto poll_us = std::to_string(ScaledBound(std::chrono::milliseconds(1)).count() * 1000);
  QuorumWritesSurviveKilledReplica(c, {"--one-sided-replication", "--one-sided-poll-us", poll_us}, &leader);
  if (HasFatalFailure()) return;
  const bool rdma = TestCluster::FirstListenUri().rfind("rdma://", 0) == 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string log = c.Log(i);
    if (i == leader) {
      // Both replicas' streams, and the restarted one's again.
      size_t streams = 0;
      for (size_t at = log.find("over the one-sided ring"); at != std::string::npos;
           at = log.find("over the one-sided ring", at + 1)) {
        ++streams;
      }
      EXPECT_EQ(streams >= 3, rdma) << "node " << i + 1 << " streamed " << streams << " times over a ring:\n" << log;
    } else {
      EXPECT_EQ(log.find("following") != std::string::npos && log.find("over the one-sided ring") != std::string::npos,
                rdma)
          << "node " << i + 1 << ":\n" << log;
    }
    EXPECT_EQ(log.find("declined one-sided"), std::string::npos) << "node " << i + 1 << ":\n" << log;
  }
}

// Replication over tls+tcp:// with mutual TLS: peers dial each other's
// advertised URIs (which carry the TLS settings), clients too; a client
// without a certificate of the cluster's CA gets nowhere.
TEST(ClusterReplicationTest, ReplicatesOverMutualTls) {
  const auto& pki = canopy::testing::GetTestPki();
  TestCluster c;
  c.SetListenUri("tls+tcp://127.0.0.1:0?cert=" + pki.server_cert + "&key=" + pki.server_key + "&ca=" + pki.ca_cert);
  StartCluster(c, 3);
  EXPECT_EQ(c.node(0).uri.rfind("tls+tcp://127.0.0.1:", 0), 0u) << c.node(0).uri;
  size_t leader = CreateTree(c, "secure");
  auto client = c.Connect(leader);
  ASSERT_TRUE(client);
  auto r = client->Commit(PutRoot("secure", "k", "v", ConsistencyLevel::kAll));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->status.code, StatusCode::kOk) << r->status.message;
  EXPECT_EQ(r->acks, 3u);
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(WaitForVersion(c, i, "secure", r->version)) << c.Log(i);
  // No client certificate: the TLS session is refused before HELLO.
  auto ep = transport::ParseEndpoint(c.node(0).uri);
  ASSERT_TRUE(ep.ok());
  ep->params.erase("cert");
  ep->params.erase("key");
  auto refused = replication::Client::Connect(ep->ToUri(), c.ClientOpts());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  EXPECT_TRUE(c.Running(0));
}

TEST(ClusterReplicationTest, ReplicaBehindTruncatedWalGetsSnapshot) {
  TestCluster c;
  // Tiny WAL segments and frequent checkpoints so the WAL forgets fast (and
  // no past versions to retain, which would keep the WAL they need).
  StartCluster(c, 3, {"--checkpoint-every", "10", "--wal-retain", "2", "--wal-segment-bytes", "2048",
                      "--keep-versions", "1"});
  size_t leader = CreateTree(c, "big");
  size_t victim = (leader + 2) % 3;
  auto client = c.Connect(leader);
  ASSERT_TRUE(client);
  auto first = client->Commit(PutRoot("big", "seed", "x", ConsistencyLevel::kAll));
  ASSERT_TRUE(first.ok() && first->status.code == StatusCode::kOk);
  c.Kill(victim);
  uint64_t last = 0;
  for (int i = 0; i < 120; ++i) {
    auto r = client->Commit(PutRoot("big", "k" + std::to_string(i % 40), std::string(200, 'a' + i % 26)));
    ASSERT_TRUE(r.ok() && r->status.code == StatusCode::kOk);
    last = r->version;
  }
  ASSERT_TRUE(c.Start(victim));
  ASSERT_TRUE(WaitForVersion(c, victim, "big", last)) << c.Log(victim);
  // The installed version is visible (STATUS reads the store) a moment before
  // the replica loop counts the snapshot: wait for the counter too.
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto vt = c.TreeState(victim, "big");
        return vt && vt->snapshots_received >= 1u;
      },
      std::chrono::seconds(10)))
      << c.Log(victim);
  auto lt = c.TreeState(leader, "big");
  ASSERT_TRUE(lt);
  EXPECT_GE(lt->snapshots_sent, 1u);
  // After the snapshot the stream continues with deltas.
  auto more = client->Commit(PutRoot("big", "after", "snapshot", ConsistencyLevel::kAll));
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more->status.code, StatusCode::kOk) << more->status.message;
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(WaitForVersion(c, i, "big", more->version));
  EXPECT_EQ(Digests(c, "big").size(), 1u);
}

TEST(ClusterReplicationTest, RedirectsAndErrorsAreClear) {
  TestCluster c;
  StartCluster(c, 3);
  size_t leader = CreateTree(c, "r");
  size_t other = (leader + 1) % 3;
  auto client = c.Connect(other);
  ASSERT_TRUE(client);
  auto r = client->Commit(PutRoot("r", "a", "1", ConsistencyLevel::kOne));  // follows the redirect
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status.code, StatusCode::kOk) << r->status.message;
  EXPECT_EQ(client->connected_uri(), c.node(leader).uri);
  auto stale = client->Commit([&] {
    auto q = PutRoot("r", "a", "2");
    q.base_version = 100;
    return q;
  }());
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ(stale->status.code, StatusCode::kConflict);
  auto bad_path = client->Commit([&] {
    CommitRequest q = PutRoot("r", "a", "2");
    q.edits[0].path = {7};
    return q;
  }());
  ASSERT_TRUE(bad_path.ok());
  EXPECT_NE(bad_path->status.code, StatusCode::kOk);
  auto missing = client->Read(replication::ReadRequest{"nope", 0, {}});
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status.code, StatusCode::kNotFound);
  // The CLI: scripts get exit status 0/1/2 and readable output.
  std::string base = BinaryPath("tools/canopy/canopy") + " %s --node " + c.node(other).uri +
                     " --cluster " + kClusterName + " --secret-file " + c.secret_file();
  auto cli = [&](const std::string& cmd, const std::string& args, std::string* out) {
    char buf[4096];
    std::snprintf(buf, sizeof buf, base.c_str(), cmd.c_str());
    return RunCommand(std::string(buf) + " " + args, out);
  };
  std::string out;
  EXPECT_EQ(cli("commit", "--tree r --cl ALL --append / --put /0:title=hello", &out), 0) << out;
  out.clear();
  ASSERT_TRUE(WaitForVersion(c, other, "r", 2));
  EXPECT_EQ(cli("read", "--tree r --path /0", &out), 0) << out;
  EXPECT_NE(out.find("title=hello"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(cli("read", "--tree r --path /9", &out), 1) << out;
  out.clear();
  EXPECT_EQ(cli("commit", "--tree r --cl MOST --append /", &out), 2) << out;
  out.clear();
  EXPECT_EQ(cli("status", "--json", &out), 0) << out;
  EXPECT_NE(out.find("\"replication_factor\":3"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(cli("status", "--all", &out), 0) << out;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NE(out.find("r node " + c.node(i).node_id + ": "), std::string::npos) << out;
  }
}

TEST(ClusterReplicationTest, WrongSecretIsRefused) {
  TestCluster c;
  StartCluster(c, 3);
  // A client with the wrong secret.
  auto bad = replication::Client::Connect(c.node(0).uri, c.ClientOpts("not the right secret"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied) << bad.status().ToString();
  // A dialer that skips checking the node's proof and sends a bogus one is
  // told so with ERROR, then dropped.
  auto conn = transport::Dial(c.node(0).uri, transport::TransportOptions{});
  ASSERT_TRUE(conn.ok());
  replication::Hello hello{kClusterName, "intruder", replication::PeerRole::kNode, replication::kProtocolVersion,
                           std::string(replication::kNonceBytes, 'n'), ""};
  ASSERT_TRUE(replication::SendMessage(**conn, hello).ok());
  auto challenge = (*conn)->Receive(Deadline::After(std::chrono::seconds(5)));
  ASSERT_TRUE(challenge.ok());
  ASSERT_TRUE(replication::SendMessage(**conn, replication::Auth{std::string(replication::kProofBytes, 'x')}).ok());
  auto refusal = (*conn)->Receive(Deadline::After(std::chrono::seconds(5)));
  ASSERT_TRUE(refusal.ok()) << refusal.status().ToString();
  ASSERT_EQ(refusal->type, static_cast<uint16_t>(replication::MessageType::kError));
  auto err = replication::DecodeError(refusal->payload);
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->code, StatusCode::kPermissionDenied);
  auto after = (*conn)->Receive(Deadline::After(std::chrono::seconds(5)));
  EXPECT_FALSE(after.ok());  // dropped
  // A node started with another secret never joins the ring.
  std::string wrong = c.dir() + "/wrong-secret";
  ASSERT_TRUE(WriteFileAtomic(wrong, "some other secret\n").ok());
  size_t rogue = c.AddNode({}, wrong);
  ASSERT_TRUE(c.Start(rogue));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  for (size_t i = 0; i < 3; ++i) {
    auto s = c.GetStatus(i);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->nodes.size(), 3u);
  }
  EXPECT_NE(c.Log(0).find("refused"), std::string::npos) << c.Log(0);
  EXPECT_TRUE(c.Running(0));
}

TEST(ClusterReplicationTest, RandomBytesDoNotCrashTheNode) {
  TestCluster c;
  c.AddNode();
  ASSERT_TRUE(c.Start(0));
  auto ep = transport::ParseEndpoint(c.node(0).uri);
  ASSERT_TRUE(ep.ok());
  for (int round = 0; round < 20; ++round) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(ep->port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    std::string junk = RandomBytes(64 + round * 97, round + 1);
    if (round % 2 == 1) {
      // A well-formed frame whose HELLO payload is garbage.
      std::string payload = RandomBytes(40 + round, round + 100);
      char header[transport::kFrameHeaderSize];
      transport::EncodeFrameHeader(header, static_cast<uint16_t>(replication::MessageType::kHello), payload, 0);
      junk = std::string(header, sizeof header) + payload;
    }
    timeval tv{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)!::write(fd, junk.data(), junk.size());
    ::shutdown(fd, SHUT_WR);
    char buf[256];
    (void)!::read(fd, buf, sizeof buf);  // ERROR or EOF: the node drops us
    ::close(fd);
  }
  EXPECT_TRUE(c.Running(0));
  auto s = c.GetStatus(0);
  ASSERT_TRUE(s) << c.Log(0);
  EXPECT_EQ(s->node_id, "1");
  // Each bad peer was logged as refused.
  EXPECT_NE(c.Log(0).find("refused tcp://127.0.0.1"), std::string::npos) << c.Log(0);
}

}  // namespace
}  // namespace canopy::testing
