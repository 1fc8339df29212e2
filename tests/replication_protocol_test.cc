// Wire codec, authentication and ring placement of the replication module.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "replication/protocol.h"
#include "tree/delta.h"
#include "replication/ring.h"

namespace canopy::replication {
namespace {

// Every single-byte change and every truncation of `encoded` must fail to
// decode (the payload CRC and the strict field checks make that so).
template <typename T>
void ExpectTamperingDetected(const std::string& encoded, Result<T> (*decode)(std::string_view)) {
  ASSERT_TRUE(decode(encoded).ok()) << decode(encoded).status().ToString();
  for (size_t i = 0; i < encoded.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      std::string bad = encoded;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      auto r = decode(bad);
      EXPECT_FALSE(r.ok()) << "flip 0x" << std::hex << int(flip) << " at byte " << std::dec << i;
      if (!r.ok()) {
        EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
      }
    }
  }
  for (size_t n = 0; n < encoded.size(); ++n) {
    EXPECT_FALSE(decode(encoded.substr(0, n)).ok()) << "truncated to " << n;
  }
  EXPECT_FALSE(decode(encoded + "x").ok()) << "trailing byte";
}

template <typename T>
void RoundTrip(const T& m, Result<T> (*decode)(std::string_view)) {
  std::string enc = Encode(m);
  auto back = decode(enc);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  ExpectTamperingDetected(enc, decode);
}

std::string Nonce(char c) { return std::string(kNonceBytes, c); }

TEST(ProtocolTest, HandshakeMessagesRoundTrip) {
  RoundTrip(Hello{"prod", "7", PeerRole::kNode, kProtocolVersion, Nonce('a'), "tcp://127.0.0.1:7000"}, &DecodeHello);
  RoundTrip(Hello{"c", "client-1", PeerRole::kClient, 9, Nonce('\0'), ""}, &DecodeHello);
  RoundTrip(Challenge{"3", Nonce('b'), std::string(kProofBytes, 'p')}, &DecodeChallenge);
  RoundTrip(Auth{std::string(kProofBytes, 'q')}, &DecodeAuth);
  RoundTrip(Welcome{"3"}, &DecodeWelcome);
}

TEST(ProtocolTest, SubscribeAsksForOneSidedOnlyWhenSet) {
  Subscribe plain{"tree-1", 4, 9, "2", 4};
  Subscribe asking = plain;
  asking.one_sided_ring_bytes = 1 << 20;
  RoundTrip(asking, &DecodeSubscribe);
  RoundTrip(plain, &DecodeSubscribe);
  EXPECT_EQ(DecodeSubscribe(Encode(plain))->one_sided_ring_bytes, 0u);
  // The request only adds bytes at the end: without it, a SUBSCRIBE is what every
  // protocol-4 node reads.
  const std::string a = Encode(plain);
  const std::string b = Encode(asking);
  ASSERT_GT(b.size(), a.size());
  EXPECT_EQ(a.substr(0, a.size() - 4), b.substr(0, a.size() - 4));
  RoundTrip(OneSidedAnswer{true, ""}, &DecodeOneSidedAnswer);
  RoundTrip(OneSidedAnswer{false, "the leader runs without --one-sided-replication"}, &DecodeOneSidedAnswer);
  EXPECT_EQ(MessageTypeName(static_cast<uint16_t>(MessageType::kOneSidedAnswer)), "ONE_SIDED_ANSWER");
  EXPECT_EQ(TypeOf(OneSidedAnswer{}), MessageType::kOneSidedAnswer);
}

TEST(ProtocolTest, ReplicationMessagesRoundTrip) {
  RoundTrip(Subscribe{"tree-1", 4, 123456789, "2", 3}, &DecodeSubscribe);
  RoundTrip(SnapshotBegin{"t", 1, 77}, &DecodeSnapshotBegin);
  RoundTrip(SnapshotChunk{"t", 1, 5, std::string("\0\1\2chunk", 8)}, &DecodeSnapshotChunk);
  RoundTrip(SnapshotEnd{"t", 1, 77, 6}, &DecodeSnapshotEnd);
  RoundTrip(Subscribe{"tree-1", 4, 0, "2", 3, {77, 1 << 20, 0xfeedfacecafebeefULL, 4096}}, &DecodeSubscribe);
  RoundTrip(SnapshotFile{"t", 1, 77, 1 << 20, 0xfeedfacecafebeefULL, 0}, &DecodeSnapshotFile);
  RoundTrip(SnapshotFile{"t", 1, 77, 1 << 20, 0xfeedfacecafebeefULL, 4096}, &DecodeSnapshotFile);
  RoundTrip(SnapshotFile{"t", 3, 77, 1 << 20, 0xfeedfacecafebeefULL, 4096, 2}, &DecodeSnapshotFile);
  // Without a data epoch the message is byte for byte the one older nodes know.
  EXPECT_EQ(Encode(SnapshotFile{"t", 1, 77, 9, 1, 0}).size() + 1,
            Encode(SnapshotFile{"t", 1, 77, 9, 1, 0, 1}).size());
  // A resume offset past the file's end is malformed, not a huge seek.
  EXPECT_TRUE(DecodeSnapshotFile(Encode(SnapshotFile{"t", 1, 77, 100, 1, 101})).status().IsCorruption());
  EXPECT_TRUE(
      DecodeSubscribe(Encode(Subscribe{"t", 1, 0, "2", 0, {7, 100, 1, 101}})).status().IsCorruption());
  RoundTrip(CheckpointRequest{"t", 3, "4"}, &DecodeCheckpointRequest);
  RoundTrip(CheckpointRequest{"t", 3, "4", {77, 1 << 20, 0xfeedfacecafebeefULL, 4096}},
            &DecodeCheckpointRequest);
  EXPECT_TRUE(DecodeCheckpointRequest(Encode(CheckpointRequest{"t", 3, "4", {7, 100, 1, 101}}))
                  .status()
                  .IsCorruption());
  EXPECT_EQ(MessageTypeName(static_cast<uint16_t>(MessageType::kCheckpointRequest)), "CHECKPOINT_REQUEST");
  RoundTrip(Delta{"t", 2, 9, 10, "encoded-delta-bytes"}, &DecodeDelta);
  RoundTrip(DeltaBatch{"t", 2, 10, {"delta-11", "delta-12", std::string(300, 'd')}}, &DecodeDeltaBatch);
  EXPECT_TRUE(DecodeDeltaBatch(Encode(DeltaBatch{"t", 2, 10, {}})).status().IsCorruption());
  RoundTrip(DeltaRecords{"t", 2, 10, 3, 3 * 1000}, &DecodeDeltaRecords);
  RoundTrip(DeltaRecords{"t", 2, 10, 1, kMaxBlobBytes}, &DecodeDeltaRecords);
  // No deltas, more bytes than any blob, or more deltas than the bytes can hold.
  EXPECT_TRUE(DecodeDeltaRecords(Encode(DeltaRecords{"t", 2, 10, 0, 100})).status().IsCorruption());
  EXPECT_TRUE(DecodeDeltaRecords(Encode(DeltaRecords{"t", 2, 10, 1, kMaxBlobBytes + 1})).status().IsCorruption());
  EXPECT_TRUE(
      DecodeDeltaRecords(Encode(DeltaRecords{"t", 2, 10, 11, 10 * tree::kDeltaMinBytes})).status().IsCorruption());
  EXPECT_TRUE(DecodeDeltaRecords(Encode(DeltaRecords{"t", 2, UINT64_MAX - 1, 2, 1000})).status().IsCorruption());
  RoundTrip(Ack{"t", 2, 10}, &DecodeAck);
  RoundTrip(Ack{"t", 2, 10, 1}, &DecodeAck);
  Heartbeat hb;
  hb.node_id = "1";
  hb.sequence = 42;
  hb.trees = {{"a", 1, 5}, {"b", 3, 0}};
  hb.members = {{"1", "tcp://127.0.0.1:1"}, {"2", "tcp://127.0.0.1:2"}};
  hb.raft_address = "127.0.0.1:7101";
  RoundTrip(hb, &DecodeHeartbeat);
  RoundTrip(ErrorMessage{StatusCode::kPermissionDenied, "wrong secret"}, &DecodeError);
}

// A replica decodes DELTA and DELTA_BATCH into views of the payload it
// received: the same fields and checks as the owning decoders, no copy of
// the (possibly MiB-sized) deltas.
TEST(ProtocolTest, DeltaViewsPointIntoThePayload) {
  const std::string big(1 << 20, 'd');
  const std::string one = Encode(Delta{"t", 2, 9, 10, big});
  auto v = DecodeDeltaView(one);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->tree, "t");
  EXPECT_EQ(v->epoch, 2u);
  EXPECT_EQ(v->base_version, 9u);
  EXPECT_EQ(v->new_version, 10u);
  EXPECT_EQ(v->delta, big);
  EXPECT_GE(v->delta.data(), one.data());
  EXPECT_LE(v->delta.data() + v->delta.size(), one.data() + one.size());

  const std::string batch = Encode(DeltaBatch{"t", 2, 10, {"delta-11", big, ""}});
  auto b = DecodeDeltaBatchView(batch);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->tree, "t");
  EXPECT_EQ(b->base_version, 10u);
  ASSERT_EQ(b->deltas.size(), 3u);
  EXPECT_EQ(b->deltas[0], "delta-11");
  EXPECT_EQ(b->deltas[1], big);
  EXPECT_TRUE(b->deltas[2].empty());
  for (std::string_view d : b->deltas) {
    EXPECT_GE(d.data(), batch.data());
    EXPECT_LE(d.data() + d.size(), batch.data() + batch.size());
  }
  // The same refusals as the owning decoders.
  EXPECT_TRUE(DecodeDeltaBatchView(Encode(DeltaBatch{"t", 2, 10, {}})).status().IsCorruption());
  EXPECT_TRUE(DecodeDeltaView(Encode(Delta{"t", 2, 10, 10, "x"})).status().IsCorruption());
  EXPECT_FALSE(DecodeDeltaView(one.substr(0, one.size() - 1)).ok());
  EXPECT_FALSE(DecodeDeltaBatchView(batch.substr(0, batch.size() / 2)).ok());
}

TEST(ProtocolTest, ClientMessagesRoundTrip) {
  CommitRequest c{"t", 3, ConsistencyLevel::kAll, 2500, {}, "", 0};
  c.edits.push_back(Edit{Edit::Kind::kPutAttribute, {0, 2}, "k", "v", 0});
  c.edits.push_back(Edit{Edit::Kind::kAppendChild, {}, "", "", 0});
  c.edits.push_back(Edit{Edit::Kind::kDeleteChild, {1}, "", "", 4});
  RoundTrip(c, &DecodeCommitRequest);
  c.client = "client-9-0123456789abcdef";
  c.sequence = 77;
  RoundTrip(c, &DecodeCommitRequest);
  RoundTrip(CommitReply{{StatusCode::kTimeout, "only 1 of 3"}, 4, 1, "tcp://127.0.0.1:9", 0, false}, &DecodeCommitReply);
  RoundTrip(CommitReply{{}, 4, 2, "", 77, true}, &DecodeCommitReply);
  RoundTrip(ReadRequest{"t", 0, {1, 2, 3}}, &DecodeReadRequest);
  RoundTrip(ReadReply{{}, 7, {{"a", "1"}, {"b", std::string(300, 'x')}}, 3}, &DecodeReadReply);
  RoundTrip(StatusRequest{}, &DecodeStatusRequest);
  StatusReply s;
  s.node_id = "1";
  s.nodes = {{"1", "tcp://127.0.0.1:1", true}, {"2", "tcp://127.0.0.1:2", false}};
  s.replication_factor = 3;
  s.vnodes = 256;
  TreeStatus t;
  t.tree = "t";
  t.leader = "1";
  t.epoch = 1;
  t.role = "leader";
  t.durable_version = 10;
  t.digest = "00ff";
  t.owners = {"1", "2"};
  t.replica_versions = {{"2", 9}};
  t.snapshots_received = 1;
  t.snapshots_sent = 2;
  s.trees.push_back(t);
  s.raft_leader = "2";
  RoundTrip(s, &DecodeStatusReply);
  RoundTrip(CreateTreeRequest{"t"}, &DecodeCreateTreeRequest);
  RoundTrip(CreateTreeReply{{}, "1", {"1", "2", "3"}}, &DecodeCreateTreeReply);
}

TEST(ProtocolTest, WrongTypeAndVersionAreRejected) {
  std::string ack = Encode(Ack{"t", 1, 1});
  auto as_delta = DecodeDelta(ack);
  ASSERT_FALSE(as_delta.ok());
  EXPECT_NE(as_delta.status().message().find("expected DELTA"), std::string::npos) << as_delta.status().ToString();
  EXPECT_FALSE(DecodeHello("").ok());
  EXPECT_EQ(MessageTypeName(0x0115), "ACK");
  EXPECT_EQ(MessageTypeName(0x7777), "UNKNOWN(0x7777)");
}

TEST(ProtocolTest, DecodersSurviveRandomInput) {
  // Random buffers (some with a valid header and CRC, so the body parser is
  // exercised) never crash a decoder and never decode to something odd.
  uint64_t x = 88172645463325252ULL;
  auto next = [&] { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x; };
  for (int round = 0; round < 2000; ++round) {
    std::string buf(next() % 64, '\0');
    for (auto& c : buf) c = static_cast<char>(next());
    (void)DecodeHello(buf);
    (void)DecodeHeartbeat(buf);
    (void)DecodeCommitRequest(buf);
    (void)DecodeDeltaBatch(buf);
    (void)DecodeDeltaRecords(buf);
    (void)DecodeStatusReply(buf);
    (void)DecodeReadReply(buf);
  }
}

TEST(ProtocolTest, ConsistencyLevels) {
  EXPECT_EQ(*ParseConsistencyLevel("quorum"), ConsistencyLevel::kQuorum);
  EXPECT_EQ(*ParseConsistencyLevel("ONE"), ConsistencyLevel::kOne);
  EXPECT_FALSE(ParseConsistencyLevel("most").ok());
  EXPECT_EQ(RequiredAcks(ConsistencyLevel::kOne, 3), 1u);
  EXPECT_EQ(RequiredAcks(ConsistencyLevel::kQuorum, 3), 2u);
  EXPECT_EQ(RequiredAcks(ConsistencyLevel::kQuorum, 4), 3u);
  EXPECT_EQ(RequiredAcks(ConsistencyLevel::kAll, 3), 3u);
  EXPECT_EQ(RequiredAcks(ConsistencyLevel::kQuorum, 1), 1u);
}

TEST(ProtocolTest, SliceMessagesRoundTrip) {
  SliceRequest q;
  q.tree = "board.x";
  q.version = 0;
  q.path = {0, 4};
  q.child_from = 10;
  q.child_limit = 20;
  q.from_end = true;
  q.level = ReadLevel::kLeader;
  q.timeout_ms = 1500;
  RoundTrip(q, &DecodeSliceRequest);
  SliceReply r;
  r.status = {StatusCode::kUnavailable, "not the leader"};
  r.version = 42;
  r.data_epoch = 3;
  r.attributes = {{"a", "1"}};
  r.child_count = 42;
  r.child_start = 12;
  r.children = {SliceChild{{{"author", "ann"}, {"text", std::string(200, 't')}}, 0}, SliceChild{{}, 7}};
  r.leader = "tcp://127.0.0.1:9";
  r.answered_by = "2";
  RoundTrip(r, &DecodeSliceReply);
  EXPECT_EQ(*ParseReadLevel("leader"), ReadLevel::kLeader);
  EXPECT_EQ(*ParseReadLevel("QUORUM"), ReadLevel::kQuorum);
  EXPECT_EQ(std::string(ReadLevelName(ReadLevel::kOne)), "ONE");
  EXPECT_FALSE(ParseReadLevel("ALL").ok());
  EXPECT_EQ(MessageTypeName(0x0128), "SLICE");
}

std::vector<std::string> NodeIds(int n, int first = 1) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back(std::to_string(first + i));
  return ids;
}

Ring MakeRing(int n, RingOptions o = {}) {
  Ring ring(o);
  for (const auto& id : NodeIds(n)) EXPECT_TRUE(ring.AddNode(id).ok());
  return ring;
}

TEST(RingTest, OwnersAreDistinctAndDeterministic) {
  Ring a = MakeRing(5);
  Ring b(RingOptions{});
  for (const auto& id : {"5", "3", "1", "4", "2"}) ASSERT_TRUE(b.AddNode(id).ok());  // other order
  for (int k = 0; k < 200; ++k) {
    std::string key = "tree-" + std::to_string(k);
    auto owners = a.Owners(key);
    ASSERT_EQ(owners.size(), 3u);
    EXPECT_EQ(std::set<std::string>(owners.begin(), owners.end()).size(), 3u);
    EXPECT_EQ(owners, b.Owners(key));
    EXPECT_TRUE(a.IsOwner(key, owners[0]));
  }
  EXPECT_EQ(MakeRing(2).Owners("x").size(), 2u);  // RF capped by node count
  EXPECT_TRUE(Ring().Owners("x").empty());
  Ring r;
  EXPECT_EQ(r.AddNode("").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(r.AddNode("1").ok());
  EXPECT_EQ(r.AddNode("1").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(r.RemoveNode("2").code(), StatusCode::kNotFound);
  EXPECT_EQ(Ring(RingOptions{0, 3}).AddNode("1").code(), StatusCode::kInvalidArgument);
}

TEST(RingTest, AddNodesPlacesTheSameRingAsAddingOneByOne) {
  Ring one_by_one = MakeRing(7);
  Ring at_once;
  ASSERT_TRUE(at_once.AddNodes({"7", "2", "5"}).ok());
  ASSERT_TRUE(at_once.AddNodes({"1", "6", "3", "4"}).ok());  // onto a ring that has nodes
  EXPECT_EQ(at_once.nodes(), one_by_one.nodes());
  for (int k = 0; k < 200; ++k) {
    std::string key = "tree-" + std::to_string(k);
    EXPECT_EQ(at_once.Owners(key), one_by_one.Owners(key)) << key;
  }
  // Errors leave the ring as it was.
  EXPECT_EQ(at_once.AddNodes({"8", "3"}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(at_once.AddNodes({"8", "8"}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(at_once.AddNodes({"8", ""}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(at_once.node_count(), 7u);
  EXPECT_FALSE(at_once.Contains("8"));
  EXPECT_EQ(Ring(RingOptions{256, 0}).AddNodes({"1"}).code(), StatusCode::kInvalidArgument);
}

TEST(RingTest, OwnershipIsBalanced) {
  // With 256 vnodes per node the share of the hash space each node owns
  // stays within 20% of the mean (it is ~RF/N).
  for (int n : {3, 5, 10}) {
    Ring ring = MakeRing(n);
    auto shares = ring.OwnershipShares();
    double sum = 0;
    for (double s : shares) sum += s;
    EXPECT_NEAR(sum, 3.0, 1e-6);
    double mean = sum / n;
    for (double s : shares) EXPECT_NEAR(s, mean, 0.2 * mean) << "n=" << n;
  }
  // Keys, too: 30000 tree names spread over 10 nodes as leaders.
  Ring ring = MakeRing(10);
  std::map<std::string, int> leaders;
  for (int k = 0; k < 30000; ++k) ++leaders[ring.Owners("t" + std::to_string(k))[0]];
  for (const auto& [id, count] : leaders) EXPECT_NEAR(count, 3000, 600) << id;
}

TEST(RingTest, JoinMovesOnlyTheJoinersShare) {
  Ring before = MakeRing(5);
  Ring after = MakeRing(5);
  ASSERT_TRUE(after.AddNode("6").ok());
  int changed = 0;
  const int kKeys = 20000;
  for (int k = 0; k < kKeys; ++k) {
    std::string key = "tree-" + std::to_string(k);
    auto old_owners = before.Owners(key);
    auto new_owners = after.Owners(key);
    std::set<std::string> o(old_owners.begin(), old_owners.end());
    std::set<std::string> n(new_owners.begin(), new_owners.end());
    if (o == n) continue;
    ++changed;
    // The only change: the new node took the place of exactly one old owner.
    ASSERT_TRUE(n.count("6")) << key;
    std::vector<std::string> lost;
    std::set_difference(o.begin(), o.end(), n.begin(), n.end(), std::back_inserter(lost));
    EXPECT_EQ(lost.size(), 1u) << key;
  }
  // Expected fraction RF/N = 3/6 = 0.5 of the keys gain node 6 as an owner.
  double frac = static_cast<double>(changed) / kKeys;
  EXPECT_NEAR(frac, 0.5, 0.08);
  // Removing it again restores the old placement exactly.
  ASSERT_TRUE(after.RemoveNode("6").ok());
  for (int k = 0; k < 1000; ++k) {
    std::string key = "tree-" + std::to_string(k);
    EXPECT_EQ(before.Owners(key), after.Owners(key));
  }
}

TEST(RingTest, RangesCoverTheRing) {
  Ring ring = MakeRing(3, RingOptions{16, 2});
  auto ranges = ring.Ranges();
  ASSERT_EQ(ranges.size(), 48u);
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(ranges[i].start_exclusive, ranges[(i + ranges.size() - 1) % ranges.size()].end_inclusive);
    EXPECT_EQ(ranges[i].owners.size(), 2u);
  }
  // A key's owners are the owners of the range its hash falls in.
  for (int k = 0; k < 100; ++k) {
    std::string key = "k" + std::to_string(k);
    uint64_t h = Ring::HashKey(key);
    auto it = std::find_if(ranges.begin(), ranges.end(), [&](const Ring::Range& r) { return h <= r.end_inclusive; });
    const auto& r = it == ranges.end() ? ranges.front() : *it;
    EXPECT_EQ(r.owners, ring.Owners(key));
  }
}

}  // namespace
}  // namespace canopy::replication
