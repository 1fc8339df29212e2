// Tests for tools/bench: the control-message codec, size parsing, the sweep
// against an in-process server, and the bench binary (JSON output, bad flags).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/file.h"
#include "tests/http_test_util.h"
#include "tests/testing/json_schema.h"
#include "tests/testing/test_util.h"
#include "tests/tls_test_util.h"
#include "tools/bench/perftest.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace canopy::bench {
namespace {

using canopy::testing::BinaryPath;
using canopy::testing::RunCommand;
using canopy::testing::TempDir;

std::string Bench() { return BinaryPath("tools/bench/bench"); }

const nlohmann::json& Schema() {
  static const nlohmann::json schema = canopy::testing::LoadJsonSchema("tools/bench/bench.schema.json");
  return schema;
}

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

TEST(BenchProtocol, DirectionsCpuAndVersions) {
  for (Direction d : {Direction::kForward, Direction::kReverse, Direction::kBidir}) {
    BeginTest begin{TestKind::kBandwidth, 1000, 7, false, d};
    auto decoded = DecodeBegin(EncodeBegin(begin));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, begin);
  }
  EXPECT_EQ(DirectionName(Direction::kBidir), "bidir");
  std::string bad_direction = EncodeBegin({TestKind::kBandwidth, 8, 1, false, Direction::kForward});
  bad_direction.back() = 9;
  EXPECT_TRUE(DecodeBegin(bad_direction).status().IsCorruption());
  EXPECT_TRUE(DecodeBegin(EncodeBegin({TestKind::kLatency, 8, 1, false, Direction::kReverse})).status().IsCorruption());

  // A version-1 BEGIN (no direction byte) is refused with both versions named.
  std::string v1 = EncodeBegin({TestKind::kBandwidth, 8, 1, false, Direction::kForward});
  v1[0] = 1;
  v1.pop_back();
  Status old = DecodeBegin(v1).status();
  EXPECT_TRUE(old.IsCorruption());
  EXPECT_NE(old.message().find("version 1 not supported (this is version 2)"), std::string::npos) << old.ToString();

  DoneCounts done{12, 3456, 7, 700, 1500, 2500, 100000, 3};
  auto d = DecodeDone(EncodeDone(done));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, done);
  done.affinity = -1;
  EXPECT_EQ(DecodeDone(EncodeDone(done))->affinity, -1);
  std::string full = EncodeDone(done);
  for (size_t n = 0; n < full.size(); ++n) EXPECT_TRUE(DecodeDone(full.substr(0, n)).status().IsCorruption()) << n;
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
  void Restart(const BenchServerOptions& options) {
    server_.reset();
    auto server = BenchServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    port_ = server_->local_endpoint().port;
  }
  static BenchServerOptions ServerOptions() {
    BenchServerOptions options;
    options.listen_uri = "tcp://127.0.0.1:0";
    options.idle_timeout = std::chrono::seconds(10);
    return options;
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

// The one-sided latency test needs rdma:// (transport/rdma/log_ring.h); over tcp:// the
// server, which got RING_OPEN, cannot register a ring on it and answers ERROR with the reason.
TEST_F(BenchServerTest, OneSidedLatencyNeedsRdma) {
  SweepOptions o = Options();
  o.sizes = {64};
  o.bandwidth = false;
  o.one_sided = true;
  auto lat = RunSweep(o);
  ASSERT_FALSE(lat.ok());
  EXPECT_NE(lat.status().message().find("needs a plain rdma:// connection"), std::string::npos)
      << lat.status().ToString();
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

TEST_F(BenchServerTest, ReverseAndBidirCountBothDirections) {
  for (bool bulk : {false, true}) {
    for (Direction dir : {Direction::kReverse, Direction::kBidir}) {
      SweepOptions o = Options();
      o.sizes = {64, 64 << 10};
      o.bulk = bulk;
      o.direction = dir;
      auto results = RunSweep(o);
      ASSERT_TRUE(results.ok()) << DirectionName(dir) << " bulk=" << bulk << ": " << results.status().ToString();
      for (const SizeResult& r : *results) {
        EXPECT_EQ(r.direction, dir);
        EXPECT_GE(r.bw_iterations, 1u);
        EXPECT_EQ(r.reverse.messages, r.bw_iterations * r.bw_burst);
        EXPECT_EQ(r.reverse.bytes, r.reverse.messages * r.size);
        EXPECT_GT(r.reverse.avg_gbps, 0);
        if (dir == Direction::kBidir) {
          EXPECT_EQ(r.forward.bytes, r.reverse.bytes);
          EXPECT_GT(r.forward.avg_gbps, 0);
          EXPECT_EQ(r.bw_bytes, r.forward.bytes + r.reverse.bytes);
        } else {
          EXPECT_EQ(r.forward.bytes, 0u);
          EXPECT_EQ(r.bw_bytes, r.reverse.bytes);
        }
        EXPECT_GT(r.bw_avg_gbps, 0);
        EXPECT_GE(r.lat_iterations, 1u);  // the latency test runs as usual
      }
    }
  }
}

TEST_F(BenchServerTest, BytesOmitIntervalsAndCpu) {
  BenchServerOptions so = ServerOptions();
  so.affinity = 0;  // only reported back
  Restart(so);
  SweepOptions o = Options();
  o.sizes = {64 << 10};
  o.iterations = 100000;
  o.time_per_size = std::chrono::seconds(5);
  o.bytes_limit = 1;  // one round is enough
  o.warmup = 0;
  o.latency = false;
  auto one = RunSweep(o);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ((*one)[0].bw_iterations, 1u);
  EXPECT_EQ((*one)[0].remote_affinity, 0);

  o.bytes_limit = 0;
  o.latency = true;
  o.iterations = 1000000;
  o.time_per_size = std::chrono::duration<double>(0.1);
  o.omit = std::chrono::duration<double>(0.03);
  o.interval = std::chrono::duration<double>(0.02);
  std::vector<IntervalResult> live;
  o.on_interval = [&](uint64_t size, const IntervalResult& i) {
    EXPECT_EQ(size, 64u << 10);
    live.push_back(i);
  };
  auto results = RunSweep(o);
  ASSERT_TRUE(results.ok()) << results.status().ToString();
  const SizeResult& r = (*results)[0];
  EXPECT_GE(r.bw_omitted_rounds, 1u);
  EXPECT_GE(r.lat_omitted, 1u);
  ASSERT_FALSE(r.intervals.empty());
  EXPECT_EQ(live.size(), r.intervals.size());
  uint64_t sum = 0;
  double previous_end = 0;
  for (const IntervalResult& i : r.intervals) {
    EXPECT_DOUBLE_EQ(i.start, previous_end);
    EXPECT_GE(i.end, i.start);
    EXPECT_EQ(i.bytes, i.forward_bytes);
    previous_end = i.end;
    sum += i.bytes;
  }
  EXPECT_EQ(sum, r.bw_bytes);
  for (const CpuUsage* cpu : {&r.bw_cpu_local, &r.bw_cpu_remote, &r.lat_cpu_local, &r.lat_cpu_remote}) {
    EXPECT_GT(cpu->wall_seconds, 0);
    EXPECT_GE(cpu->user_pct, 0);
    EXPECT_GE(cpu->sys_pct, 0);
    EXPECT_DOUBLE_EQ(cpu->total_pct, cpu->user_pct + cpu->sys_pct);
  }
  EXPECT_NE(FormatCpu(r.bw_cpu_local).find("%u/"), std::string::npos);
}

TEST_F(BenchServerTest, TwoClientsAtOnce) {
  SweepOptions o = Options();
  o.sizes = {64, 4096};
  Result<std::vector<SizeResult>> a = Status::Internal("not run");
  Result<std::vector<SizeResult>> b = Status::Internal("not run");
  std::thread other([&] {
    SweepOptions reverse = o;
    reverse.direction = Direction::kReverse;
    b = RunSweep(reverse);
  });
  a = RunSweep(o);
  other.join();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->size(), 2u);
  EXPECT_EQ(b->size(), 2u);
}

TEST_F(BenchServerTest, BusyBeyondMaxClients) {
  BenchServerOptions so = ServerOptions();
  so.max_connections = 1;
  Restart(so);
  auto holder = transport::Dial("tcp://127.0.0.1:" + std::to_string(port_), transport::TransportOptions{});
  ASSERT_TRUE(holder.ok()) << holder.status().ToString();
  // The holder is being served once a test can begin on it.
  ASSERT_TRUE((*holder)->Send(kMsgBegin, EncodeBegin({TestKind::kLatency, 8, 1, false, Direction::kForward})).ok());
  auto ready = (*holder)->Receive(Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  ASSERT_EQ(ready->type, kMsgReady);

  SweepOptions o = Options();
  o.sizes = {64};
  auto busy = RunSweep(o);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kAborted) << busy.status().ToString();
  EXPECT_NE(busy.status().message().find("server busy"), std::string::npos) << busy.status().ToString();

  (*holder)->Close();
  holder->reset();
  Status last = Status::Internal("not run");
  Deadline deadline = Deadline::After(std::chrono::seconds(5));
  while (!deadline.expired()) {  // the slot frees once the server notices the close
    auto again = RunSweep(o);
    last = again.status();
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(last.ok()) << last.ToString();
}

TEST_F(BenchServerTest, MaxDurationEndsTheSessionWithAnError) {
  BenchServerOptions so = ServerOptions();
  so.max_duration = std::chrono::milliseconds(200);
  Restart(so);
  for (Direction dir : {Direction::kForward, Direction::kReverse}) {
    SweepOptions o = Options();
    o.sizes = {1024, 2048, 4096};
    o.direction = dir;
    o.iterations = 1000000;
    o.time_per_size = std::chrono::seconds(2);
    auto results = RunSweep(o);
    ASSERT_FALSE(results.ok()) << DirectionName(dir);
    EXPECT_NE(results.status().message().find("maximum session duration (--max-duration) of 0.2 s"), std::string::npos)
        << results.status().ToString();
  }
}

TEST_F(BenchServerTest, OldProtocolVersionIsACleanError) {
  auto conn = transport::Dial("tcp://127.0.0.1:" + std::to_string(port_), transport::TransportOptions{});
  ASSERT_TRUE(conn.ok());
  std::string v1 = EncodeBegin({TestKind::kBandwidth, 8, 1, false, Direction::kForward});
  v1[0] = 1;
  v1.pop_back();
  ASSERT_TRUE((*conn)->Send(kMsgBegin, v1).ok());
  auto m = (*conn)->Receive(Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->type, kMsgError);
  EXPECT_NE(m->payload.find("bench protocol version 1 not supported (this is version 2)"), std::string::npos)
      << m->payload;
}

// --secret-file: the shared HMAC handshake (transport/auth.h) before any test.
TEST_F(BenchServerTest, SharedSecretIsCheckedBeforeAnyTest) {
  BenchServerOptions options = ServerOptions();
  options.secret = "bench secret 1";
  Restart(options);
  SweepOptions o = Options();
  o.sizes = {64};
  o.secret = "bench secret 1";
  auto good = RunSweep(o, nullptr);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  // Wrong secret: the client finds out from the server's proof.
  o.secret = "bench secret 2";
  auto wrong = RunSweep(o, nullptr);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
  // No secret: the server refuses the BEGIN it did not wait for, with ERROR.
  o.secret.clear();
  auto none = RunSweep(o, nullptr);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("authentication required"), std::string::npos) << none.status().ToString();
  // The server still serves the right secret afterwards.
  o.secret = "bench secret 1";
  EXPECT_TRUE(RunSweep(o, nullptr).ok());
}

TEST_F(BenchServerTest, OpenServerRefusesAnAuthenticatingClient) {
  SweepOptions o = Options();
  o.sizes = {64};
  o.secret = "bench secret 1";
  auto r = RunSweep(o, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  EXPECT_NE(r.status().message().find("open (started without --secret-file)"), std::string::npos)
      << r.status().ToString();
}

TEST_F(BenchServerTest, SweepOverTls) {
  const auto& pki = canopy::testing::GetTestPki();
  BenchServerOptions options = ServerOptions();
  options.listen_uri = "tls+tcp://127.0.0.1:0";
  options.transport.backend_args = canopy::testing::ServerTlsArgs(pki);
  options.secret = "bench secret 1";
  Restart(options);
  SweepOptions o = Options();
  o.uri = "tls+tcp://127.0.0.1:" + std::to_string(port_);
  o.transport.backend_args = canopy::testing::ClientTlsArgs(pki);
  o.secret = "bench secret 1";
  o.sizes = {64, 256 << 10};
  for (bool bulk : {false, true}) {
    o.bulk = bulk;
    auto r = RunSweep(o, nullptr);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT((*r)[1].bw_avg_gbps, 0);
  }
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
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
}

TEST(BenchCli, BadFlagsGiveAnError) {
  for (const char* args : {"--bogus", "", "-s 0 127.0.0.1", "--sizes 8:2 127.0.0.1", "--sizes x 127.0.0.1",
                           "-n 0 127.0.0.1", "-t 0 127.0.0.1", "--test both 127.0.0.1", "-s 1G 127.0.0.1",
                           "-s 64 --sizes 2:8 127.0.0.1", "-p 0 127.0.0.1", "--server 127.0.0.1",
                           "--one-sided 127.0.0.1", "--one-sided --test lat 127.0.0.1",
                           "--one-sided --test lat --transport rdma --bulk 127.0.0.1"}) {
    std::string out;
    int rc = RunCommand(Bench() + " " + args, &out);
    EXPECT_EQ(rc, 2) << args << ": " << out;
    EXPECT_NE(out.find("usage: bench"), std::string::npos) << args << ": " << out;
  }
  // With --json a usage error is one JSON document too (stderr still has the usage text).
  for (const char* args : {"--bogus", "", "-n 0 127.0.0.1", "-R --bidir 127.0.0.1", "--bytes 0 127.0.0.1",
                           "--bytes x 127.0.0.1", "-i 0 127.0.0.1", "--omit -1 127.0.0.1", "-a -1 127.0.0.1",
                           "-a 100000 127.0.0.1", "-t abc 127.0.0.1"}) {
    std::string out;
    int rc = RunCommand("{ " + Bench() + " --json " + args + " 2>/dev/null; }", &out);
    EXPECT_EQ(rc, 2) << args << ": " << out;
    EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "") << args;
  }
  for (const char* args : {"--server --max-duration -1", "--server --max-clients 0", "--server -a -1"}) {
    std::string out;
    EXPECT_EQ(RunCommand(Bench() + " " + args, &out), 2) << args << ": " << out;
  }
  std::string out;
  ASSERT_EQ(RunCommand(Bench() + " --help", &out), 0);
  for (const char* option : {"--size", "--sizes", "--iterations", "--time", "--warmup", "--test", "--bulk", "--json",
                             "--server", "--port", "--transport", "--transport-arg", "--bind", "--port-file",
                             "--bytes", "--omit", "--interval", "--reverse", "--bidir", "--affinity", "--max-duration",
                             "--max-clients", "--idle-timeout", "--secret-file", "10^9 bit/s"}) {
    EXPECT_NE(out.find(option), std::string::npos) << option;
  }
}

// A bench server process on a free loopback port; killed (SIGTERM) on scope exit.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> extra = {}) {
    std::string port_file = dir_.File("port");
    std::vector<std::string> args = {Bench(), "--server", "-q", "--bind", "127.0.0.1", "-p", "0", "--port-file",
                                     port_file};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = canopy::testing::ForkChild([args]() -> int {
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      return 91;
    });
    Deadline deadline = Deadline::After(std::chrono::seconds(10));
    while (!PathExists(port_file) && !deadline.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto text = ReadFileToString(port_file);
    if (text.ok()) port_ = text->substr(0, text->find('\n'));
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      canopy::testing::WaitChild(pid_, std::chrono::seconds(10));
    }
  }
  const std::string& port() const { return port_; }  // empty when it did not start
  pid_t pid() const { return pid_; }

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  std::string port_;
};

// The real binaries: a server process and a tiny sweep whose JSON parses and
// has the expected fields.
TEST(BenchCli, TinySweepJson) {
  ServerProcess server;
  ASSERT_FALSE(server.port().empty()) << "bench server did not start";
  std::string port = server.port();

  std::string out;
  int rc = RunCommand("{ " + Bench() + " --json --sizes 2:1K -n 4 -t 0.05 --warmup 1 -p " + port +
                          " 127.0.0.1 2>/dev/null; }",
                      &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  auto j = nlohmann::json::parse(out);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["transport"].get<std::string>(), "tcp");
  EXPECT_EQ(j["units"]["gbps"].get<std::string>(), "1e9 bits per second");
  EXPECT_EQ(j["units"]["bandwidth"].get<std::string>(), "decimal Gbit/s (10^9 bit/s)");
  EXPECT_EQ(j["direction"].get<std::string>(), "forward");
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
    EXPECT_GT(row["bw_cpu"]["remote"]["wall_seconds"].get<double>(), 0);
  }

  out.clear();
  rc = RunCommand(Bench() + " -s 4K -n 3 -t 0.05 -p " + port + " 127.0.0.1", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("BW peak[Gb/s]"), std::string::npos) << out;
  EXPECT_NE(out.find("t_p99[us]"), std::string::npos) << out;
  EXPECT_NE(out.find("      4096"), std::string::npos) << out;
  EXPECT_NE(out.find("decimal Gbit/s (10^9 bit/s)"), std::string::npos) << out;
  EXPECT_NE(out.find("CPU Utilization (bandwidth tests): local/sender "), std::string::npos) << out;
  EXPECT_NE(out.find("remote/receiver "), std::string::npos) << out;
}

// -P 2: two connections at once; the results are their sums and each
// connection's own figures are in "streams".
TEST(BenchCli, ParallelConnectionsReportEachAndTheSum) {
  ServerProcess server;
  ASSERT_FALSE(server.port().empty()) << "bench server did not start";
  std::string out;
  int rc = RunCommand("{ " + Bench() + " --json -P 2 --test bw --sizes 4K:8K -n 6 -t 0.2 --warmup 1 -p " +
                          server.port() + " 127.0.0.1 2>/dev/null; }",
                      &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["parallel"].get<int>(), 2);
  ASSERT_EQ(j["streams"].size(), 2u);
  ASSERT_EQ(j["results"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    uint64_t bytes = 0;
    double gbps = 0;
    for (const auto& stream : j["streams"]) {
      ASSERT_EQ(stream.size(), 2u);
      EXPECT_EQ(stream[i]["size"], j["results"][i]["size"]);
      EXPECT_GT(stream[i]["bw_bytes"].get<uint64_t>(), 0u);
      bytes += stream[i]["bw_bytes"].get<uint64_t>();
      gbps += stream[i]["bw_avg_gbps"].get<double>();
    }
    EXPECT_EQ(j["results"][i]["bw_bytes"].get<uint64_t>(), bytes);
    EXPECT_DOUBLE_EQ(j["results"][i]["bw_avg_gbps"].get<double>(), gbps);
  }
  out.clear();
  rc = RunCommand(Bench() + " -P 2 --test bw -s 4K -n 3 -t 0.05 -p " + server.port() + " 127.0.0.1", &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("4096 B stream 1: "), std::string::npos) << out;
  EXPECT_NE(out.find("4096 B stream 2: "), std::string::npos) << out;
  // Latency tests do not mix with parallel connections; -P is 1..64.
  for (const char* args : {"-P 2 127.0.0.1", "-P 0 --test bw 127.0.0.1", "-P 65 --test bw 127.0.0.1"}) {
    out.clear();
    EXPECT_EQ(RunCommand("{ " + Bench() + " --json " + args + " 2>/dev/null; }", &out), 2) << args << ": " << out;
    EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "") << args;
  }
}

// -R, --bidir, -i, --bytes, --omit and -a, each validated against the schema.
// bench --server --metrics: clients served and the transport's totals in the
// Prometheus text format.
TEST(BenchCli, ServerExposesItsTotalsAsMetrics) {
  TempDir dir;
  const std::string metrics_port_file = dir.File("metrics-port");
  ServerProcess server({"--metrics", "127.0.0.1:0", "--metrics-port-file", metrics_port_file});
  ASSERT_FALSE(server.port().empty()) << "bench server did not start";
  std::string out;
  ASSERT_EQ(RunCommand("{ " + Bench() + " --json -s 1K -n 4 -t 0.05 --warmup 1 -p " + server.port() +
                           " 127.0.0.1 2>/dev/null; }",
                       &out),
            0)
      << out;
  auto port = ReadFileToString(metrics_port_file);
  ASSERT_TRUE(port.ok());
  std::string text;
  // The server counts the client once its session ended.
  Deadline deadline = Deadline::After(std::chrono::seconds(5));
  do {
    canopy::testing::RawResponse response;
    ASSERT_TRUE(canopy::testing::RoundTrip(static_cast<uint16_t>(std::stoul(*port)), canopy::testing::Get("/metrics"),
                                           &response));
    ASSERT_EQ(response.status, 200);
    text = response.body;
    if (text.find("canopy_bench_clients_total{outcome=\"served\"} 1") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (!deadline.expired());
  EXPECT_NE(text.find("canopy_bench_clients_total{outcome=\"served\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_bench_clients_active 0"), std::string::npos) << text;
  EXPECT_NE(text.find("canopy_transport_bytes_total{direction=\"received\",scheme=\"tcp\"}"), std::string::npos)
      << text;
}

TEST(BenchCli, ModesConformToTheSchema) {
  ServerProcess server({"-a", "0"});
  ASSERT_FALSE(server.port().empty()) << "bench server did not start";
  const std::string common = " --json -s 64K -n 20 -t 0.05 --warmup 1 -p " + server.port() + " 127.0.0.1";
  struct Case {
    const char* args;
    const char* direction;
  };
  for (const Case& c : {Case{"-R", "reverse"}, Case{"--bidir", "bidir"}, Case{"-i 0.01 --omit 0.01", "forward"},
                        Case{"-R -i 0.01 --bytes 1 --test bw", "reverse"}, Case{"--bidir -i 0.01 -a 0", "bidir"},
                        Case{"--test lat --bulk", "forward"}}) {
    std::string out;
    int rc = RunCommand("{ " + Bench() + " " + c.args + common + " 2>/dev/null; }", &out);
    ASSERT_EQ(rc, 0) << c.args << ": " << out;
    EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "") << c.args;
    auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["direction"].get<std::string>(), c.direction) << c.args;
    EXPECT_EQ(j["affinity"]["server"].get<int>(), 0) << c.args;
    const auto& row = j["results"][0];
    std::string args = c.args;
    if (args.find("-i ") != std::string::npos) {
      ASSERT_TRUE(row.contains("intervals")) << c.args;
      ASSERT_FALSE(row["intervals"].empty()) << c.args;
      uint64_t sum = 0;
      for (const auto& i : row["intervals"]) sum += i["bytes"].get<uint64_t>();
      EXPECT_EQ(sum, row["bw_bytes"].get<uint64_t>()) << c.args;
    }
    if (args.find("--bytes 1") != std::string::npos) {
      EXPECT_EQ(row["bw_rounds"].get<int>(), 1);
    }
    if (args.find("--bidir") != std::string::npos) {
      EXPECT_EQ(row["forward"]["bytes"], row["reverse"]["bytes"]);
      EXPECT_GT(row["reverse"]["avg_gbps"].get<double>(), 0);
    }
    if (args.find("-a 0") != std::string::npos) {
      EXPECT_EQ(j["affinity"]["client"].get<int>(), 0);
    }
    if (args.find("--test lat") != std::string::npos) {
      EXPECT_FALSE(row.contains("bw_rounds"));
    }
  }
  // The text form of -i and --bidir.
  std::string out;
  ASSERT_EQ(RunCommand(Bench() + " --bidir -i 0.01 -s 64K -n 20 -t 0.05 -p " + server.port() + " 127.0.0.1", &out),
            0)
      << out;
  EXPECT_NE(out.find("[    65536 B]   0.000-"), std::string::npos) << out;
  EXPECT_NE(out.find("Gbit/s  (forward "), std::string::npos) << out;
  EXPECT_NE(out.find("65536 B bidir: forward "), std::string::npos) << out;
}

// Failures mid-run still give one JSON document that conforms, and exit 1.
TEST(BenchCli, FailuresMidRunAreJson) {
  {
    ServerProcess server({"--max-duration", "0.2"});
    ASSERT_FALSE(server.port().empty()) << "bench server did not start";
    std::string out;
    int rc = RunCommand("{ " + Bench() + " --json --sizes 1K:4K -n 1000000 -t 1 --warmup 1 -p " + server.port() +
                            " 127.0.0.1 2>/dev/null; }",
                        &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
    auto j = nlohmann::json::parse(out);
    EXPECT_FALSE(j["ok"].get<bool>());
    EXPECT_NE(j["error"].get<std::string>().find("--max-duration"), std::string::npos) << out;
  }
  {
    ServerProcess server;
    ASSERT_FALSE(server.port().empty()) << "bench server did not start";
    std::string out;
    // Killed while the sweep (7 sizes, ~1.4 s) is running; the sizes done by then are in "results".
    int rc = RunCommand("{ " + Bench() + " --json -R --sizes 1K:64K -n 1000000 -t 0.1 --warmup 1 -p " +
                            server.port() + " 127.0.0.1 2>/dev/null & c=$!; sleep 0.5; kill -9 " +
                            std::to_string(server.pid()) + "; wait $c; }",
                        &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_EQ(canopy::testing::JsonConforms(Schema(), out), "");
    auto j = nlohmann::json::parse(out);
    EXPECT_FALSE(j["ok"].get<bool>());
    EXPECT_EQ(j["results"].size(), j["sizes_completed"].get<size_t>());
  }
}

}  // namespace
}  // namespace canopy::bench
