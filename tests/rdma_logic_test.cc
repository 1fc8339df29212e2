// Unit tests for the verbs-free parts of the rdma backend: wire items, credit
// accounting, slot pool, fragmentation / reassembly, the connection state
// machine and the one-sided log ring's layout. These run on every machine (no RDMA device needed).
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "base/coding.h"
#include "base/crc32c.h"
#include "tests/testing/test_util.h"
#include "transport/frame.h"
#include "transport/rdma/bulk_policy.h"
#include "transport/rdma/connection_state.h"
#include "transport/rdma/credits.h"
#include "transport/rdma/keepalive.h"
#include "transport/rdma/log_ring_layout.h"
#include "transport/rdma/one_sided_record.h"
#include "transport/rdma/rdma_wire.h"
#include "transport/rdma/slot_pool.h"
#include "transport/rdma/stream.h"

namespace canopy::transport::rdma {
namespace {

using ::canopy::testing::RandomBytes;

std::string Item(const ItemHeader& header, std::string_view body) {
  std::string out(kItemHeaderSize, '\0');
  ItemHeader h = header;
  h.body_len = static_cast<uint32_t>(body.size());
  EncodeItemHeader(out.data(), h);
  out.append(body);
  return out;
}

// --- wire -------------------------------------------------------------------

TEST(RdmaWire, ItemHeaderRoundTrips) {
  ItemHeader header{ItemKind::kData, 0xfffffff0u, 7, 0};
  const std::string item = Item(header, "abc");
  auto decoded = DecodeItemHeader(item);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->kind, ItemKind::kData);
  EXPECT_EQ(decoded->data_reposted, 0xfffffff0u);
  EXPECT_EQ(decoded->ctrl_reposted, 7u);
  EXPECT_EQ(decoded->body_len, 3u);
  // Little-endian on the wire, byte by byte.
  EXPECT_EQ(static_cast<unsigned char>(item[4]), 0xf0);
  EXPECT_EQ(static_cast<unsigned char>(item[7]), 0xff);
}

TEST(RdmaWire, RejectsMalformedItems) {
  EXPECT_TRUE(DecodeItemHeader("short").status().IsCorruption());
  std::string item = Item({ItemKind::kData, 0, 0, 0}, "abc");
  std::string bad_kind = item;
  bad_kind[0] = 9;
  EXPECT_TRUE(DecodeItemHeader(bad_kind).status().IsCorruption());
  std::string reserved = item;
  reserved[2] = 1;
  EXPECT_TRUE(DecodeItemHeader(reserved).status().IsCorruption());
  // body_len says 3, but 2 bytes arrived.
  EXPECT_TRUE(DecodeItemHeader(std::string_view(item).substr(0, item.size() - 1)).status().IsCorruption());
  EXPECT_TRUE(DecodeItemHeader(Item({ItemKind::kData, 0, 0, 0}, "")).status().IsCorruption())
      << "empty data item";
  EXPECT_TRUE(DecodeItemHeader(Item({ItemKind::kShutdown, 0, 0, 0}, "x")).status().IsCorruption());
  EXPECT_TRUE(DecodeItemHeader(Item({ItemKind::kBulkDone, 0, 0, 0}, "1234567")).status().IsCorruption());
  EXPECT_TRUE(DecodeItemHeader(Item({ItemKind::kShutdown, 0, 0, 0}, "")).ok());
}

TEST(RdmaWire, HelloRoundTripsAndIsValidated) {
  Hello hello;
  hello.data_depth = 64;
  hello.ctrl_depth = 8;
  hello.recv_buffer_bytes = 65536;
  hello.credit_rkey = 0x1234;
  hello.credit_addr = 0x7f0011223344ull;
  char body[kHelloBodySize];
  EncodeHello(body, hello);
  auto decoded = DecodeHello(std::string_view(body, sizeof body));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->features, 0u) << "what a peer that predates the field sends there";
  hello.features = kHelloAcceptsUncheckedPayloads;
  EncodeHello(body, hello);
  auto with_features = DecodeHello(std::string_view(body, sizeof body));
  ASSERT_TRUE(with_features.ok()) << with_features.status().ToString();
  EXPECT_EQ(with_features->features, kHelloAcceptsUncheckedPayloads);
  hello.features = 0;
  EncodeHello(body, hello);
  EXPECT_EQ(decoded->data_depth, 64u);
  EXPECT_EQ(decoded->ctrl_depth, 8u);
  EXPECT_EQ(decoded->recv_buffer_bytes, 65536u);
  EXPECT_EQ(decoded->credit_rkey, 0x1234u);
  EXPECT_EQ(decoded->credit_addr, 0x7f0011223344ull);

  std::string bad(body, sizeof body);
  bad[0] ^= 1;
  EXPECT_TRUE(DecodeHello(bad).status().IsCorruption()) << "magic";
  bad.assign(body, sizeof body);
  EncodeFixed16(bad.data() + 4, 2);
  auto version = DecodeHello(bad);
  EXPECT_TRUE(version.status().IsCorruption());
  EXPECT_NE(version.status().message().find("version 2"), std::string::npos) << version.status().ToString();
  Hello zero = hello;
  zero.data_depth = 0;
  EncodeHello(body, zero);
  EXPECT_TRUE(DecodeHello(std::string_view(body, sizeof body)).status().IsCorruption());
  Hello tiny = hello;
  tiny.recv_buffer_bytes = 16;
  EncodeHello(body, tiny);
  EXPECT_TRUE(DecodeHello(std::string_view(body, sizeof body)).status().IsCorruption());
  EXPECT_TRUE(DecodeHello("too short").status().IsCorruption());
}

TEST(RdmaWire, BulkSegmentAndDoneRoundTrip) {
  BulkSegment segment{0xdeadbeef000ull, 77, 5u << 20, 42};
  char body[kBulkSegmentBodySize];
  EncodeBulkSegment(body, segment);
  auto decoded = DecodeBulkSegment(std::string_view(body, sizeof body));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->remote_addr, segment.remote_addr);
  EXPECT_EQ(decoded->rkey, 77u);
  EXPECT_EQ(decoded->length, 5u << 20);
  EXPECT_EQ(decoded->segment_id, 42u);
  segment.length = 0;
  EncodeBulkSegment(body, segment);
  EXPECT_TRUE(DecodeBulkSegment(std::string_view(body, sizeof body)).status().IsCorruption());

  char done[kBulkDoneBodySize];
  EncodeBulkDone(done, 99);
  auto id = DecodeBulkDone(std::string_view(done, sizeof done));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, 99u);
  EXPECT_TRUE(IsControlItem(ItemKind::kHello));
  EXPECT_TRUE(IsControlItem(ItemKind::kBulkDone));
  EXPECT_FALSE(IsControlItem(ItemKind::kData));
  EXPECT_FALSE(IsControlItem(ItemKind::kShutdown));
}

TEST(RdmaWire, CounterDeltaWraps) {
  EXPECT_EQ(CounterDelta(5, 3), 2);
  EXPECT_EQ(CounterDelta(3, 5), -2);
  EXPECT_EQ(CounterDelta(2, 0xfffffffeu), 4);
  EXPECT_EQ(CounterDelta(0xfffffffeu, 2), -4);
}

// --- credits ----------------------------------------------------------------

TEST(RdmaCredits, SenderStopsAtDepthAndResumesOnReports) {
  SendCredits credits(4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(credits.CanSend());
    credits.Consume();
  }
  EXPECT_FALSE(credits.CanSend());
  EXPECT_EQ(credits.available(), 0u);
  ASSERT_TRUE(credits.OnPeerReport(3).ok());
  EXPECT_EQ(credits.available(), 3u);
  ASSERT_TRUE(credits.OnPeerReport(2).ok()) << "stale report is ignored";
  EXPECT_EQ(credits.available(), 3u);
  EXPECT_TRUE(credits.OnPeerReport(5).IsCorruption()) << "more re-posts than items sent";
  EXPECT_EQ(credits.peer_reposted(), 3u);
  credits.SetDepth(8);
  EXPECT_EQ(credits.available(), 7u);
}

TEST(RdmaCredits, ZeroDepthAllowsNothingUntilHello) {
  SendCredits credits(0);
  EXPECT_FALSE(credits.CanSend());
  credits.SetDepth(2);
  EXPECT_TRUE(credits.CanSend());
}

TEST(RdmaCredits, ReturnerReportsAtThreshold) {
  CreditReturner returner(3);
  returner.OnReposted(2);
  EXPECT_FALSE(returner.ReportDue());
  returner.OnReposted();
  EXPECT_TRUE(returner.ReportDue());
  EXPECT_EQ(returner.TakeForPiggyback(), 3u);
  EXPECT_FALSE(returner.ReportDue());
  EXPECT_EQ(returner.unreported(), 0u);
  CreditReturner zero(0);  // clamps to 1
  zero.OnReposted();
  EXPECT_TRUE(zero.ReportDue());
}

// A sender and a receiver wired through the credit classes only: the
// receiver's ring of `depth` slots must never be overrun, every item must
// arrive in order, and the pair must never stall (a stalled sender always
// gets a report eventually).
TEST(RdmaCredits, SimulatedLinkNeverOverrunsTheReceiveRing) {
  for (uint32_t depth : {1u, 2u, 7u, 64u}) {
    std::mt19937 rng(depth);
    SendCredits credits(depth);
    CreditReturner returner(std::max<uint32_t>(1, depth / 8));
    std::deque<uint32_t> ring;           // items sitting in receive slots, unconsumed
    std::deque<uint32_t> credit_writes;  // explicit reports in flight
    uint32_t next_send = 0, next_expect = 0;
    const uint32_t total = 5000;
    for (int step = 0; step < 200000 && next_expect < total; ++step) {
      switch (rng() % 3) {
        case 0:  // sender
          if (next_send < total && credits.CanSend()) {
            credits.Consume();
            ring.push_back(next_send++);
            ASSERT_LE(ring.size(), depth) << "receive ring overrun at depth " << depth;
          }
          break;
        case 1:  // receiver application consumes and re-posts
          if (!ring.empty()) {
            ASSERT_EQ(ring.front(), next_expect);
            ring.pop_front();
            ++next_expect;
            returner.OnReposted();
            if (returner.ReportDue()) credit_writes.push_back(returner.TakeForPiggyback());
          }
          break;
        case 2:  // an explicit credit write lands
          if (!credit_writes.empty()) {
            ASSERT_TRUE(credits.OnPeerReport(credit_writes.front()).ok());
            credit_writes.pop_front();
          }
          break;
      }
    }
    EXPECT_EQ(next_expect, total) << "link stalled at depth " << depth;
  }
}

// --- slot pool --------------------------------------------------------------

TEST(RdmaSlotPool, HandsOutEachSlotOnce) {
  SlotPool pool(3);
  std::vector<uint32_t> got;
  for (int i = 0; i < 3; ++i) {
    auto slot = pool.Acquire();
    ASSERT_TRUE(slot.has_value());
    got.push_back(*slot);
  }
  EXPECT_FALSE(pool.Acquire().has_value());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 2}));
  ASSERT_TRUE(pool.Release(1).ok());
  EXPECT_EQ(pool.Release(1).code(), StatusCode::kInternal) << "double release";
  EXPECT_EQ(pool.Release(3).code(), StatusCode::kInternal) << "out of range";
  EXPECT_EQ(*pool.Acquire(), 1u);
  EXPECT_EQ(pool.free_count(), 0u);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(pool.Release(i).ok());
  EXPECT_TRUE(pool.all_free());
}

// --- fragmentation / reassembly ---------------------------------------------

// Encodes frames, cuts the byte stream into items of `capacity` bytes with a
// StreamPacker, and returns the item bodies.
std::vector<std::string> Fragment(const std::vector<std::pair<uint16_t, std::string>>& frames,
                                  size_t capacity, std::vector<std::string>* headers) {
  StreamPacker packer;
  for (const auto& [type, payload] : frames) {
    headers->emplace_back(kFrameHeaderSize, '\0');
    EncodeFrameHeader(headers->back().data(), type, payload, 0);
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    packer.Append((*headers)[i]);
    packer.Append(frames[i].second);
  }
  std::vector<std::string> items;
  while (!packer.done()) {
    std::string buf(capacity, '\0');
    const size_t n = packer.Fill(buf.data(), buf.size());
    buf.resize(n);
    items.push_back(buf);
  }
  return items;
}

TEST(RdmaStream, PackerCutsPiecesAcrossBoundaries) {
  StreamPacker packer;
  packer.Append("hello ");
  packer.Append("");
  packer.Append("world");
  EXPECT_EQ(packer.remaining(), 11u);
  char buf[4];
  std::string out;
  while (!packer.done()) {
    const size_t n = packer.Fill(buf, sizeof buf);
    ASSERT_GT(n, 0u);
    ASSERT_LE(n, sizeof buf);
    out.append(buf, n);
  }
  EXPECT_EQ(out, "hello world");
  EXPECT_EQ(packer.Fill(buf, sizeof buf), 0u);
}

TEST(RdmaStream, ReassemblesFramesLargerThanOneSlotInOrder) {
  std::vector<std::pair<uint16_t, std::string>> frames = {
      {1, ""}, {2, "x"}, {3, RandomBytes(1000, 1)}, {4, RandomBytes(100000, 2)}, {5, "tail"}};
  std::vector<std::string> headers;
  const std::vector<std::string> items = Fragment(frames, 97, &headers);
  ASSERT_GT(items.size(), 1000u);

  InboundStream stream;
  FrameAssembler assembler(1 << 20);
  std::vector<uint32_t> released;
  std::vector<Message> got;
  // Items arrive one at a time; the assembler is stepped after each, as a
  // Receive would be, so frames are rebuilt across partial arrivals.
  for (size_t i = 0; i < items.size(); ++i) {
    InboundItem item;
    item.kind = ItemKind::kData;
    item.slot = static_cast<uint32_t>(i);
    item.data = items[i];
    stream.Push(item);
    for (;;) {
      auto step = assembler.Step(stream, &released);
      ASSERT_TRUE(step.ok()) << step.status().ToString();
      if (!step->has_value()) break;
      got.push_back(std::move(**step));
    }
  }
  ASSERT_EQ(got.size(), frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(got[i].type, frames[i].first);
    EXPECT_EQ(got[i].payload, frames[i].second) << "frame " << i;
    EXPECT_EQ(got[i].bulk_bytes, 0u);
  }
  // Every slot was released exactly once, in arrival order.
  ASSERT_EQ(released.size(), items.size());
  for (size_t i = 0; i < released.size(); ++i) EXPECT_EQ(released[i], i);
  EXPECT_TRUE(stream.empty());
  EXPECT_TRUE(assembler.at_boundary());
}

// The reassembly buffer follows the bytes that arrived, as the TCP backend's
// receive buffer does: a header announcing a huge payload reserves nothing
// for it beyond 64 KiB, and a frame whose bytes are all queued is sized to
// them at once (not doubled up from 64 KiB, re-copying at every step).
TEST(RdmaStream, PayloadBufferGrowsWithArrivedBytesNotTheAnnouncedLength) {
  std::vector<uint32_t> released;
  {
    // 200 MiB announced, 1 KiB sent, then nothing: a stalled peer.
    // The header of a 200 MiB frame, with a valid header CRC (the payload
    // CRC cannot matter: the frame never completes).
    char header[kFrameHeaderSize];
    EncodeFrameHeader(header, 3, std::string_view(), 0);
    EncodeFixed32(header + 8, 200u << 20);
    EncodeFixed32(header + 28, crc32c::Value(header, 28));
    const std::string first = std::string(header, sizeof header) + std::string(1024, 'a');
    InboundStream stream;
    stream.Push(InboundItem{ItemKind::kData, 0, first, {}, 0});
    FrameAssembler assembler(256u << 20);
    auto step = assembler.Step(stream, &released);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_FALSE(step->has_value());
    EXPECT_LE(assembler.reserved_payload_bytes(), size_t{64} << 10);
    EXPECT_FALSE(assembler.at_boundary());
  }
  {
    // A 2 MiB frame of which 1.5 MiB (in 8 KiB slots) is already queued: the
    // buffer covers exactly what is here; the rest arrives and completes it.
    const std::string payload = RandomBytes(size_t{2} << 20, 9);
    std::vector<std::string> headers;
    const std::vector<std::string> items = Fragment({{4, payload}}, 8192, &headers);
    const size_t queued_items = (size_t{3} << 20) / 2 / 8192;  // 1.5 MiB of slots
    InboundStream stream;
    size_t queued_payload = 0;
    for (size_t i = 0; i < queued_items; ++i) {
      stream.Push(InboundItem{ItemKind::kData, static_cast<uint32_t>(i), items[i], {}, 0});
      queued_payload += items[i].size();
    }
    queued_payload -= kFrameHeaderSize;
    EXPECT_EQ(stream.QueuedDataBytes(), queued_payload + kFrameHeaderSize);
    FrameAssembler assembler(4u << 20);
    auto step = assembler.Step(stream, &released);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_FALSE(step->has_value());
    EXPECT_EQ(assembler.reserved_payload_bytes(), queued_payload);
    for (size_t i = queued_items; i < items.size(); ++i) {
      stream.Push(InboundItem{ItemKind::kData, static_cast<uint32_t>(i), items[i], {}, 0});
    }
    step = assembler.Step(stream, &released);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    ASSERT_TRUE(step->has_value());
    EXPECT_EQ((*step)->payload, payload);
    EXPECT_TRUE(stream.empty());
  }
}

TEST(RdmaStream, ShutdownAtBoundaryIsClosedAndSticky) {
  std::vector<std::string> headers;
  const std::vector<std::string> items = Fragment({{7, "last"}}, 1000, &headers);
  InboundStream stream;
  stream.Push(InboundItem{ItemKind::kData, 0, items[0], {}, 0});
  stream.Push(InboundItem{ItemKind::kShutdown, 1, {}, {}, 0});
  FrameAssembler assembler(1 << 20);
  std::vector<uint32_t> released;
  auto first = assembler.Step(stream, &released);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ((*first)->payload, "last");
  for (int i = 0; i < 2; ++i) {
    auto end = assembler.Step(stream, &released);
    EXPECT_TRUE(end.status().IsClosed()) << end.status().ToString();
  }
}

TEST(RdmaStream, RejectsBrokenStreams) {
  std::vector<std::string> headers;
  const std::vector<std::string> items = Fragment({{7, RandomBytes(50, 3)}}, 40, &headers);
  ASSERT_EQ(items.size(), 3u);  // 82 bytes in pieces of 40
  std::vector<uint32_t> released;
  {
    // Shutdown in the middle of a frame.
    InboundStream stream;
    stream.Push(InboundItem{ItemKind::kData, 0, items[0], {}, 0});
    stream.Push(InboundItem{ItemKind::kShutdown, 1, {}, {}, 0});
    FrameAssembler assembler(1 << 20);
    EXPECT_TRUE(assembler.Step(stream, &released).status().IsCorruption());
  }
  {
    // A bulk segment where a frame header belongs.
    InboundStream stream;
    stream.Push(InboundItem{ItemKind::kBulkSegment, 0, {}, BulkSegment{1, 2, 3, 4}, 0});
    FrameAssembler assembler(1 << 20);
    EXPECT_TRUE(assembler.Step(stream, &released).status().IsCorruption());
  }
  {
    // A flipped payload byte fails the frame CRC.
    std::string corrupt = items[2];
    corrupt[0] ^= 0x40;
    InboundStream stream;
    stream.Push(InboundItem{ItemKind::kData, 0, items[0], {}, 0});
    stream.Push(InboundItem{ItemKind::kData, 1, items[1], {}, 0});
    stream.Push(InboundItem{ItemKind::kData, 2, corrupt, {}, 0});
    FrameAssembler assembler(1 << 20);
    EXPECT_TRUE(assembler.Step(stream, &released).status().IsCorruption());
  }
  {
    // A payload above the receiver's limit is refused from the header alone.
    InboundStream stream;
    stream.Push(InboundItem{ItemKind::kData, 0, items[0], {}, 0});
    FrameAssembler assembler(10);
    EXPECT_TRUE(assembler.Step(stream, &released).status().IsCorruption());
  }
}

TEST(RdmaStream, BulkBytesFollowTheFrameAsDataOrSegments) {
  char header[kFrameHeaderSize];
  EncodeFrameHeader(header, 9, "meta", 10 + 4096);
  std::string first = std::string(header, sizeof header) + "meta" + "0123456789";
  InboundStream stream;
  stream.Push(InboundItem{ItemKind::kData, 0, first, {}, 0});
  stream.Push(InboundItem{ItemKind::kBulkSegment, 1, {}, BulkSegment{0x1000, 5, 4096, 1}, 0});
  FrameAssembler assembler(1 << 20);
  std::vector<uint32_t> released;
  auto message = assembler.Step(stream, &released);
  ASSERT_TRUE(message.ok());
  ASSERT_TRUE(message->has_value());
  EXPECT_EQ((*message)->bulk_bytes, 4106u);
  EXPECT_TRUE(released.empty()) << "the item still holds the eager bulk bytes";
  // Eager bulk bytes straight out of the slot.
  std::string_view piece = stream.PeekData(4);
  EXPECT_EQ(piece, "0123");
  stream.AdvanceData(4, &released);
  char rest[6];
  EXPECT_EQ(stream.ReadData(rest, sizeof rest, &released), 6u);
  EXPECT_EQ(std::string(rest, 6), "456789");
  EXPECT_EQ(released, (std::vector<uint32_t>{0}));
  // Then the segment, consumed in two pieces.
  ASSERT_EQ(stream.front()->kind, ItemKind::kBulkSegment);
  EXPECT_TRUE(stream.PeekData(10).empty());
  EXPECT_FALSE(stream.AdvanceSegment(1000, &released));
  EXPECT_EQ(stream.front()->consumed, 1000u);
  EXPECT_TRUE(stream.AdvanceSegment(3096, &released));
  EXPECT_EQ(released, (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(stream.empty());
}

// --- connection state machine -----------------------------------------------

TEST(RdmaConnectionState, ActiveAndPassivePaths) {
  ConnectionStateMachine active;
  EXPECT_FALSE(active.CheckSend().ok());
  ASSERT_TRUE(active.Apply(ConnEvent::kResolveAddress).ok());
  ASSERT_TRUE(active.Apply(ConnEvent::kAddressResolved).ok());
  ASSERT_TRUE(active.Apply(ConnEvent::kRouteResolved).ok());
  EXPECT_EQ(active.state(), ConnState::kConnecting);
  ASSERT_TRUE(active.Apply(ConnEvent::kEstablished).ok());
  EXPECT_TRUE(active.CheckAlive().ok()) << "control items flow while awaiting hello";
  EXPECT_FALSE(active.CheckSend().ok()) << "data waits for the hello";
  ASSERT_TRUE(active.Apply(ConnEvent::kHelloReceived).ok());
  EXPECT_TRUE(active.CheckSend().ok());
  EXPECT_TRUE(active.ReceiveEndStatus().ok());

  ConnectionStateMachine passive;
  ASSERT_TRUE(passive.Apply(ConnEvent::kConnectRequest).ok());
  ASSERT_TRUE(passive.Apply(ConnEvent::kEstablished).ok());
  ASSERT_TRUE(passive.Apply(ConnEvent::kHelloReceived).ok());
  EXPECT_EQ(passive.state(), ConnState::kOpen);
}

TEST(RdmaConnectionState, RefusesOutOfOrderEvents) {
  ConnectionStateMachine m;
  EXPECT_EQ(m.Apply(ConnEvent::kRouteResolved).code(), StatusCode::kInternal);
  EXPECT_EQ(m.Apply(ConnEvent::kHelloReceived).code(), StatusCode::kInternal);
  EXPECT_EQ(m.state(), ConnState::kIdle);
  ASSERT_TRUE(m.Apply(ConnEvent::kResolveAddress).ok());
  EXPECT_EQ(m.Apply(ConnEvent::kEstablished).code(), StatusCode::kInternal);
  EXPECT_EQ(m.Apply(ConnEvent::kResolveAddress).code(), StatusCode::kInternal);
}

TEST(RdmaConnectionState, DisconnectFailsButPeerShutdownStillReadsClosed) {
  ConnectionStateMachine m;
  ASSERT_TRUE(m.Apply(ConnEvent::kConnectRequest).ok());
  ASSERT_TRUE(m.Apply(ConnEvent::kEstablished).ok());
  ASSERT_TRUE(m.Apply(ConnEvent::kHelloReceived).ok());
  ASSERT_TRUE(m.Apply(ConnEvent::kDisconnected).ok());
  EXPECT_EQ(m.state(), ConnState::kFailed);
  EXPECT_TRUE(m.CheckSend().IsUnavailable()) << m.CheckSend().ToString();
  EXPECT_TRUE(m.ReceiveEndStatus().IsUnavailable());
  m.Fail(Status::Corruption("later failure"));
  EXPECT_TRUE(m.failure().IsUnavailable()) << "the first failure wins";
  m.MarkPeerShutdown();
  EXPECT_TRUE(m.ReceiveEndStatus().IsClosed());
  ASSERT_TRUE(m.Apply(ConnEvent::kClose).ok());
  EXPECT_EQ(m.CheckSend().code(), StatusCode::kAborted);
  EXPECT_EQ(m.ReceiveEndStatus().code(), StatusCode::kAborted);
  ASSERT_TRUE(m.Apply(ConnEvent::kClose).ok()) << "close is idempotent";
  ASSERT_TRUE(m.Apply(ConnEvent::kDisconnected).ok());
  EXPECT_EQ(m.state(), ConnState::kClosed);
}

TEST(RdmaConnectionState, LocalShutdownStopsDataButNotControl) {
  ConnectionStateMachine m;
  ASSERT_TRUE(m.Apply(ConnEvent::kConnectRequest).ok());
  ASSERT_TRUE(m.Apply(ConnEvent::kEstablished).ok());
  ASSERT_TRUE(m.Apply(ConnEvent::kHelloReceived).ok());
  m.MarkLocalShutdown();
  EXPECT_TRUE(m.CheckSend().IsUnavailable());
  EXPECT_TRUE(m.CheckAlive().ok());
  EXPECT_TRUE(m.ReceiveEndStatus().ok()) << "receiving continues after our own Shutdown";
}

}  // namespace
}  // namespace canopy::transport::rdma

namespace canopy::transport::rdma {
namespace {

// A vanished peer must be seen within io_timeout: one probe interval of quiet, then every retry
// of the probe unanswered.
TEST(RdmaBulkPolicy, SoftwareDevicesSendUpToOneMebibyteEagerlyUnlessTold) {
  constexpr uint32_t kRxe = 0xFFFFFF, kOldRxe = 0, kSiw = 0x626d74, kMellanox = 0x02c9, kBroadcom = 0x14e4;
  for (uint32_t soft : {kRxe, kOldRxe, kSiw}) {
    EXPECT_TRUE(IsSoftwareRdmaVendor(soft)) << soft;
    EXPECT_EQ(EagerBulkFor(std::nullopt, soft), uint64_t{1} << 20) << soft;
  }
  for (uint32_t hard : {kMellanox, kBroadcom}) {
    EXPECT_FALSE(IsSoftwareRdmaVendor(hard)) << hard;
    EXPECT_EQ(EagerBulkFor(std::nullopt, hard), uint64_t{64} << 10) << hard;
  }
  // An explicit eager_bulk wins on every device, 0 included (everything a READ).
  EXPECT_EQ(EagerBulkFor(4096, kRxe), 4096u);
  EXPECT_EQ(EagerBulkFor(0, kRxe), 0u);
  EXPECT_EQ(EagerBulkFor(8u << 20, kMellanox), 8u << 20);
}

TEST(RdmaKeepalive, ProbePlusRetriesFitInTheIoTimeout) {
  using std::chrono::milliseconds;
  for (milliseconds io : {milliseconds(2000), milliseconds(8000), milliseconds(30000), milliseconds(120000)}) {
    const uint8_t e = AckTimeoutExponentFor(io);
    EXPECT_GE(e, 14);
    EXPECT_LE(e, 20);
    const auto retries = AckTimeoutFor(e) * (kRetryCount + 1);
    EXPECT_LE(retries, io / 2) << io.count();
    EXPECT_LT(ProbeIntervalFor(io) + retries, io) << io.count();
    // The largest exponent that fits is chosen (fewer spurious retransmits on a slow peer).
    if (e < 20) {
      EXPECT_GT(AckTimeoutFor(e + 1) * (kRetryCount + 1), io / 2) << io.count();
    }
  }
  EXPECT_LT(kRetryCount, 7);  // rxe retries forever at 7
  EXPECT_EQ(AckTimeoutExponentFor(milliseconds(8000)), 17);  // 537 ms per attempt, 3.8 s in all
  EXPECT_EQ(AckTimeoutExponentFor(milliseconds(10)), 14);    // clamped: never below 67 ms
  EXPECT_EQ(AckTimeoutExponentFor(milliseconds(3600000)), 20);
  EXPECT_EQ(ProbeIntervalFor(milliseconds(8000)), milliseconds(2000));
  EXPECT_EQ(ProbeIntervalFor(milliseconds(100)), milliseconds(100));
  EXPECT_EQ(ProbeIntervalFor(milliseconds(3600000)), milliseconds(10000));
}

// --- one-sided log ring layout ----------------------------------------------

TEST(RdmaLogRingLayout, RingSizesAreChecked) {
  EXPECT_TRUE(CheckRingBytes(4096).ok());
  EXPECT_EQ(CheckRingBytes(32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRingBytes(4100).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRingBytes(kRingMaxBytes + 8).code(), StatusCode::kInvalidArgument);
}

TEST(RdmaLogRingLayout, RecordsArePlacedWholeAndWrapWithAPadOrASilentSkip) {
  EXPECT_EQ(RingRecordBytes(0), 32u);
  EXPECT_EQ(RingRecordBytes(1), 40u);
  EXPECT_EQ(RingRecordBytes(8), 40u);
  // Fits where the tail is.
  auto fits = PlaceRecord(1000 + 64, 1000, 8);
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(fits->offset, 64u);
  EXPECT_EQ(fits->skip_bytes, 0u);
  EXPECT_FALSE(fits->pad_record);
  EXPECT_EQ(fits->advance(), 40u);
  // 80 bytes left, the record needs 96: a pad at 920, the record at 0.
  auto padded = PlaceRecord(920, 1000, 64);
  ASSERT_TRUE(padded.ok());
  EXPECT_TRUE(padded->pad_record);
  EXPECT_EQ(padded->skip_bytes, 80u);
  EXPECT_EQ(padded->offset, 0u);
  EXPECT_EQ(padded->advance(), 80u + 96u);
  // 16 bytes left (less than a header): skipped without a pad, as the receiver skips them.
  auto skipped = PlaceRecord(2 * 1000 - 16, 1000, 0);
  ASSERT_TRUE(skipped.ok());
  EXPECT_FALSE(skipped->pad_record);
  EXPECT_EQ(skipped->skip_bytes, 16u);
  EXPECT_EQ(RingImplicitSkip(2 * 1000 - 16, 1000), 16u);
  EXPECT_EQ(RingImplicitSkip(2 * 1000 - 24, 1000), 0u);
  // Never fits.
  EXPECT_EQ(PlaceRecord(0, 64, 64).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(PlaceRecord(0, 64, 32).ok());
}

TEST(RdmaLogRingLayout, FreeBytesRefuseImpossibleReports) {
  EXPECT_EQ(*RingFreeBytes(0, 0, 256), 256u);
  EXPECT_EQ(*RingFreeBytes(300, 100, 256), 56u);
  EXPECT_EQ(RingFreeBytes(100, 101, 256).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(RingFreeBytes(600, 100, 256).status().code(), StatusCode::kCorruption);
}

TEST(RdmaLogRingLayout, RecordCarriesItsSeqTwiceAndACrcOverHeaderAndPayload) {
  const std::string payload = "delta bytes";
  std::string record(RingRecordBytes(payload.size()), '\x55');
  EncodeRingRecord(record.data(), 7, 3, payload);
  const RingRecordHeader header = DecodeRingRecordHeader(record.data());
  EXPECT_EQ(header.seq, 7u);
  EXPECT_EQ(header.epoch, 3u);
  EXPECT_EQ(header.length, payload.size());
  EXPECT_EQ(header.crc, RingRecordCrc(header, payload));
  EXPECT_EQ(record.substr(kRingRecordHeaderSize, payload.size()), payload);
  EXPECT_EQ(DecodeFixed64(record.data() + record.size() - kRingRecordTrailerSize), 7u);
  for (size_t i = kRingRecordHeaderSize + payload.size(); i < record.size() - kRingRecordTrailerSize; ++i) {
    EXPECT_EQ(record[i], '\0') << i;
  }
  // Another epoch or a changed byte gives another CRC.
  RingRecordHeader other = header;
  other.epoch = 4;
  EXPECT_NE(RingRecordCrc(other, payload), header.crc);
  EXPECT_NE(RingRecordCrc(header, "delta bytez"), header.crc);
  std::string pad(kRingRecordHeaderSize, '\0');
  EncodeRingPad(pad.data(), 8, 3);
  const RingRecordHeader pad_header = DecodeRingRecordHeader(pad.data());
  EXPECT_EQ(pad_header.length, kRingPadLength);
  EXPECT_EQ(pad_header.crc, RingRecordCrc(pad_header, {}));
}

TEST(RdmaLogRingLayout, TornFeedbackIsDetected) {
  char block[kFeedbackBlockSize];
  EncodeFeedback(block, RingFeedback{4096, 17});
  auto feedback = DecodeFeedback(block);
  ASSERT_TRUE(feedback.has_value());
  EXPECT_EQ(feedback->consumed, 4096u);
  EXPECT_EQ(feedback->durable, 17u);
  char newer[kFeedbackBlockSize];
  EncodeFeedback(newer, RingFeedback{8192, 18});
  std::memcpy(block, newer, 8);  // half of the newer report has landed
  EXPECT_FALSE(DecodeFeedback(block).has_value());
}

TEST(RdmaLogRingLayout, CredentialsRoundTripAndRejectGarbage) {
  const RingOffer offer{0x7f0000001000ull, 0x1234, 1u << 20, 9};
  auto decoded = DecodeRingOffer(EncodeRingOffer(offer));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->addr, offer.addr);
  EXPECT_EQ(decoded->rkey, offer.rkey);
  EXPECT_EQ(decoded->ring_bytes, offer.ring_bytes);
  EXPECT_EQ(decoded->epoch, offer.epoch);
  std::string bad = EncodeRingOffer(offer);
  bad[0] ^= 1;
  EXPECT_EQ(DecodeRingOffer(bad).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeRingOffer(EncodeRingOffer(RingOffer{1, 2, 12, 1})).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeRingOffer("short").status().code(), StatusCode::kCorruption);

  const FeedbackTarget target{0x7f0000002000ull, 0x99, 9};
  auto back = DecodeFeedbackTarget(EncodeFeedbackTarget(target));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->addr, target.addr);
  EXPECT_EQ(back->rkey, target.rkey);
  EXPECT_EQ(back->epoch, target.epoch);
  EXPECT_EQ(DecodeFeedbackTarget(EncodeRingOffer(offer)).status().code(), StatusCode::kCorruption);
}

// ---- one-sided stream records (one_sided_record.h) ----

TEST(RdmaOneSidedRecord, MessagesAndMarkersRoundTrip) {
  std::string record;
  EncodeOneSidedMessage(0x0114, "delta bytes", &record);
  ASSERT_EQ(record.size(), kOneSidedRecordHeaderSize + 11);
  auto m = DecodeOneSidedRecord(record);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, OneSidedRecordKind::kMessage);
  EXPECT_EQ(m->type, 0x0114);
  EXPECT_EQ(m->payload, "delta bytes");
  // An empty message is a message, not a marker.
  EncodeOneSidedMessage(0x0115, "", &record);
  auto empty = DecodeOneSidedRecord(record);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->kind, OneSidedRecordKind::kMessage);
  EXPECT_TRUE(empty->payload.empty());
  for (OneSidedRecordKind kind : {OneSidedRecordKind::kOnStream, OneSidedRecordKind::kEnd}) {
    auto marker = DecodeOneSidedRecord(EncodeOneSidedMarker(kind));
    ASSERT_TRUE(marker.ok()) << marker.status().ToString();
    EXPECT_EQ(marker->kind, kind);
    EXPECT_EQ(marker->type, 0);
    EXPECT_TRUE(marker->payload.empty());
  }
}

TEST(RdmaOneSidedRecord, MalformedRecordsAreCorruption) {
  EXPECT_EQ(DecodeOneSidedRecord("").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeOneSidedRecord(std::string("\x01\x14", 2)).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeOneSidedRecord(std::string("\x00\x00\x00", 3)).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeOneSidedRecord(std::string("\x04\x00\x00", 3)).status().code(), StatusCode::kCorruption);
  // A marker carries nothing: bytes after it, or a type, are not a marker.
  std::string marker = EncodeOneSidedMarker(OneSidedRecordKind::kOnStream);
  EXPECT_EQ(DecodeOneSidedRecord(marker + "x").status().code(), StatusCode::kCorruption);
  marker[1] = 1;
  EXPECT_EQ(DecodeOneSidedRecord(marker).status().code(), StatusCode::kCorruption);
}

TEST(RdmaOneSidedRecord, InlineLimitIsAQuarterOfTheRing) {
  for (uint64_t ring : {uint64_t{4096}, uint64_t{1} << 20, uint64_t{65536}, uint64_t{1000}}) {
    const uint64_t max = OneSidedMaxInlinePayload(ring);
    ASSERT_GT(max, 0u) << ring;
    // The largest inline message's record takes at most a quarter of the ring, and fits.
    EXPECT_LE(RingRecordBytes(kOneSidedRecordHeaderSize + max), ring / 4) << ring;
    EXPECT_GT(RingRecordBytes(kOneSidedRecordHeaderSize + max + 8), ring / 4) << ring;
    EXPECT_TRUE(PlaceRecord(ring - 8, ring, kOneSidedRecordHeaderSize + max).ok()) << ring;
  }
  EXPECT_EQ(OneSidedMaxInlinePayload(64), 0u);  // 16 bytes: not even the headers
  EXPECT_EQ(OneSidedMaxInlinePayload(128), 0u);
  EXPECT_EQ(OneSidedMaxInlinePayload(256), 29u);  // a 64-byte record
}

}  // namespace
}  // namespace canopy::transport::rdma
