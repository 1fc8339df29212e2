// Tests for tools/bench: the control-message codec, size parsing, the sweep
// against an in-process server, and the bench binary (JSON output, bad flags).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/file.h"
#include "tests/testing/test_util.h"
#include "tools/bench/perftest.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace canopy::bench {
namespace {

using canopy::testing::BinaryPath;
using canopy::testing::RunCommand;
using canopy::testing::TempDir;

std::string Bench() { return BinaryPath("tools/bench/bench"); }

TEST(BenchProtocol, BeginAndDoneRoundTripAndRejectJunk) {
  BeginTest begin{TestKind::kLatency, 4096, 1, true};
  auto decoded = DecodeBegin(EncodeBegin(begin));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, begin);
  std::string full = EncodeBegin(begin);
  for (size_t n = 0; n < full.size(); ++n) {
    EXPECT_TRUE(DecodeBegin(full.substr(0, n)).status().IsCorruption()) << n;
  }
  EXPECT_TRUE(DecodeBegin(full + "x").status().IsCorruption());
  EXPECT_TRUE(DecodeBegin(EncodeBegin({TestKind::kBandwidth, 0, 1, false})).status().IsCorruption());
  EXPECT_TRUE(DecodeBegin(EncodeBegin({TestKind::kBandwidth, kMaxMessageSize + 1, 1, false})).status().IsCorruption());
  EXPECT_TRUE(DecodeBegin(EncodeBegin({TestKind::kBandwidth, 8, 0, false})).status().IsCorruption());
  std::string bad_kind = full;
  bad_kind[1] = 9;
  EXPECT_TRUE(DecodeBegin(bad_kind).status().IsCorruption());

  DoneCounts done{12, 3456};
  auto d = DecodeDone(EncodeDone(done));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, done);
  EXPECT_TRUE(DecodeDone(EncodeDone(done).substr(1)).status().IsCorruption());
}

TEST(BenchSizes, PowersOfTwoAndRanges) {
  auto sizes = ParseSizeRange("2:8M");
  ASSERT_TRUE(sizes.ok());
  ASSERT_EQ(sizes->size(), 23u);
  EXPECT_EQ(sizes->front(), 2u);
  EXPECT_EQ(sizes->back(), 8u << 20);
  auto odd = PowerOfTwoSizes(3, 100);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(*odd, (std::vector<uint64_t>{4, 8, 16, 32, 64}));
  EXPECT_FALSE(ParseSizeRange("8M:2").ok());
  EXPECT_FALSE(ParseSizeRange("0:2").ok());
  EXPECT_FALSE(ParseSizeRange("2-8").ok());
  EXPECT_FALSE(ParseSizeRange("5:7").ok());  // no power of two in between
}

TEST(BenchSizes, Percentile) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 100), 100);
  EXPECT_EQ(Percentile(v, 0), 1);
  std::vector<double> empty;
  EXPECT_EQ(Percentile(empty, 50), 0);
}

class BenchServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport::RegisterBuiltinTransports();
    BenchServerOptions options;
    options.listen_uri = "tcp://127.0.0.1:0";
    options.idle_timeout = std::chrono::seconds(10);
    auto server = BenchServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    port_ = server_->local_endpoint().port;
  }
  SweepOptions Options() {
    SweepOptions o;
    o.uri = "tcp://127.0.0.1:" + std::to_string(port_);
    o.sizes = *PowerOfTwoSizes(2, 64 << 10);
    o.iterations = 5;
    o.warmup = 1;
    o.time_per_size = std::chrono::duration<double>(0.05);
    return o;
  }
  std::unique_ptr<BenchServer> server_;
  uint16_t port_ = 0;
};

TEST_F(BenchServerTest, SweepMeasuresEverySize) {
  for (bool bulk : {false, true}) {
    SweepOptions o = Options();
    o.bulk = bulk;
    int seen = 0;
    auto results = RunSweep(o, [&](const SizeResult&) { ++seen; });
    ASSERT_TRUE(results.ok()) << results.status().ToString();
    ASSERT_EQ(results->size(), o.sizes.size());
    EXPECT_EQ(seen, static_cast<int>(o.sizes.size()));
    for (size_t i = 0; i < results->size(); ++i) {
      const SizeResult& r = (*results)[i];
      EXPECT_EQ(r.size, o.sizes[i]);
      EXPECT_GE(r.bw_iterations, 1u);
      EXPECT_LE(r.bw_iterations, 5u);
      EXPECT_EQ(r.bw_messages, r.bw_iterations * r.bw_burst);
      EXPECT_EQ(r.bw_bytes, r.bw_messages * r.size);
      EXPECT_GT(r.bw_avg_gbps, 0);
      EXPECT_GE(r.bw_peak_gbps, r.bw_avg_gbps * 0.999);
      EXPECT_GT(r.msg_rate_mmps, 0);
      EXPECT_GE(r.lat_iterations, 1u);
      EXPECT_LE(r.lat_min_us, r.lat_p50_us);
      EXPECT_LE(r.lat_p50_us, r.lat_p99_us);
      EXPECT_LE(r.lat_p99_us, r.lat_max_us);
      EXPECT_GT(r.lat_min_us, 0);
    }
  }
}

TEST_F(BenchServerTest, OnlyOneTest) {
  SweepOptions o = Options();
  o.sizes = {1000};
  o.latency = false;
  auto bw = RunSweep(o);
  ASSERT_TRUE(bw.ok()) << bw.status().ToString();
  EXPECT_GT((*bw)[0].bw_iterations, 0u);
  EXPECT_EQ((*bw)[0].lat_iterations, 0u);
  o.latency = true;
  o.bandwidth = false;
  auto lat = RunSweep(o);
  ASSERT_TRUE(lat.ok()) << lat.status().ToString();
  EXPECT_EQ((*lat)[0].bw_iterations, 0u);
  EXPECT_GT((*lat)[0].lat_iterations, 0u);
}

TEST_F(BenchServerTest, ServerRejectsMessagesOutsideATest) {
  auto conn = transport::Dial("tcp://127.0.0.1:" + std::to_string(port_), transport::TransportOptions{});
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE((*conn)->Send(kMsgData, "stray").ok());
  auto m = (*conn)->Receive(Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->type, kMsgError);
  EXPECT_NE(m->payload.find("outside a bandwidth test"), std::string::npos) << m->payload;
}

TEST(BenchCli, UnreachableServerFails) {
  transport::RegisterBuiltinTransports();
  auto listener = transport::ListenOn("tcp://127.0.0.1:0", transport::TransportOptions{});
  ASSERT_TRUE(listener.ok());
  uint16_t port = (*listener)->local_endpoint().port;
  (*listener)->Close();
  std::string out;
  int rc = RunCommand("{ " + Bench() + " --json -p " + std::to_string(port) + " -s 64 127.0.0.1 2>/dev/null; }", &out);
  EXPECT_EQ(rc, 1) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["error_code"].get<std::string>(), "Unavailable");
}

TEST(BenchCli, BadFlagsGiveAnError) {
  for (const char* args : {"--bogus", "", "-s 0 127.0.0.1", "--sizes 8:2 127.0.0.1", "--sizes x 127.0.0.1",
                           "-n 0 127.0.0.1", "-t 0 127.0.0.1", "--test both 127.0.0.1", "-s 1G 127.0.0.1",
                           "-s 64 --sizes 2:8 127.0.0.1", "-p 0 127.0.0.1", "--server 127.0.0.1"}) {
    std::string out;
    int rc = RunCommand(Bench() + " " + args, &out);
    EXPECT_EQ(rc, 2) << args << ": " << out;
    EXPECT_NE(out.find("usage: bench"), std::string::npos) << args << ": " << out;
  }
  std::string out;
  ASSERT_EQ(RunCommand(Bench() + " --help", &out), 0);
  for (const char* option : {"--size", "--sizes", "--iterations", "--time", "--warmup", "--test", "--bulk", "--json",
                             "--server", "--port", "--transport", "--transport-arg", "--bind", "--port-file"}) {
    EXPECT_NE(out.find(option), std::string::npos) << option;
  }
}

// The real binaries: a server process and a tiny sweep whose JSON parses and
// has the expected fields.
TEST(BenchCli, TinySweepJson) {
  TempDir dir;
  std::string port_file = dir.File("port");
  pid_t server = canopy::testing::ForkChild([&]() -> int {
    std::string binary = Bench();
    ::execl(binary.c_str(), binary.c_str(), "--server", "-q", "--bind", "127.0.0.1", "-p", "0", "--port-file",
            port_file.c_str(), static_cast<char*>(nullptr));
    return 91;
  });
  ASSERT_GT(server, 0);
  struct KillOnExit {
    pid_t pid;
    ~KillOnExit() {
      ::kill(pid, SIGTERM);
      canopy::testing::WaitChild(pid, std::chrono::seconds(10));
    }
  } guard{server};
  Deadline deadline = Deadline::After(std::chrono::seconds(10));
  while (!PathExists(port_file) && !deadline.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto port_text = ReadFileToString(port_file);
  ASSERT_TRUE(port_text.ok()) << "bench server did not start";
  std::string port = port_text->substr(0, port_text->find('\n'));

  std::string out;
  int rc = RunCommand("{ " + Bench() + " --json --sizes 2:1K -n 4 -t 0.05 --warmup 1 -p " + port +
                          " 127.0.0.1 2>/dev/null; }",
                      &out);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["transport"].get<std::string>(), "tcp");
  EXPECT_EQ(j["units"]["gbps"].get<std::string>(), "1e9 bits per second");
  ASSERT_EQ(j["results"].size(), 10u);  // 2, 4, ..., 1024
  uint64_t expected = 2;
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["size"].get<uint64_t>(), expected);
    expected *= 2;
    for (const char* field : {"bw_peak_gbps", "bw_avg_gbps", "msg_rate_mmps", "lat_p50_us", "lat_p99_us"}) {
      ASSERT_TRUE(row.contains(field)) << field;
      EXPECT_GT(row[field].get<double>(), 0) << field;
    }
    EXPECT_LE(row["bw_rounds"].get<int>(), 4);
  }

  out.clear();
  rc = RunCommand(Bench() + " -s 4K -n 3 -t 0.05 -p " + port + " 127.0.0.1", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("BW peak[Gb/s]"), std::string::npos) << out;
  EXPECT_NE(out.find("t_p99[us]"), std::string::npos) << out;
  EXPECT_NE(out.find("      4096"), std::string::npos) << out;
}

}  // namespace
}  // namespace canopy::bench
