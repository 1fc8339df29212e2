// Negotiation of one-sided replication (replication/one_sided.h) over
// tcp://, where it must fall back to the message stream: what the leader
// answers, and that the stream goes on intact afterwards. The one-sided
// stream itself runs in the Soft-RoCE guests (rdma_transport_test
// RdmaOneSidedStream.*, cluster_replication_test with
// --one-sided-replication; tests/rdma_vm_guest.sh).
#include "replication/one_sided.h"

#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "replication/handshake.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace canopy::replication {
namespace {

using namespace std::chrono_literals;

struct TcpPair {
  std::shared_ptr<transport::Transport> transport;
  std::unique_ptr<transport::Listener> listener;
  std::unique_ptr<transport::Connection> replica;  // the dialer
  std::unique_ptr<transport::Connection> leader;   // the accepted end
};

TcpPair Connect() {
  transport::RegisterBuiltinTransports();
  TcpPair p;
  auto transport = transport::TransportRegistry::Global().Create("tcp", transport::TransportOptions{});
  EXPECT_TRUE(transport.ok()) << transport.status().ToString();
  p.transport = *transport;
  auto listener = p.transport->Listen(*transport::ParseEndpoint("tcp://127.0.0.1:0"));
  EXPECT_TRUE(listener.ok()) << listener.status().ToString();
  p.listener = std::move(*listener);
  std::optional<Result<std::unique_ptr<transport::Connection>>> accepted;
  std::thread t([&] { accepted.emplace(p.listener->Accept(Deadline::After(5s))); });
  auto dialed = p.transport->Connect(p.listener->local_endpoint());
  t.join();
  EXPECT_TRUE(dialed.ok()) << dialed.status().ToString();
  EXPECT_TRUE(accepted->ok()) << accepted->status().ToString();
  p.replica = std::move(*dialed);
  p.leader = std::move(**accepted);
  return p;
}

Subscribe Asking(uint64_t ring_bytes) {
  Subscribe s{"docs", 3, 0, "2", 0};
  s.one_sided_ring_bytes = ring_bytes;
  return s;
}

// The replica side of the exchange in a thread, as FollowOn does it.
Result<std::unique_ptr<transport::Connection>> Follow(TcpPair& p, const Subscribe& sub) {
  return FollowOneSided(*p.replica, sub, 1ms, Deadline::After(5s));
}

TEST(OneSidedNegotiation, ReplicaAsksOnlyOverRdma) {
  TcpPair p = Connect();
  ASSERT_TRUE(p.replica && p.leader);
  EXPECT_EQ(OneSidedRingToAsk(*p.replica, true, 1 << 20), 0u);  // tcp://: never
  EXPECT_EQ(OneSidedRingToAsk(*p.replica, false, 1 << 20), 0u);
}

TEST(OneSidedNegotiation, LeaderDeclinesOverTcpAndTheStreamGoesOn) {
  TcpPair p = Connect();
  ASSERT_TRUE(p.replica && p.leader);
  const Subscribe sub = Asking(1 << 20);
  std::optional<Result<std::unique_ptr<transport::Connection>>> followed;
  std::thread replica([&] { followed.emplace(Follow(p, sub)); });
  auto led = LeadOneSided(*p.leader, sub, /*enabled=*/true, 3, 1ms, Deadline::After(5s));
  replica.join();
  ASSERT_TRUE(led.ok()) << led.status().ToString();
  EXPECT_EQ(*led, nullptr);
  ASSERT_TRUE(followed->ok()) << followed->status().ToString();
  EXPECT_EQ(**followed, nullptr);
  // Nothing else was sent: the next message either way is the stream's own.
  ASSERT_TRUE(SendMessage(*p.leader, Heartbeat{}).ok());
  ASSERT_TRUE(SendMessage(*p.replica, Ack{"docs", 3, 0, 0}).ok());
  auto hb = p.replica->Receive(Deadline::After(5s));
  ASSERT_TRUE(hb.ok()) << hb.status().ToString();
  EXPECT_EQ(hb->type, static_cast<uint16_t>(MessageType::kHeartbeat));
  auto ack = p.leader->Receive(Deadline::After(5s));
  ASSERT_TRUE(ack.ok()) << ack.status().ToString();
  EXPECT_EQ(ack->type, static_cast<uint16_t>(MessageType::kAck));
}

TEST(OneSidedNegotiation, DeclineSaysWhy) {
  for (bool enabled : {true, false}) {
    TcpPair p = Connect();
    ASSERT_TRUE(p.replica && p.leader);
    auto led = LeadOneSided(*p.leader, Asking(4096), enabled, 3, 1ms, Deadline::After(5s));
    ASSERT_TRUE(led.ok()) << led.status().ToString();
    auto m = p.replica->Receive(Deadline::After(5s));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->type, static_cast<uint16_t>(MessageType::kOneSidedAnswer));
    auto answer = DecodeOneSidedAnswer(m->payload);
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    EXPECT_FALSE(answer->accepted);
    EXPECT_NE(answer->reason.find(enabled ? "rdma" : "--one-sided-replication"), std::string::npos)
        << answer->reason;
  }
}

TEST(OneSidedNegotiation, NoRequestNoAnswer) {
  TcpPair p = Connect();
  ASSERT_TRUE(p.replica && p.leader);
  const Subscribe sub = Asking(0);
  auto led = LeadOneSided(*p.leader, sub, true, 3, 1ms, Deadline::After(5s));
  ASSERT_TRUE(led.ok());
  EXPECT_EQ(*led, nullptr);
  auto followed = Follow(p, sub);  // returns at once: it does not read
  ASSERT_TRUE(followed.ok());
  EXPECT_EQ(*followed, nullptr);
  EXPECT_EQ(p.replica->Receive(Deadline::After(100ms)).status().code(), StatusCode::kTimeout);
}

TEST(OneSidedNegotiation, AnErrorInsteadOfTheAnswerIsTheReplicasError) {
  TcpPair p = Connect();
  ASSERT_TRUE(p.replica && p.leader);
  SendError(*p.leader, Status::Unavailable("node 1 is not the leader of docs"));
  auto followed = Follow(p, Asking(4096));
  ASSERT_EQ(followed.status().code(), StatusCode::kUnavailable) << followed.status().ToString();
  EXPECT_NE(followed.status().message().find("not the leader"), std::string::npos);
  // A malformed answer is Corruption.
  TcpPair q = Connect();
  ASSERT_TRUE(q.replica && q.leader);
  ASSERT_TRUE(q.leader->Send(static_cast<uint16_t>(MessageType::kOneSidedAnswer), "garbage").ok());
  EXPECT_EQ(Follow(q, Asking(4096)).status().code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace canopy::replication
