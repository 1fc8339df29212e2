// The frame: canopy's unit of message on every backend's ordered stream.
//
// Layout (32 bytes, little-endian), followed by payload_len payload bytes and
// then, on the stream, bulk_len raw bulk bytes (see transport.h):
//
//   off size field
//    0   2   magic        0x5943 ("CY")
//    2   1   version      kFrameVersion (1)
//    3   1   flags        bit 0: bulk bytes follow; bit 1: payload unchecked
//                         (see kFrameFlagPayloadUnchecked); others must be 0
//    4   2   type         message type, chosen by the layer above
//    6   2   reserved     must be 0
//    8   4   payload_len  <= the receiver's max_message_bytes
//   12   4   payload_crc  CRC32C of the payload bytes (0 when unchecked)
//   16   8   bulk_len     bytes of bulk data that follow the payload
//   24   4   reserved     must be 0
//   28   4   header_crc   CRC32C of bytes [0, 28)
//
// The header has its own CRC so that a corrupt length is caught before the
// receiver waits for (or allocates) the payload it announces.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/result.h"

namespace canopy::transport {

inline constexpr size_t kFrameHeaderSize = 32;
inline constexpr uint16_t kFrameMagic = 0x5943;
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr uint8_t kFrameFlagBulk = 0x01;
// The payload carries no CRC (payload_crc is 0). Only for a transport that
// itself guarantees the bytes end to end, and only towards a peer that said
// it accepts such frames (so a receiver refuses the flag unless its
// connection allows it). rdma:// does so: on a reliable connection every
// packet's CRC (RoCE's ICRC, InfiniBand's ICRC and VCRC) is checked by the
// receiving adapter, and a damaged packet is retransmitted, never delivered.
// The header keeps its own CRC; the data a payload carries (WAL records,
// checkpoint blocks) keeps its own CRC32C as well.
inline constexpr uint8_t kFrameFlagPayloadUnchecked = 0x02;

// Whether a frame's payload carries its CRC32C.
enum class PayloadCheck { kCrc32c, kNone };

// The check for payloads on a link whose end (the peer when sending, this
// side when receiving) accepts unchecked payloads, or does not.
constexpr PayloadCheck PayloadCheckFor(bool accepts_unchecked) {
  return accepts_unchecked ? PayloadCheck::kNone : PayloadCheck::kCrc32c;
}

struct FrameHeader {
  uint16_t type = 0;
  uint32_t payload_len = 0;
  uint32_t payload_crc = 0;
  uint64_t bulk_len = 0;
  PayloadCheck payload_check = PayloadCheck::kCrc32c;
};

// Writes the 32-byte header for `payload` (computing its CRC, unless
// `check` is kNone: see kFrameFlagPayloadUnchecked) into out.
void EncodeFrameHeader(char out[kFrameHeaderSize], uint16_t type, std::string_view payload, uint64_t bulk_len,
                       PayloadCheck check = PayloadCheck::kCrc32c);

// Checks magic, version, flags, reserved fields, header CRC and the payload
// length bound. `required` is the check every payload must carry: kCrc32c
// (the default) refuses a frame whose payload is unchecked; kNone accepts it
// (only a connection that told its peer it accepts such frames passes that).
// Corruption with the reason on any failure.
// REQUIRES: header.size() == kFrameHeaderSize.
Result<FrameHeader> DecodeFrameHeader(std::string_view header, uint32_t max_payload_len,
                                      PayloadCheck required = PayloadCheck::kCrc32c);

// Corruption if the payload does not match the header's length and (for a
// checked payload) its CRC.
Status VerifyFramePayload(const FrameHeader& header, std::string_view payload);

// How much of an announced payload a receiver reserves (capacity: address
// space, no page touched) when the header arrives, before the bytes do. The
// bytes it zeroes or fills still grow only with what arrived, so a header
// alone costs no memory; a payload up to this size then grows in place, with
// no copy of what arrived so far.
inline constexpr size_t kPayloadReserveMax = size_t{8} << 20;

}  // namespace canopy::transport
