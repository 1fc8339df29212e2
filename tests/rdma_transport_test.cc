// The rdma:// backend end to end: the shared conformance suite and an rcopy
// round trip when this host has an RDMA device (GTEST_SKIP with the reason
// otherwise), the one-sided log ring (transport/rdma/log_ring.h) between two
// rdma:// connection ends, and, when it has none, the clear NotSupported failure of the
// registry, of `rcopy --transport rdma` and of `canopy node --listen rdma://`.
//
// The address used on a device host: $CANOPY_RDMA_TEST_ADDR if set, else the
// first IPv4 address of the first device's network interface (RoCE netdev or
// IPoIB), found through /sys/class/infiniband.
#include "transport/rdma/rdma_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <fstream>
#include <string>
#include <thread>

#include "base/file.h"
#include "tests/testing/test_util.h"
#include "tests/transport_conformance.h"
#include "transport/builtin.h"
#include "transport/rdma/log_ring.h"
#include "transport/rdma/one_sided_stream.h"
#include "transport/registry.h"

namespace canopy::transport {
namespace {

using namespace std::chrono_literals;
using ::canopy::testing::BinaryPath;
using ::canopy::testing::RandomBytes;
using ::canopy::testing::RunCommand;
using ::canopy::testing::TempDir;
using ::canopy::transport::testing::ConformanceBackend;
using ::canopy::transport::testing::TransportConformanceTest;

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Network interfaces that belong to RDMA device `dev`.
std::vector<std::string> NetdevsOf(const std::string& dev) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  const fs::path base = fs::path("/sys/class/infiniband") / dev;
  // RoCE / rxe: the GID table names its netdev.
  for (const char* p : {"ports/1/gid_attrs/ndevs/0", "ports/1/gid_attrs/ndevs/1"}) {
    const std::string name = ReadFirstLine((base / p).string());
    if (!name.empty()) names.push_back(name);
  }
  // IPoIB and most NIC drivers: device/net/<ifname>.
  for (const auto& entry : fs::directory_iterator(base / "device" / "net", ec)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

std::string FirstIpv4Of(const std::vector<std::string>& netdevs) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (const std::string& want : netdevs) {
    for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || want != i->ifa_name) continue;
      char text[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
      found = text;
    }
    if (!found.empty()) break;
  }
  freeifaddrs(list);
  return found;
}

// The address tests listen on, or empty when none could be found.
std::string RdmaTestAddress() {
  if (const char* env = std::getenv("CANOPY_RDMA_TEST_ADDR"); env != nullptr && *env != '\0') return env;
  const std::vector<std::string> devices = RdmaDeviceNames();
  if (devices.empty()) return "";
  return FirstIpv4Of(NetdevsOf(devices.front()));
}

// Why the device tests cannot run here; empty when they can.
std::string DeviceSkipReason() {
  if (RdmaDeviceNames().empty()) {
    return "no RDMA device on this host (ibv_get_device_list returned none); create Soft-RoCE with "
           "hw/soft-roce.sh add IFACE or run on an InfiniBand/RoCE host (hw/RDMA.md)";
  }
  if (RdmaTestAddress().empty()) {
    return "RDMA device present but no IPv4 address found on its netdev; set CANOPY_RDMA_TEST_ADDR";
  }
  return "";
}

ConformanceBackend RdmaBackend(std::string name, std::vector<std::string> args) {
  ConformanceBackend backend;
  backend.name = std::move(name);
  const std::string address = RdmaTestAddress();
  backend.listen_uri = "rdma://" + (address.empty() ? std::string("127.0.0.1") : address) + ":0";
  backend.listener_options.connect_timeout = ::canopy::testing::ScaledBound(3s);
  backend.dialer_options.connect_timeout = ::canopy::testing::ScaledBound(3s);
  backend.listener_options.backend_args = args;
  backend.dialer_options.backend_args = args;
  backend.skip_reason = DeviceSkipReason;
  return backend;
}

INSTANTIATE_TEST_SUITE_P(Rdma, TransportConformanceTest,
                         ::testing::Values(RdmaBackend("event_mode", {}),
                                           RdmaBackend("busy_poll_small_slots",
                                                       {"cq_mode=poll", "slot_bytes=8192",
                                                        "eager_bulk=4096"})),
                         ::canopy::transport::testing::ConformanceBackendName);

// The fault-injection wrapper over rdma:// with no faults must be invisible too.
ConformanceBackend FaultRdmaBackend() {
  ConformanceBackend backend = RdmaBackend("fault_rdma_no_faults", {});
  backend.listen_uri = "fault+" + backend.listen_uri;
  return backend;
}

INSTANTIATE_TEST_SUITE_P(FaultRdma, TransportConformanceTest, ::testing::Values(FaultRdmaBackend()),
                         ::canopy::transport::testing::ConformanceBackendName);

// --- no device: clear NotSupported everywhere -------------------------------

bool HasDevice() { return !RdmaDeviceNames().empty(); }
constexpr const char* kHasDevice = "an RDMA device is present, so the no-device path does not run here";

void ExpectNoDeviceMessage(const Status& status) {
  EXPECT_EQ(status.code(), StatusCode::kNotSupported) << status.ToString();
  EXPECT_NE(status.message().find("no RDMA device found (ibv_get_device_list returned none)"),
            std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("rdma link add rxe0 type rxe netdev IFACE"), std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("hw/RDMA.md"), std::string::npos) << status.ToString();
}

TEST(RdmaTransport, IsBuiltInAndListed) {
  RegisterBuiltinTransports();
  bool listed = false;
  for (const auto& entry : TransportRegistry::Global().List()) {
    if (entry.scheme == "rdma") {
      listed = true;
      EXPECT_TRUE(entry.available) << "built with rdma-core, so the backend is registered: "
                                   << entry.description;
    }
  }
  EXPECT_TRUE(listed);
}

TEST(RdmaTransport, FactoryFailsWithoutDevice) {
  if (HasDevice()) GTEST_SKIP() << kHasDevice;
  RegisterBuiltinTransports();
  auto transport = TransportRegistry::Global().Create("rdma", TransportOptions{});
  ASSERT_FALSE(transport.ok());
  ExpectNoDeviceMessage(transport.status());
  auto listener = ListenOn("rdma://127.0.0.1:0", TransportOptions{});
  ASSERT_FALSE(listener.ok());
  ExpectNoDeviceMessage(listener.status());
  auto connection = Dial("rdma://127.0.0.1:7471", TransportOptions{});
  ASSERT_FALSE(connection.ok());
  ExpectNoDeviceMessage(connection.status());
}

TEST(RdmaTransport, BadOptionsAreRejectedBeforeTheDeviceCheck) {
  RegisterBuiltinTransports();
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"cq_mode=sometimes"}, {"slot_bytes=12"}, {"slot_bytes=abc"}, {"colour=blue"}, {"device"}}) {
    TransportOptions options;
    options.backend_args = args;
    auto transport = TransportRegistry::Global().Create("rdma", options);
    ASSERT_FALSE(transport.ok()) << args[0];
    EXPECT_EQ(transport.status().code(), StatusCode::kInvalidArgument) << transport.status().ToString();
  }
}

// Runs `command` (stdout+stderr captured) and checks it fails with the message.
void ExpectCommandFailsWithNoDevice(const std::string& command) {
  std::string output;
  const int rc = RunCommand("timeout 20 " + command + " 2>&1", &output);
  EXPECT_NE(rc, 0) << command << "\n" << output;
  EXPECT_NE(rc, 124) << "timed out instead of failing at once: " << command << "\n" << output;
  EXPECT_NE(output.find("no RDMA device found"), std::string::npos) << command << "\n" << output;
  EXPECT_NE(output.find("rdma link add rxe0 type rxe netdev IFACE"), std::string::npos) << command << "\n"
                                                                                        << output;
}

TEST(RdmaTransport, RcopyFailsClearlyWithoutDevice) {
  if (HasDevice()) GTEST_SKIP() << kHasDevice;
  const std::string rcopy = BinaryPath("tools/rcopy/rcopy");
  if (access(rcopy.c_str(), X_OK) != 0) GTEST_SKIP() << "rcopy is not built in this tree (" << rcopy << ")";
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.File("src"), "some bytes").ok());
  ExpectCommandFailsWithNoDevice(rcopy + " " + dir.File("src") +
                                 " 127.0.0.1:copy --transport rdma --port 7471");
  ExpectCommandFailsWithNoDevice(rcopy + " --server --root " + dir.path() + " --transport rdma --port 0");
}

TEST(RdmaTransport, CanopyNodeFailsClearlyWithoutDevice) {
  if (HasDevice()) GTEST_SKIP() << kHasDevice;
  const std::string canopy = BinaryPath("tools/canopy/canopy");
  if (access(canopy.c_str(), X_OK) != 0)
    GTEST_SKIP() << "canopy is not built in this tree (" << canopy << ")";
  TempDir dir;
  ExpectCommandFailsWithNoDevice(canopy + " node --listen rdma://127.0.0.1:0 --data " + dir.File("data") +
                                 " --cluster rdmatest --secret rdma-test-secret-0123456789");
}

// --- device: rcopy round trip -----------------------------------------------

TEST(RdmaTransport, RcopyRoundTripOverRdma) {
  if (std::string why = DeviceSkipReason(); !why.empty()) GTEST_SKIP() << why;
  const std::string rcopy = BinaryPath("tools/rcopy/rcopy");
  if (access(rcopy.c_str(), X_OK) != 0) GTEST_SKIP() << "rcopy is not built in this tree (" << rcopy << ")";
  const std::string address = RdmaTestAddress();
  TempDir dir;
  ASSERT_TRUE(CreateDirs(dir.File("root")).ok());
  const std::string contents = RandomBytes((size_t{48} << 20) + 12345, 77);
  ASSERT_TRUE(WriteFileAtomic(dir.File("src"), contents).ok());
  const std::string port_file = dir.File("port");
  pid_t server = fork();
  ASSERT_GE(server, 0);
  if (server == 0) {
    execl(rcopy.c_str(), rcopy.c_str(), "--server", "--root", dir.File("root").c_str(), "--transport", "rdma",
          "--bind", address.c_str(), "--port", "0", "--port-file", port_file.c_str(), "--quiet",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string port;
  for (int i = 0; i < 200 && port.empty(); ++i) {
    std::this_thread::sleep_for(50ms);
    port = ReadFirstLine(port_file);
  }
  std::string output;
  int rc = -1;
  if (!port.empty()) {
    rc = RunCommand("timeout 60 " + rcopy + " " + dir.File("src") + " " + address +
                        ":copy --transport rdma --port " + port + " --verify --chunk 4M -P 2 2>&1",
                    &output);
  }
  kill(server, SIGTERM);
  EXPECT_NE(::canopy::testing::WaitChild(server, 10s), -1);
  ASSERT_FALSE(port.empty()) << "rcopy server did not write its port";
  ASSERT_EQ(rc, 0) << output;
  auto copied = ReadFileToString(dir.File("root/copy"));
  ASSERT_TRUE(copied.ok()) << copied.status().ToString();
  EXPECT_TRUE(*copied == contents) << "copied file differs (" << copied->size() << " bytes)";
}

// --- one-sided log ring (transport/rdma/log_ring.h) -------------------------

using rdma::DecodeFeedbackTarget;
using rdma::DecodeRingOffer;
using rdma::EncodeFeedbackTarget;
using rdma::EncodeRingOffer;
using rdma::LogRingReceiver;
using rdma::LogRingWriter;
using rdma::RingOffer;

constexpr uint16_t kOfferType = 0x7e01;
constexpr uint16_t kTargetType = 0x7e02;

// Both ends of one connection on `uri`'s scheme (accepted end = server).
struct ConnectedPair {
  std::shared_ptr<Transport> transport;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> client;
  std::unique_ptr<Connection> server;
};

Result<ConnectedPair> ConnectOver(const std::string& uri) {
  RegisterBuiltinTransports();
  CANOPY_ASSIGN_OR_RETURN(Endpoint endpoint, ParseEndpoint(uri));
  TransportOptions options;
  options.connect_timeout = ::canopy::testing::ScaledBound(3s);
  ConnectedPair pair;
  CANOPY_ASSIGN_OR_RETURN(pair.transport, TransportRegistry::Global().Create(endpoint.scheme, options));
  CANOPY_ASSIGN_OR_RETURN(pair.listener, pair.transport->Listen(endpoint));
  std::optional<Result<std::unique_ptr<Connection>>> accepted;
  std::thread acceptor(
      [&] { accepted.emplace(pair.listener->Accept(Deadline::After(::canopy::testing::ScaledBound(5s)))); });
  auto client = pair.transport->Connect(pair.listener->local_endpoint());
  if (!client.ok()) pair.listener->Close();
  acceptor.join();
  if (!client.ok()) return client.status().WithContext("Connect");
  if (!accepted->ok()) return accepted->status().WithContext("Accept");
  pair.client = std::move(*client);
  pair.server = std::move(**accepted);
  return pair;
}

Deadline RingDeadline() { return Deadline::After(::canopy::testing::ScaledBound(10s)); }

// The offer goes server -> client, the feedback target back, both over the connection itself.
Result<std::unique_ptr<LogRingWriter>> HandShake(ConnectedPair& pair, LogRingReceiver& ring) {
  CANOPY_RETURN_IF_ERROR(pair.server->Send(kOfferType, EncodeRingOffer(ring.offer())));
  CANOPY_ASSIGN_OR_RETURN(Message offer_message, pair.client->Receive(RingDeadline()));
  if (offer_message.type != kOfferType) return Status::Corruption("expected the ring offer");
  CANOPY_ASSIGN_OR_RETURN(RingOffer offer, DecodeRingOffer(offer_message.payload));
  CANOPY_ASSIGN_OR_RETURN(std::unique_ptr<LogRingWriter> writer, LogRingWriter::Create(*pair.client, offer));
  CANOPY_RETURN_IF_ERROR(pair.client->Send(kTargetType, EncodeFeedbackTarget(writer->feedback_target())));
  CANOPY_ASSIGN_OR_RETURN(Message target_message, pair.server->Receive(RingDeadline()));
  if (target_message.type != kTargetType) return Status::Corruption("expected the feedback target");
  CANOPY_ASSIGN_OR_RETURN(rdma::FeedbackTarget target, DecodeFeedbackTarget(target_message.payload));
  CANOPY_RETURN_IF_ERROR(ring.AttachWriter(target));
  return writer;
}

std::string RecordPayload(int i) {
  const size_t length = static_cast<size_t>(i * 37 % 150);
  std::string payload(length, '\0');
  for (size_t j = 0; j < length; ++j) payload[j] = static_cast<char>('a' + (i + j) % 26);
  return payload;
}

std::string RdmaRingUri() { return "rdma://" + RdmaTestAddress() + ":0"; }

TEST(RdmaLogRing, NeedsAnRdmaConnection) {
  auto pair = ConnectOver("tcp://127.0.0.1:0");
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  auto ring = LogRingReceiver::Create(*pair->server, 4096, 1);
  ASSERT_EQ(ring.status().code(), StatusCode::kNotSupported) << ring.status().ToString();
  EXPECT_NE(ring.status().message().find("needs a plain rdma:// connection"), std::string::npos);
  auto writer = LogRingWriter::Create(*pair->client, RingOffer{4096, 1, 4096, 1});
  EXPECT_EQ(writer.status().code(), StatusCode::kNotSupported) << writer.status().ToString();
}

TEST(RdmaLogRing, RecordsArriveInOrderAcrossWraparound) {
  if (std::string why = DeviceSkipReason(); !why.empty()) GTEST_SKIP() << why;
  auto pair = ConnectOver(RdmaRingUri());
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  EXPECT_EQ(LogRingReceiver::Create(*pair->server, 100, 1).status().code(), StatusCode::kInvalidArgument);
  auto ring = LogRingReceiver::Create(*pair->server, 512, 1);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  auto writer = HandShake(*pair, **ring);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  EXPECT_EQ((*writer)->Append(std::string(600, 'x'), RingDeadline()).code(), StatusCode::kInvalidArgument);

  // 300 records of 0..149 bytes through 512 bytes: many laps, with pads and silent skips.
  constexpr int kRecords = 300;
  Status written;
  std::thread producer([&] {
    for (int i = 0; i < kRecords && written.ok(); ++i) written = (*writer)->Append(RecordPayload(i), RingDeadline());
    if (written.ok()) written = (*writer)->WaitDurable(kRecords, RingDeadline());
  });
  for (int i = 0; i < kRecords; ++i) {
    auto record = (*ring)->Wait(RingDeadline());
    ASSERT_TRUE(record.ok()) << "record " << i << ": " << record.status().ToString();
    ASSERT_EQ(std::string(*record), RecordPayload(i)) << "record " << i;
    ASSERT_TRUE((*ring)->Release().ok());
    ASSERT_TRUE((*ring)->ReportDurable(i + 1).ok());
  }
  producer.join();
  ASSERT_TRUE(written.ok()) << written.ToString();
  EXPECT_EQ((*writer)->durable_version(), static_cast<uint64_t>(kRecords));
  EXPECT_EQ((*ring)->records_received(), static_cast<uint64_t>(kRecords));
  auto none = (*ring)->Poll();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_TRUE((*writer)->Flush(RingDeadline()).ok());
}

TEST(RdmaLogRing, FullRingHoldsTheWriterUntilTheReceiverReleases) {
  if (std::string why = DeviceSkipReason(); !why.empty()) GTEST_SKIP() << why;
  auto pair = ConnectOver(RdmaRingUri());
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  auto ring = LogRingReceiver::Create(*pair->server, 256, 1);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  auto writer = HandShake(*pair, **ring);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  // Records of 16 payload bytes take 48 bytes: five fill 240 of the 256.
  auto payload = [](int i) { return std::string(16, static_cast<char>('A' + i)); };
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*writer)->Append(payload(i), RingDeadline()).ok()) << i;
  Status full = (*writer)->Append(payload(5), Deadline::After(200ms));
  ASSERT_EQ(full.code(), StatusCode::kTimeout) << full.ToString();
  EXPECT_NE(full.message().find("log ring full"), std::string::npos) << full.ToString();

  // One release frees 48 bytes: the next record skips the last 16 and goes to offset 0.
  auto first = (*ring)->Wait(RingDeadline());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(std::string(*first), payload(0));
  ASSERT_TRUE((*ring)->Release().ok());
  Status resumed = (*writer)->Append(payload(5), RingDeadline());
  ASSERT_TRUE(resumed.ok()) << resumed.ToString();
  for (int i = 1; i <= 5; ++i) {
    auto record = (*ring)->Wait(RingDeadline());
    ASSERT_TRUE(record.ok()) << i << ": " << record.status().ToString();
    EXPECT_EQ(std::string(*record), payload(i));
    ASSERT_TRUE((*ring)->Release().ok());
  }
}

TEST(RdmaLogRing, RevocationFencesTheStaleWriter) {
  if (std::string why = DeviceSkipReason(); !why.empty()) GTEST_SKIP() << why;
  auto pair = ConnectOver(RdmaRingUri());
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  auto ring = LogRingReceiver::Create(*pair->server, 1024, 1);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  auto stale = HandShake(*pair, **ring);
  ASSERT_TRUE(stale.ok()) << stale.status().ToString();
  ASSERT_TRUE((*stale)->Append("epoch 1", RingDeadline()).ok());
  auto first = (*ring)->Wait(RingDeadline());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, "epoch 1");
  ASSERT_TRUE((*ring)->Release().ok());

  const uint32_t old_rkey = (*ring)->offer().rkey;
  EXPECT_EQ((*ring)->Revoke(1).status().code(), StatusCode::kInvalidArgument);
  auto renewed = (*ring)->Revoke(2);
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  EXPECT_EQ(renewed->epoch, 2u);
  EXPECT_NE(renewed->rkey, old_rkey);
  // The stale writer's target belongs to epoch 1.
  EXPECT_EQ((*ring)->AttachWriter((*stale)->feedback_target()).code(), StatusCode::kInvalidArgument);

  // The writer of epoch 2 gets the new offer over the connection and is served.
  auto current = HandShake(*pair, **ring);
  ASSERT_TRUE(current.ok()) << current.status().ToString();
  EXPECT_EQ((*current)->epoch(), 2u);
  ASSERT_TRUE((*current)->Append("epoch 2", RingDeadline()).ok());
  auto second = (*ring)->Wait(RingDeadline());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(*second, "epoch 2");
  ASSERT_TRUE((*ring)->Release().ok());
  ASSERT_TRUE((*current)->Flush(RingDeadline()).ok());

  // The stale writer's WRITE is refused by the receiver's NIC: a clear error, nothing lands.
  Status write = (*stale)->Append("stale epoch 1", RingDeadline());
  if (write.ok()) write = (*stale)->Flush(RingDeadline());
  ASSERT_EQ(write.code(), StatusCode::kPermissionDenied) << write.ToString();
  EXPECT_NE(write.message().find("revoked"), std::string::npos) << write.ToString();
  auto nothing = (*ring)->Poll();
  ASSERT_TRUE(nothing.ok()) << nothing.status().ToString();
  EXPECT_FALSE(nothing->has_value());
  EXPECT_EQ((*ring)->records_received(), 2u);
}

// ---------------------------------------------------------------------------
// One-sided stream: a Connection over two log rings (one_sided_stream.h).

using rdma::OneSidedOptions;
using rdma::SupportsOneSided;
using rdma::UpgradeToOneSided;

struct OneSidedPair {
  ConnectedPair pair;
  std::unique_ptr<Connection> client;  // over pair.client
  std::unique_ptr<Connection> server;  // over pair.server
};

// Both ends upgrade at once (each sends its offer, then reads the peer's).
Result<OneSidedPair> UpgradeBoth(ConnectedPair pair, uint64_t client_ring, uint64_t server_ring) {
  OneSidedPair out;
  out.pair = std::move(pair);
  std::optional<Result<std::unique_ptr<Connection>>> server;
  std::thread t([&] {
    server.emplace(UpgradeToOneSided(*out.pair.server, OneSidedOptions{server_ring, 3, std::chrono::microseconds(200)},
                                     RingDeadline()));
  });
  auto client =
      UpgradeToOneSided(*out.pair.client, OneSidedOptions{client_ring, 3, std::chrono::microseconds(200)}, RingDeadline());
  if (!client.ok()) out.pair.client->Close();
  t.join();
  if (!client.ok()) return client.status().WithContext("client upgrade");
  if (!server->ok()) return server->status().WithContext("server upgrade");
  out.client = std::move(*client);
  out.server = std::move(**server);
  return out;
}

std::string StreamPayload(int i) { return std::string(static_cast<size_t>(i * 37 % 1500), static_cast<char>('a' + i % 26)); }

TEST(RdmaOneSidedStream, NeedsAnRdmaConnection) {
  auto pair = ConnectOver("tcp://127.0.0.1:0");
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  EXPECT_FALSE(SupportsOneSided(*pair->client));
  auto up = UpgradeToOneSided(*pair->client, OneSidedOptions{}, RingDeadline());
  ASSERT_EQ(up.status().code(), StatusCode::kNotSupported) << up.status().ToString();
  EXPECT_NE(up.status().message().find("plain rdma:// connection"), std::string::npos);
}

TEST(RdmaOneSidedStream, MessagesKeepTheirOrderAcrossRingStreamAndBulk) {
  if (std::string why = DeviceSkipReason(); !why.empty()) GTEST_SKIP() << why;
  auto connected = ConnectOver(RdmaRingUri());
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  EXPECT_TRUE(SupportsOneSided(*connected->client));
  // The server's ring of 4 KiB carries messages up to 992 bytes inline; larger ones
  // go on the stream behind a marker. The client's ring of 8 KiB holds every answer.
  auto both = UpgradeBoth(std::move(*connected), 8192, 4096);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  constexpr int kMessages = 120;
  const std::string bulk = RandomBytes(64 << 10, 7);
  Status sent;
  std::thread producer([&] {
    for (int i = 0; i < kMessages && sent.ok(); ++i) {
      if (i == kMessages / 2) {
        sent = both->client->SendWithBulk(0x7e10, "bulk follows", BulkSource::FromMemory(bulk));
        if (!sent.ok()) break;
      }
      sent = both->client->Send(static_cast<uint16_t>(0x7e00 + i % 16), StreamPayload(i));
    }
    if (sent.ok()) sent = both->client->Shutdown();
  });
  for (int i = 0; i < kMessages; ++i) {
    if (i == kMessages / 2) {
      auto m = both->server->Receive(RingDeadline());
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      EXPECT_EQ(m->type, 0x7e10);
      EXPECT_EQ(m->payload, "bulk follows");
      ASSERT_EQ(m->bulk_bytes, bulk.size());
      std::string got(bulk.size(), '\0');
      ASSERT_TRUE(both->server->ReceiveBulk(BulkSink::ToMemory(got.data()), got.size(), RingDeadline()).ok());
      EXPECT_EQ(got, bulk);
    }
    auto m = both->server->Receive(RingDeadline());
    ASSERT_TRUE(m.ok()) << "message " << i << ": " << m.status().ToString();
    EXPECT_EQ(m->type, 0x7e00 + i % 16) << i;
    ASSERT_EQ(m->payload, StreamPayload(i)) << i;
    // The other direction runs at the same time: an answer per message.
    ASSERT_TRUE(both->server->Send(0x7e20, std::to_string(i)).ok());
  }
  auto end = both->server->Receive(RingDeadline());
  EXPECT_EQ(end.status().code(), StatusCode::kClosed) << end.status().ToString();
  producer.join();
  ASSERT_TRUE(sent.ok()) << sent.ToString();
  for (int i = 0; i < kMessages; ++i) {
    auto answer = both->client->Receive(RingDeadline());
    ASSERT_TRUE(answer.ok()) << i << ": " << answer.status().ToString();
    EXPECT_EQ(answer->payload, std::to_string(i));
  }
  EXPECT_EQ(both->client->Receive(Deadline::After(50ms)).status().code(), StatusCode::kTimeout);
  EXPECT_GE(both->client->stats().messages_sent, static_cast<uint64_t>(kMessages));
}

TEST(RdmaOneSidedStream, PeerThatGoesAwayIsUnavailable) {
  if (std::string why = DeviceSkipReason(); !why.empty()) GTEST_SKIP() << why;
  auto connected = ConnectOver(RdmaRingUri());
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  auto both = UpgradeBoth(std::move(*connected), 4096, 4096);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  ASSERT_TRUE(both->client->Send(0x7e01, "last words").ok());
  auto first = both->server->Receive(RingDeadline());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->payload, "last words");
  // The client goes away abruptly: its rings and its connection.
  both->client.reset();
  both->pair.client.reset();
  const auto start = std::chrono::steady_clock::now();
  auto gone = both->server->Receive(RingDeadline());
  EXPECT_EQ(gone.status().code(), StatusCode::kUnavailable) << gone.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, ::canopy::testing::ScaledBound(5s));
}

TEST(RdmaOneSidedStream, DestroyedEndFencesItsStaleWriter) {
  if (std::string why = DeviceSkipReason(); !why.empty()) GTEST_SKIP() << why;
  auto connected = ConnectOver(RdmaRingUri());
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  auto both = UpgradeBoth(std::move(*connected), 4096, 4096);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  ASSERT_TRUE(both->client->Send(0x7e01, "before").ok());
  auto before = both->server->Receive(RingDeadline());
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  // The server gives the stream up: its ring is deregistered, the connection stays.
  both->server.reset();
  Status stale;
  for (int i = 0; i < 64 && stale.ok(); ++i) {
    stale = both->client->Send(0x7e01, "stale " + std::to_string(i));
    if (stale.ok()) std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(stale.code(), StatusCode::kPermissionDenied) << stale.ToString();
  EXPECT_NE(stale.message().find("revoked"), std::string::npos) << stale.ToString();
}

}  // namespace
}  // namespace canopy::transport
