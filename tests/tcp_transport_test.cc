// The TCP backend: the shared conformance suite (IPv4, IPv6, small socket
// buffers, Nagle on with the copying file path) plus what only TCP can be
// asked: corrupt frames written by a raw socket, resets, killed peer
// processes, send io_timeout, connect timeout, URI parameters, the registry
// and Dial/ListenOn.

#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "base/coding.h"
#include "base/crc32c.h"
#include "base/file.h"
#include "tests/testing/test_util.h"
#include "tests/transport_conformance.h"
#include "transport/builtin.h"
#include "transport/frame.h"
#include "transport/registry.h"

namespace canopy::transport {
namespace {

using namespace std::chrono_literals;
using ::canopy::testing::RandomBytes;
using ::canopy::testing::TempDir;
using testing::ConformanceBackend;
using testing::TransportConformanceTest;

std::string Ipv6Unavailable() {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return "no IPv6 sockets on this host";
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::close(fd);
  return rc == 0 ? "" : "cannot bind [::1] on this host (IPv6 loopback disabled)";
}

ConformanceBackend SmallBuffers() {
  ConformanceBackend backend{"ipv4_small_buffers", "tcp://127.0.0.1:0", {}, {}, {}};
  backend.listener_options.buffer_bytes = 64 << 10;
  backend.dialer_options.buffer_bytes = 64 << 10;
  return backend;
}

INSTANTIATE_TEST_SUITE_P(
    Tcp, TransportConformanceTest,
    ::testing::Values(ConformanceBackend{"ipv4", "tcp://127.0.0.1:0", {}, {}, {}},
                      ConformanceBackend{"ipv6", "tcp://[::1]:0", {}, {}, Ipv6Unavailable},
                      ConformanceBackend{
                          "ipv4_nodelay_off_copying", "tcp://127.0.0.1:0?nodelay=0&zerocopy=0", {}, {}, {}},
                      SmallBuffers()),
    testing::ConformanceBackendName);

constexpr auto kLimit = 20s;

std::shared_ptr<Transport> MakeTcp(const TransportOptions& options = {}) {
  auto transport = CreateTcpTransport(options);
  EXPECT_TRUE(transport.ok()) << transport.status().ToString();
  return transport.ok() ? *transport : nullptr;
}

// A plain blocking socket connected to `endpoint`, for writing raw bytes.
UniqueFd RawConnect(const Endpoint& endpoint) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(endpoint.port);
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return UniqueFd();
  return fd;
}

std::string Frame(uint16_t type, std::string_view payload, uint64_t bulk_len = 0) {
  char header[kFrameHeaderSize];
  EncodeFrameHeader(header, type, payload, bulk_len);
  return std::string(header, kFrameHeaderSize) + std::string(payload);
}

void RefreshHeaderCrc(std::string* frame) {
  EncodeFixed32(frame->data() + 28, crc32c::Value(frame->data(), 28));
}

class TcpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport_ = MakeTcp(options_);
    ASSERT_TRUE(transport_);
    auto listener = transport_->Listen(*ParseEndpoint("tcp://127.0.0.1:0"));
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_ = std::move(*listener);
    endpoint_ = listener_->local_endpoint();
  }

  // Writes `bytes` from a raw socket, then returns the accepted connection's
  // next Receive result. The raw socket stays open (in raw_) unless close_after.
  Result<Message> ReceiveRaw(std::string_view bytes, bool close_after = false,
                             std::chrono::milliseconds deadline = 5s) {
    raw_ = RawConnect(endpoint_);
    EXPECT_TRUE(raw_.valid());
    EXPECT_TRUE(WriteAll(raw_.get(), bytes.data(), bytes.size(), "raw").ok());
    if (close_after) raw_.Reset();
    auto accepted = listener_->Accept(Deadline::After(kLimit));
    if (!accepted.ok()) return accepted.status();
    server_ = std::move(*accepted);
    return server_->Receive(Deadline::After(deadline));
  }

  TransportOptions options_;
  std::shared_ptr<Transport> transport_;
  std::unique_ptr<Listener> listener_;
  Endpoint endpoint_;
  UniqueFd raw_;
  std::unique_ptr<Connection> server_;
};

TEST_F(TcpTest, ValidRawFrameIsReceived) {
  auto message = ReceiveRaw(Frame(12, "hello") + Frame(13, ""));
  ASSERT_TRUE(message.ok()) << message.status().ToString();
  EXPECT_EQ(message->type, 12);
  EXPECT_EQ(message->payload, "hello");
  auto second = server_->Receive(Deadline::After(kLimit));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->type, 13);
}

TEST_F(TcpTest, BadHeaderCrcIsCorruption) {
  std::string frame = Frame(1, "payload");
  frame[5] ^= 0x01;  // type byte, header CRC now stale
  auto message = ReceiveRaw(frame);
  ASSERT_FALSE(message.ok());
  EXPECT_EQ(message.status().code(), StatusCode::kCorruption) << message.status().ToString();
  EXPECT_NE(message.status().message().find("header CRC"), std::string::npos) << message.status().ToString();
  // Sticky: the stream is unusable afterwards.
  EXPECT_EQ(server_->Receive(Deadline::After(10ms)).status().code(), StatusCode::kCorruption);
}

TEST_F(TcpTest, BadMagicIsCorruption) {
  auto message = ReceiveRaw("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(16, ' '));
  ASSERT_FALSE(message.ok());
  EXPECT_EQ(message.status().code(), StatusCode::kCorruption) << message.status().ToString();
  EXPECT_NE(message.status().message().find("magic"), std::string::npos) << message.status().ToString();
}

TEST_F(TcpTest, HugeLengthIsRefusedBeforeAnyAllocation) {
  std::string frame = Frame(1, "");
  EncodeFixed32(frame.data() + 8, 0xFFFFFFF0u);  // ~4 GiB payload, valid header CRC
  RefreshHeaderCrc(&frame);
  auto message = ReceiveRaw(frame);
  ASSERT_FALSE(message.ok());
  EXPECT_EQ(message.status().code(), StatusCode::kCorruption) << message.status().ToString();
  EXPECT_NE(message.status().message().find("exceeds"), std::string::npos) << message.status().ToString();
}

TEST_F(TcpTest, BadPayloadCrcIsCorruption) {
  std::string frame = Frame(1, "the payload");
  frame.back() ^= 0x40;
  auto message = ReceiveRaw(frame);
  ASSERT_FALSE(message.ok());
  EXPECT_EQ(message.status().code(), StatusCode::kCorruption) << message.status().ToString();
  EXPECT_NE(message.status().message().find("payload CRC"), std::string::npos) << message.status().ToString();
}

TEST_F(TcpTest, UnknownVersionIsCorruption) {
  std::string frame = Frame(1, "x");
  frame[2] = 9;
  RefreshHeaderCrc(&frame);
  auto message = ReceiveRaw(frame);
  EXPECT_EQ(message.status().code(), StatusCode::kCorruption) << message.status().ToString();
}

TEST_F(TcpTest, TruncatedFrameThenCloseIsUnavailable) {
  std::string frame = Frame(1, std::string(1000, 'p'));
  auto message = ReceiveRaw(std::string_view(frame).substr(0, 500), /*close_after=*/true);
  EXPECT_EQ(message.status().code(), StatusCode::kUnavailable) << message.status().ToString();
  auto header_only = ReceiveRaw(std::string_view(frame).substr(0, 20), /*close_after=*/true);
  EXPECT_EQ(header_only.status().code(), StatusCode::kUnavailable) << header_only.status().ToString();
}

TEST_F(TcpTest, ResetMidStreamIsUnavailable) {
  std::string frame = Frame(1, std::string(1000, 'p'));
  raw_ = RawConnect(endpoint_);
  ASSERT_TRUE(raw_.valid());
  ASSERT_TRUE(WriteAll(raw_.get(), frame.data(), 600, "raw").ok());
  linger abort_on_close{1, 0};
  ASSERT_EQ(::setsockopt(raw_.get(), SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close)), 0);
  auto accepted = listener_->Accept(Deadline::After(kLimit));
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  std::this_thread::sleep_for(50ms);
  raw_.Reset();  // RST
  auto message = (*accepted)->Receive(Deadline::After(kLimit));
  EXPECT_EQ(message.status().code(), StatusCode::kUnavailable) << message.status().ToString();
}

TEST_F(TcpTest, TimeoutInTheMiddleOfAFrameResumes) {
  std::string frame = Frame(4, RandomBytes(100000, 3));
  auto message = ReceiveRaw(std::string_view(frame).substr(0, 50000), false, 100ms);
  EXPECT_EQ(message.status().code(), StatusCode::kTimeout) << message.status().ToString();
  ASSERT_TRUE(WriteAll(raw_.get(), frame.data() + 50000, frame.size() - 50000, "raw").ok());
  auto rest = server_->Receive(Deadline::After(kLimit));
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  EXPECT_EQ(rest->payload, RandomBytes(100000, 3));
}

TEST_F(TcpTest, ReceiverLimitRefusesLargerFrames) {
  // The sender allows 1 MiB, this listener only 1 KiB.
  TransportOptions small;
  small.max_message_bytes = 1024;
  auto strict = MakeTcp(small);
  auto strict_listener = strict->Listen(*ParseEndpoint("tcp://127.0.0.1:0"));
  ASSERT_TRUE(strict_listener.ok());
  auto client = transport_->Connect((*strict_listener)->local_endpoint());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto server = (*strict_listener)->Accept(Deadline::After(kLimit));
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*client)->Send(1, std::string(1024, 'a')).ok());
  ASSERT_TRUE((*client)->Send(1, std::string(1025, 'a')).ok());
  auto fits = (*server)->Receive(Deadline::After(kLimit));
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_EQ(fits->payload.size(), 1024u);
  auto too_big = (*server)->Receive(Deadline::After(kLimit));
  EXPECT_EQ(too_big.status().code(), StatusCode::kCorruption) << too_big.status().ToString();
  // And the strict side refuses to send it.
  EXPECT_EQ((*server)->Send(1, std::string(1025, 'a')).code(), StatusCode::kInvalidArgument);
}

TEST_F(TcpTest, SendWithoutProgressTimesOut) {
  TransportOptions impatient;
  impatient.io_timeout = 300ms;
  impatient.buffer_bytes = 256 << 10;
  auto sender_transport = MakeTcp(impatient);
  auto client = sender_transport->Connect(endpoint_);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto server = listener_->Accept(Deadline::After(kLimit));
  ASSERT_TRUE(server.ok());
  const std::string big(size_t{64} << 20, 't');
  auto start = Clock::now();
  Status s = (*client)->Send(1, big);
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_GE(Clock::now() - start, 300ms);
  // Part of the frame went out: the connection refuses to send more, and
  // the peer sees the stream cut instead of hanging.
  EXPECT_FALSE((*client)->Send(1, "x").ok());
  auto message = (*server)->Receive(Deadline::After(kLimit));
  EXPECT_EQ(message.status().code(), StatusCode::kUnavailable) << message.status().ToString();
}

TEST_F(TcpTest, KilledSenderProcessIsAnErrorNotAHang) {
  const Endpoint target = endpoint_;
  pid_t child = canopy::testing::ForkChild([target]() -> int {
    auto transport = CreateTcpTransport({});
    if (!transport.ok()) return 2;
    auto connection = (*transport)->Connect(target);
    if (!connection.ok()) return 3;
    std::string bulk(size_t{256} << 20, 'k');
    (void)(*connection)->SendWithBulk(1, "doomed", BulkSource::FromMemory(bulk));
    return 4;
  });
  ASSERT_GT(child, 0);
  auto server = listener_->Accept(Deadline::After(kLimit));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto message = (*server)->Receive(Deadline::After(kLimit));
  ASSERT_TRUE(message.ok()) << message.status().ToString();
  ASSERT_EQ(message->bulk_bytes, size_t{256} << 20);
  std::string piece(1 << 20, '\0');
  ASSERT_TRUE(
      (*server)->ReceiveBulk(BulkSink::ToMemory(piece.data()), piece.size(), Deadline::After(kLimit)).ok());
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  canopy::testing::WaitChild(child, kLimit);
  Status s = Status::Ok();
  for (uint64_t left = message->bulk_bytes - piece.size(); left > 0 && s.ok();) {
    uint64_t n = std::min<uint64_t>(left, piece.size());
    s = (*server)->ReceiveBulk(BulkSink::ToMemory(piece.data()), n, Deadline::After(kLimit));
    left -= n;
  }
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
}

TEST_F(TcpTest, KilledReceiverProcessFailsTheSender) {
  const Endpoint target = endpoint_;
  pid_t child = canopy::testing::ForkChild([target]() -> int {
    auto transport = CreateTcpTransport({});
    if (!transport.ok()) return 2;
    auto connection = (*transport)->Connect(target);
    if (!connection.ok()) return 3;
    ::pause();  // reads nothing until killed
    return 4;
  });
  ASSERT_GT(child, 0);
  auto server = listener_->Accept(Deadline::After(kLimit));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::thread killer([child] {
    std::this_thread::sleep_for(300ms);
    ::kill(child, SIGKILL);
  });
  const std::string big(size_t{128} << 20, 'b');
  Status s = (*server)->SendWithBulk(1, "to the dead", BulkSource::FromMemory(big));
  killer.join();
  canopy::testing::WaitChild(child, kLimit);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
}

TEST_F(TcpTest, BulkMisuseIsRefused) {
  auto client = transport_->Connect(endpoint_);
  ASSERT_TRUE(client.ok());
  auto server = listener_->Accept(Deadline::After(kLimit));
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*client)->SendWithBulk(1, "m", BulkSource::FromMemory("0123456789")).ok());
  auto message = (*server)->Receive(Deadline::After(kLimit));
  ASSERT_TRUE(message.ok());
  ASSERT_EQ(message->bulk_bytes, 10u);
  EXPECT_EQ((*server)->Receive(Deadline::After(kLimit)).status().code(), StatusCode::kInvalidArgument);
  char buffer[16];
  EXPECT_EQ((*server)->ReceiveBulk(BulkSink::ToMemory(buffer), 11, Deadline::After(kLimit)).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE((*server)->ReceiveBulk(BulkSink::ToMemory(buffer), 10, Deadline::After(kLimit)).ok());
  EXPECT_EQ(std::string(buffer, 10), "0123456789");

  // A file range past the end is refused before anything is sent.
  TempDir dir;
  auto file = OpenFile(dir.File("short"), O_RDWR | O_CREAT);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(WriteAll(file->get(), "abc", 3, "short").ok());
  EXPECT_EQ((*client)->SendWithBulk(1, "", BulkSource::FromFile(file->get(), 1, 3)).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE((*client)->Send(2, "still aligned").ok());
  auto next = (*server)->Receive(Deadline::After(kLimit));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->payload, "still aligned");
}

TEST_F(TcpTest, BulkIntoAnAppendOnlyFileFallsBackFromSplice) {
  auto client = transport_->Connect(endpoint_);
  ASSERT_TRUE(client.ok());
  auto server = listener_->Accept(Deadline::After(kLimit));
  ASSERT_TRUE(server.ok());
  const std::string bulk = RandomBytes((3 << 20) + 5, 4);
  std::thread sender([&] { EXPECT_TRUE((*client)->SendWithBulk(1, "", BulkSource::FromMemory(bulk)).ok()); });
  auto message = (*server)->Receive(Deadline::After(kLimit));
  ASSERT_TRUE(message.ok());
  TempDir dir;
  auto sink = OpenFile(dir.File("append"), O_WRONLY | O_CREAT | O_APPEND);
  ASSERT_TRUE(sink.ok());
  // splice(2) refuses O_APPEND files; pwrite appends, which is the right
  // place as long as the offsets are sequential from 0.
  Status s = (*server)->ReceiveBulk(BulkSink::ToFile(sink->get(), 0), bulk.size(), Deadline::After(kLimit));
  sender.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto written = ReadFileToString(dir.File("append"));
  ASSERT_TRUE(written.ok());
  EXPECT_TRUE(*written == bulk);
}

TEST_F(TcpTest, BulkIntoDevNullIsDiscarded) {
  auto client = transport_->Connect(endpoint_);
  ASSERT_TRUE(client.ok());
  auto server = listener_->Accept(Deadline::After(kLimit));
  ASSERT_TRUE(server.ok());
  const std::string bulk = RandomBytes((2 << 20) + 1, 5);
  std::thread sender([&] {
    EXPECT_TRUE((*client)->SendWithBulk(1, "", BulkSource::FromMemory(bulk)).ok());
    EXPECT_TRUE((*client)->Send(2, "next").ok());
  });
  auto message = (*server)->Receive(Deadline::After(kLimit));
  ASSERT_TRUE(message.ok());
  auto null = OpenFile("/dev/null", O_WRONLY);
  ASSERT_TRUE(null.ok());
  Status s =
      (*server)->ReceiveBulk(BulkSink::ToFile(null->get(), 0), bulk.size() / 2, Deadline::After(kLimit));
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = (*server)->ReceiveBulk(BulkSink::ToFile(null->get(), 0), bulk.size() - bulk.size() / 2,
                             Deadline::After(kLimit));
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto next = (*server)->Receive(Deadline::After(kLimit));
  sender.join();
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->payload, "next");
}

TEST_F(TcpTest, UriParameters) {
  EXPECT_EQ(transport_->Connect(*ParseEndpoint("tcp://127.0.0.1:1?bogus=1")).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(transport_->Connect(*ParseEndpoint("tcp://127.0.0.1:1?nodelay=maybe")).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(transport_->Connect(*ParseEndpoint("tcp://127.0.0.1:1?zerocopy=2")).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(transport_->Connect(*ParseEndpoint("tcp://127.0.0.1:0")).status().code(),
            StatusCode::kInvalidArgument);
  Endpoint with_param = endpoint_;
  with_param.params["nodelay"] = "0";
  auto client = transport_->Connect(with_param);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ((*client)->peer_uri(), endpoint_.ToUri());
}

TEST_F(TcpTest, ConnectTimesOutWhenTheHandshakeGetsNoAnswer) {
  // A listener with backlog 0 that never accepts: once one connection waits
  // in its queue the kernel drops further SYNs, so a connect stays pending.
  UniqueFd full(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  ASSERT_EQ(::bind(full.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(full.get(), 0), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(full.get(), reinterpret_cast<sockaddr*>(&address), &length), 0);
  Endpoint target{"tcp", "127.0.0.1", ntohs(address.sin_port), {}};
  UniqueFd queued = RawConnect(target);
  ASSERT_TRUE(queued.valid());
  std::this_thread::sleep_for(50ms);

  TransportOptions options;
  options.connect_timeout = 300ms;
  auto impatient = MakeTcp(options);
  auto start = Clock::now();
  auto connection = impatient->Connect(target);
  ASSERT_FALSE(connection.ok());
  EXPECT_EQ(connection.status().code(), StatusCode::kTimeout) << connection.status().ToString();
  EXPECT_GE(Clock::now() - start, 290ms);
}

TEST_F(TcpTest, UnresolvableHostIsUnavailable) {
  auto connection = transport_->Connect(*ParseEndpoint("tcp://no-such-host.invalid:7000"));
  EXPECT_EQ(connection.status().code(), StatusCode::kUnavailable) << connection.status().ToString();
}

TEST(TcpRegistryTest, RegistryCreatesListsAndRefuses) {
  TransportRegistry registry;
  EXPECT_EQ(registry.Create("tcp", {}).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(RegisterTcpTransport(registry).ok());
  EXPECT_EQ(RegisterTcpTransport(registry).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(registry.RegisterUnavailable("warp", "rebuild with -DWARP=ON").ok());
  EXPECT_EQ(registry.RegisterUnavailable("warp", "again").code(), StatusCode::kAlreadyExists);

  auto tcp = registry.Create("tcp", {});
  ASSERT_TRUE(tcp.ok()) << tcp.status().ToString();
  EXPECT_EQ((*tcp)->scheme(), "tcp");
  auto warp = registry.Create("warp", {});
  EXPECT_EQ(warp.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(warp.status().message().find("-DWARP=ON"), std::string::npos) << warp.status().ToString();
  auto unknown = registry.Create("gopher", {});
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("tcp"), std::string::npos) << "lists the known schemes";

  auto entries = registry.List();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].scheme, "tcp");
  EXPECT_TRUE(entries[0].available);
  EXPECT_EQ(entries[1].scheme, "warp");
  EXPECT_FALSE(entries[1].available);
}

TEST(TcpRegistryTest, DialAndListenOnThroughTheGlobalRegistry) {
  RegisterBuiltinTransports();
  RegisterBuiltinTransports();  // idempotent
  auto listener = ListenOn("tcp://localhost:0", {});
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  const Endpoint local = (*listener)->local_endpoint();
  EXPECT_NE(local.port, 0);
  auto client = Dial(local.ToUri(), {});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto server = (*listener)->Accept(Deadline::After(kLimit));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE((*client)->Send(1, "via registry").ok());
  auto message = (*server)->Receive(Deadline::After(kLimit));
  ASSERT_TRUE(message.ok());
  EXPECT_EQ(message->payload, "via registry");

  EXPECT_EQ(Dial("tcp:/127.0.0.1:1", {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dial("nope://127.0.0.1:1", {}).status().code(), StatusCode::kNotFound);
  for (const auto& entry : TransportRegistry::Global().List()) {
    if (!entry.available) {
      EXPECT_EQ(Dial(entry.scheme + "://127.0.0.1:1", {}).status().code(), StatusCode::kNotSupported);
    }
  }
}

}  // namespace
}  // namespace canopy::transport
