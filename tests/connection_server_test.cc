// transport/connection_server.h over tcp://127.0.0.1: connections beyond the
// cap reach the handler as refusals, beyond the refusal cap they are closed,
// and Stop() closes open connections and returns only when every handler has.
#include "transport/connection_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "tests/testing/test_util.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace canopy::transport {
namespace {

using namespace std::chrono_literals;

constexpr uint16_t kHello = 0x7001;
constexpr uint16_t kBusy = 0x7002;

struct Fixture {
  std::atomic<int> served{0}, refused{0}, handlers_returned{0};
  std::atomic<int> aborted{0};  // handlers whose Receive was ended by Stop()
  std::unique_ptr<ConnectionServer> server;

  explicit Fixture(size_t max_serving, size_t max_refusing) {
    RegisterBuiltinTransports();
    auto listener = ListenOn("tcp://127.0.0.1:0", TransportOptions{});
    EXPECT_TRUE(listener.ok()) << listener.status().ToString();
    ConnectionServer::Options options;
    options.name = "test server";
    options.max_serving = max_serving;
    options.max_refusing = max_refusing;
    server = std::make_unique<ConnectionServer>(std::move(*listener), options, [this](Connection& c, bool refuse) {
      if (refuse) {
        ++refused;
        (void)c.Send(kBusy, "busy");
        // Hold the refusing thread until the client has gone, so that the
        // refusal cap is reached while the test dials more.
        (void)c.Receive(Deadline::After(canopy::testing::ScaledBound(10s)));
      } else {
        ++served;
        (void)c.Send(kHello, "hello");
        auto m = c.Receive(Deadline::After(canopy::testing::ScaledBound(60s)));  // until Stop() or the client
        if (!m.ok() && m.status().code() == StatusCode::kAborted) ++aborted;
      }
      ++handlers_returned;
    });
  }

  std::unique_ptr<Connection> Dial() {
    auto c = transport::Dial(server->local_endpoint().ToUri(), TransportOptions{});
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
};

TEST(ConnectionServerTest, ServesUpToTheCapThenRefusesThenCloses) {
  Fixture f(/*max_serving=*/2, /*max_refusing=*/1);
  const Deadline deadline = Deadline::After(canopy::testing::ScaledBound(10s));
  std::vector<std::unique_ptr<Connection>> served;
  for (int i = 0; i < 2; ++i) {
    served.push_back(f.Dial());
    ASSERT_NE(served.back(), nullptr);
    auto m = served.back()->Receive(deadline);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->type, kHello);
  }
  EXPECT_EQ(f.server->counts().serving, 2u);
  // The third is over the cap: its handler is told to refuse.
  auto third = f.Dial();
  ASSERT_NE(third, nullptr);
  auto busy = third->Receive(deadline);
  ASSERT_TRUE(busy.ok()) << busy.status().ToString();
  EXPECT_EQ(busy->type, kBusy);
  // The fourth finds the one refusal slot taken: closed without a word.
  auto fourth = f.Dial();
  ASSERT_NE(fourth, nullptr);
  auto nothing = fourth->Receive(deadline);
  ASSERT_FALSE(nothing.ok());
  EXPECT_NE(nothing.status().code(), StatusCode::kTimeout) << nothing.status().ToString();
  EXPECT_EQ(f.refused.load(), 1);
  const ConnectionServer::Counts counts = f.server->counts();
  EXPECT_EQ(counts.accepted, 4u);
  EXPECT_EQ(counts.peak_serving, 2u);

  // Stop() ends the two served connections' blocked Receives (Aborted) and
  // returns after every handler has returned.
  third.reset();
  f.server->Stop();
  EXPECT_EQ(f.handlers_returned.load(), 3);
  EXPECT_EQ(f.aborted.load(), 2);
  EXPECT_EQ(f.server->counts().serving, 0u);
}

TEST(ConnectionServerTest, AFinishedConnectionFreesItsSlot) {
  Fixture f(/*max_serving=*/1, /*max_refusing=*/4);
  const Deadline deadline = Deadline::After(canopy::testing::ScaledBound(10s));
  for (int i = 0; i < 3; ++i) {
    auto c = f.Dial();
    ASSERT_NE(c, nullptr);
    auto m = c->Receive(deadline);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->type, kHello) << "connection " << i;
    ASSERT_TRUE(c->Shutdown().ok());
    c.reset();
    // The handler sees the client close and returns; then the slot is free.
    while (f.handlers_returned.load() < i + 1 && !deadline.expired()) std::this_thread::sleep_for(1ms);
    while (f.server->counts().serving != 0 && !deadline.expired()) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(f.served.load(), 3);
  EXPECT_EQ(f.refused.load(), 0);
  f.server->Stop();
  EXPECT_EQ(f.aborted.load(), 0);
}

}  // namespace
}  // namespace canopy::transport
