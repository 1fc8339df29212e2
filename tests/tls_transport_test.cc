// tls+tcp://: the conformance suite over TLS 1.3 (mutual TLS), then what can go wrong with certificates and peers: a
// certificate that does not verify (self-signed, wrong host, wrong CA,
// expired), a client certificate the server refuses, plaintext sent to a TLS
// port, a TLS client at a plain port, bad settings. Each failure is a clear
// error, and the listener keeps serving the next, good, client.
// Certificates are made at test time (tests/tls_test_util.h).

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <future>
#include <string>
#include <thread>

#include "base/fd.h"
#include "base/file.h"
#include "tests/testing/test_util.h"
#include "tests/tls_test_util.h"
#include "tests/transport_conformance.h"
#include "transport/builtin.h"
#include "transport/registry.h"
#include "transport/tcp/tcp_transport.h"

namespace canopy::transport {
namespace {

using namespace std::chrono_literals;
using ::canopy::testing::ClientTlsArgs;
using ::canopy::testing::GetTestPki;
using ::canopy::testing::ServerTlsArgs;
using ::canopy::testing::TestPki;
using testing::ConformanceBackend;
using testing::TransportConformanceTest;

ConformanceBackend TlsBackend(const char* name, bool mutual, bool ktls) {
  const TestPki& pki = GetTestPki();
  ConformanceBackend backend{name, "tls+tcp://127.0.0.1:0", {}, {}, {}};
  backend.listener_options.backend_args = ServerTlsArgs(pki, mutual);
  backend.dialer_options.backend_args = ClientTlsArgs(pki, mutual);
  if (!ktls) {
    backend.listener_options.backend_args.push_back("ktls=0");
    backend.dialer_options.backend_args.push_back("ktls=0");
  }
  return backend;
}

// One variant (the suite costs ~20 s, ~40 s under ASan): mutual TLS with
// kernel TLS asked for, so a host with the tls module runs the kTLS datapath
// and one without runs user-space TLS. Server-only authentication is covered
// by the tests below.
INSTANTIATE_TEST_SUITE_P(TlsTcp, TransportConformanceTest,
                         ::testing::Values(TlsBackend("mutual_tls", true, true)),
                         testing::ConformanceBackendName);

TransportOptions WithArgs(std::vector<std::string> args) {
  TransportOptions options;
  options.connect_timeout = 5s;
  options.io_timeout = 10s;
  options.backend_args = std::move(args);
  return options;
}

// A tls+tcp listener on 127.0.0.1 whose accepted connections are served on a
// background thread: each gets its first message echoed back, or records the
// error its first Receive returned (the server side of a failed handshake).
class TlsServer {
 public:
  explicit TlsServer(std::vector<std::string> args) {
    RegisterBuiltinTransports();
    auto listener = ListenOn("tls+tcp://127.0.0.1:0", WithArgs(std::move(args)));
    EXPECT_TRUE(listener.ok()) << listener.status().ToString();
    if (!listener.ok()) return;
    listener_ = std::move(listener).value();
    port_ = listener_->local_endpoint().port;
    thread_ = std::thread([this] { Loop(); });
  }
  ~TlsServer() {
    stop_ = true;
    if (listener_) listener_->Close();
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return port_; }
  std::string uri(const std::string& host = "127.0.0.1") const {
    return "tls+tcp://" + host + ":" + std::to_string(port_);
  }
  // The outcome of the n-th accepted connection (waits up to 10 s).
  Status Outcome(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, 10s, [&] { return outcomes_.size() > n; });
    if (outcomes_.size() <= n) return Status::Timeout("no outcome for connection " + std::to_string(n));
    return outcomes_[n];
  }

 private:
  void Loop() {
    while (!stop_) {
      auto conn = listener_->Accept(Deadline::After(200ms));
      if (!conn.ok()) continue;
      auto m = (*conn)->Receive(Deadline::After(10s));
      Status outcome = m.status();
      if (m.ok()) outcome = (*conn)->Send(m->type, m->payload);
      std::lock_guard<std::mutex> lock(mu_);
      outcomes_.push_back(outcome);
      cv_.notify_all();
    }
  }
  std::unique_ptr<Listener> listener_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> outcomes_;
};

// Dials, sends one message and expects it back.
Status RoundTrip(const std::string& uri, std::vector<std::string> args) {
  CANOPY_ASSIGN_OR_RETURN(auto conn, Dial(uri, WithArgs(std::move(args))));
  CANOPY_RETURN_IF_ERROR(conn->Send(7, "hello over TLS"));
  CANOPY_ASSIGN_OR_RETURN(Message reply, conn->Receive(Deadline::After(10s)));
  if (reply.payload != "hello over TLS") return Status::Corruption("wrong echo: " + reply.payload);
  return Status::Ok();
}

class TlsTransportTest : public ::testing::Test {
 protected:
  const TestPki& pki_ = GetTestPki();
};

TEST_F(TlsTransportTest, GoodClientsAndSchemeInUris) {
  TlsServer server(ServerTlsArgs(pki_));
  ASSERT_TRUE(RoundTrip(server.uri(), ClientTlsArgs(pki_)).ok());
  // localhost is in the certificate too; settings may come as URI parameters.
  ASSERT_TRUE(RoundTrip(server.uri("localhost") + "?ca=" + pki_.ca_cert, {}).ok());
  auto conn = Dial(server.uri(), WithArgs(ClientTlsArgs(pki_)));
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  EXPECT_EQ((*conn)->peer_uri().rfind("tls+tcp://127.0.0.1:", 0), 0u) << (*conn)->peer_uri();
}

TEST_F(TlsTransportTest, CertificatesThatDoNotVerifyAreRefusedAndTheServerKeepsServing) {
  struct Case {
    const char* what;
    std::vector<std::string> server_args;
    std::vector<std::string> client_args;
    const char* expect;  // in the client's error
  };
  const std::vector<Case> cases = {
      {"self-signed server", {"cert=" + pki_.self_signed_cert, "key=" + pki_.self_signed_key}, ClientTlsArgs(pki_),
       "does not verify"},
      {"server of another CA", {"cert=" + pki_.other_server_cert, "key=" + pki_.other_server_key},
       ClientTlsArgs(pki_), "does not verify"},
      {"client trusts another CA", ServerTlsArgs(pki_), {"ca=" + pki_.other_ca_cert}, "does not verify"},
      {"expired server certificate", {"cert=" + pki_.expired_cert, "key=" + pki_.expired_key}, ClientTlsArgs(pki_),
       "expired"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TlsServer server(c.server_args);
    auto conn = Dial(server.uri(), WithArgs(c.client_args));  // the client's handshake runs in Connect
    ASSERT_FALSE(conn.ok());
    EXPECT_EQ(conn.status().code(), StatusCode::kPermissionDenied) << conn.status().ToString();
    EXPECT_NE(conn.status().message().find(c.expect), std::string::npos) << conn.status().ToString();
    // The server saw the handshake fail (the client hung up on it).
    EXPECT_FALSE(server.Outcome(0).ok());
  }
  // The wrong host: the certificate names 127.0.0.1, ::1 and localhost only.
  TlsServer server(ServerTlsArgs(pki_));
  Status wrong_host = RoundTrip(server.uri() + "?server_name=db.example.org", ClientTlsArgs(pki_));
  EXPECT_EQ(wrong_host.code(), StatusCode::kPermissionDenied) << wrong_host.ToString();
  EXPECT_NE(wrong_host.message().find("mismatch"), std::string::npos) << wrong_host.ToString();
  // ... and verify_host=0 accepts it (still verifying the chain).
  EXPECT_TRUE(RoundTrip(server.uri() + "?server_name=db.example.org&verify_host=0", ClientTlsArgs(pki_)).ok());
  // The same listener still serves a good client after a refused one.
  auto ok = RoundTrip(server.uri(), ClientTlsArgs(pki_));
  EXPECT_TRUE(ok.ok()) << ok.ToString();
}

TEST_F(TlsTransportTest, MutualTlsRefusesMissingAndForeignClientCertificates) {
  TlsServer server(ServerTlsArgs(pki_, /*require_client_cert=*/true));
  size_t n = 0;
  for (const auto& args : {ClientTlsArgs(pki_, false),
                           std::vector<std::string>{"ca=" + pki_.ca_cert, "cert=" + pki_.other_client_cert,
                                                    "key=" + pki_.other_client_key},
                           std::vector<std::string>{"ca=" + pki_.ca_cert, "cert=" + pki_.expired_cert,
                                                    "key=" + pki_.expired_key}}) {
    // Under TLS 1.3 the client may finish its handshake before the server
    // checks its certificate: the refusal then arrives on the first receive.
    Status s = RoundTrip(server.uri(), args);
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
    Status seen = server.Outcome(n++);
    EXPECT_EQ(seen.code(), StatusCode::kPermissionDenied) << seen.ToString();
    EXPECT_NE(seen.message().find("certificate"), std::string::npos) << seen.ToString();
  }
  Status good = RoundTrip(server.uri(), ClientTlsArgs(pki_, true));
  EXPECT_TRUE(good.ok()) << good.ToString();
  EXPECT_TRUE(server.Outcome(n).ok()) << server.Outcome(n).ToString();
}

TEST_F(TlsTransportTest, PlaintextToATlsPortIsAClearErrorAndTheServerKeepsServing) {
  TlsServer server(ServerTlsArgs(pki_));
  // A canopy tcp:// client: its frame is not a TLS record.
  auto plain = Dial("tcp://127.0.0.1:" + std::to_string(server.port()), TransportOptions{});
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->Send(7, "in the clear").ok());
  Status seen = server.Outcome(0);
  EXPECT_TRUE(seen.IsCorruption()) << seen.ToString();
  EXPECT_NE(seen.message().find("does not speak TLS"), std::string::npos) << seen.ToString();
  auto answer = (*plain)->Receive(Deadline::After(10s));
  EXPECT_FALSE(answer.ok());  // an alert (not a frame) or the end of the stream
  // An HTTP request.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server.port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string request = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  Status http = server.Outcome(1);
  EXPECT_TRUE(http.IsCorruption()) << http.ToString();
  ::close(fd);
  Status good = RoundTrip(server.uri(), ClientTlsArgs(pki_));
  EXPECT_TRUE(good.ok()) << good.ToString();
}

TEST_F(TlsTransportTest, TlsClientAtAPlainPortFailsClearly) {
  RegisterBuiltinTransports();
  auto plain = ListenOn("tcp://127.0.0.1:0", TransportOptions{});
  ASSERT_TRUE(plain.ok());
  auto served = std::async(std::launch::async, [&] {
    auto conn = (*plain)->Accept(Deadline::After(10s));
    if (conn.ok()) (void)(*conn)->Receive(Deadline::After(10s));  // a ClientHello is no frame: Corruption
  });
  Status s = RoundTrip("tls+tcp://127.0.0.1:" + std::to_string((*plain)->local_endpoint().port),
                       ClientTlsArgs(pki_));
  EXPECT_TRUE(s.IsUnavailable() || s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("TLS handshake"), std::string::npos) << s.ToString();
  served.get();
}

TEST_F(TlsTransportTest, BadSettingsAreRefused) {
  RegisterBuiltinTransports();
  // A listener needs a certificate and its key.
  auto no_cert = ListenOn("tls+tcp://127.0.0.1:0", TransportOptions{});
  ASSERT_FALSE(no_cert.ok());
  EXPECT_EQ(no_cert.status().code(), StatusCode::kInvalidArgument) << no_cert.status().ToString();
  auto mismatched = ListenOn("tls+tcp://127.0.0.1:0",
                             WithArgs({"cert=" + pki_.server_cert, "key=" + pki_.client_key}));
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("mismatch"), std::string::npos)
      << mismatched.status().ToString();
  auto missing = ListenOn("tls+tcp://127.0.0.1:0", WithArgs({"cert=/nonexistent.pem", "key=" + pki_.server_key}));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent.pem"), std::string::npos) << missing.status().ToString();
  // Unknown arguments, bad flags; TLS settings on plain tcp://.
  EXPECT_EQ(ListenOn("tls+tcp://127.0.0.1:0", WithArgs({"--no-huge"})).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dial("tls+tcp://127.0.0.1:1?ktls=maybe", TransportOptions{}).status().code(),
            StatusCode::kInvalidArgument);
  auto plain_with_ca = Dial("tcp://127.0.0.1:1?ca=" + pki_.ca_cert, TransportOptions{});
  ASSERT_FALSE(plain_with_ca.ok());
  EXPECT_NE(plain_with_ca.status().message().find("tls+tcp://"), std::string::npos) << plain_with_ca.status().ToString();
}

TEST_F(TlsTransportTest, FileBulkCrossesTls) {
  // Large file bulk both ways through the TLS stream (sendfile/splice under
  // kernel TLS, buffered copies in user space), byte-exact.
  RegisterBuiltinTransports();
  ::canopy::testing::TempDir dir;
  const std::string data = ::canopy::testing::RandomBytes(3 << 20, 42);
  ASSERT_TRUE(WriteFileAtomic(dir.File("src"), data).ok());
  auto listener = ListenOn("tls+tcp://127.0.0.1:0", WithArgs(ServerTlsArgs(pki_)));
  ASSERT_TRUE(listener.ok());
  auto accepted = std::async(std::launch::async, [&] { return (*listener)->Accept(Deadline::After(10s)); });
  auto client = Dial((*listener)->local_endpoint().ToUri(), WithArgs(ClientTlsArgs(pki_)));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto server = accepted.get();
  ASSERT_TRUE(server.ok());
  UniqueFd src(::open(dir.File("src").c_str(), O_RDONLY));
  ASSERT_TRUE(src.valid());
  auto sent = std::async(std::launch::async, [&] {
    return (*client)->SendWithBulk(9, "file", BulkSource::FromFile(src.get(), 0, data.size()));
  });
  auto m = (*server)->Receive(Deadline::After(10s));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->bulk_bytes, data.size());
  UniqueFd dst(::open(dir.File("dst").c_str(), O_RDWR | O_CREAT, 0644));
  ASSERT_TRUE((*server)->ReceiveBulk(BulkSink::ToFile(dst.get(), 0), data.size(), Deadline::After(20s)).ok());
  ASSERT_TRUE(sent.get().ok());
  auto back = ReadFileToString(dir.File("dst"));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == data);
}

}  // namespace
}  // namespace canopy::transport
