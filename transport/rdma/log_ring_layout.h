// The one-sided log ring's memory layout and cursor arithmetic, apart from
// verbs so that it is unit-tested on any machine (tests/rdma_logic_test.cc).
// log_ring.h is the part that moves bytes; read it first.
//
// The ring is `ring_bytes` (a multiple of 8) of memory on the receiver that
// the writer fills with RDMA WRITE. Both sides count bytes with the same
// monotonically increasing 64-bit cursor: the writer's tail (bytes written)
// and the receiver's consumed count (bytes released); the position in the
// ring is cursor % ring_bytes. Each record is one contiguous WRITE:
//
//   off        size  field
//    0          8    seq       1, 2, 3, ...: the receiver waits for exactly the next one
//    8          8    epoch     the epoch of the ring's registration (RingOffer::epoch)
//   16          4    length    payload bytes, or kRingPadLength for a pad record
//   20          4    crc       CRC32C of bytes 0..19 and the payload
//   24          len  payload
//   24+len      ..   zeros up to a multiple of 8
//   end-8       8    trailer   == seq; written last in the same WRITE
//
// All fields little-endian. A record never wraps: when it does not fit in the
// bytes left before the end of the ring, the writer skips them. If at least a
// header fits there, it writes a pad record (header only, length
// kRingPadLength, a seq of its own) so the receiver knows to skip; otherwise
// both sides skip the tail bytes without a pad. The receiver zeroes every
// byte it releases, so a stale seq or trailer of an earlier lap is never
// mistaken for a new one (seq is never 0).
//
// The receiver reports back by RDMA WRITE into a 24-byte feedback block on the
// writer: consumed u64, durable u64, check u64 (consumed ^ durable ^
// kFeedbackMix), so that a torn read of the block is detected and retried.
//
// The credentials travel over the connection's message stream:
//   RingOffer (receiver -> writer, 40 bytes): magic u32 "CYRG", version u16,
//     reserved u16, rkey u32, reserved u32, addr u64, ring_bytes u64, epoch u64
//   FeedbackTarget (writer -> receiver, 32 bytes): magic u32 "CYRF", version
//     u16, reserved u16, rkey u32, reserved u32, addr u64, epoch u64
//
// Thread safety: pure functions and values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/result.h"

namespace canopy::transport::rdma {

inline constexpr size_t kRingRecordHeaderSize = 24;
inline constexpr size_t kRingRecordTrailerSize = 8;
inline constexpr uint32_t kRingPadLength = 0xffffffffu;
inline constexpr uint64_t kRingMinBytes = 64;
inline constexpr uint64_t kRingMaxBytes = 1ull << 30;
inline constexpr size_t kFeedbackBlockSize = 24;
inline constexpr uint64_t kFeedbackMix = 0x43594652494e4721ull;
inline constexpr size_t kRingOfferSize = 40;
inline constexpr size_t kFeedbackTargetSize = 32;

// Where the receiver's ring is and which epoch its registration belongs to.
struct RingOffer {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint64_t ring_bytes = 0;
  uint64_t epoch = 0;
};

// Where the writer's feedback block is.
struct FeedbackTarget {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint64_t epoch = 0;  // the epoch of the offer the writer accepted
};

struct RingRecordHeader {
  uint64_t seq = 0;
  uint64_t epoch = 0;
  uint32_t length = 0;  // kRingPadLength for a pad
  uint32_t crc = 0;
};

struct RingFeedback {
  uint64_t consumed = 0;
  uint64_t durable = 0;
};

// Bytes one record with `payload_bytes` of payload occupies.
constexpr uint64_t RingRecordBytes(uint64_t payload_bytes) {
  return kRingRecordHeaderSize + (payload_bytes + 7) / 8 * 8 + kRingRecordTrailerSize;
}

// InvalidArgument unless kRingMinBytes <= ring_bytes <= kRingMaxBytes and a multiple of 8.
Status CheckRingBytes(uint64_t ring_bytes);

// Where the writer puts the next record when its tail is `tail`.
struct RingPlacement {
  uint64_t skip_bytes = 0;  // bytes left unused before the end of the ring (0: none)
  bool pad_record = false;  // a pad header goes at tail % ring_bytes first
  uint64_t offset = 0;      // ring offset of the record itself
  uint64_t record_bytes = 0;
  uint64_t advance() const { return skip_bytes + record_bytes; }  // how far the tail moves
};

// InvalidArgument when the record can never fit (RingRecordBytes > ring_bytes).
Result<RingPlacement> PlaceRecord(uint64_t tail, uint64_t ring_bytes, uint64_t payload_bytes);

// Bytes the receiver skips without reading at consumed position `consumed`
// (the end of the ring is closer than one header); 0 otherwise.
uint64_t RingImplicitSkip(uint64_t consumed, uint64_t ring_bytes);

// Free bytes the writer may fill: ring_bytes - (tail - consumed). Corruption
// when the receiver reports more consumed than was written or a negative fill.
Result<uint64_t> RingFreeBytes(uint64_t tail, uint64_t consumed, uint64_t ring_bytes);

// The CRC a record header carries over its first 20 bytes plus the payload.
uint32_t RingRecordCrc(const RingRecordHeader& header, std::string_view payload);

// Writes header (with its crc filled in from `payload`), payload, zero
// padding and trailer into out[0, RingRecordBytes(payload.size())).
void EncodeRingRecord(char* out, uint64_t seq, uint64_t epoch, std::string_view payload);
// Writes a pad header into out[0, kRingRecordHeaderSize).
void EncodeRingPad(char* out, uint64_t seq, uint64_t epoch);
RingRecordHeader DecodeRingRecordHeader(const char* in);

void EncodeFeedback(char out[kFeedbackBlockSize], const RingFeedback& feedback);
// nullopt when the check word does not match (a torn read: read again).
std::optional<RingFeedback> DecodeFeedback(const char in[kFeedbackBlockSize]);

std::string EncodeRingOffer(const RingOffer& offer);
// Corruption on bad size, magic, version or ring size.
Result<RingOffer> DecodeRingOffer(std::string_view bytes);
std::string EncodeFeedbackTarget(const FeedbackTarget& target);
Result<FeedbackTarget> DecodeFeedbackTarget(std::string_view bytes);

}  // namespace canopy::transport::rdma
