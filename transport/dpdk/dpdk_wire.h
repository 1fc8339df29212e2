// The DPDK backend's wire format: canopy's reliable-stream segment header,
// carried as the payload of an ordinary Ethernet + IPv4 + UDP frame (so that
// tcpdump/wireshark decode the outer layers), plus small value helpers
// (MAC/IPv4 text forms, fault-injection settings, canopy's backend_args keys).
//
// Segment header (little-endian, kSegmentHeaderSize bytes, then sack_count
// 16-byte SACK blocks, then payload_len stream bytes):
//
//   off size field
//    0   2   magic        0x4443 ("CD")
//    2   1   version      kSegmentVersion (1)
//    3   1   kind         SegmentKind
//    4   1   flags        kSegFlagFin: a FIN follows the payload in sequence space
//                         kSegFlagAckNow: the receiver must answer with an ACK
//    5   1   sack_count   number of SACK blocks (<= kMaxSackBlocks)
//    6   2   header_check ones'-complement sum (RFC 1071) of the header and its
//                         SACK blocks, computed with this field 0
//    8   4   src_conn     sender's connection id
//   12   4   dst_conn     receiver's connection id (0 in a SYN)
//   16   8   seq          stream offset of the first payload byte
//   24   8   ack          next stream offset the sender expects (cumulative ack);
//                         in a SYN / SYN-ACK: the sender's handshake features
//                         (kHandshake* bits; a peer that predates them sends 0
//                         there and ignores the field in a SYN / SYN-ACK)
//   32   4   window       bytes beyond `ack` the sender can buffer
//   36   4   payload_len  stream bytes in this segment (SYN/SYN-ACK: 4, the MSS)
//   40   8   tsval        sender's clock (ns) when the segment was sent
//   48   8   tsecr        latest tsval received from the peer (0: none)
//
// Sequence numbers are 64-bit byte offsets starting at 0 in each direction;
// the FIN occupies one offset after the last data byte. Connection ids tell
// incarnations apart. Integrity: header_check always covers the header and
// its SACK blocks end to end (the stream's own check: a damaged sequence
// number or length would corrupt the stream silently); the payload is covered
// by the UDP checksum, computed in software, offloaded to the NIC, or left 0
// on links that cannot damage a frame (memif shared memory; see
// ChecksumMode in dpdk_port.cc).
//
// Thread safety: pure functions and values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace canopy::transport::dpdk {

inline constexpr uint16_t kSegmentMagic = 0x4443;
inline constexpr uint8_t kSegmentVersion = 2;
inline constexpr size_t kSegmentHeaderSize = 56;
inline constexpr size_t kSackBlockSize = 16;
// SACK blocks a pure ACK may carry (further limited by the MSS); sack_count is one byte.
inline constexpr size_t kMaxSackBlocks = 255;
// SACK blocks a data segment may carry (room is reserved in the MSS for them).
inline constexpr size_t kDataSackBlocks = 4;
// Ethernet (14) + IPv4 (20) + UDP (8).
inline constexpr size_t kOuterHeaderSize = 42;

enum class SegmentKind : uint8_t { kSyn = 1, kSynAck = 2, kData = 3, kRst = 4 };
// Handshake feature: the sender accepts frames whose payload carries no
// CRC32C (transport/frame.h, kFrameFlagPayloadUnchecked), because its port's
// link cannot damage a frame (memif shared memory; ChecksumMode in
// dpdk_port.cc).
inline constexpr uint64_t kHandshakeAcceptsUncheckedPayloads = 0x1;
inline constexpr uint8_t kSegFlagFin = 0x01;
inline constexpr uint8_t kSegFlagAckNow = 0x02;

struct SackBlock {
  uint64_t start = 0;  // first byte
  uint64_t end = 0;    // one past the last byte
};

struct SegmentHeader {
  SegmentKind kind = SegmentKind::kData;
  uint8_t flags = 0;
  uint32_t src_conn = 0;
  uint32_t dst_conn = 0;
  uint64_t seq = 0;
  uint64_t ack = 0;
  uint32_t window = 0;
  uint32_t payload_len = 0;
  uint64_t tsval = 0;
  uint64_t tsecr = 0;
  std::vector<SackBlock> sacks;

  size_t encoded_size() const { return kSegmentHeaderSize + sacks.size() * kSackBlockSize; }
};

// Writes h.encoded_size() bytes to out. REQUIRES: h.sacks.size() <= kMaxSackBlocks.
void EncodeSegmentHeader(const SegmentHeader& h, char* out);

// Parses a header (and its SACK blocks) from the start of `bytes`; checks the
// magic, version, kind, header_check, the SACK count and that payload_len
// bytes follow. Corruption with the reason otherwise.
// `bytes` may hold just the start of a datagram of datagram_len bytes (at
// least the header and its SACK blocks, when present); SIZE_MAX means all of it.
Result<SegmentHeader> DecodeSegmentHeader(std::string_view bytes, size_t datagram_len = SIZE_MAX);

struct MacAddress {
  uint8_t bytes[6] = {0, 0, 0, 0, 0, 0};
  bool operator==(const MacAddress&) const = default;
  static MacAddress Broadcast() { return MacAddress{{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}; }
};
// "02:00:00:00:00:01" (':' or '-' separated hex pairs).
Result<MacAddress> ParseMac(std::string_view text);
std::string FormatMac(const MacAddress& mac);

// Dotted quad to a host-order address; InvalidArgument otherwise.
Result<uint32_t> ParseIpv4(std::string_view text);
// The ports a port= value names: one ("0", "net_memif0") or several joined
// by '+' ("0+1"); InvalidArgument for an empty name.
Result<std::vector<std::string>> SplitPortList(std::string_view text);
std::string FormatIpv4(uint32_t host_order);

// The 16-bit ones'-complement sum (RFC 1071) of n bytes taken as native-order
// 16-bit words, folded, not inverted: what DPDK's rte_raw_cksum returns (an
// odd last byte counts as a word padded with a zero byte). Sums eight bytes
// per add, four sums in flight (RFC 1071's deferred carries), several times
// rte_raw_cksum's word-at-a-time speed on jumbo frames.
uint16_t RawOnesSum(const void* data, size_t n);

// Frame faults injected on transmit, each a probability in [0, 1].
struct FaultConfig {
  double drop = 0;
  double duplicate = 0;
  double reorder = 0;
  uint64_t seed = 1;
  bool active() const { return drop > 0 || duplicate > 0 || reorder > 0; }
};

// canopy's own settings, given in TransportOptions::backend_args as
// "key=value[,key=value...]" arguments next to the EAL arguments:
//   port=N|NAME     DPDK port (id or device name) used by this transport (default 0);
//                   several joined by '+' (port=0+1): the transport listens on
//                   every one and spreads the connections it dials over them
//                   (one port per core: each has its own I/O thread and poll lock)
//   ip=A.B.C.D      this side's IPv4 address when dialling (listening uses the URI host)
//   peer_mac=MAC    static neighbour: destination MAC for every peer (skips ARP)
//   mtu=N           requested port MTU (default 9000; the port's maximum is used if lower)
//   mbufs=N         mbufs in the port's pool (default sized from the ring sizes)
//   mbuf_bytes=N    data room per mbuf (default 2048, at least 1024); frames
//                   larger than that travel as multi-segment mbuf chains
//                   (net_memif and net_af_packet ports raise it to a whole
//                   frame: see dpdk_port.cc)
//   fault_drop=P fault_dup=P fault_reorder=P fault_seed=N   fault injection on transmit
// The URI may carry port=, ip= and peer_mac= too (they win over backend_args).
struct CanopyArgs {
  std::string port = "0";
  std::string ip;
  std::string peer_mac;
  uint32_t mtu = 9000;
  uint32_t mbufs = 0;
  uint32_t mbuf_bytes = 2048;
  FaultConfig faults;
};

struct SplitArgs {
  std::vector<std::string> eal;  // passed to rte_eal_init in order
  CanopyArgs canopy;
};

// Separates canopy's key=value arguments from EAL arguments. An argument is
// canopy's when every comma-separated piece is key=value with a known key;
// InvalidArgument for a known key with a bad value, or a mix of known and
// unknown keys in one argument.
Result<SplitArgs> SplitBackendArgs(const std::vector<std::string>& args);

}  // namespace canopy::transport::dpdk
