// dpdk:// cases that need processes of their own (the EAL can be set up only
// once per process, and a forked copy of an initialised EAL is unusable):
//   - a server and a client process joined by one net_memif socket copy data;
//   - a peer killed mid-transfer gives the survivor a clear error within
//     io_timeout, whichever side dies;
//   - bad EAL arguments give a Status error, never an exit or abort;
//   - net_af_packet on a veth pair between two network namespaces this test
//     creates (skipped unless root with `ip netns`).
// The parent process never initialises the EAL; every case forks children.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/crc32c.h"
#include "base/file.h"
#include "tests/testing/json_schema.h"
#include "tests/testing/test_util.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace canopy::transport {
namespace {

using namespace std::chrono_literals;
using ::canopy::testing::ForkChild;
using ::canopy::testing::RandomBytes;
using ::canopy::testing::RunCommand;
using ::canopy::testing::WaitChild;

constexpr uint16_t kServerPort = 7000;

int Fail(const std::string& who, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", who.c_str(), s.ToString().c_str());
  return 1;
}

TransportOptions ChildOptions(const std::string& prefix, const std::string& vdev,
                              std::chrono::milliseconds io_timeout) {
  TransportOptions o;
  o.backend_args = {
      "--no-huge",     "-m", "256", "--no-pci", "--log-level=lib.eal:warning", "--file-prefix=" + prefix,
      "--vdev=" + vdev};
  o.connect_timeout = 3s;
  o.io_timeout = io_timeout;
  return o;
}

Result<std::unique_ptr<Listener>> ListenIn(const TransportOptions& options, const std::string& uri) {
  RegisterBuiltinTransports();
  CANOPY_ASSIGN_OR_RETURN(auto t, TransportRegistry::Global().Create("dpdk", options));
  CANOPY_ASSIGN_OR_RETURN(auto e, ParseEndpoint(uri));
  return t->Listen(e);
}

// Dials until the server process is up (its memif link, then its listener), bounded by `limit`.
Result<std::unique_ptr<Connection>> DialIn(const TransportOptions& options, const std::string& uri,
                                           std::chrono::seconds limit) {
  RegisterBuiltinTransports();
  CANOPY_ASSIGN_OR_RETURN(auto t, TransportRegistry::Global().Create("dpdk", options));
  CANOPY_ASSIGN_OR_RETURN(auto e, ParseEndpoint(uri));
  Deadline deadline = Deadline::After(limit);
  for (;;) {
    auto c = t->Connect(e);
    if (c.ok() || deadline.expired()) return c;
    std::this_thread::sleep_for(100ms);
  }
}

// Server side of a copy: `pieces` messages labelled `label` carrying
// `bulk` bytes between them (equal parts), verified against the
// deterministic source, answered with "ok", then the orderly end.
int ServeCopy(const TransportOptions& options, const std::string& uri, size_t bulk, uint64_t seed,
              int ready_fd, const std::string& label = "copy", size_t pieces = 1) {
  auto listener = ListenIn(options, uri);
  if (!listener.ok()) return Fail("server listen", listener.status());
  (void)!write(ready_fd, "r", 1);
  auto conn = (*listener)->Accept(Deadline::After(20s));
  if (!conn.ok()) return Fail("server accept", conn.status());
  const size_t part = bulk / pieces;
  std::string got(bulk, '\0');
  for (size_t i = 0; i < pieces; ++i) {
    auto msg = (*conn)->Receive(Deadline::After(20s));
    if (!msg.ok()) return Fail("server receive", msg.status());
    if (msg->payload != label || msg->bulk_bytes != part)
      return Fail("server", Status::Corruption("unexpected header"));
    Status s = (*conn)->ReceiveBulk(BulkSink::ToMemory(got.data() + i * part), part, Deadline::After(30s));
    if (!s.ok()) return Fail("server bulk", s);
  }
  if (got != RandomBytes(bulk, seed)) return Fail("server", Status::Corruption("bulk bytes differ"));
  Status s = (*conn)->Send(2, "ok");
  if (!s.ok()) return Fail("server reply", s);
  auto end = (*conn)->Receive(Deadline::After(20s));
  if (end.status().code() != StatusCode::kClosed) return Fail("server end", end.status());
  return 0;
}

int ClientCopy(const TransportOptions& options, const std::string& uri, size_t bulk, uint64_t seed,
               const std::string& label = "copy", size_t pieces = 1) {
  auto conn = DialIn(options, uri, 20s);
  if (!conn.ok()) return Fail("client connect", conn.status());
  const std::string data = RandomBytes(bulk, seed);
  const size_t part = bulk / pieces;
  for (size_t i = 0; i < pieces; ++i) {
    Status s = (*conn)->SendWithBulk(1, label, BulkSource::FromMemory(std::string_view(data).substr(i * part, part)));
    if (!s.ok()) return Fail("client send", s);
  }
  auto reply = (*conn)->Receive(Deadline::After(30s));
  if (!reply.ok()) return Fail("client reply", reply.status());
  if (reply->payload != "ok") return Fail("client", Status::Corruption("bad reply"));
  Status s = (*conn)->Shutdown();
  if (!s.ok()) return Fail("client shutdown", s);
  return 0;
}

std::string MemifSocket(const std::string& tag) {
  return "/tmp/canopy-dpdk-" + tag + "-" + std::to_string(getpid()) + ".sock";
}

// Waits for the byte a server child writes once it listens (so that the
// memif client finds the server's socket).
bool WaitReady(int fd) {
  pollfd p{fd, POLLIN, 0};
  char byte;
  return ::poll(&p, 1, 20000) == 1 && ::read(fd, &byte, 1) == 1;
}

void ExpectExitedZero(int status, const std::string& who) {
  ASSERT_NE(status, -1) << who << " did not finish in time";
  ASSERT_TRUE(WIFEXITED(status)) << who << " was killed by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << who << " failed (see its message above)";
}

void CopyBetweenProcesses(const std::string& tag, const std::string& extra_args) {
  const std::string socket = MemifSocket(tag);
  const std::string uri = "dpdk://10.0.0.1:" + std::to_string(kServerPort);
  const size_t bulk = size_t{48} << 20;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t server = ForkChild([&] {
    auto options =
        ChildOptions("cps" + std::to_string(getpid()), "net_memif0,role=server,socket=" + socket, 10s);
    if (!extra_args.empty()) options.backend_args.push_back(extra_args);
    return ServeCopy(options, uri, bulk, 5, ready[1]);
  });
  EXPECT_TRUE(WaitReady(ready[0])) << "the server process did not come up";
  close(ready[0]);
  close(ready[1]);
  pid_t client = ForkChild([&] {
    auto options =
        ChildOptions("cpc" + std::to_string(getpid()), "net_memif0,role=client,socket=" + socket, 10s);
    options.backend_args.push_back("ip=10.0.0.2");
    if (!extra_args.empty()) options.backend_args.push_back(extra_args);
    return ClientCopy(options, uri, bulk, 5);
  });
  int cs = WaitChild(client, 60s);
  int ss = WaitChild(server, 10s);
  ExpectExitedZero(cs, "client");
  ExpectExitedZero(ss, "server");
}

TEST(DpdkTwoProcesses, CopyOverMemifBetweenProcesses) { CopyBetweenProcesses("copy", ""); }

// 1 KiB mbufs: every full-size frame is a two-segment chain on transmit and
// on receive (checksums, header reads and payload copies across segments),
// here with some loss and reordering too.
TEST(DpdkTwoProcesses, CopyWithMultiSegmentMbufsAndFaults) {
  CopyBetweenProcesses("multiseg", "mbuf_bytes=1024,fault_drop=0.02,fault_reorder=0.02");
}

// One port per core: each process has two memif ports (two sockets) and
// names both (port=0+1). The server listens on both; the client's four
// connections go two to each port (each new one to the port carrying fewer),
// and every one carries its bulk byte-exact. ConnectionStats::device says
// which port each connection is on, at both ends.
TEST(DpdkTwoProcesses, ConnectionsSpreadOverTwoMemifPorts) {
  constexpr int kConnections = 4;
  const size_t bulk = size_t{4} << 20;
  const std::string sock_a = MemifSocket("twoa"), sock_b = MemifSocket("twob");
  const std::string uri = "dpdk://10.0.0.1:" + std::to_string(kServerPort);
  // "net_memif0 net_memif1 net_memif0 net_memif1" is what both ends must see.
  auto devices_ok = [](const std::vector<std::string>& devices) {
    int on0 = 0, on1 = 0;
    for (const auto& d : devices) {
      on0 += d == "net_memif0";
      on1 += d == "net_memif1";
    }
    return on0 == kConnections / 2 && on1 == kConnections / 2;
  };
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t server = ForkChild([&] {
    auto options =
        ChildOptions("tps" + std::to_string(getpid()), "net_memif0,role=server,socket=" + sock_a, 10s);
    options.backend_args.push_back("--vdev=net_memif1,role=server,socket=" + sock_b);
    options.backend_args.push_back("port=0+1");
    auto listener = ListenIn(options, uri);
    if (!listener.ok()) return Fail("server listen", listener.status());
    (void)!write(ready[1], "r", 1);
    std::vector<std::unique_ptr<Connection>> conns;
    std::vector<std::string> devices;
    for (int i = 0; i < kConnections; ++i) {
      auto conn = (*listener)->Accept(Deadline::After(20s));
      if (!conn.ok()) return Fail("server accept", conn.status());
      devices.push_back((*conn)->stats().device);
      conns.push_back(std::move(*conn));
    }
    for (int i = 0; i < kConnections; ++i) {
      auto msg = conns[i]->Receive(Deadline::After(20s));
      if (!msg.ok()) return Fail("server receive", msg.status());
      std::string got(msg->bulk_bytes, '\0');
      Status s = conns[i]->ReceiveBulk(BulkSink::ToMemory(got.data()), got.size(), Deadline::After(30s));
      if (!s.ok()) return Fail("server bulk", s);
      const uint64_t seed = std::stoull(msg->payload);
      if (got != RandomBytes(bulk, seed)) return Fail("server", Status::Corruption("bulk bytes differ"));
      s = conns[i]->Send(2, "ok");
      if (!s.ok()) return Fail("server reply", s);
    }
    if (!devices_ok(devices)) {
      std::string seen;
      for (const auto& d : devices) seen += " " + d;
      return Fail("server", Status::Internal("connections were not spread over both ports:" + seen));
    }
    for (auto& c : conns) {
      auto end = c->Receive(Deadline::After(20s));
      if (end.status().code() != StatusCode::kClosed) return Fail("server end", end.status());
    }
    return 0;
  });
  EXPECT_TRUE(WaitReady(ready[0])) << "the server process did not come up";
  close(ready[0]);
  close(ready[1]);
  pid_t client = ForkChild([&] {
    auto options =
        ChildOptions("tpc" + std::to_string(getpid()), "net_memif0,role=client,socket=" + sock_a, 10s);
    options.backend_args.push_back("--vdev=net_memif1,role=client,socket=" + sock_b);
    options.backend_args.push_back("port=0+1");
    options.backend_args.push_back("ip=10.0.0.2");
    RegisterBuiltinTransports();
    auto t = TransportRegistry::Global().Create("dpdk", options);
    if (!t.ok()) return Fail("client transport", t.status());
    auto e = ParseEndpoint(uri);
    if (!e.ok()) return Fail("client uri", e.status());
    std::vector<std::unique_ptr<Connection>> conns;
    std::vector<std::string> devices;
    Deadline deadline = Deadline::After(20s);
    while (conns.size() < kConnections) {
      auto c = (*t)->Connect(*e);  // retried until both memif links are up
      if (!c.ok()) {
        if (deadline.expired()) return Fail("client connect", c.status());
        std::this_thread::sleep_for(100ms);
        continue;
      }
      devices.push_back((*c)->stats().device);
      conns.push_back(std::move(*c));
    }
    if (!devices_ok(devices))
      return Fail("client", Status::Internal("connections not spread over both ports"));
    for (int i = 0; i < kConnections; ++i) {
      const std::string data = RandomBytes(bulk, 100 + i);
      Status s = conns[i]->SendWithBulk(1, std::to_string(100 + i), BulkSource::FromMemory(data));
      if (!s.ok()) return Fail("client send", s);
    }
    for (auto& c : conns) {
      auto reply = c->Receive(Deadline::After(30s));
      if (!reply.ok() || reply->payload != "ok") return Fail("client reply", reply.status());
      Status s = c->Shutdown();
      if (!s.ok()) return Fail("client shutdown", s);
    }
    return 0;
  });
  int cs = WaitChild(client, 60s);
  int ss = WaitChild(server, 10s);
  ExpectExitedZero(cs, "client");
  ExpectExitedZero(ss, "server");
}

// One side streams a large bulk transfer; once the receiver has 4 MiB, the
// parent SIGKILLs `victim`. The survivor must fail with Unavailable or
// Timeout within io_timeout (+ slack) of the kill; it reports the code and
// the failure time (steady clock, shared by processes) through a pipe.
void KillPeerMidTransfer(bool kill_receiver) {
  constexpr auto kIoTimeout = 2000ms;
  const std::string socket = MemifSocket(kill_receiver ? "killrx" : "killtx");
  const std::string uri = "dpdk://10.0.0.1:" + std::to_string(kServerPort);
  int progress[2], report[2], ready[2];
  ASSERT_EQ(pipe(progress), 0);
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(report), 0);
  auto send_report = [&](const Status& s) {
    uint64_t msg[2] = {static_cast<uint64_t>(s.code()), NowNanos()};
    std::fprintf(stderr, "survivor: %s\n", s.ToString().c_str());
    (void)!write(report[1], msg, sizeof(msg));
  };
  // The server receives.
  pid_t server = ForkChild([&]() -> int {
    auto listener = ListenIn(
        ChildOptions("ks" + std::to_string(getpid()), "net_memif0,role=server,socket=" + socket, kIoTimeout),
        uri);
    if (!listener.ok()) return Fail("server listen", listener.status());
    (void)!write(ready[1], "r", 1);
    auto conn = (*listener)->Accept(Deadline::After(20s));
    if (!conn.ok()) return Fail("server accept", conn.status());
    auto msg = (*conn)->Receive(Deadline::After(20s));
    if (!msg.ok()) return Fail("server receive", msg.status());
    std::string buf(1 << 20, '\0');
    for (uint64_t got = 0; got < msg->bulk_bytes; got += buf.size()) {
      if (got == (4u << 20)) (void)!write(progress[1], "p", 1);
      Status s = (*conn)->ReceiveBulk(BulkSink::ToMemory(buf.data()), buf.size(), Deadline::After(60s));
      if (!s.ok()) {
        send_report(s);
        return 0;
      }
    }
    return Fail("server", Status::Internal("the whole transfer arrived although the sender was killed"));
  });
  EXPECT_TRUE(WaitReady(ready[0])) << "the server process did not come up";
  close(ready[0]);
  close(ready[1]);
  pid_t client = ForkChild([&]() -> int {
    auto options =
        ChildOptions("kc" + std::to_string(getpid()), "net_memif0,role=client,socket=" + socket, kIoTimeout);
    auto conn = DialIn(options, uri, 20s);
    if (!conn.ok()) return Fail("client connect", conn.status());
    // 1 GiB of a sparse file: far more than moves before the kill.
    std::string path = "/tmp/canopy-dpdk-sparse-" + std::to_string(getpid());
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    ::unlink(path.c_str());
    if (fd < 0 || ::ftruncate(fd, off_t{1} << 30) != 0) return Fail("client", Status::IOError("sparse file"));
    Status s = (*conn)->SendWithBulk(1, "big", BulkSource::FromFile(fd, 0, uint64_t{1} << 30));
    if (s.ok()) return Fail("client", Status::Internal("1 GiB went out although the receiver was killed"));
    send_report(s);
    return 0;
  });
  close(progress[1]);
  close(report[1]);
  pid_t victim = kill_receiver ? server : client;
  pid_t survivor = kill_receiver ? client : server;
  char byte;
  ASSERT_EQ(read(progress[0], &byte, 1), 1) << "the transfer never reached 4 MiB";
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const uint64_t killed_at = NowNanos();
  (void)WaitChild(victim, 10s);
  uint64_t msg[2] = {0, 0};
  ssize_t n = read(report[0], msg, sizeof(msg));
  int status = WaitChild(survivor, 30s);
  close(progress[0]);
  close(report[0]);
  ExpectExitedZero(status, "survivor");
  ASSERT_EQ(n, static_cast<ssize_t>(sizeof(msg))) << "the survivor reported nothing";
  auto code = static_cast<StatusCode>(msg[0]);
  EXPECT_TRUE(code == StatusCode::kUnavailable || code == StatusCode::kTimeout) << StatusCodeName(code);
  double after_ms = (static_cast<double>(msg[1]) - static_cast<double>(killed_at)) / 1e6;
  const double limit_ms = std::chrono::duration<double, std::milli>(kIoTimeout).count() + 1500;
  EXPECT_LE(after_ms, limit_ms) << "the error came " << after_ms << " ms after the kill; io_timeout is "
                                << kIoTimeout.count() << " ms";
}

TEST(DpdkTwoProcesses, ReceiverKilledMidTransferFailsTheSenderWithinIoTimeout) { KillPeerMidTransfer(true); }
TEST(DpdkTwoProcesses, SenderKilledMidTransferFailsTheReceiverWithinIoTimeout) { KillPeerMidTransfer(false); }

// Runs Create (and a Listen) in a child with `args`; the child must exit
// normally having got a non-OK Status with a message (never exit/abort).
void ExpectCleanFailure(const std::vector<std::string>& args, StatusCode expected) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t child = ForkChild([&]() -> int {
    RegisterBuiltinTransports();
    TransportOptions o;
    o.backend_args = args;
    Status s;
    auto t = TransportRegistry::Global().Create("dpdk", o);
    if (!t.ok()) {
      s = t.status();
    } else {
      auto l = (*t)->Listen(*ParseEndpoint("dpdk://10.0.0.1:0"));
      s = l.ok() ? Status::Ok() : l.status();
    }
    std::string line = std::to_string(static_cast<int>(s.code())) + " " + s.message();
    (void)!write(pipefd[1], line.data(), line.size());
    return 0;
  });
  close(pipefd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = WaitChild(child, 30s);
  std::string what = "args:";
  for (const auto& a : args) what += " " + a;
  ExpectExitedZero(status, what);
  ASSERT_FALSE(out.empty()) << what;
  int code = std::stoi(out);
  EXPECT_EQ(code, static_cast<int>(expected)) << what << " -> " << out;
  EXPECT_GT(out.size(), 10u) << "no message: " << out;
  std::fprintf(stderr, "%s -> %s\n", what.c_str(), out.c_str());
}

TEST(DpdkBadArguments, UnknownEalOptionIsInvalidArgument) {
  ExpectCleanFailure({"--no-huge", "--definitely-not-an-eal-option"}, StatusCode::kInvalidArgument);
}
TEST(DpdkBadArguments, MalformedEalValueIsInvalidArgument) {
  ExpectCleanFailure({"--no-huge", "-m", "lots", "--no-pci"}, StatusCode::kInvalidArgument);
}
TEST(DpdkBadArguments, HelpWouldExitAndIsRefused) {
  ExpectCleanFailure({"--help"}, StatusCode::kInvalidArgument);
}
TEST(DpdkBadArguments, VdevWithoutValueIsInvalidArgument) {
  ExpectCleanFailure({"--no-huge", "--vdev"}, StatusCode::kInvalidArgument);
}
TEST(DpdkBadArguments, BadFaultProbabilityIsInvalidArgument) {
  ExpectCleanFailure({"--no-huge", "fault_drop=1.5"}, StatusCode::kInvalidArgument);
}
TEST(DpdkBadArguments, NoPortsIsNotFound) {
  ExpectCleanFailure({"--no-huge", "-m", "128", "--no-pci", "--log-level=lib.eal:warning"},
                     StatusCode::kNotFound);
}

// The rcopy binary over dpdk:// between two processes (memif): the copy is
// byte-exact, and the transport's once-per-process setup (the EAL loading
// its PMD plugins, the port) is done before the clock and reported apart as
// setup_seconds, not counted in seconds / gbit_per_s.
TEST(DpdkRcopy, CopiesOverMemifWithTheSetupOutsideTheClock) {
  canopy::testing::TempDir dir;
  const std::string socket = MemifSocket("rcopy");
  const std::string port_file = dir.File("port");
  ASSERT_EQ(::mkdir(dir.File("root").c_str(), 0755), 0);
  auto eal = [&](const std::string& prefix, const std::string& role) {
    return "--no-huge -m 256 --no-pci --log-level=lib.eal:warning --file-prefix=" + prefix +
           std::to_string(getpid()) + " --vdev=net_memif0,role=" + role + ",socket=" + socket;
  };
  const std::string rcopy = canopy::testing::BinaryPath("tools/rcopy/rcopy");
  const std::string server_eal = eal("rcs", "server");
  pid_t server = ForkChild([&]() -> int {
    ::execl(rcopy.c_str(), rcopy.c_str(), "--server", "-q", "--root", dir.File("root").c_str(), "--transport",
            "dpdk", "--bind", "10.0.0.1", "-p", "0", "--port-file", port_file.c_str(), "--idle-timeout", "20",
            "--transport-arg", server_eal.c_str(), static_cast<char*>(nullptr));
    return 91;
  });
  ASSERT_GT(server, 0);
  struct StopOnExit {
    pid_t pid;
    ~StopOnExit() {
      ::kill(pid, SIGTERM);
      (void)WaitChild(pid, 10s);
    }
  } stop{server};
  Deadline up = Deadline::After(20s);
  while (!PathExists(port_file) && !up.expired()) std::this_thread::sleep_for(10ms);
  auto port_text = ReadFileToString(port_file);
  ASSERT_TRUE(port_text.ok()) << "the rcopy server did not come up";
  const std::string port = port_text->substr(0, port_text->find('\n'));

  const std::string source = RandomBytes((size_t{6} << 20) + 3, 21);
  ASSERT_TRUE(WriteFileAtomic(dir.File("source"), source).ok());
  std::string out;
  int rc = RunCommand("{ " + rcopy + " --json --transport dpdk -p " + port + " --transport-arg '" +
                          eal("rcc", "client") + " ip=10.0.0.2' " + dir.File("source") +
                          " 10.0.0.1:copy 2>/dev/null; }",
                      &out);
  ASSERT_EQ(rc, 0) << out;
  static const nlohmann::json schema = canopy::testing::LoadJsonSchema("tools/rcopy/rcopy.schema.json");
  EXPECT_EQ(canopy::testing::JsonConforms(schema, out), "");
  auto j = nlohmann::json::parse(out);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["transport"], "dpdk");
  EXPECT_EQ(j["bytes_sent"].get<uint64_t>(), source.size());
  // Bringing up the EAL takes a measurable time in any build; it is not in seconds.
  EXPECT_GT(j["setup_seconds"].get<double>(), 0.0);
  EXPECT_GT(j["seconds"].get<double>(), 0.0);
  const double bits = static_cast<double>(source.size()) * 8;
  EXPECT_NEAR(j["gbit_per_s"].get<double>(), bits / j["seconds"].get<double>() / 1e9, 1e-6);
  auto copied = ReadFileToString(dir.File("root/copy"));
  ASSERT_TRUE(copied.ok()) << copied.status().ToString();
  EXPECT_TRUE(*copied == source) << "the copy differs from the source";
}

// ---- net_af_packet on a veth pair between two namespaces ----

std::string NetnsUnavailable() {
  if (geteuid() != 0) return "needs root to create network namespaces";
  if (RunCommand("ip netns list >/dev/null 2>&1") != 0) return "`ip netns` is not available";
  return "";
}

class VethTestbed {
 public:
  // mtu: of both veth ends (0: the kernel's default).
  explicit VethTestbed(int mtu = 0) {
    std::string id = std::to_string(getpid());
    ns_a_ = "cdpdk" + id + "a";
    ns_b_ = "cdpdk" + id + "b";
    if_a_ = "cdk" + id + "a";
    if_b_ = "cdk" + id + "b";
    std::string cmd = "set -e; ip netns add " + ns_a_ + "; ip netns add " + ns_b_ + "; ip link add " + if_a_ +
                      " type veth peer name " + if_b_ + "; ip link set " + if_a_ + " netns " + ns_a_ +
                      "; ip link set " + if_b_ + " netns " + ns_b_ + "; ip -n " + ns_a_ + " link set " +
                      if_a_ + " up; ip -n " + ns_b_ + " link set " + if_b_ + " up";
    if (mtu > 0) {
      cmd += "; ip -n " + ns_a_ + " link set " + if_a_ + " mtu " + std::to_string(mtu) + "; ip -n " + ns_b_ +
             " link set " + if_b_ + " mtu " + std::to_string(mtu);
    }
    ok_ = RunCommand(cmd, &output_) == 0;
  }
  ~VethTestbed() {
    RunCommand("ip netns del " + ns_a_ + " 2>/dev/null; ip netns del " + ns_b_ + " 2>/dev/null");
  }
  bool ok() const { return ok_; }
  const std::string& output() const { return output_; }
  std::string ns_a_, ns_b_, if_a_, if_b_;

 private:
  bool ok_ = false;
  std::string output_;
};

int EnterNetns(const std::string& name) {
  int fd = ::open(("/var/run/netns/" + name).c_str(), O_RDONLY);
  if (fd < 0) return -1;
  int rc = setns(fd, CLONE_NEWNET);
  ::close(fd);
  return rc;
}

TEST(DpdkAfPacket, CopyOverVethBetweenNamespaces) {
  std::string why = NetnsUnavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  VethTestbed bed;
  if (!bed.ok()) GTEST_SKIP() << "cannot build the veth testbed here: " << bed.output();
  const std::string uri = "dpdk://10.9.0.1:" + std::to_string(kServerPort);
  const size_t bulk = size_t{16} << 20;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t server = ForkChild([&]() -> int {
    if (EnterNetns(bed.ns_a_) != 0) return Fail("server", Status::IOError("setns"));
    return ServeCopy(ChildOptions("afs" + std::to_string(getpid()), "net_af_packet0,iface=" + bed.if_a_, 10s),
                     uri, bulk, 11, ready[1]);
  });
  EXPECT_TRUE(WaitReady(ready[0])) << "the server process did not come up";
  close(ready[0]);
  close(ready[1]);
  pid_t client = ForkChild([&]() -> int {
    if (EnterNetns(bed.ns_b_) != 0) return Fail("client", Status::IOError("setns"));
    auto options = ChildOptions("afc" + std::to_string(getpid()), "net_af_packet0,iface=" + bed.if_b_, 10s);
    options.backend_args.push_back("ip=10.9.0.2");
    return ClientCopy(options, uri, bulk, 11);
  });
  int cs = WaitChild(client, 60s);
  int ss = WaitChild(server, 10s);
  ExpectExitedZero(cs, "client");
  ExpectExitedZero(ss, "server");
}

// Jumbo frames on af_packet (framesz=16384 ring frames, veth MTU 9000), with
// a 1 MiB send ring that wraps 16 times: 64 messages of an odd length (32-byte
// frame header + 3-byte label + 256 KiB), each flushed, so segments start at
// odd stream offsets and frames whose payload spans the wrap carry pieces of
// odd length. Their UDP checksum must still be right, or the receiver drops
// them on every retransmission and the copy stalls. The port must leave the
// kernel interface's MTU alone.
TEST(DpdkAfPacket, JumboFramesAcrossSendRingWrapsOverVeth) {
  std::string why = NetnsUnavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  VethTestbed bed(9000);
  if (!bed.ok()) GTEST_SKIP() << "cannot build the veth testbed with MTU 9000 here: " << bed.output();
  const std::string uri = "dpdk://10.9.0.1:" + std::to_string(kServerPort);
  const size_t bulk = size_t{16} << 20;
  const std::string label = "odd";
  const std::string vdev_opts = ",framesz=16384,blocksz=16384";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t server = ForkChild([&]() -> int {
    if (EnterNetns(bed.ns_a_) != 0) return Fail("server", Status::IOError("setns"));
    auto options = ChildOptions("ajs" + std::to_string(getpid()), "net_af_packet0,iface=" + bed.if_a_ + vdev_opts, 10s);
    return ServeCopy(options, uri, bulk, 13, ready[1], label, 64);
  });
  EXPECT_TRUE(WaitReady(ready[0])) << "the server process did not come up";
  close(ready[0]);
  close(ready[1]);
  pid_t client = ForkChild([&]() -> int {
    if (EnterNetns(bed.ns_b_) != 0) return Fail("client", Status::IOError("setns"));
    auto options = ChildOptions("ajc" + std::to_string(getpid()), "net_af_packet0,iface=" + bed.if_b_ + vdev_opts, 10s);
    options.backend_args.push_back("ip=10.9.0.2");
    options.max_inflight_bytes = 1 << 20;
    return ClientCopy(options, uri, bulk, 13, label, 64);
  });
  int cs = WaitChild(client, 60s);
  int ss = WaitChild(server, 10s);
  ExpectExitedZero(cs, "client");
  ExpectExitedZero(ss, "server");
  std::string mtu;
  ASSERT_EQ(RunCommand("ip netns exec " + bed.ns_a_ + " cat /sys/class/net/" + bed.if_a_ + "/mtu", &mtu), 0);
  EXPECT_EQ(mtu.substr(0, mtu.find('\n')), "9000") << "the dpdk:// port changed the interface's MTU";
}

}  // namespace
}  // namespace canopy::transport
