#include "tools/chaosproxy/chaos_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/testing/test_util.h"

namespace canopy::chaos {
namespace {

// A loopback echo server on an ephemeral port, one thread per connection.
class EchoServer {
 public:
  EchoServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        std::thread([c] {
          char buf[65536];
          for (;;) {
            ssize_t n = ::read(c, buf, sizeof buf);
            if (n <= 0) break;
            if (::send(c, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
          }
          ::close(c);
        }).detach();
      }
    });
  }
  ~EchoServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  int fd_;
  uint16_t port_ = 0;
  std::thread thread_;
};

int ConnectLoopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends `data` and reads back up to data.size() bytes; stops early at EOF,
// error or the 5 s receive timeout.
std::string RoundTrip(int fd, const std::string& data) {
  std::thread writer([&] {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd, data.data() + off, std::min<size_t>(65536, data.size() - off), MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  });
  std::string got;
  char buf[65536];
  while (got.size() < data.size()) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  writer.join();
  return got;
}

struct RunningProxy {
  explicit RunningProxy(ChaosOptions o) {
    auto p = ChaosProxy::Create(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    proxy = std::move(*p);
    thread = std::thread([this] { EXPECT_TRUE(proxy->Run().ok()); });
  }
  ~RunningProxy() {
    proxy->Stop();
    thread.join();
  }
  std::unique_ptr<ChaosProxy> proxy;
  std::thread thread;
};

TEST(ChaosProxyTest, ForwardsBytesExactlyWithoutFaults) {
  EchoServer echo;
  ChaosOptions o;
  o.target_port = echo.port();
  RunningProxy rp(o);
  int fd = ConnectLoopback(rp.proxy->port());
  ASSERT_GE(fd, 0);
  std::string data = testing::RandomBytes(8 << 20, 3);
  EXPECT_EQ(RoundTrip(fd, data), data);
  ::close(fd);
  // The proxy counts a chunk after its write returns, which can be after the
  // echo's last bytes reached us: wait (bounded) for the count to catch up.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (rp.proxy->counters().bytes_forwarded.load() < 2 * data.size() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(rp.proxy->counters().bytes_forwarded.load(), 2 * data.size());
  EXPECT_EQ(rp.proxy->counters().corruptions.load(), 0u);
}

TEST(ChaosProxyTest, DelayHoldsTraffic) {
  EchoServer echo;
  ChaosOptions o;
  o.target_port = echo.port();
  o.delay_ms = 150;
  RunningProxy rp(o);
  int fd = ConnectLoopback(rp.proxy->port());
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(RoundTrip(fd, "ping"), "ping");
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(300));  // delayed both ways
  ::close(fd);
}

TEST(ChaosProxyTest, CorruptionFlipsBytes) {
  EchoServer echo;
  ChaosOptions o;
  o.target_port = echo.port();
  o.corrupt_prob = 1.0;
  RunningProxy rp(o);
  int fd = ConnectLoopback(rp.proxy->port());
  std::string data = testing::RandomBytes(1 << 16, 4);
  std::string got = RoundTrip(fd, data);
  EXPECT_EQ(got.size(), data.size());
  EXPECT_NE(got, data);
  EXPECT_GT(rp.proxy->counters().corruptions.load(), 0u);
  ::close(fd);
}

TEST(ChaosProxyTest, CutAfterBytesResetsTheConnection) {
  EchoServer echo;
  ChaosOptions o;
  o.target_port = echo.port();
  o.cut_after_bytes = 100000;
  RunningProxy rp(o);
  int fd = ConnectLoopback(rp.proxy->port());
  std::string data = testing::RandomBytes(4 << 20, 5);
  std::string got = RoundTrip(fd, data);
  EXPECT_LT(got.size(), data.size());
  EXPECT_EQ(got, data.substr(0, got.size()));  // what did arrive is intact
  EXPECT_GE(rp.proxy->counters().cuts.load(), 1u);
  ::close(fd);
}

TEST(ChaosProxyTest, PartitionBlackHolesAndCutAllResets) {
  EchoServer echo;
  ChaosOptions o;
  o.target_port = echo.port();
  RunningProxy rp(o);
  int fd = ConnectLoopback(rp.proxy->port());
  EXPECT_EQ(RoundTrip(fd, "before"), "before");
  rp.proxy->SetPartitioned(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(::send(fd, "lost", 4, MSG_NOSIGNAL), 4);
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 300), 0);  // nothing comes back through the partition
  rp.proxy->SetPartitioned(false);
  rp.proxy->CutAll();
  char c;
  EXPECT_LE(::read(fd, &c, 1), 0);  // reset (or EOF), not a hang
  ::close(fd);
  int fd2 = ConnectLoopback(rp.proxy->port());
  EXPECT_EQ(RoundTrip(fd2, "after"), "after");
  ::close(fd2);
}

TEST(ChaosProxyTest, RefusesNonLoopbackAddresses) {
  ChaosOptions o;
  o.target_host = "192.0.2.1";
  o.target_port = 80;
  EXPECT_EQ(ChaosProxy::Create(o).status().code(), StatusCode::kInvalidArgument);
  o.target_host = "127.0.0.1";
  o.listen_host = "0.0.0.0";
  EXPECT_EQ(ChaosProxy::Create(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace canopy::chaos
