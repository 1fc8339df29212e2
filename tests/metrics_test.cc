// `canopy node --metrics`: the Prometheus text format served by a 3-node
// cluster on 127.0.0.1, read directly and through a real Prometheus (the
// Debian package) that scrapes the nodes every 200 ms; a PromQL query over
// its HTTP API must count exactly the commits made. Also: the node takes its
// options from --config, and `canopy` without a command is bad usage.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "tests/cluster_harness.h"
#include "tests/http_test_util.h"

namespace canopy::testing {
namespace {

using replication::CommitRequest;
using replication::ConsistencyLevel;
using replication::Edit;

std::string Scrape(uint16_t port, int* status = nullptr) {
  RawResponse response;
  if (!RoundTrip(port, Get("/metrics"), &response)) return "";
  if (status != nullptr) *status = response.status;
  return response.body;
}

// The value of the series `name{labels}` whose label text contains every
// fragment of `has` (e.g. {"consistency=\"QUORUM\"", "outcome=\"ok\""}),
// summed over the matches; -1 when none matches.
double SeriesSum(const std::string& text, const std::string& name, const std::vector<std::string>& has) {
  double sum = -1;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) continue;
    size_t space = line.rfind(' ');
    std::string labels = line.substr(name.size(), space - name.size());
    bool all = true;
    for (const auto& h : has) all = all && labels.find(h) != std::string::npos;
    if (!all) continue;
    sum = (sum < 0 ? 0 : sum) + std::stod(line.substr(space + 1));
  }
  return sum;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

uint16_t ReadPortFile(const std::string& path) {
  uint16_t port = 0;
  WaitUntil(
      [&] {
        auto text = ReadFileToString(path);
        if (!text.ok() || text->empty()) return false;
        port = static_cast<uint16_t>(std::stoul(*text));
        return true;
      },
      std::chrono::seconds(10));
  return port;
}

// A Prometheus server (the Debian package's binary) on 127.0.0.1 with its own
// storage in a temporary directory; stopped with SIGTERM.
class PrometheusProcess {
 public:
  static bool Available() { return ::access("/usr/bin/prometheus", X_OK) == 0; }

  bool Start(const std::vector<uint16_t>& targets, std::string* why) {
    port_ = PickFreePort();
    std::string config = "global:\n  scrape_interval: 200ms\n  scrape_timeout: 150ms\n"
                         "scrape_configs:\n  - job_name: canopy\n    static_configs:\n      - targets: [";
    for (size_t i = 0; i < targets.size(); ++i) {
      config += (i ? ", " : "") + std::string("'127.0.0.1:") + std::to_string(targets[i]) + "'";
    }
    config += "]\n";
    const std::string config_file = dir_.File("prometheus.yml");
    if (!WriteFileAtomic(config_file, config).ok()) return false;
    const std::string log = dir_.File("prometheus.log");
    const std::vector<std::string> args = {"/usr/bin/prometheus",
                                           "--config.file=" + config_file,
                                           "--storage.tsdb.path=" + dir_.File("data"),
                                           "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                           "--log.level=warn"};
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    bool ready = WaitUntil(
        [&] {
          RawResponse r;
          return RoundTrip(port_, Get("/-/ready"), &r) && r.status == 200;
        },
        std::chrono::seconds(20));
    if (!ready) *why = "prometheus did not become ready: " + ReadFileToString(log).value_or("");
    return ready;
  }

  // Runs an instant PromQL query; the single result's value, or NaN.
  double Query(const std::string& promql) {
    RawResponse r;
    if (!RoundTrip(port_, Get("/api/v1/query?query=" + UrlEncode(promql)), &r) || r.status != 200) return NAN;
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (!j.is_object() || j.value("status", "") != "success") return NAN;
    const auto& result = j["data"]["result"];
    if (!result.is_array() || result.size() != 1) return NAN;
    return std::stod(result[0]["value"][1].get<std::string>());
  }

  ~PrometheusProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      if (!WaitUntil([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, std::chrono::seconds(10))) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
      }
    }
  }

 private:
  TempDir dir_;
  uint16_t port_ = 0;
  pid_t pid_ = -1;
};

TEST(MetricsTest, ClusterMetricsAreScrapedByPrometheus) {
  TestCluster c;
  TempDir ports;
  for (int i = 0; i < 3; ++i) {
    c.AddNode({"--metrics", "127.0.0.1:0", "--metrics-port-file", ports.File("m" + std::to_string(i))});
    ASSERT_TRUE(c.Start(static_cast<size_t>(i))) << c.Log(static_cast<size_t>(i));
  }
  ASSERT_TRUE(c.WaitForMembers(3)) << c.Log(0);
  std::vector<uint16_t> metric_ports;
  for (int i = 0; i < 3; ++i) {
    metric_ports.push_back(ReadPortFile(ports.File("m" + std::to_string(i))));
    ASSERT_NE(metric_ports.back(), 0) << c.Log(static_cast<size_t>(i));
  }

  // Prometheus first (when installed), so that it sees the counters before
  // and after the commits.
  std::unique_ptr<PrometheusProcess> prometheus;
  if (PrometheusProcess::Available()) {
    prometheus = std::make_unique<PrometheusProcess>();
    std::string why;
    ASSERT_TRUE(prometheus->Start(metric_ports, &why)) << why;
    ASSERT_TRUE(WaitUntil([&] { return prometheus->Query("sum(up)") == 3; }, std::chrono::seconds(15)))
        << "prometheus does not scrape the 3 nodes";
  }

  auto client = c.Connect(0);
  ASSERT_TRUE(client);
  auto created = client->CreateTree("m");
  ASSERT_TRUE(created.ok() && created->status.code == StatusCode::kOk);
  size_t leader = c.IndexOfUri(created->leader);
  ASSERT_LT(leader, 3u);
  constexpr int kCommits = 25;
  for (int i = 0; i < kCommits; ++i) {
    CommitRequest r;
    r.tree = "m";
    r.level = i < 20 ? ConsistencyLevel::kQuorum : ConsistencyLevel::kAll;
    r.timeout_ms = 8000;
    r.edits.push_back(Edit{Edit::Kind::kPutAttribute, {}, "k", std::to_string(i), 0});
    auto reply = client->Commit(r);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_EQ(reply->status.code, StatusCode::kOk) << reply->status.message;
  }

  // Read directly: the leader counted every commit by level, with latencies.
  int status = 0;
  std::string text = Scrape(metric_ports[leader], &status);
  ASSERT_EQ(status, 200) << text;
  EXPECT_NE(text.find("# TYPE canopy_commits_total counter"), std::string::npos) << text;
  EXPECT_EQ(SeriesSum(text, "canopy_commits_total", {"consistency=\"QUORUM\"", "outcome=\"ok\""}), 20) << text;
  EXPECT_EQ(SeriesSum(text, "canopy_commits_total", {"consistency=\"ALL\"", "outcome=\"ok\""}), 5) << text;
  EXPECT_EQ(SeriesSum(text, "canopy_commit_latency_seconds_count", {"consistency=\"QUORUM\""}), 20) << text;
  EXPECT_GT(SeriesSum(text, "canopy_wal_fsync_seconds_count", {}), 0) << text;
  EXPECT_GT(SeriesSum(text, "canopy_transport_connections_total", {"scheme=\"tcp\"", "direction=\"accepted\""}), 0)
      << text;
  EXPECT_GT(SeriesSum(text, "canopy_transport_bytes_total", {"scheme=\"tcp\"", "direction=\"sent\""}), 0) << text;
  EXPECT_GE(SeriesSum(text, "canopy_tree_epoch", {"tree=\"m\""}), 1) << text;
  auto tree = c.TreeState(leader, "m");
  ASSERT_TRUE(tree);
  // Both replicas acknowledged the last ALL commit: acked = latest, lag 0.
  EXPECT_EQ(SeriesSum(text, "canopy_replica_acked_version", {"tree=\"m\""}), 2.0 * tree->durable_version) << text;
  EXPECT_EQ(SeriesSum(text, "canopy_replica_lag_versions", {"tree=\"m\""}), 0) << text;
  EXPECT_EQ(SeriesSum(text, "canopy_failovers_total", {}), 0) << text;
  RawResponse other;
  ASSERT_TRUE(RoundTrip(metric_ports[leader], Get("/nope"), &other));
  EXPECT_EQ(other.status, 404);

  if (!prometheus) GTEST_SKIP() << "/usr/bin/prometheus is missing (Debian package prometheus): scraped directly only";
  // Through Prometheus: the counter summed over the cluster equals the
  // commits made (every node is scraped; only the leader counts commits).
  const std::string query = "sum(max_over_time(canopy_commits_total{outcome=\"ok\"}[1m]))";
  double seen = NAN;
  EXPECT_TRUE(WaitUntil(
      [&] {
        seen = prometheus->Query(query);
        return seen == kCommits;
      },
      std::chrono::seconds(15)))
      << query << " = " << seen;
  EXPECT_EQ(prometheus->Query("sum(canopy_commits_total{consistency=\"ALL\"})"), 5);
  // The scrape that showed every commit may predate the replicas' last
  // acknowledgement (seen once under the sanitizer build): wait for a later one.
  const std::string caught_up = "count(canopy_replica_lag_versions{tree=\"m\"} == 0)";
  EXPECT_TRUE(WaitUntil(
      [&] {
        seen = prometheus->Query(caught_up);
        return seen == 2;
      },
      std::chrono::seconds(15)))
      << caught_up << " = " << seen;
}

// A replica that comes back behind the deltas its leader keeps in memory
// (about the newest 64 KiB) gets the WAL tail as the leader's own file bytes
// (DELTA_RECORDS, on the transport's bulk path): both ends count those bytes,
// and the copies end equal. 40 values of 8 KB make a run the replica takes
// in memory; of 40 KB, one that lands in a file that becomes a segment of
// its WAL (Store::BeginWalRun).
class ReplicaBehind : public ::testing::TestWithParam<size_t> {};

TEST_P(ReplicaBehind, TheDeltasInMemoryGetsTheWalRecordsOnTheBulkPath) {
  const size_t value_bytes = GetParam();
  TestCluster c;
  TempDir ports;
  auto port_file = [&](size_t i) { return ports.File("m" + std::to_string(i)); };
  for (size_t i = 0; i < 3; ++i) {
    c.AddNode({"--metrics", "127.0.0.1:0", "--metrics-port-file", port_file(i)});
    ASSERT_TRUE(c.Start(i)) << c.Log(i);
  }
  ASSERT_TRUE(c.WaitForMembers(3)) << c.Log(0);
  auto client = c.Connect(0);
  ASSERT_TRUE(client);
  auto created = client->CreateTree("w");
  ASSERT_TRUE(created.ok() && created->status.code == StatusCode::kOk);
  const size_t leader = c.IndexOfUri(created->leader);
  ASSERT_LT(leader, 3u);
  auto writer = c.Connect(leader);
  ASSERT_TRUE(writer);
  auto commit = [&](int i, ConsistencyLevel level) -> uint64_t {
    CommitRequest r;
    r.tree = "w";
    r.level = level;
    r.timeout_ms = 8000;
    r.edits.push_back(Edit{Edit::Kind::kPutAttribute,
                           {},
                           "k" + std::to_string(i),
                           std::string(value_bytes, static_cast<char>('a' + i % 26)),
                           0});
    auto reply = writer->Commit(r);
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    if (!reply.ok()) return 0;
    EXPECT_EQ(reply->status.code, StatusCode::kOk) << reply->status.message;
    return reply->version;
  };
  ASSERT_GT(commit(0, ConsistencyLevel::kAll), 0u);  // every replica subscribed
  const size_t victim = (leader + 1) % 3;
  c.Kill(victim);
  uint64_t last = 0;
  constexpr int kAway = 40;  // 40 values: far more than the leader keeps in memory
  for (int i = 1; i <= kAway; ++i) ASSERT_GT(last = commit(i, ConsistencyLevel::kQuorum), 0u);
  ::unlink(port_file(victim).c_str());
  ASSERT_TRUE(c.Start(victim)) << c.Log(victim);
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto t = c.TreeState(victim, "w");
        return t && t->durable_version == last;
      },
      std::chrono::seconds(30)))
      << c.Log(victim);
  const uint16_t victim_port = ReadPortFile(port_file(victim));
  ASSERT_NE(victim_port, 0) << c.Log(victim);
  const std::string received = Scrape(victim_port);
  // The records of the versions beyond the leader's memory came as file bytes.
  const double away_bytes = kAway * static_cast<double>(value_bytes);
  EXPECT_GE(SeriesSum(received, "canopy_delta_records_bytes_total", {"direction=\"received\""}),
            away_bytes - (64 << 10))
      << received;
  const std::string sent = Scrape(ReadPortFile(port_file(leader)));
  EXPECT_GE(SeriesSum(sent, "canopy_delta_records_bytes_total", {"direction=\"sent\""}), away_bytes - (64 << 10))
      << sent;
  auto mine = c.TreeState(victim, "w");
  auto theirs = c.TreeState(leader, "w");
  ASSERT_TRUE(mine && theirs);
  EXPECT_FALSE(mine->digest.empty());
  EXPECT_EQ(mine->digest, theirs->digest);
}

INSTANTIATE_TEST_SUITE_P(MetricsTest, ReplicaBehind, ::testing::Values(size_t{8000}, size_t{40000}));

TEST(MetricsTest, NodeTakesItsOptionsFromAConfigFile) {
  TempDir dir;
  TestCluster c;  // for its secret file
  const std::string uri_file = dir.File("uri");
  const std::string port_file = dir.File("metrics-port");
  const std::string config = dir.File("n1.conf");
  ASSERT_TRUE(WriteFileAtomic(config, "# canopy node options\n"
                                      "listen = tcp://127.0.0.1:0\n"
                                      "data = " + dir.File("data") + "\n"
                                      "cluster = " + kClusterName + "\n"
                                      "secret-file = " + c.secret_file() + "\n"
                                      "node-id = 7\n"
                                      "metrics = 127.0.0.1:0\n"
                                      "metrics-port-file = " + port_file + "\n")
                  .ok());
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(dir.File("log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::string binary = BinaryPath("tools/canopy/canopy");
    ::execl(binary.c_str(), binary.c_str(), "node", "--config", config.c_str(), "--uri-file", uri_file.c_str(),
            static_cast<char*>(nullptr));
    _exit(127);
  }
  uint16_t port = ReadPortFile(port_file);
  EXPECT_NE(port, 0) << ReadFileToString(dir.File("log")).value_or("");
  if (port != 0) {
    std::string text = Scrape(port);
    EXPECT_NE(text.find("node=\"7\""), std::string::npos) << text;
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;

  // A missing config file, and an unknown name in one, are usage errors.
  std::string out;
  EXPECT_EQ(RunCommand(BinaryPath("tools/canopy/canopy") + " node --config " + dir.File("none.conf"), &out), 2);
  EXPECT_NE(out.find("--config"), std::string::npos) << out;
  ASSERT_TRUE(WriteFileAtomic(dir.File("bad.conf"), "no-such-option = 1\n").ok());
  EXPECT_EQ(RunCommand(BinaryPath("tools/canopy/canopy") + " node --config " + dir.File("bad.conf"), &out), 2);
}

TEST(CanopyCli, NoCommandIsBadUsage) {
  std::string out;
  // Only stderr is captured: the usage goes there.
  EXPECT_EQ(RunCommand("{ " + BinaryPath("tools/canopy/canopy") + " 2>&1 >/dev/null; }", &out), 2);
  EXPECT_NE(out.find("usage: canopy COMMAND"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunCommand("{ " + BinaryPath("tools/canopy/canopy") + " 2>/dev/null; }", &out), 2);
  EXPECT_EQ(out, "");  // nothing on stdout
  out.clear();
  EXPECT_EQ(RunCommand(BinaryPath("tools/canopy/canopy") + " --help", &out), 0);
  EXPECT_NE(out.find("usage: canopy COMMAND"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(BinaryPath("tools/canopy/canopy") + " no-such-command", &out), 2);
  // An unreachable node: the reason names it once.
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.File("secret"), "a secret of eight bytes or more\n").ok());
  const std::string dead = "tcp://127.0.0.1:" + std::to_string(PickFreePort());
  out.clear();
  EXPECT_EQ(RunCommand(BinaryPath("tools/canopy/canopy") + " status --node " + dead + " --cluster c --secret-file " +
                           dir.File("secret") + " --timeout-ms 2000",
                       &out),
            1);
  EXPECT_NE(out.find("connect to " + dead), std::string::npos) << out;
  EXPECT_EQ(out.find(dead), out.rfind(dead)) << out;
}

}  // namespace
}  // namespace canopy::testing
