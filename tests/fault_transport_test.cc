#include "transport/fault/fault_transport.h"

#include <thread>

#include <gtest/gtest.h>

#include "tests/transport_conformance.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace canopy::transport {
namespace {

using testing::ConformanceBackend;
using testing::TransportConformanceTest;

TransportOptions SuiteOptions() {
  TransportOptions o;
  o.connect_timeout = std::chrono::seconds(3);
  o.io_timeout = std::chrono::seconds(20);
  return o;
}

// With no fault parameters the wrapper must be invisible: the whole suite.
INSTANTIATE_TEST_SUITE_P(FaultTcp, TransportConformanceTest,
                         ::testing::Values(ConformanceBackend{"fault_tcp_no_faults", "fault+tcp://127.0.0.1:0",
                                                              SuiteOptions(), SuiteOptions(), nullptr}),
                         testing::ConformanceBackendName);

struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Connection> client, server;
};

// Listener without faults; the client's faults come from `query`.
Pair Connect(const std::string& query) {
  RegisterBuiltinTransports();
  Pair p;
  auto l = ListenOn("tcp://127.0.0.1:0", SuiteOptions());
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  p.listener = std::move(*l);
  Endpoint e = p.listener->local_endpoint();
  std::thread acceptor([&] {
    auto s = p.listener->Accept(Deadline::After(std::chrono::seconds(5)));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) p.server = std::move(*s);
  });
  auto c = Dial("fault+tcp://127.0.0.1:" + std::to_string(e.port) + query, SuiteOptions());
  acceptor.join();
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (c.ok()) p.client = std::move(*c);
  return p;
}

Deadline Soon() { return Deadline::After(std::chrono::milliseconds(300)); }

TEST(FaultTransportTest, DropLosesMessagesSilently) {
  Pair p = Connect("?drop=1");
  ASSERT_TRUE(p.client && p.server);
  ASSERT_TRUE(p.client->Send(1, "gone").ok());
  EXPECT_TRUE(p.server->Receive(Soon()).status().IsTimeout());
  EXPECT_GE(GlobalFaultCounters().dropped, 1u);
}

TEST(FaultTransportTest, DuplicateDeliversTwice) {
  Pair p = Connect("?dup=1");
  ASSERT_TRUE(p.client && p.server);
  ASSERT_TRUE(p.client->Send(3, "twice").ok());
  for (int i = 0; i < 2; ++i) {
    auto m = p.server->Receive(Soon());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->type, 3);
    EXPECT_EQ(m->payload, "twice");
  }
}

TEST(FaultTransportTest, CorruptFlipsOnePayloadByte) {
  Pair p = Connect("?corrupt=1&seed=9");
  ASSERT_TRUE(p.client && p.server);
  std::string payload(1000, 'a');
  ASSERT_TRUE(p.client->Send(1, payload).ok());
  auto m = p.server->Receive(Soon());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->payload.size(), payload.size());
  int differing = 0;
  for (size_t i = 0; i < payload.size(); ++i) differing += m->payload[i] != payload[i];
  EXPECT_EQ(differing, 1);
}

TEST(FaultTransportTest, CutAfterBytesKillsTheConnection) {
  Pair p = Connect("?cut_after=2500");
  ASSERT_TRUE(p.client && p.server);
  std::string kb(1000, 'x');
  EXPECT_TRUE(p.client->Send(1, kb).ok());
  EXPECT_TRUE(p.client->Send(1, kb).ok());
  EXPECT_TRUE(p.client->Send(1, kb).IsUnavailable());
  EXPECT_TRUE(p.client->Send(1, "x").IsUnavailable());  // stays cut
  ASSERT_TRUE(p.server->Receive(Soon()).ok());
  ASSERT_TRUE(p.server->Receive(Soon()).ok());
  auto third = p.server->Receive(Deadline::After(std::chrono::seconds(5)));
  EXPECT_FALSE(third.ok());
  EXPECT_FALSE(third.status().IsTimeout()) << "the peer must see the cut, not wait: " << third.status().ToString();
}

TEST(FaultTransportTest, DelayHoldsEachMessage) {
  Pair p = Connect("?delay_ms=100");
  ASSERT_TRUE(p.client && p.server);
  auto start = Clock::now();
  ASSERT_TRUE(p.client->Send(1, "slow").ok());
  ASSERT_TRUE(p.server->Receive(Deadline::After(std::chrono::seconds(2))).ok());
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(100));
}

TEST(FaultTransportTest, ConnectDelaySlowsTheSetUpNotTheMessages) {
  auto start = Clock::now();
  Pair p = Connect("?connect_delay_ms=300");
  ASSERT_TRUE(p.client && p.server);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(300));
  start = Clock::now();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(p.client->Send(1, "fast").ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(p.server->Receive(Deadline::After(std::chrono::seconds(2))).ok());
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(1000))
      << "the messages must not wait 300 ms each";
}

TEST(FaultTransportTest, BadParametersAreRejected) {
  RegisterBuiltinTransports();
  for (const char* uri : {"fault+tcp://127.0.0.1:1?drop=2", "fault+tcp://127.0.0.1:1?dup=x",
                          "fault+tcp://127.0.0.1:1?cut_after=-5", "fault+tcp://127.0.0.1:1?delay_ms=99999999",
                          "fault+tcp://127.0.0.1:1?connect_delay_ms=60001"}) {
    auto c = Dial(uri, SuiteOptions());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << uri << ": " << c.status().ToString();
  }
}

}  // namespace
}  // namespace canopy::transport
