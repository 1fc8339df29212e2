#include "transport/rdma/stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace canopy::transport::rdma {

size_t StreamPacker::Fill(char* dst, size_t capacity) {
  size_t written = 0;
  while (written < capacity && !pieces_.empty()) {
    std::string_view front = pieces_.front();
    const size_t n = std::min(capacity - written, front.size() - offset_in_front_);
    std::memcpy(dst + written, front.data() + offset_in_front_, n);
    written += n;
    offset_in_front_ += n;
    if (offset_in_front_ == front.size()) {
      pieces_.pop_front();
      offset_in_front_ = 0;
    }
  }
  remaining_ -= written;
  return written;
}

std::string_view InboundStream::PeekData(size_t max) const {
  if (items_.empty() || items_.front().kind != ItemKind::kData) return {};
  const InboundItem& item = items_.front();
  return item.data.substr(item.consumed, std::min<size_t>(max, item.data.size() - item.consumed));
}

void InboundStream::AdvanceData(size_t n, std::vector<uint32_t>* released) {
  InboundItem& item = items_.front();
  item.consumed += n;
  if (item.consumed >= item.data.size()) Pop(released);
}

size_t InboundStream::QueuedDataBytes() const {
  size_t bytes = 0;
  for (const InboundItem& item : items_) {
    if (item.kind != ItemKind::kData) break;
    bytes += item.data.size() - item.consumed;
  }
  return bytes;
}

size_t InboundStream::ReadData(char* dst, size_t n, std::vector<uint32_t>* released) {
  size_t copied = 0;
  while (copied < n) {
    std::string_view piece = PeekData(n - copied);
    if (piece.empty()) break;
    std::memcpy(dst + copied, piece.data(), piece.size());
    copied += piece.size();
    AdvanceData(piece.size(), released);
  }
  return copied;
}

bool InboundStream::AdvanceSegment(uint64_t n, std::vector<uint32_t>* released) {
  InboundItem& item = items_.front();
  item.consumed += n;
  if (item.consumed < item.segment.length) return false;
  Pop(released);
  return true;
}

void InboundStream::Pop(std::vector<uint32_t>* released) {
  released->push_back(items_.front().slot);
  items_.pop_front();
}

std::vector<uint32_t> InboundStream::HeldSlots() const {
  std::vector<uint32_t> slots;
  for (const InboundItem& item : items_) slots.push_back(item.slot);
  return slots;
}

Result<std::optional<Message>> FrameAssembler::Step(InboundStream& stream, std::vector<uint32_t>* released) {
  // Header.
  while (header_have_ < kFrameHeaderSize) {
    InboundItem* item = stream.front();
    if (item == nullptr) return std::optional<Message>();
    if (item->kind == ItemKind::kShutdown) {
      if (header_have_ == 0) return Status::Closed("peer shut down the connection");
      return Status::Corruption("rdma: peer shut down in the middle of a frame header");
    }
    if (item->kind != ItemKind::kData) {
      return Status::Corruption(
          fmt::format("rdma: {} item where a frame header was expected", ItemKindName(item->kind)));
    }
    header_have_ += stream.ReadData(header_ + header_have_, kFrameHeaderSize - header_have_, released);
    if (header_have_ == kFrameHeaderSize) {
      auto decoded = DecodeFrameHeader(std::string_view(header_, kFrameHeaderSize), max_payload_, required_);
      if (!decoded.ok()) return decoded.status();
      frame_ = *decoded;
      payload_.clear();  // grows with the bytes that arrive (see below)
      // Capacity for the announced length, up to kPayloadReserveMax (frame.h):
      // no page touched, and the growth below copies nothing within it.
      payload_.reserve(std::min<size_t>(frame_.payload_len, kPayloadReserveMax));
    }
  }
  // Payload.
  while (payload_.size() < frame_.payload_len) {
    InboundItem* item = stream.front();
    if (item == nullptr) return std::optional<Message>();
    if (item->kind != ItemKind::kData) {
      return Status::Corruption(fmt::format("rdma: {} item in the middle of a {}-byte payload",
                                            ItemKindName(item->kind), frame_.payload_len));
    }
    // Appended straight from the slots: the buffer's size (the bytes
    // touched) grows only with the bytes that arrive, never to the
    // announced length up front, so a header alone does not make us
    // allocate and touch up to max_message_bytes (the rule of the TCP
    // backend). Resizing first and copying over it zeroed every byte once
    // more: under TCG, ~100 us per 64 KiB message.
    while (payload_.size() < frame_.payload_len) {
      const std::string_view piece = stream.PeekData(frame_.payload_len - payload_.size());
      if (piece.empty()) break;
      payload_.append(piece);
      stream.AdvanceData(piece.size(), released);
    }
  }
  CANOPY_RETURN_IF_ERROR(VerifyFramePayload(frame_, payload_));
  Message message;
  message.type = frame_.type;
  message.payload = std::move(payload_);
  message.bulk_bytes = frame_.bulk_len;
  payload_.clear();
  header_have_ = 0;
  return std::optional<Message>(std::move(message));
}

}  // namespace canopy::transport::rdma
