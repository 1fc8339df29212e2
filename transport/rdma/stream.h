// Message fragmentation and in-order reassembly for the RDMA backend (no
// verbs here).
//
// Outbound, a canopy frame (frame.h header + payload, then eagerly sent bulk
// bytes) is a byte stream cut into data items no larger than the peer's
// receive slot; StreamPacker copies the next piece of that stream into a send
// slot. Inbound, InboundStream is the ordered queue of received data items
// (views into receive slots that stay posted-out until consumed) and
// FrameAssembler rebuilds frames from it, across item boundaries and across
// Receive calls that time out half way.
//
// Each consumed item's slot index is appended to `released` so the caller can
// re-post it and return the credit.
//
// Thread safety: none; each object is used under the connection's receive
// lock (InboundStream additionally under its state mutex for Push).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "transport/frame.h"
#include "transport/rdma/rdma_wire.h"
#include "transport/transport.h"

namespace canopy::transport::rdma {

// Copies a sequence of byte ranges (the caller keeps them alive) into
// fixed-capacity buffers, in order.
class StreamPacker {
 public:
  StreamPacker() = default;
  void Append(std::string_view bytes) {
    if (!bytes.empty()) pieces_.push_back(bytes);
    remaining_ += bytes.size();
  }
  // Copies up to `capacity` next bytes into dst; returns how many.
  size_t Fill(char* dst, size_t capacity);
  size_t remaining() const { return remaining_; }
  bool done() const { return remaining_ == 0; }

 private:
  std::deque<std::string_view> pieces_;
  size_t offset_in_front_ = 0;
  size_t remaining_ = 0;
};

struct InboundItem {
  ItemKind kind = ItemKind::kData;  // kData, kBulkSegment or kShutdown
  uint32_t slot = 0;                // receive slot holding it
  std::string_view data;            // kData: the body (in the slot)
  BulkSegment segment;              // kBulkSegment
  uint64_t consumed = 0;            // bytes of data / segment already consumed
};

class InboundStream {
 public:
  // REQUIRES: item.kind is a data item (not control).
  void Push(const InboundItem& item) { items_.push_back(item); }
  bool empty() const { return items_.empty(); }
  size_t size() const { return items_.size(); }
  // The oldest unconsumed item, or null.
  InboundItem* front() { return items_.empty() ? nullptr : &items_.front(); }

  // Contiguous unconsumed bytes of the front item when it is kData (at most
  // max bytes); empty otherwise.
  std::string_view PeekData(size_t max) const;
  // Consumes n bytes of the front kData item (n <= its remaining bytes);
  // pops it and reports its slot when done.
  void AdvanceData(size_t n, std::vector<uint32_t>* released);
  // Unconsumed bytes of the consecutive kData items at the front (up to the
  // first non-data item): what ReadData could copy now.
  size_t QueuedDataBytes() const;
  // Copies up to n bytes from consecutive kData items; stops at a non-data
  // item or when the queue runs dry. Returns bytes copied.
  size_t ReadData(char* dst, size_t n, std::vector<uint32_t>* released);
  // Consumes n bytes of the front kBulkSegment; returns true when that
  // completed the segment (it is popped and its slot reported).
  bool AdvanceSegment(uint64_t n, std::vector<uint32_t>* released);
  // Pops the front item (any kind) and reports its slot.
  void Pop(std::vector<uint32_t>* released);

  // Every slot still held (for tear-down).
  std::vector<uint32_t> HeldSlots() const;

 private:
  std::deque<InboundItem> items_;
};

// Rebuilds frames (header, payload) from an InboundStream.
class FrameAssembler {
 public:
  explicit FrameAssembler(uint32_t max_payload) : max_payload_(max_payload) {}
  // The check each frame's payload must carry (frame.h: kCrc32c by default;
  // kNone where the connection told its peer it accepts unchecked payloads).
  void set_required_check(PayloadCheck required) { required_ = required; }

  // Pulls what is available. Returns a complete Message (bulk_bytes set from
  // its header), nullopt when more items are needed, Closed when the stream
  // ends with kShutdown at a frame boundary (it stays queued, so later calls
  // say Closed again), Corruption for a bad frame or a shutdown / bulk
  // segment in the middle of a frame.
  // REQUIRES: no bulk bytes pending (the caller tracks them).
  Result<std::optional<Message>> Step(InboundStream& stream, std::vector<uint32_t>* released);

  // True between frames.
  bool at_boundary() const { return header_have_ == 0; }
  // Bytes held for the payload of the frame in progress: the bytes that have
  // arrived (appended from the slots), never the announced length alone.
  size_t reserved_payload_bytes() const { return payload_.size(); }

 private:
  uint32_t max_payload_;
  PayloadCheck required_ = PayloadCheck::kCrc32c;
  char header_[kFrameHeaderSize] = {};
  size_t header_have_ = 0;
  FrameHeader frame_;
  std::string payload_;
};

}  // namespace canopy::transport::rdma
