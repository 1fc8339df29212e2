// What a one-sided stream (one_sided_stream.h) puts in each log ring record,
// apart from verbs so that it is unit-tested on any machine
// (tests/rdma_logic_test.cc).
//
// Every record's payload (log_ring_layout.h) starts with a kind byte:
//
//   off size field
//    0   1   kind      kMessage, kOnStream or kEnd
//    1   2   type      kMessage: the message type (LE); otherwise 0
//    3   ..  payload   kMessage: the message payload; otherwise empty
//
//   kMessage   one whole message, carried by the ring
//   kOnStream  the next message travels on the underlying connection's own
//              stream (too large for a record, or a message with bulk
//              bytes): the receiver takes exactly one message from there
//              before it reads the ring again, so the order is kept
//   kEnd       the writer shut its sending side down (orderly end: Closed)
//
// The ring's record CRC covers these bytes; a kind the decoder does not
// know, a short record or bytes after a marker are Corruption.
//
// Set-up messages on the underlying stream (message types of the transport's
// own range, never a replication message type):
//   kOneSidedRingOfferType       EncodeRingOffer of the sender's ring
//   kOneSidedFeedbackTargetType  EncodeFeedbackTarget of the sender's writer
//
// Thread safety: pure functions and values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"

namespace canopy::transport::rdma {

inline constexpr uint16_t kOneSidedRingOfferType = 0x4310;
inline constexpr uint16_t kOneSidedFeedbackTargetType = 0x4311;
inline constexpr size_t kOneSidedRecordHeaderSize = 3;

enum class OneSidedRecordKind : uint8_t { kMessage = 1, kOnStream = 2, kEnd = 3 };

struct OneSidedRecord {
  OneSidedRecordKind kind = OneSidedRecordKind::kMessage;
  uint16_t type = 0;
  std::string_view payload;  // a view into the decoded bytes
};

// Appends the record for a message of `type` and `payload` to *out (cleared first).
void EncodeOneSidedMessage(uint16_t type, std::string_view payload, std::string* out);
// A kOnStream or kEnd marker.
std::string EncodeOneSidedMarker(OneSidedRecordKind kind);
// Corruption on a short record, an unknown kind, or a marker with bytes after it.
Result<OneSidedRecord> DecodeOneSidedRecord(std::string_view record);

// The largest message payload a record of a ring of `ring_bytes` carries:
// a quarter of the ring less the headers, so that a full-size record never
// waits for more than a quarter of the ring to drain. Larger messages go on
// the stream (kOnStream). 0 when the ring is too small for any.
uint64_t OneSidedMaxInlinePayload(uint64_t ring_bytes);

}  // namespace canopy::transport::rdma
