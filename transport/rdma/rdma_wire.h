// The RDMA backend's wire items: what one RDMA SEND carries.
//
// Every SEND starts with a 16-byte item header (little-endian):
//
//   off size field
//    0   1   kind            ItemKind below
//    1   1   reserved        must be 0
//    2   2   reserved        must be 0
//    4   4   data_reposted   cumulative count of data receive slots the
//                            sender of this item has re-posted (credit return)
//    8   4   ctrl_reposted   the same for control receive slots
//   12   4   body_len        bytes of body that follow the header
//
// Bodies:
//   kHello        magic u32 "CYRD", version u16, features u16, data_depth u32,
//                 ctrl_depth u32, recv_buffer_bytes u32, credit_rkey u32,
//                 credit_addr u64                                (32 bytes)
//                 features: bit 0 (kHelloAcceptsUncheckedPayloads) the sender
//                 of the hello accepts frames whose payload carries no CRC
//                 (frame.h, kFrameFlagPayloadUnchecked). A peer that predates
//                 it sends 0 there and ignores what it receives.
//   kData         bytes of the framed message stream (frame headers, payloads
//                 and eagerly sent bulk bytes), in order
//   kBulkSegment  remote_addr u64, rkey u32, reserved u32, length u64,
//                 segment_id u64                                 (32 bytes)
//   kBulkDone     segment_id u64                                 (8 bytes)
//   kShutdown     empty: the sender will send no more data items
//
// kHello and kBulkDone are control items: the receiver's progress thread
// handles them at once and re-posts their slot. kData, kBulkSegment and
// kShutdown are data items: they stay in their receive slot, in order, until
// the application consumes them.
//
// Counters are 32-bit and wrap; compare them with CounterDelta.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"

namespace canopy::transport::rdma {

inline constexpr size_t kItemHeaderSize = 16;
inline constexpr uint32_t kHelloMagic = 0x44525943;  // "CYRD" little-endian
inline constexpr uint16_t kWireVersion = 1;
inline constexpr uint16_t kHelloAcceptsUncheckedPayloads = 0x1;
inline constexpr size_t kHelloBodySize = 32;
inline constexpr size_t kBulkSegmentBodySize = 32;
inline constexpr size_t kBulkDoneBodySize = 8;
// Largest control item (header + body); control send slots are this big.
inline constexpr size_t kMaxControlItemSize = kItemHeaderSize + 32;

enum class ItemKind : uint8_t {
  kHello = 1,
  kData = 2,
  kBulkSegment = 3,
  kBulkDone = 4,
  kShutdown = 5,
};

// True for items handled by the progress thread (their slot is re-posted at
// once and counted as a control credit).
bool IsControlItem(ItemKind kind);
const char* ItemKindName(ItemKind kind);

struct ItemHeader {
  ItemKind kind = ItemKind::kData;
  uint32_t data_reposted = 0;
  uint32_t ctrl_reposted = 0;
  uint32_t body_len = 0;
};

struct Hello {
  uint16_t version = kWireVersion;
  uint16_t features = 0;           // kHello* bits
  uint32_t data_depth = 0;         // data receive slots (credits) offered
  uint32_t ctrl_depth = 0;         // control receive slots offered
  uint32_t recv_buffer_bytes = 0;  // size of one receive slot (header + body)
  uint32_t credit_rkey = 0;        // where the peer RDMA-WRITEs its counters
  uint64_t credit_addr = 0;
};

struct BulkSegment {
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t length = 0;
  uint64_t segment_id = 0;
};

// Writes the 16-byte header into out.
void EncodeItemHeader(char out[kItemHeaderSize], const ItemHeader& header);

// Parses the header of a received item of `received` bytes. Corruption when
// the item is shorter than its header, the kind is unknown, reserved bytes are
// set, or body_len does not match the received length.
Result<ItemHeader> DecodeItemHeader(std::string_view received);

void EncodeHello(char out[kHelloBodySize], const Hello& hello);
// Corruption on bad size, magic, version, or zero depths / buffer size.
Result<Hello> DecodeHello(std::string_view body);

void EncodeBulkSegment(char out[kBulkSegmentBodySize], const BulkSegment& segment);
Result<BulkSegment> DecodeBulkSegment(std::string_view body);

void EncodeBulkDone(char out[kBulkDoneBodySize], uint64_t segment_id);
Result<uint64_t> DecodeBulkDone(std::string_view body);

// (int32_t)(newer - older): positive when `newer` is ahead of `older` on the
// wrapping 32-bit counter line.
inline int32_t CounterDelta(uint32_t newer, uint32_t older) { return static_cast<int32_t>(newer - older); }

}  // namespace canopy::transport::rdma
