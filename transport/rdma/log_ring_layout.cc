#include "transport/rdma/log_ring_layout.h"

#include <fmt/format.h>

#include <cstring>

#include "base/coding.h"
#include "base/crc32c.h"

namespace canopy::transport::rdma {
namespace {

constexpr uint32_t kOfferMagic = 0x47525943;     // "CYRG"
constexpr uint32_t kFeedbackMagic = 0x46525943;  // "CYRF"
constexpr uint16_t kRingVersion = 1;

void EncodeHeaderFields(char* out, const RingRecordHeader& header) {
  EncodeFixed64(out, header.seq);
  EncodeFixed64(out + 8, header.epoch);
  EncodeFixed32(out + 16, header.length);
}

Status CheckPrefix(std::string_view bytes, size_t size, uint32_t magic, const char* what) {
  if (bytes.size() != size)
    return Status::Corruption(fmt::format("rdma: {} is {} bytes, expected {}", what, bytes.size(), size));
  if (DecodeFixed32(bytes.data()) != magic) return Status::Corruption(fmt::format("rdma: {} has a bad magic", what));
  if (DecodeFixed16(bytes.data() + 4) != kRingVersion)
    return Status::Corruption(fmt::format("rdma: {} has version {}, expected {}", what,
                                          DecodeFixed16(bytes.data() + 4), kRingVersion));
  return Status::Ok();
}

}  // namespace

Status CheckRingBytes(uint64_t ring_bytes) {
  if (ring_bytes < kRingMinBytes || ring_bytes > kRingMaxBytes || ring_bytes % 8 != 0) {
    return Status::InvalidArgument(fmt::format("rdma: log ring of {} bytes: expected a multiple of 8 in [{}, {}]",
                                               ring_bytes, kRingMinBytes, kRingMaxBytes));
  }
  return Status::Ok();
}

Result<RingPlacement> PlaceRecord(uint64_t tail, uint64_t ring_bytes, uint64_t payload_bytes) {
  RingPlacement placement;
  placement.record_bytes = RingRecordBytes(payload_bytes);
  if (payload_bytes >= kRingPadLength || placement.record_bytes > ring_bytes) {
    return Status::InvalidArgument(fmt::format(
        "rdma: a record of {} payload bytes ({} in the ring) cannot fit in a log ring of {} bytes", payload_bytes,
        placement.record_bytes, ring_bytes));
  }
  const uint64_t position = tail % ring_bytes;
  const uint64_t left = ring_bytes - position;
  if (placement.record_bytes <= left) {
    placement.offset = position;
    return placement;
  }
  placement.skip_bytes = left;
  placement.pad_record = left >= kRingRecordHeaderSize;
  placement.offset = 0;
  return placement;
}

uint64_t RingImplicitSkip(uint64_t consumed, uint64_t ring_bytes) {
  const uint64_t left = ring_bytes - consumed % ring_bytes;
  return left < kRingRecordHeaderSize ? left : 0;
}

Result<uint64_t> RingFreeBytes(uint64_t tail, uint64_t consumed, uint64_t ring_bytes) {
  if (consumed > tail || tail - consumed > ring_bytes) {
    return Status::Corruption(fmt::format(
        "rdma: log ring receiver reports {} bytes consumed but {} were written (ring {} bytes)", consumed, tail,
        ring_bytes));
  }
  return ring_bytes - (tail - consumed);
}

uint32_t RingRecordCrc(const RingRecordHeader& header, std::string_view payload) {
  char fields[20];
  EncodeHeaderFields(fields, header);
  return crc32c::Extend(crc32c::Value(fields, sizeof fields), payload.data(), payload.size());
}

void EncodeRingRecord(char* out, uint64_t seq, uint64_t epoch, std::string_view payload) {
  RingRecordHeader header{seq, epoch, static_cast<uint32_t>(payload.size()), 0};
  header.crc = RingRecordCrc(header, payload);
  EncodeHeaderFields(out, header);
  EncodeFixed32(out + 20, header.crc);
  if (!payload.empty()) std::memcpy(out + kRingRecordHeaderSize, payload.data(), payload.size());
  const uint64_t total = RingRecordBytes(payload.size());
  const uint64_t used = kRingRecordHeaderSize + payload.size();
  std::memset(out + used, 0, total - kRingRecordTrailerSize - used);
  EncodeFixed64(out + total - kRingRecordTrailerSize, seq);
}

void EncodeRingPad(char* out, uint64_t seq, uint64_t epoch) {
  RingRecordHeader header{seq, epoch, kRingPadLength, 0};
  header.crc = RingRecordCrc(header, {});
  EncodeHeaderFields(out, header);
  EncodeFixed32(out + 20, header.crc);
}

RingRecordHeader DecodeRingRecordHeader(const char* in) {
  return RingRecordHeader{DecodeFixed64(in), DecodeFixed64(in + 8), DecodeFixed32(in + 16), DecodeFixed32(in + 20)};
}

void EncodeFeedback(char out[kFeedbackBlockSize], const RingFeedback& feedback) {
  EncodeFixed64(out, feedback.consumed);
  EncodeFixed64(out + 8, feedback.durable);
  EncodeFixed64(out + 16, feedback.consumed ^ feedback.durable ^ kFeedbackMix);
}

std::optional<RingFeedback> DecodeFeedback(const char in[kFeedbackBlockSize]) {
  RingFeedback feedback{DecodeFixed64(in), DecodeFixed64(in + 8)};
  if (DecodeFixed64(in + 16) != (feedback.consumed ^ feedback.durable ^ kFeedbackMix)) return std::nullopt;
  return feedback;
}

std::string EncodeRingOffer(const RingOffer& offer) {
  std::string out(kRingOfferSize, '\0');
  EncodeFixed32(out.data(), kOfferMagic);
  EncodeFixed16(out.data() + 4, kRingVersion);
  EncodeFixed32(out.data() + 8, offer.rkey);
  EncodeFixed64(out.data() + 16, offer.addr);
  EncodeFixed64(out.data() + 24, offer.ring_bytes);
  EncodeFixed64(out.data() + 32, offer.epoch);
  return out;
}

Result<RingOffer> DecodeRingOffer(std::string_view bytes) {
  CANOPY_RETURN_IF_ERROR(CheckPrefix(bytes, kRingOfferSize, kOfferMagic, "log ring offer"));
  RingOffer offer;
  offer.rkey = DecodeFixed32(bytes.data() + 8);
  offer.addr = DecodeFixed64(bytes.data() + 16);
  offer.ring_bytes = DecodeFixed64(bytes.data() + 24);
  offer.epoch = DecodeFixed64(bytes.data() + 32);
  if (Status s = CheckRingBytes(offer.ring_bytes); !s.ok()) return Status::Corruption(s.message());
  return offer;
}

std::string EncodeFeedbackTarget(const FeedbackTarget& target) {
  std::string out(kFeedbackTargetSize, '\0');
  EncodeFixed32(out.data(), kFeedbackMagic);
  EncodeFixed16(out.data() + 4, kRingVersion);
  EncodeFixed32(out.data() + 8, target.rkey);
  EncodeFixed64(out.data() + 16, target.addr);
  EncodeFixed64(out.data() + 24, target.epoch);
  return out;
}

Result<FeedbackTarget> DecodeFeedbackTarget(std::string_view bytes) {
  CANOPY_RETURN_IF_ERROR(CheckPrefix(bytes, kFeedbackTargetSize, kFeedbackMagic, "log ring feedback target"));
  FeedbackTarget target;
  target.rkey = DecodeFixed32(bytes.data() + 8);
  target.addr = DecodeFixed64(bytes.data() + 16);
  target.epoch = DecodeFixed64(bytes.data() + 24);
  return target;
}

}  // namespace canopy::transport::rdma
