#include "transport/frame.h"

#include <gtest/gtest.h>

#include <string>

#include "base/coding.h"
#include "base/crc32c.h"
#include "tests/testing/test_util.h"

namespace canopy::transport {
namespace {

std::string Header(uint16_t type, std::string_view payload, uint64_t bulk_len) {
  char out[kFrameHeaderSize];
  EncodeFrameHeader(out, type, payload, bulk_len);
  return std::string(out, kFrameHeaderSize);
}

// Decodes header + payload the way a receiver does.
Status DecodeFrame(std::string_view frame, uint32_t max_payload, FrameHeader* header_out = nullptr) {
  if (frame.size() < kFrameHeaderSize) return Status::Corruption("short header");
  auto header = DecodeFrameHeader(frame.substr(0, kFrameHeaderSize), max_payload);
  if (!header.ok()) return header.status();
  if (header_out) *header_out = *header;
  std::string_view rest = frame.substr(kFrameHeaderSize);
  if (rest.size() < header->payload_len) return Status::Corruption("short payload");
  return VerifyFramePayload(*header, rest.substr(0, header->payload_len));
}

TEST(FrameTest, HeaderRoundTrips) {
  const std::string payload = canopy::testing::RandomBytes(1000, 1);
  std::string header = Header(0xBEEF, payload, 0);
  ASSERT_EQ(header.size(), kFrameHeaderSize);
  EXPECT_EQ(DecodeFixed16(header.data()), kFrameMagic);
  auto decoded = DecodeFrameHeader(header, 1 << 20);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->type, 0xBEEF);
  EXPECT_EQ(decoded->payload_len, 1000u);
  EXPECT_EQ(decoded->payload_crc, crc32c::Value(payload));
  EXPECT_EQ(decoded->bulk_len, 0u);
  EXPECT_TRUE(VerifyFramePayload(*decoded, payload).ok());

  auto with_bulk = DecodeFrameHeader(Header(1, "", uint64_t{1} << 40), 0);
  ASSERT_TRUE(with_bulk.ok()) << with_bulk.status().ToString();
  EXPECT_EQ(with_bulk->bulk_len, uint64_t{1} << 40);
  EXPECT_EQ(with_bulk->payload_len, 0u);
  EXPECT_TRUE(VerifyFramePayload(*with_bulk, "").ok());
}

TEST(FrameTest, LayoutIsLittleEndianAsDocumented) {
  std::string h = Header(0x0102, "abc", 0x0807060504030201ull);
  EXPECT_EQ(static_cast<uint8_t>(h[0]), 0x43);
  EXPECT_EQ(static_cast<uint8_t>(h[1]), 0x59);
  EXPECT_EQ(h[2], kFrameVersion);
  EXPECT_EQ(h[3], kFrameFlagBulk);
  EXPECT_EQ(DecodeFixed16(h.data() + 4), 0x0102);
  EXPECT_EQ(DecodeFixed32(h.data() + 8), 3u);
  EXPECT_EQ(DecodeFixed32(h.data() + 12), crc32c::Value("abc"));
  EXPECT_EQ(DecodeFixed64(h.data() + 16), 0x0807060504030201ull);
  EXPECT_EQ(DecodeFixed32(h.data() + 28), crc32c::Value(h.data(), 28));
}

TEST(FrameTest, EverySingleByteFlipIsDetected) {
  const std::string payload = canopy::testing::RandomBytes(64, 2);
  for (uint64_t bulk : {uint64_t{0}, uint64_t{12345}}) {
    const std::string frame = Header(77, payload, bulk) + payload;
    ASSERT_TRUE(DecodeFrame(frame, 1 << 20).ok());
    for (size_t i = 0; i < frame.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string corrupt = frame;
        corrupt[i] = static_cast<char>(corrupt[i] ^ (1 << bit));
        Status s = DecodeFrame(corrupt, 1 << 20);
        EXPECT_EQ(s.code(), StatusCode::kCorruption)
            << "flip of bit " << bit << " in byte " << i << " accepted";
      }
      // And replacing the byte with any other value.
      std::string corrupt = frame;
      corrupt[i] = static_cast<char>(~corrupt[i]);
      EXPECT_EQ(DecodeFrame(corrupt, 1 << 20).code(), StatusCode::kCorruption) << "byte " << i;
    }
  }
}

TEST(FrameTest, TruncationsAreRejected) {
  const std::string payload = canopy::testing::RandomBytes(100, 3);
  const std::string frame = Header(5, payload, 0) + payload;
  for (size_t n = 0; n < frame.size(); ++n) {
    EXPECT_FALSE(DecodeFrame(std::string_view(frame).substr(0, n), 1 << 20).ok())
        << "prefix of " << n << " bytes";
  }
  for (size_t n = 0; n < kFrameHeaderSize; ++n) {
    auto header = DecodeFrameHeader(std::string_view(frame).substr(0, n), 1 << 20);
    EXPECT_EQ(header.status().code(), StatusCode::kCorruption);
  }
  auto header = DecodeFrameHeader(std::string_view(frame).substr(0, kFrameHeaderSize), 1 << 20);
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(VerifyFramePayload(*header, std::string_view(payload).substr(0, 99)).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(VerifyFramePayload(*header, payload + "x").code(), StatusCode::kCorruption);
}

TEST(FrameTest, ChecksEveryHeaderFieldEvenWithAValidCrc) {
  auto reencode = [](std::string h) {
    EncodeFixed32(h.data() + 28, crc32c::Value(h.data(), 28));
    return h;
  };
  const std::string good = Header(1, "xyz", 0);
  std::string h = good;
  h[2] = 2;  // version
  EXPECT_EQ(DecodeFrameHeader(reencode(h), 100).status().code(), StatusCode::kCorruption);
  h = good;
  h[3] = 0x04;  // unknown flag
  EXPECT_EQ(DecodeFrameHeader(reencode(h), 100).status().code(), StatusCode::kCorruption);
  h = good;
  h[3] = kFrameFlagBulk;  // bulk flag without bulk length
  EXPECT_EQ(DecodeFrameHeader(reencode(h), 100).status().code(), StatusCode::kCorruption);
  h = good;
  h[6] = 1;  // reserved
  EXPECT_EQ(DecodeFrameHeader(reencode(h), 100).status().code(), StatusCode::kCorruption);
  h = good;
  h[25] = 1;  // reserved
  EXPECT_EQ(DecodeFrameHeader(reencode(h), 100).status().code(), StatusCode::kCorruption);
  h = good;
  h[0] = 'X';  // magic
  EXPECT_EQ(DecodeFrameHeader(reencode(h), 100).status().code(), StatusCode::kCorruption);
  // The payload bound.
  EXPECT_TRUE(DecodeFrameHeader(good, 3).ok());
  auto over = DecodeFrameHeader(good, 2);
  EXPECT_EQ(over.status().code(), StatusCode::kCorruption);
  EXPECT_NE(over.status().message().find("exceeds"), std::string::npos);
}

// A payload without a CRC (kFrameFlagPayloadUnchecked): refused unless the
// receiver accepts such frames; then only its length is checked. The flag
// and a non-zero CRC together are refused, as is a bad header either way.
TEST(FrameTest, AnUncheckedPayloadIsAcceptedOnlyWhereAllowed) {
  const std::string payload = "replicated bytes";
  char out[kFrameHeaderSize];
  EncodeFrameHeader(out, 7, payload, 0, PayloadCheck::kNone);
  const std::string header(out, kFrameHeaderSize);
  EXPECT_EQ(static_cast<uint8_t>(header[3]), kFrameFlagPayloadUnchecked);
  EXPECT_EQ(DecodeFixed32(header.data() + 12), 0u) << "no CRC computed";

  auto refused = DecodeFrameHeader(header, 100);
  ASSERT_EQ(refused.status().code(), StatusCode::kCorruption);
  EXPECT_NE(refused.status().message().find("without a CRC"), std::string::npos)
      << refused.status().ToString();

  auto decoded = DecodeFrameHeader(header, 100, PayloadCheck::kNone);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->type, 7);
  EXPECT_EQ(decoded->payload_check, PayloadCheck::kNone);
  EXPECT_TRUE(VerifyFramePayload(*decoded, payload).ok());
  EXPECT_TRUE(VerifyFramePayload(*decoded, "Replicated bytes").ok()) << "the transport vouches for the bytes";
  EXPECT_EQ(VerifyFramePayload(*decoded, payload + "x").code(), StatusCode::kCorruption)
      << "length still checked";

  // A checked frame decodes the same either way, and its CRC is still checked.
  auto checked = DecodeFrameHeader(Header(7, payload, 0), 100, PayloadCheck::kNone);
  ASSERT_TRUE(checked.ok());
  EXPECT_EQ(checked->payload_check, PayloadCheck::kCrc32c);
  EXPECT_EQ(VerifyFramePayload(*checked, "Replicated bytes").code(), StatusCode::kCorruption);

  // The flag with a CRC in the field: not what any encoder writes.
  std::string both = header;
  EncodeFixed32(both.data() + 12, crc32c::Value(payload));
  EncodeFixed32(both.data() + 28, crc32c::Value(both.data(), 28));
  EXPECT_EQ(DecodeFrameHeader(both, 100, PayloadCheck::kNone).status().code(), StatusCode::kCorruption);
  // The header's own CRC still guards the unchecked frame.
  std::string flipped = header;
  flipped[9] ^= 1;
  EXPECT_EQ(DecodeFrameHeader(flipped, 100, PayloadCheck::kNone).status().code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace canopy::transport
