#include "transport/frame.h"

#include <string>

#include "base/coding.h"
#include "base/crc32c.h"

namespace canopy::transport {

void EncodeFrameHeader(char out[kFrameHeaderSize], uint16_t type, std::string_view payload, uint64_t bulk_len,
                       PayloadCheck check) {
  const bool checked = check == PayloadCheck::kCrc32c;
  EncodeFixed16(out + 0, kFrameMagic);
  out[2] = static_cast<char>(kFrameVersion);
  out[3] =
      static_cast<char>((bulk_len > 0 ? kFrameFlagBulk : 0) | (checked ? 0 : kFrameFlagPayloadUnchecked));
  EncodeFixed16(out + 4, type);
  EncodeFixed16(out + 6, 0);
  EncodeFixed32(out + 8, static_cast<uint32_t>(payload.size()));
  EncodeFixed32(out + 12, checked ? crc32c::Value(payload) : 0);
  EncodeFixed64(out + 16, bulk_len);
  EncodeFixed32(out + 24, 0);
  EncodeFixed32(out + 28, crc32c::Value(out, 28));
}

Result<FrameHeader> DecodeFrameHeader(std::string_view header, uint32_t max_payload_len,
                                      PayloadCheck required) {
  if (header.size() != kFrameHeaderSize) {
    return Status::Corruption("frame header is " + std::to_string(header.size()) + " bytes, expected " +
                              std::to_string(kFrameHeaderSize));
  }
  const char* p = header.data();
  if (DecodeFixed16(p) != kFrameMagic) return Status::Corruption("bad frame magic (not a canopy peer?)");
  if (DecodeFixed32(p + 28) != crc32c::Value(p, 28)) return Status::Corruption("frame header CRC mismatch");
  auto version = static_cast<uint8_t>(p[2]);
  if (version != kFrameVersion) {
    return Status::Corruption("unsupported frame version " + std::to_string(version) + " (this build speaks " +
                              std::to_string(kFrameVersion) + ")");
  }
  auto flags = static_cast<uint8_t>(p[3]);
  if ((flags & ~(kFrameFlagBulk | kFrameFlagPayloadUnchecked)) != 0)
    return Status::Corruption("unknown frame flags");
  const bool unchecked = (flags & kFrameFlagPayloadUnchecked) != 0;
  if (unchecked && required == PayloadCheck::kCrc32c) {
    return Status::Corruption("frame payload without a CRC on a connection that checks every payload");
  }
  if (DecodeFixed16(p + 6) != 0 || DecodeFixed32(p + 24) != 0) {
    return Status::Corruption("frame reserved fields are not zero");
  }
  FrameHeader h;
  h.type = DecodeFixed16(p + 4);
  h.payload_len = DecodeFixed32(p + 8);
  h.payload_crc = DecodeFixed32(p + 12);
  h.bulk_len = DecodeFixed64(p + 16);
  h.payload_check = PayloadCheckFor(unchecked);
  if (unchecked && h.payload_crc != 0) return Status::Corruption("unchecked frame payload with a CRC");
  if (((flags & kFrameFlagBulk) != 0) != (h.bulk_len > 0)) {
    return Status::Corruption("frame bulk flag disagrees with bulk length");
  }
  if (h.payload_len > max_payload_len) {
    return Status::Corruption("frame payload of " + std::to_string(h.payload_len) + " bytes exceeds limit " +
                              std::to_string(max_payload_len));
  }
  return h;
}

Status VerifyFramePayload(const FrameHeader& header, std::string_view payload) {
  if (payload.size() != header.payload_len) return Status::Corruption("frame payload length mismatch");
  if (header.payload_check == PayloadCheck::kCrc32c && crc32c::Value(payload) != header.payload_crc) {
    return Status::Corruption("frame payload CRC mismatch");
  }
  return Status::Ok();
}

}  // namespace canopy::transport
