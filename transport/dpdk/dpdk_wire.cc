#include "transport/dpdk/dpdk_wire.h"

#include <bit>
#include <charconv>
#include <cstring>
#include <cstdio>
#include <set>

#include "base/coding.h"

namespace canopy::transport::dpdk {
namespace {

// RFC 1071 checksum of n bytes (n even: the header is 56 + 16k) as
// little-endian 16-bit words, inverted. A ones'-complement sum commutes with
// byte swapping, so on a big-endian host the native-word sum is swapped.
uint16_t HeaderCheck(const char* p, size_t n) {
  uint16_t sum = RawOnesSum(p, n);
  if constexpr (std::endian::native == std::endian::big) sum = static_cast<uint16_t>((sum >> 8) | (sum << 8));
  return static_cast<uint16_t>(~sum);
}

// Adds v to the 64-bit ones'-complement sum s (end-around carry).
inline void AddOnes(uint64_t& s, uint64_t v) {
  s += v;
  s += s < v ? 1 : 0;
}

inline uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

uint16_t RawOnesSum(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  for (; n >= 32; p += 32, n -= 32) {
    AddOnes(a, Load64(p));
    AddOnes(b, Load64(p + 8));
    AddOnes(c, Load64(p + 16));
    AddOnes(d, Load64(p + 24));
  }
  for (; n >= 8; p += 8, n -= 8) AddOnes(a, Load64(p));
  if (n > 0) {
    uint64_t tail = 0;  // the last bytes in place, zero-padded
    std::memcpy(&tail, p, n);
    AddOnes(a, tail);
  }
  AddOnes(a, b);
  AddOnes(a, c);
  AddOnes(a, d);
  // Fold 64 -> 32 -> 16 bits, carries wrapped around at each step.
  uint64_t s = (a & 0xffffffffu) + (a >> 32);
  s = (s & 0xffffffffu) + (s >> 32);
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  return static_cast<uint16_t>(s);
}

void EncodeSegmentHeader(const SegmentHeader& h, char* out) {
  EncodeFixed16(out + 0, kSegmentMagic);
  out[2] = static_cast<char>(kSegmentVersion);
  out[3] = static_cast<char>(h.kind);
  out[4] = static_cast<char>(h.flags);
  out[5] = static_cast<char>(h.sacks.size());
  EncodeFixed16(out + 6, 0);
  EncodeFixed32(out + 8, h.src_conn);
  EncodeFixed32(out + 12, h.dst_conn);
  EncodeFixed64(out + 16, h.seq);
  EncodeFixed64(out + 24, h.ack);
  EncodeFixed32(out + 32, h.window);
  EncodeFixed32(out + 36, h.payload_len);
  EncodeFixed64(out + 40, h.tsval);
  EncodeFixed64(out + 48, h.tsecr);
  char* p = out + kSegmentHeaderSize;
  for (const SackBlock& b : h.sacks) {
    EncodeFixed64(p, b.start);
    EncodeFixed64(p + 8, b.end);
    p += kSackBlockSize;
  }
  EncodeFixed16(out + 6, HeaderCheck(out, h.encoded_size()));
}

Result<SegmentHeader> DecodeSegmentHeader(std::string_view bytes, size_t datagram_len) {
  if (datagram_len == SIZE_MAX) datagram_len = bytes.size();
  if (bytes.size() < kSegmentHeaderSize || datagram_len < bytes.size())
    return Status::Corruption("segment shorter than its header");
  const char* p = bytes.data();
  if (DecodeFixed16(p) != kSegmentMagic) return Status::Corruption("bad segment magic");
  if (static_cast<uint8_t>(p[2]) != kSegmentVersion) {
    return Status::Corruption("unsupported segment version " + std::to_string(static_cast<uint8_t>(p[2])));
  }
  SegmentHeader h;
  auto kind = static_cast<uint8_t>(p[3]);
  if (kind < 1 || kind > 4) return Status::Corruption("unknown segment kind " + std::to_string(kind));
  h.kind = static_cast<SegmentKind>(kind);
  h.flags = static_cast<uint8_t>(p[4]);
  if ((h.flags & ~(kSegFlagFin | kSegFlagAckNow)) != 0) return Status::Corruption("unknown segment flags");
  size_t sack_count = static_cast<uint8_t>(p[5]);
  if (sack_count > kMaxSackBlocks) return Status::Corruption("too many SACK blocks");
  h.src_conn = DecodeFixed32(p + 8);
  h.dst_conn = DecodeFixed32(p + 12);
  h.seq = DecodeFixed64(p + 16);
  h.ack = DecodeFixed64(p + 24);
  h.window = DecodeFixed32(p + 32);
  h.payload_len = DecodeFixed32(p + 36);
  h.tsval = DecodeFixed64(p + 40);
  h.tsecr = DecodeFixed64(p + 48);
  size_t need = kSegmentHeaderSize + sack_count * kSackBlockSize;
  if (bytes.size() < need) return Status::Corruption("segment shorter than its SACK blocks");
  if (HeaderCheck(p, need) != 0) return Status::Corruption("segment header check failed");
  if (datagram_len - need < h.payload_len) {
    return Status::Corruption("segment announces more bytes than the frame holds");
  }
  h.sacks.resize(sack_count);
  const char* s = p + kSegmentHeaderSize;
  for (size_t i = 0; i < sack_count; ++i, s += kSackBlockSize) {
    h.sacks[i].start = DecodeFixed64(s);
    h.sacks[i].end = DecodeFixed64(s + 8);
    if (h.sacks[i].end <= h.sacks[i].start) return Status::Corruption("empty or inverted SACK block");
  }
  return h;
}

Result<MacAddress> ParseMac(std::string_view text) {
  MacAddress mac;
  if (text.size() != 17) return Status::InvalidArgument("bad MAC address '" + std::string(text) + "'");
  for (int i = 0; i < 6; ++i) {
    std::string_view pair = text.substr(i * 3, 2);
    if (i < 5 && text[i * 3 + 2] != ':' && text[i * 3 + 2] != '-') {
      return Status::InvalidArgument("bad MAC address '" + std::string(text) + "'");
    }
    unsigned value = 0;
    auto [ptr, ec] = std::from_chars(pair.data(), pair.data() + 2, value, 16);
    if (ec != std::errc() || ptr != pair.data() + 2) {
      return Status::InvalidArgument("bad MAC address '" + std::string(text) + "'");
    }
    mac.bytes[i] = static_cast<uint8_t>(value);
  }
  return mac;
}

std::string FormatMac(const MacAddress& mac) {
  char buf[18];
  std::snprintf(buf, sizeof(buf), "%02x:%02x:%02x:%02x:%02x:%02x", mac.bytes[0], mac.bytes[1], mac.bytes[2],
                mac.bytes[3], mac.bytes[4], mac.bytes[5]);
  return buf;
}

Result<std::vector<std::string>> SplitPortList(std::string_view text) {
  const std::string whole(text);
  std::vector<std::string> names;
  for (;;) {
    size_t plus = text.find('+');
    std::string_view name = text.substr(0, plus);
    if (name.empty()) {
      return Status::InvalidArgument("port=" + whole +
                                     ": needs a port id or device name (several joined by '+')");
    }
    names.emplace_back(name);
    if (plus == std::string_view::npos) return names;
    text.remove_prefix(plus + 1);
  }
}

Result<uint32_t> ParseIpv4(std::string_view text) {
  uint32_t addr = 0;
  std::string_view rest = text;
  for (int i = 0; i < 4; ++i) {
    unsigned part = 0;
    auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), part);
    if (ec != std::errc() || part > 255 || ptr == rest.data()) {
      return Status::InvalidArgument("'" + std::string(text) +
                                     "' is not an IPv4 address (the dpdk backend is IPv4 only)");
    }
    addr = (addr << 8) | part;
    rest.remove_prefix(static_cast<size_t>(ptr - rest.data()));
    if (i < 3) {
      if (rest.empty() || rest[0] != '.') {
        return Status::InvalidArgument("'" + std::string(text) +
                                       "' is not an IPv4 address (the dpdk backend is IPv4 only)");
      }
      rest.remove_prefix(1);
    }
  }
  if (!rest.empty()) return Status::InvalidArgument("'" + std::string(text) + "' is not an IPv4 address");
  return addr;
}

std::string FormatIpv4(uint32_t a) {
  return std::to_string(a >> 24) + "." + std::to_string((a >> 16) & 255) + "." +
         std::to_string((a >> 8) & 255) + "." + std::to_string(a & 255);
}

namespace {

const std::set<std::string, std::less<>>& KnownKeys() {
  static const std::set<std::string, std::less<>> keys = {
      "port",       "ip",         "peer_mac",  "mtu",           "mbufs",
      "mbuf_bytes", "fault_drop", "fault_dup", "fault_reorder", "fault_seed"};
  return keys;
}

Status ParseProbability(std::string_view key, const std::string& value, double* out) {
  try {
    size_t used = 0;
    double p = std::stod(value, &used);
    if (used != value.size() || !(p >= 0 && p <= 1)) throw std::invalid_argument("range");
    *out = p;
    return Status::Ok();
  } catch (...) {
    return Status::InvalidArgument(std::string(key) + "=" + value + ": expected a probability in [0, 1]");
  }
}

Status ParseUnsigned(std::string_view key, const std::string& value, uint64_t max, uint64_t* out) {
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || ptr != value.data() + value.size() || v > max) {
    return Status::InvalidArgument(std::string(key) + "=" + value +
                                   ": expected an integer <= " + std::to_string(max));
  }
  *out = v;
  return Status::Ok();
}

Status ApplyKey(std::string_view key, const std::string& value, CanopyArgs* a) {
  uint64_t n = 0;
  if (key == "port") {
    CANOPY_RETURN_IF_ERROR(SplitPortList(value).status());
    a->port = value;
  } else if (key == "ip") {
    CANOPY_RETURN_IF_ERROR(ParseIpv4(value).status().ok() ? Status::Ok() : ParseIpv4(value).status());
    a->ip = value;
  } else if (key == "peer_mac") {
    auto mac = ParseMac(value);
    if (!mac.ok()) return mac.status();
    a->peer_mac = value;
  } else if (key == "mtu") {
    CANOPY_RETURN_IF_ERROR(ParseUnsigned(key, value, 65535, &n));
    if (n < 576) return Status::InvalidArgument("mtu=" + value + ": at least 576");
    a->mtu = static_cast<uint32_t>(n);
  } else if (key == "mbufs") {
    CANOPY_RETURN_IF_ERROR(ParseUnsigned(key, value, 1u << 24, &n));
    if (n < 512) return Status::InvalidArgument("mbufs=" + value + ": at least 512");
    a->mbufs = static_cast<uint32_t>(n);
  } else if (key == "mbuf_bytes") {
    CANOPY_RETURN_IF_ERROR(ParseUnsigned(key, value, 65535 - 128, &n));
    if (n < 1024) return Status::InvalidArgument("mbuf_bytes=" + value + ": at least 1024");
    a->mbuf_bytes = static_cast<uint32_t>(n);
  } else if (key == "fault_drop") {
    return ParseProbability(key, value, &a->faults.drop);
  } else if (key == "fault_dup") {
    return ParseProbability(key, value, &a->faults.duplicate);
  } else if (key == "fault_reorder") {
    return ParseProbability(key, value, &a->faults.reorder);
  } else if (key == "fault_seed") {
    CANOPY_RETURN_IF_ERROR(ParseUnsigned(key, value, UINT64_MAX, &n));
    a->faults.seed = n == 0 ? 1 : n;
  }
  return Status::Ok();
}

}  // namespace

Result<SplitArgs> SplitBackendArgs(const std::vector<std::string>& args) {
  SplitArgs out;
  for (const std::string& arg : args) {
    if (arg.empty() || arg[0] == '-') {
      out.eal.push_back(arg);
      continue;
    }
    std::vector<std::pair<std::string, std::string>> pieces;
    bool any_known = false, any_unknown = false;
    size_t start = 0;
    while (start <= arg.size()) {
      size_t comma = arg.find(',', start);
      std::string piece = arg.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      size_t eq = piece.find('=');
      if (eq != std::string::npos && KnownKeys().count(std::string_view(piece).substr(0, eq)) > 0) {
        any_known = true;
        pieces.emplace_back(piece.substr(0, eq), piece.substr(eq + 1));
      } else {
        any_unknown = true;
      }
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (!any_known) {
      out.eal.push_back(arg);
      continue;
    }
    if (any_unknown) {
      return Status::InvalidArgument(
          "backend argument '" + arg +
          "' mixes canopy keys (port, ip, peer_mac, mtu, mbufs, mbuf_bytes, fault_*) with unknown ones");
    }
    for (auto& [key, value] : pieces) CANOPY_RETURN_IF_ERROR(ApplyKey(key, value, &out.canopy));
  }
  return out;
}

}  // namespace canopy::transport::dpdk
