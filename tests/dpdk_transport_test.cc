// The dpdk:// backend in one process: two net_memif ports (server and client
// on the same socket, --no-huge) carry the shared transport conformance
// suite, a lossy 256 MiB transfer with drop + reordering + duplication
// injected, and the wire codec / argument parsing. The two-process, killed
// peer, bad-EAL and veth/af_packet cases are in dpdk_process_test.cc (they
// need processes of their own: the EAL is once per process).

#include <gtest/gtest.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <sys/mman.h>
#include <csignal>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/crc32c.h"
#include "tests/dpdk_test_util.h"
#include "tests/testing/test_util.h"
#include "tests/transport_conformance.h"
#include "transport/builtin.h"
#include "transport/dpdk/burst_fault_guard.h"
#include "transport/dpdk/byte_ring.h"
#include "transport/dpdk/dpdk_conn.h"
#include "transport/dpdk/dpdk_port.h"
#include "transport/dpdk/dpdk_wire.h"
#include "transport/registry.h"

namespace canopy::transport {
namespace {

using namespace std::chrono_literals;
using ::canopy::testing::RandomBytes;
using testing::ConformanceBackend;
using testing::TransportConformanceTest;

ConformanceBackend MemifBackend() {
  return ConformanceBackend{
      "memif_pair", "dpdk://10.0.0.1:0", MemifOptions("port=0"), MemifOptions("port=1"), {}};
}

ConformanceBackend MemifSmallWindows() {
  ConformanceBackend b{
      "memif_small_windows", "dpdk://10.0.0.1:0", MemifOptions("port=0"), MemifOptions("port=1"), {}};
  for (TransportOptions* o : {&b.listener_options, &b.dialer_options}) {
    o->buffer_bytes = 64 << 10;
    o->max_inflight_bytes = 64 << 10;
  }
  return b;
}

// memif works under ASan too (no hugepages, plain mmap), so no skip here.
INSTANTIATE_TEST_SUITE_P(Dpdk, TransportConformanceTest,
                         ::testing::Values(MemifBackend(), MemifSmallWindows()),
                         testing::ConformanceBackendName);

TEST(DpdkTransport, UriParamsAndStatsAndPeerUri) {
  auto pair = ConnectMemifPair("mtu=1500");
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  EXPECT_EQ(pair->client->peer_uri(), pair->listener->local_endpoint().ToUri());
  EXPECT_EQ(pair->server->peer_uri().rfind("dpdk://10.0.0.101:", 0), 0u) << pair->server->peer_uri();
  ASSERT_TRUE(pair->client->Send(3, "hello").ok());
  auto msg = pair->server->Receive(Deadline::After(5s));
  ASSERT_TRUE(msg.ok()) << msg.status().ToString();
  EXPECT_EQ(msg->payload, "hello");
  EXPECT_EQ(pair->client->stats().messages_sent, 1u);
  EXPECT_EQ(pair->server->stats().bytes_received, 5u);
}

TEST(DpdkTransport, UnknownPortIsNotFound) {
  RegisterBuiltinTransports();
  auto t = TransportRegistry::Global().Create("dpdk", MemifOptions("port=7"));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto l = (*t)->Listen(*ParseEndpoint("dpdk://10.0.0.1:0"));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kNotFound) << l.status().ToString();
  auto named = (*t)->Listen(*ParseEndpoint("dpdk://10.0.0.1:0?port=net_memif9"));
  EXPECT_EQ(named.status().code(), StatusCode::kNotFound) << named.status().ToString();
  auto v6 = (*t)->Listen(*ParseEndpoint("dpdk://[::1]:0?port=0"));
  EXPECT_EQ(v6.status().code(), StatusCode::kInvalidArgument) << v6.status().ToString();
}

// Prepare brings the port up without a peer: it returns at once for an
// address nobody listens on (Connect there would wait for connect_timeout),
// fails as Connect would for a port that does not exist, and goes through
// fault+ to the inner transport.
TEST(DpdkTransport, PrepareStartsThePortWithoutAPeer) {
  RegisterBuiltinTransports();
  TransportOptions options = MemifOptions("port=1");
  options.connect_timeout = 10s;
  auto t = TransportRegistry::Global().Create("dpdk", options);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const auto start = std::chrono::steady_clock::now();
  Status prepared = (*t)->Prepare(*ParseEndpoint("dpdk://10.0.0.77:4000"));
  EXPECT_TRUE(prepared.ok()) << prepared.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "Prepare waited for a peer";

  Status missing = (*t)->Prepare(*ParseEndpoint("dpdk://10.0.0.77:4000?port=net_memif9"));
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
  auto dialed = (*t)->Connect(*ParseEndpoint("dpdk://10.0.0.77:4000?port=net_memif9"));
  EXPECT_EQ(dialed.status().code(), StatusCode::kNotFound) << dialed.status().ToString();

  EXPECT_TRUE(PrepareDial("fault+dpdk://10.0.0.77:4000?drop=0.1", options).ok());
  Status bad_fault = PrepareDial("fault+dpdk://10.0.0.77:4000?drop=7", options);
  EXPECT_EQ(bad_fault.code(), StatusCode::kInvalidArgument) << bad_fault.ToString();
  EXPECT_EQ(PrepareDial("nosuch://10.0.0.77:4000", options).code(), StatusCode::kNotFound);
}

// A SegmentOutput that records what a connection asks of the port and knows
// a MAC only once told (the ARP reply).
class RecordingOutput final : public dpdk::SegmentOutput {
 public:
  bool Emit(const dpdk::ConnState&, const dpdk::MacAddress&, const dpdk::SegmentHeader& h,
            const dpdk::ByteRing*, uint64_t) override {
    emitted.push_back(h.kind);
    headers.push_back(h);
    return true;
  }
  bool Neighbour(uint32_t, dpdk::MacAddress* mac) override {
    if (!mac_known) return false;
    *mac = dpdk::MacAddress{};
    return true;
  }
  void SendArpRequest(uint32_t, uint32_t) override { ++arp_requests; }

  bool mac_known = false;
  int arp_requests = 0;
  std::vector<dpdk::SegmentKind> emitted;
  std::vector<dpdk::SegmentHeader> headers;
};

// A client's parameters: 10.0.0.1:1000 -> 10.0.0.2:2000, connection id 1.
dpdk::ConnParams ClientParams() {
  dpdk::ConnParams params;
  params.local_id = 1;
  params.local_ip = 0x0a000001;
  params.remote_ip = 0x0a000002;
  params.local_port = 1000;
  params.remote_port = 2000;
  return params;
}

// The dialler sends its SYN on the first poll after the ARP reply arrives,
// not at the next handshake retry (50 ms later): that retry once cost every
// rcopy over dpdk:// 50 ms before its first byte.
TEST(DpdkConnState, SynGoesOutOnThePollAfterTheArpReply) {
  const dpdk::ConnParams params = ClientParams();
  const uint64_t t0 = 1'000'000'000;
  auto conn = dpdk::ConnState::NewClient(params, t0);
  RecordingOutput out;
  conn->Poll(out, t0, 32);
  EXPECT_EQ(out.arp_requests, 1);
  EXPECT_TRUE(out.emitted.empty());

  conn->Poll(out, t0 + 10'000, 32);  // 10 us on, no reply yet: nothing new
  EXPECT_EQ(out.arp_requests, 1);
  EXPECT_TRUE(out.emitted.empty());

  out.mac_known = true;  // the reply arrived
  conn->Poll(out, t0 + 20'000, 32);
  ASSERT_EQ(out.emitted.size(), 1u);
  EXPECT_EQ(out.emitted[0], dpdk::SegmentKind::kSyn);
  EXPECT_EQ(out.arp_requests, 1);

  conn->Poll(out, t0 + 30'000, 32);  // the SYN is not repeated before its retry time
  EXPECT_EQ(out.emitted.size(), 1u);
}

// A frame's payload held in pieces, as a multi-segment mbuf chain holds it.
class PiecewisePayload final : public dpdk::PayloadSource {
 public:
  PiecewisePayload(std::string bytes, uint32_t piece) : bytes_(std::move(bytes)), piece_(piece) {}
  void CopyOut(uint32_t offset, uint32_t len, char* dst) const override {
    std::memcpy(dst, bytes_.data() + offset, len);
  }
  Span SpanAt(uint32_t offset, uint32_t len) const override {
    return Span{bytes_.data() + offset, std::min(len, piece_ - offset % piece_)};
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
  uint32_t piece_;
};

// An established client connection (its peer's id 7) for driving by hand.
// The listener's (connection 7) answer to ClientParams()'s SYN, with the
// handshake `features` (dpdk_wire.h, kHandshake*).
dpdk::SegmentHeader SynAckTo(const dpdk::ConnParams& client, uint64_t features = 0) {
  dpdk::SegmentHeader syn_ack;
  syn_ack.kind = dpdk::SegmentKind::kSynAck;
  syn_ack.src_conn = 7;
  syn_ack.dst_conn = client.local_id;
  syn_ack.seq = client.mss;
  syn_ack.ack = features;
  syn_ack.window = 1u << 20;
  return syn_ack;
}

// The first segment `conn` emits when polled at `now_ns` (its MAC known).
dpdk::SegmentHeader FirstSegmentOf(dpdk::ConnState& conn, uint64_t now_ns) {
  RecordingOutput out;
  out.mac_known = true;
  conn.Poll(out, now_ns, 32);
  EXPECT_FALSE(out.headers.empty()) << "nothing emitted";
  return out.headers.empty() ? dpdk::SegmentHeader{} : out.headers[0];
}

std::shared_ptr<dpdk::ConnState> EstablishedClient(uint64_t now_ns) {
  const dpdk::ConnParams params = ClientParams();
  auto conn = dpdk::ConnState::NewClient(params, now_ns);
  RecordingOutput out;
  out.mac_known = true;
  conn->Poll(out, now_ns, 32);
  conn->OnSegment(SynAckTo(params), PiecewisePayload("", 1), now_ns);
  return conn;
}

dpdk::SegmentHeader DataSegment(uint64_t seq, uint32_t len) {
  dpdk::SegmentHeader h;
  h.kind = dpdk::SegmentKind::kData;
  h.src_conn = 7;
  h.dst_conn = 1;
  h.seq = seq;
  h.window = 1u << 20;
  h.payload_len = len;
  return h;
}

// The handshake features ride in the ack field of SYN and SYN-ACK (where no
// peer reads an ack): a side whose link cannot damage frames says it accepts
// frames with an unchecked payload, and each side learns what its peer said;
// a peer that sends 0 there (one that predates the field) is taken as not
// accepting them.
TEST(DpdkConnState, HandshakeCarriesTheUncheckedPayloadFeature) {
  const uint64_t t0 = 1'000'000'000;
  for (bool ours : {false, true}) {
    for (bool theirs : {false, true}) {
      dpdk::ConnParams params = ClientParams();
      params.accepts_unchecked_payloads = ours;
      auto client = dpdk::ConnState::NewClient(params, t0);
      const dpdk::SegmentHeader syn = FirstSegmentOf(*client, t0);
      EXPECT_EQ(syn.kind, dpdk::SegmentKind::kSyn);
      EXPECT_EQ(syn.ack, ours ? dpdk::kHandshakeAcceptsUncheckedPayloads : 0u);
      EXPECT_FALSE(client->peer_accepts_unchecked_payloads()) << "nothing heard yet";
      client->OnSegment(SynAckTo(params, theirs ? dpdk::kHandshakeAcceptsUncheckedPayloads : 0),
                        PiecewisePayload("", 1), t0);
      EXPECT_EQ(client->peer_accepts_unchecked_payloads(), theirs);

      // The listening side, from that SYN.
      dpdk::ConnParams server_params = ClientParams();
      server_params.local_id = 7;
      server_params.accepts_unchecked_payloads = theirs;
      auto server = dpdk::ConnState::NewServer(server_params, syn, dpdk::MacAddress{}, t0);
      EXPECT_EQ(server->peer_accepts_unchecked_payloads(), ours);
      const dpdk::SegmentHeader syn_ack = FirstSegmentOf(*server, t0);
      EXPECT_EQ(syn_ack.kind, dpdk::SegmentKind::kSynAck);
      EXPECT_EQ(syn_ack.ack, theirs ? dpdk::kHandshakeAcceptsUncheckedPayloads : 0u);
    }
  }
}

// One copy on receive: a ReadWith that waits posts its drainer, and a frame
// its own thread's poll receives is drained where it lies in the frame, piece
// by piece, with successive bytes; a frame another thread receives meanwhile
// goes through the receive ring. A drainer that takes only part of what it is
// offered leaves the rest, in order, for the next read; one that fails makes
// the read fail with its error.
TEST(DpdkConnState, AWaitingReadWithDrainsItsOwnPollsFramesInPlace) {
  const uint64_t t0 = 1'000'000'000;
  auto conn = EstablishedClient(t0);
  const PiecewisePayload first(RandomBytes(3000, 21), 1000);
  const PiecewisePayload second(RandomBytes(2000, 22), 2000);
  const PiecewisePayload third(RandomBytes(1500, 23), 1500);
  int polls = 0;
  conn->set_poller([&] {
    if (polls++ > 0) return false;
    conn->OnSegment(DataSegment(0, 3000), first, t0);
    return true;
  });
  std::vector<const char*> where;
  std::string got;
  auto take_all = [&](const char* src, size_t len) -> Result<size_t> {
    where.push_back(src);
    got.append(src, len);
    return len;
  };
  auto read = conn->ReadWith(8192, take_all, Deadline::After(2s));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, 3000u);
  EXPECT_EQ(got, first.bytes());
  ASSERT_EQ(where.size(), 3u) << "one call per piece of the frame";
  for (size_t i = 0; i < where.size(); ++i) EXPECT_EQ(where[i], first.bytes().data() + 1000 * i);

  // Received by another thread (the port's I/O thread) before any read: into the ring.
  std::thread io([&] { conn->OnSegment(DataSegment(3000, 2000), second, t0); });
  io.join();
  where.clear();
  got.clear();
  read = conn->ReadWith(8192, take_all, Deadline::After(2s));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(got, second.bytes());
  ASSERT_FALSE(where.empty());
  EXPECT_NE(where[0], second.bytes().data());

  // A drainer that takes 600 bytes of the 1500 offered: the other 900 follow on the next read.
  polls = 0;
  conn->set_poller([&] {
    if (polls++ > 0) return false;
    conn->OnSegment(DataSegment(5000, 1500), third, t0);
    return true;
  });
  got.clear();
  read = conn->ReadWith(
      8192,
      [&](const char* src, size_t len) -> Result<size_t> {
        got.append(src, std::min<size_t>(len, 600));
        return std::min<size_t>(len, 600);
      },
      Deadline::After(2s));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, 600u);
  read = conn->ReadWith(8192, take_all, Deadline::After(2s));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, 900u);
  EXPECT_EQ(got, third.bytes());

  // A drainer that fails: the read returns its error.
  const PiecewisePayload fourth(RandomBytes(100, 24), 100);
  polls = 0;
  conn->set_poller([&] {
    if (polls++ > 0) return false;
    conn->OnSegment(DataSegment(6500, 100), fourth, t0);
    return true;
  });
  read = conn->ReadWith(
      8192, [](const char*, size_t) -> Result<size_t> { return Status::IOError("disk full"); },
      Deadline::After(2s));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().ToString(), Status::IOError("disk full").ToString());
  conn->set_poller(nullptr);
}

// A drainer that is full (the message it reads is complete) declines the
// next frame of the same poll with 0: the read returns what it took, and
// the declined bytes follow on the next read, none lost or repeated.
TEST(DpdkConnState, AFullDrainerDeclinesTheNextFrameOfItsPoll) {
  const uint64_t t0 = 1'000'000'000;
  auto conn = EstablishedClient(t0);
  const PiecewisePayload first(RandomBytes(1200, 31), 1200);
  const PiecewisePayload second(RandomBytes(800, 32), 800);
  int polls = 0;
  conn->set_poller([&] {
    if (polls++ > 0) return false;
    conn->OnSegment(DataSegment(0, 1200), first, t0);
    conn->OnSegment(DataSegment(1200, 800), second, t0);
    return true;
  });
  std::string message;
  int calls = 0;
  auto read = conn->ReadWith(
      8192,
      [&](const char* src, size_t len) -> Result<size_t> {
        ++calls;
        const size_t take = std::min(len, 1200 - message.size());
        message.append(src, take);
        return take;
      },
      Deadline::After(2s));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, 1200u);
  EXPECT_EQ(message, first.bytes());
  EXPECT_EQ(calls, 2) << "offered the second frame once, then no more";
  std::string rest(800, '\0');
  auto got = conn->Read(rest.data(), rest.size(), Deadline::After(2s));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 800u);
  EXPECT_EQ(rest, second.bytes());
  conn->set_poller(nullptr);
}

// A read that polls the port itself and sees no traffic for kSpinNs hands
// the port to its I/O thread at once (a wakeup) before it sleeps: while
// application threads poll, that thread checks back only every 0.1-1 ms.
TEST(DpdkConnState, AReadThatStopsPollingWakesTheIoThread) {
  auto conn = EstablishedClient(1'000'000'000);
  std::atomic<int> polls{0}, wakeups{0};
  conn->set_poller([&] {
    ++polls;
    return false;
  });
  conn->set_wakeup([&] { ++wakeups; });
  char buf[16];
  auto read = conn->Read(buf, sizeof buf, Deadline::After(100ms));
  EXPECT_EQ(read.status().code(), StatusCode::kTimeout) << read.status().ToString();
  EXPECT_GT(polls.load(), 0);
  EXPECT_GE(wakeups.load(), 1) << "the read went to sleep without waking the I/O thread";
  conn->set_poller(nullptr);
  conn->set_wakeup(nullptr);
}

TEST(DpdkTransport, SecondTransportWithOtherEalArgumentsIsRefused) {
  RegisterBuiltinTransports();
  ASSERT_TRUE(TransportRegistry::Global().Create("dpdk", MemifOptions("port=0")).ok());
  TransportOptions other;
  other.backend_args = {"--no-huge", "-m", "128"};
  auto t = TransportRegistry::Global().Create("dpdk", other);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
}

// Two connections on the same port pair, both streaming at once: neither may
// starve the other (the port serves its connections round robin and each has
// its own congestion window). Each keeps sending until both have delivered
// the target, so both are busy the whole time; the deadline only bounds a
// failure. Their shares are measured in bench/scenarios/dpdk_tcp.sh (bench -P 2).
TEST(DpdkTransport, TwoConnectionsOnOnePortBothMakeProgress) {
  constexpr size_t kTarget = size_t{24} << 20;
  constexpr size_t kMessage = size_t{256} << 10;
  std::vector<Pair> pairs;
  for (int i = 0; i < 2; ++i) {
    auto pair = ConnectMemifPair("mtu=9000");
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    pairs.push_back(std::move(*pair));
  }
  const std::string payload = RandomBytes(kMessage, 9);
  std::atomic<bool> stop{false};
  std::atomic<size_t> received[2] = {0, 0};
  Status send_status[2], receive_status[2];
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      while (!stop.load() && send_status[i].ok()) send_status[i] = pairs[i].client->Send(5, payload);
      if (send_status[i].ok()) send_status[i] = pairs[i].client->Shutdown();
    });
    threads.emplace_back([&, i] {
      for (;;) {
        auto msg = pairs[i].server->Receive(Deadline::After(30s));
        if (!msg.ok()) {
          if (!msg.status().IsClosed()) receive_status[i] = msg.status();
          return;
        }
        if (msg->payload != payload) {
          receive_status[i] = Status::Corruption("message differs");
          return;
        }
        received[i] += msg->payload.size();
      }
    });
  }
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while ((received[0] < kTarget || received[1] < kTarget) && std::chrono::steady_clock::now() < deadline &&
         send_status[0].ok() && send_status[1].ok()) {
    std::this_thread::sleep_for(5ms);
  }
  const size_t got[2] = {received[0].load(), received[1].load()};
  stop = true;
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(send_status[i].ok()) << "connection " << i << ": " << send_status[i].ToString();
    EXPECT_TRUE(receive_status[i].ok()) << "connection " << i << ": " << receive_status[i].ToString();
    EXPECT_GE(got[i], kTarget) << "connection " << i << " delivered " << got[i] << " bytes while connection "
                               << 1 - i << " delivered " << got[1 - i];
  }
}

// The UDP checksum over a frame whose payload is a chain of pieces of odd
// lengths (as where the send ring wraps) equals the one over the same bytes
// in one buffer. DPDK 22.11's own multi-segment sum (rte_raw_cksum_mbuf)
// gets the pieces at odd offsets wrong; canopy's Ipv4UdpSum must not.
TEST(DpdkTransport, UdpChecksumOverOddSegmentsMatchesContiguous) {
  ASSERT_TRUE(ConnectMemifPair("mtu=1500").ok());  // the EAL is up from here on
  rte_mempool* pool = rte_pktmbuf_pool_create("cksum_test", 64, 0, 0, 4096 + RTE_PKTMBUF_HEADROOM, SOCKET_ID_ANY);
  ASSERT_NE(pool, nullptr);
  const std::string bytes = RandomBytes(3001, 5);
  rte_ipv4_hdr ip{};
  ip.version_ihl = RTE_IPV4_VHL_DEF;
  ip.total_length = rte_cpu_to_be_16(static_cast<uint16_t>(sizeof(rte_ipv4_hdr) + bytes.size()));
  ip.next_proto_id = IPPROTO_UDP;
  ip.src_addr = rte_cpu_to_be_32(0x0a000001);
  ip.dst_addr = rte_cpu_to_be_32(0x0a000002);
  // One buffer, then pieces of 1, 999, 2 and 1999 bytes chained.
  rte_mbuf* flat = rte_pktmbuf_alloc(pool);
  ASSERT_NE(flat, nullptr);
  char* flat_bytes = rte_pktmbuf_append(flat, static_cast<uint16_t>(bytes.size()));
  ASSERT_NE(flat_bytes, nullptr);
  std::memcpy(flat_bytes, bytes.data(), bytes.size());
  rte_mbuf* chain = nullptr;
  size_t at = 0;
  for (size_t piece : {size_t{1}, size_t{999}, size_t{2}, size_t{1999}}) {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    ASSERT_NE(m, nullptr);
    std::memcpy(rte_pktmbuf_append(m, static_cast<uint16_t>(piece)), bytes.data() + at, piece);
    at += piece;
    if (chain == nullptr) {
      chain = m;
    } else {
      ASSERT_EQ(rte_pktmbuf_chain(chain, m), 0);
    }
  }
  ASSERT_EQ(at, bytes.size());
  const uint16_t expected = dpdk::Ipv4UdpSum(flat, &ip, 0, static_cast<uint32_t>(bytes.size()));
  EXPECT_EQ(expected, static_cast<uint16_t>(~rte_ipv4_udptcp_cksum(&ip, bytes.data())))
      << "one buffer: as DPDK's single-buffer checksum";
  EXPECT_EQ(dpdk::Ipv4UdpSum(chain, &ip, 0, static_cast<uint32_t>(bytes.size())), expected);
  // From an offset inside the chain, against the same bytes in one buffer.
  EXPECT_EQ(dpdk::Ipv4UdpSum(chain, &ip, 3, 2001), dpdk::Ipv4UdpSum(flat, &ip, 3, 2001));
  rte_pktmbuf_free(flat);
  rte_pktmbuf_free(chain);
  rte_mempool_free(pool);
}

// ---- pure pieces: no EAL needed ----

TEST(DpdkWire, SegmentHeaderRoundTripsAndRejectsDamage) {
  dpdk::SegmentHeader h;
  h.kind = dpdk::SegmentKind::kData;
  h.flags = dpdk::kSegFlagFin;
  h.src_conn = 0xdeadbeef;
  h.dst_conn = 17;
  h.seq = uint64_t{1} << 40;
  h.ack = 12345;
  h.window = 1 << 20;
  h.payload_len = 3;
  h.tsval = 99;
  h.tsecr = 98;
  h.sacks = {{100, 200}, {300, 400}};
  std::string buf(h.encoded_size() + 3, 'p');
  dpdk::EncodeSegmentHeader(h, buf.data());
  auto d = dpdk::DecodeSegmentHeader(buf);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->src_conn, h.src_conn);
  EXPECT_EQ(d->seq, h.seq);
  EXPECT_EQ(d->ack, h.ack);
  EXPECT_EQ(d->window, h.window);
  EXPECT_EQ(d->flags, h.flags);
  ASSERT_EQ(d->sacks.size(), 2u);
  EXPECT_EQ(d->sacks[1].end, 400u);
  // Truncated payload, bad magic, bad kind, inverted SACK block.
  EXPECT_TRUE(
      dpdk::DecodeSegmentHeader(std::string_view(buf).substr(0, buf.size() - 1)).status().IsCorruption());
  std::string bad = buf;
  bad[0] ^= 1;
  EXPECT_TRUE(dpdk::DecodeSegmentHeader(bad).status().IsCorruption());
  bad = buf;
  bad[3] = 9;
  EXPECT_TRUE(dpdk::DecodeSegmentHeader(bad).status().IsCorruption());
  h.sacks = {{5, 5}};
  std::string inverted(h.encoded_size() + 3, 'p');
  dpdk::EncodeSegmentHeader(h, inverted.data());
  EXPECT_TRUE(dpdk::DecodeSegmentHeader(inverted).status().IsCorruption());
}

// RawOnesSum is DPDK's rte_raw_cksum, faster: every length 0..200 at every
// alignment 0..7, a jumbo frame, and the words that exercise the carries.
TEST(DpdkWire, RawOnesSumMatchesDpdkRawChecksum) {
  const std::string bytes = RandomBytes(9100, 11);
  for (size_t align = 0; align < 8; ++align) {
    for (size_t len = 0; len <= 200; ++len) {
      const char* p = bytes.data() + align;
      ASSERT_EQ(dpdk::RawOnesSum(p, len), rte_raw_cksum(p, len)) << "length " << len << " at +" << align;
    }
    const char* p = bytes.data() + align;
    EXPECT_EQ(dpdk::RawOnesSum(p, 9000), rte_raw_cksum(p, 9000)) << "9000 bytes at +" << align;
  }
  for (unsigned char fill : {0x00, 0x01, 0x80, 0xfe, 0xff}) {
    const std::string same(4099, static_cast<char>(fill));
    for (size_t len : {size_t{1}, size_t{2}, size_t{8}, size_t{33}, size_t{4096}, size_t{4099}}) {
      EXPECT_EQ(dpdk::RawOnesSum(same.data(), len), rte_raw_cksum(same.data(), len))
          << len << " bytes of " << static_cast<int>(fill);
    }
  }
}

// A transport on two ports listens on the same UDP port of both, or of
// neither: where one port has it taken, Listen fails and leaves the other
// port's UDP port free. Naming one port twice is refused.
TEST(DpdkTransport, ListenOnSeveralPortsTakesTheUdpPortOnAllOrNone) {
  RegisterBuiltinTransports();
  auto one = TransportRegistry::Global().Create("dpdk", MemifOptions("port=1"));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  auto both = TransportRegistry::Global().Create("dpdk", MemifOptions("port=0+1"));
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  auto endpoint = ParseEndpoint("dpdk://10.0.0.9:7311");
  ASSERT_TRUE(endpoint.ok());
  auto held = (*one)->Listen(*endpoint);  // UDP 7311 taken on port 1 only
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  auto refused = (*both)->Listen(*endpoint);
  EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists) << refused.status().ToString();
  (*held)->Close();
  auto retried = (*both)->Listen(*endpoint);  // port 0 kept nothing from the refused try
  ASSERT_TRUE(retried.ok()) << retried.status().ToString();
  EXPECT_EQ((*retried)->local_endpoint().port, 7311);
  auto any = (*both)->Listen(*ParseEndpoint("dpdk://10.0.0.9:0"));  // a UDP port free on both
  ASSERT_TRUE(any.ok()) << any.status().ToString();
  EXPECT_NE((*any)->local_endpoint().port, 0);
  auto twice = TransportRegistry::Global().Create("dpdk", MemifOptions("port=0+net_memif0"));
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ((*twice)->Listen(*endpoint).status().code(), StatusCode::kInvalidArgument);
}

TEST(DpdkWire, SplitsCanopyKeysFromEalArguments) {
  auto s = dpdk::SplitBackendArgs({"--no-huge", "-m", "512", "--vdev", "net_memif0,role=server,socket=/tmp/x",
                                   "port=1,ip=10.1.2.3", "fault_drop=0.05,fault_reorder=0.1", "mtu=1500"});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->eal, (std::vector<std::string>{"--no-huge", "-m", "512", "--vdev",
                                              "net_memif0,role=server,socket=/tmp/x"}));
  EXPECT_EQ(s->canopy.port, "1");
  EXPECT_EQ(s->canopy.ip, "10.1.2.3");
  EXPECT_DOUBLE_EQ(s->canopy.faults.drop, 0.05);
  EXPECT_DOUBLE_EQ(s->canopy.faults.reorder, 0.1);
  EXPECT_EQ(s->canopy.mtu, 1500u);
  auto several = dpdk::SplitBackendArgs({"port=net_memif0+net_memif1"});
  ASSERT_TRUE(several.ok()) << several.status().ToString();
  EXPECT_EQ(several->canopy.port, "net_memif0+net_memif1");
  EXPECT_EQ(*dpdk::SplitPortList("0+1+2"), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(*dpdk::SplitPortList("net_memif0"), (std::vector<std::string>{"net_memif0"}));
  for (const char* bad : {"fault_drop=2", "fault_dup=x", "ip=300.1.1.1", "peer_mac=zz", "mtu=10",
                          "port=1,bogus=2", "port=", "port=0+", "port=+1", "port=0++1"}) {
    EXPECT_EQ(dpdk::SplitBackendArgs({bad}).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  auto mac = dpdk::ParseMac("02:00:0a:0B:ff:01");
  ASSERT_TRUE(mac.ok());
  EXPECT_EQ(dpdk::FormatMac(*mac), "02:00:0a:0b:ff:01");
  EXPECT_EQ(dpdk::FormatIpv4(*dpdk::ParseIpv4("10.0.0.1")), "10.0.0.1");
  EXPECT_FALSE(dpdk::ParseIpv4("10.0.0").ok());
  EXPECT_FALSE(dpdk::ParseIpv4("localhost").ok());
}

// Rings of 2 MiB and more start on a 2 MiB boundary (so that transparent
// huge pages can back them); smaller ones are plain heap memory. Both hold
// and return what was written through the whole capacity.
TEST(DpdkWire, RingMemoryIsHugePageAlignedFromTwoMebibytes) {
  for (size_t capacity : {size_t{64} << 10, size_t{2} << 20, size_t{16} << 20}) {
    SCOPED_TRACE(capacity);
    dpdk::RingStorage storage(capacity);
    const auto address = reinterpret_cast<uintptr_t>(storage.bytes.get());
    if (capacity >= (size_t{2} << 20)) {
      EXPECT_EQ(address % (size_t{2} << 20), 0u);
    }
    std::memset(storage.bytes.get(), 0x5a, capacity);
    EXPECT_EQ(storage.bytes.get()[0], 0x5a);
    EXPECT_EQ(storage.bytes.get()[capacity - 1], 0x5a);
  }
}

// Frames that point into a send ring keep its storage alive together, with
// one reference: the storage outlives its ring until the last frame lets go.
TEST(DpdkWire, RingStorageLivesUntilItsLastFrameLetsGo) {
  std::weak_ptr<dpdk::RingStorage> watch;
  dpdk::RingStorage* storage = nullptr;
  {
    dpdk::ByteRing ring(1u << 16);
    watch = ring.storage();
    storage = ring.storage().get();
    storage->AddFrame(ring.storage());
    storage->AddFrame(ring.storage());
    EXPECT_EQ(watch.use_count(), 2) << "the ring, and one for all its frames";
    dpdk::RingStorage::ReleaseFrame(storage);
    EXPECT_EQ(watch.use_count(), 2);
  }
  EXPECT_FALSE(watch.expired()) << "a frame still points into it";
  storage->AddFrame(watch.lock());
  dpdk::RingStorage::ReleaseFrame(storage);
  EXPECT_FALSE(watch.expired());
  dpdk::RingStorage::ReleaseFrame(storage);
  EXPECT_TRUE(watch.expired()) << "the last frame let go";
}

TEST(DpdkWire, ByteRingWrapsAroundByAbsoluteOffsets) {
  dpdk::ByteRing ring(8);
  EXPECT_EQ(ring.Append("abcdef", 6), 6u);
  char out[8];
  EXPECT_EQ(ring.Read(out, 4), 4u);
  EXPECT_EQ(std::string(out, 4), "abcd");
  EXPECT_EQ(ring.Append("ghijklmn", 8), 6u);  // only 6 fit
  EXPECT_EQ(ring.begin(), 4u);
  EXPECT_EQ(ring.end(), 12u);
  ring.CopyOut(6, 5, out);
  EXPECT_EQ(std::string(out, 5), "ghijk");
  ring.ConsumeTo(10);
  EXPECT_EQ(ring.Read(out, 8), 2u);
  EXPECT_EQ(std::string(out, 2), "kl");
}

// What a memif burst meets when the peer dies under it: its shared memory
// is unmapped (here by the burst itself, standing in for the EAL interrupt
// thread), and the next access faults.
struct VanishingMemory {
  char* page = nullptr;
  size_t bytes = 0;
  bool link_down = true;
};

uint16_t TouchAfterUnmap(void* arg) {
  auto* m = static_cast<VanishingMemory*>(arg);
  m->page[0] = 1;
  EXPECT_EQ(::munmap(m->page, m->bytes), 0);
  *static_cast<volatile char*>(m->page) = 2;  // faults: no longer mapped
  return 7;
}

uint16_t TouchMapped(void* arg) {
  auto* m = static_cast<VanishingMemory*>(arg);
  m->page[0] = 3;
  return 5;
}

bool LinkIsDown(void* arg) { return static_cast<VanishingMemory*>(arg)->link_down; }

VanishingMemory MapPage() {
  VanishingMemory m;
  m.bytes = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* p = ::mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  m.page = static_cast<char*>(p);
  return m;
}

TEST(BurstFaultGuard, BurstWhoseMemoryVanishesAfterLinkDownIsAbandoned) {
  const uint64_t before = dpdk::AbandonedBursts();
  for (int round = 0; round < 3; ++round) {  // the guard re-arms after each jump
    VanishingMemory m = MapPage();
    uint16_t count = 99;
    EXPECT_FALSE(dpdk::RunGuardedBurst(TouchAfterUnmap, LinkIsDown, &m, &count));
    EXPECT_EQ(count, 0);
    VanishingMemory ok = MapPage();
    EXPECT_TRUE(dpdk::RunGuardedBurst(TouchMapped, LinkIsDown, &ok, &count));
    EXPECT_EQ(count, 5);
    EXPECT_EQ(ok.page[0], 3);
    ::munmap(ok.page, ok.bytes);
  }
  EXPECT_EQ(dpdk::AbandonedBursts(), before + 3);
}

// A fault while the link is still up is a bug, not a vanished peer: the
// process dies of it as it would without the guard. So does a fault outside
// any burst once the guard is installed.
TEST(BurstFaultGuardDeathTest, OtherFaultsStillKillTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
#ifdef CANOPY_SANITIZE
  // ASan's handler (the one before the guard's) reports SEGV and exits 1.
  const auto died_of_the_fault = ::testing::ExitedWithCode(1);
#else
  const auto died_of_the_fault = ::testing::KilledBySignal(SIGSEGV);
#endif
  EXPECT_EXIT(
      {
        VanishingMemory m = MapPage();
        m.link_down = false;
        uint16_t count = 0;
        dpdk::RunGuardedBurst(TouchAfterUnmap, LinkIsDown, &m, &count);
      },
      died_of_the_fault, "");
  EXPECT_EXIT(
      {
        VanishingMemory ok = MapPage();
        uint16_t count = 0;
        dpdk::RunGuardedBurst(TouchMapped, LinkIsDown, &ok, &count);
        ::munmap(ok.page, ok.bytes);
        *static_cast<volatile char*>(ok.page) = 4;
      },
      died_of_the_fault, "");
}

}  // namespace
}  // namespace canopy::transport
