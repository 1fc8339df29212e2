// The frame: canopy's unit of message on every backend's ordered stream.
//
// Layout (32 bytes, little-endian), followed by payload_len payload bytes and
// then, on the stream, bulk_len raw bulk bytes (see transport.h):
//
//   off size field
//    0   2   magic        0x5943 ("CY")
//    2   1   version      kFrameVersion (1)
//    3   1   flags        bit 0: bulk bytes follow; other bits must be 0
//    4   2   type         message type, chosen by the layer above
//    6   2   reserved     must be 0
//    8   4   payload_len  <= the receiver's max_message_bytes
//   12   4   payload_crc  CRC32C of the payload bytes
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

struct FrameHeader {
  uint16_t type = 0;
  uint32_t payload_len = 0;
  uint32_t payload_crc = 0;
  uint64_t bulk_len = 0;
};

// Writes the 32-byte header for `payload` (computing its CRC) into out.
void EncodeFrameHeader(char out[kFrameHeaderSize], uint16_t type, std::string_view payload,
                       uint64_t bulk_len);

// Checks magic, version, flags, reserved fields, header CRC and the payload
// length bound. Corruption with the reason on any failure.
// REQUIRES: header.size() == kFrameHeaderSize.
Result<FrameHeader> DecodeFrameHeader(std::string_view header, uint32_t max_payload_len);

// Corruption if the payload does not match the header's length and CRC.
Status VerifyFramePayload(const FrameHeader& header, std::string_view payload);

// How much of an announced payload a receiver reserves (capacity: address
// space, no page touched) when the header arrives, before the bytes do. The
// bytes it zeroes or fills still grow only with what arrived, so a header
// alone costs no memory; a payload up to this size then grows in place, with
// no copy of what arrived so far.
inline constexpr size_t kPayloadReserveMax = size_t{8} << 20;

}  // namespace canopy::transport
