#include "transport/rdma/rdma_wire.h"

#include <fmt/format.h>

#include "base/coding.h"

namespace canopy::transport::rdma {

bool IsControlItem(ItemKind kind) { return kind == ItemKind::kHello || kind == ItemKind::kBulkDone; }

const char* ItemKindName(ItemKind kind) {
  switch (kind) {
    case ItemKind::kHello:
      return "hello";
    case ItemKind::kData:
      return "data";
    case ItemKind::kBulkSegment:
      return "bulk-segment";
    case ItemKind::kBulkDone:
      return "bulk-done";
    case ItemKind::kShutdown:
      return "shutdown";
  }
  return "unknown";
}

void EncodeItemHeader(char out[kItemHeaderSize], const ItemHeader& header) {
  out[0] = static_cast<char>(header.kind);
  out[1] = 0;
  EncodeFixed16(out + 2, 0);
  EncodeFixed32(out + 4, header.data_reposted);
  EncodeFixed32(out + 8, header.ctrl_reposted);
  EncodeFixed32(out + 12, header.body_len);
}

Result<ItemHeader> DecodeItemHeader(std::string_view received) {
  if (received.size() < kItemHeaderSize) {
    return Status::Corruption(fmt::format("rdma: received item of {} bytes, shorter than its {}-byte header",
                                          received.size(), kItemHeaderSize));
  }
  const char* p = received.data();
  const auto kind = static_cast<uint8_t>(p[0]);
  if (kind < static_cast<uint8_t>(ItemKind::kHello) || kind > static_cast<uint8_t>(ItemKind::kShutdown)) {
    return Status::Corruption(fmt::format("rdma: unknown item kind {}", kind));
  }
  if (p[1] != 0 || DecodeFixed16(p + 2) != 0)
    return Status::Corruption("rdma: item header reserved bytes are set");
  ItemHeader header;
  header.kind = static_cast<ItemKind>(kind);
  header.data_reposted = DecodeFixed32(p + 4);
  header.ctrl_reposted = DecodeFixed32(p + 8);
  header.body_len = DecodeFixed32(p + 12);
  if (header.body_len != received.size() - kItemHeaderSize) {
    return Status::Corruption(fmt::format("rdma: {} item announces {} body bytes but {} arrived",
                                          ItemKindName(header.kind), header.body_len,
                                          received.size() - kItemHeaderSize));
  }
  size_t expected = 0;
  switch (header.kind) {
    case ItemKind::kHello:
      expected = kHelloBodySize;
      break;
    case ItemKind::kBulkSegment:
      expected = kBulkSegmentBodySize;
      break;
    case ItemKind::kBulkDone:
      expected = kBulkDoneBodySize;
      break;
    case ItemKind::kShutdown:
      expected = 0;
      break;
    case ItemKind::kData:
      if (header.body_len == 0) return Status::Corruption("rdma: empty data item");
      return header;
  }
  if (header.body_len != expected) {
    return Status::Corruption(fmt::format("rdma: {} item has a {}-byte body, expected {}",
                                          ItemKindName(header.kind), header.body_len, expected));
  }
  return header;
}

void EncodeHello(char out[kHelloBodySize], const Hello& hello) {
  EncodeFixed32(out, kHelloMagic);
  EncodeFixed16(out + 4, hello.version);
  EncodeFixed16(out + 6, hello.features);
  EncodeFixed32(out + 8, hello.data_depth);
  EncodeFixed32(out + 12, hello.ctrl_depth);
  EncodeFixed32(out + 16, hello.recv_buffer_bytes);
  EncodeFixed32(out + 20, hello.credit_rkey);
  EncodeFixed64(out + 24, hello.credit_addr);
}

Result<Hello> DecodeHello(std::string_view body) {
  if (body.size() != kHelloBodySize) return Status::Corruption("rdma: hello body has the wrong size");
  const char* p = body.data();
  if (DecodeFixed32(p) != kHelloMagic)
    return Status::Corruption("rdma: hello has a bad magic (not a canopy peer?)");
  Hello hello;
  hello.version = DecodeFixed16(p + 4);
  if (hello.version != kWireVersion) {
    return Status::Corruption(
        fmt::format("rdma: peer speaks wire version {}, this build speaks {}", hello.version, kWireVersion));
  }
  hello.features = DecodeFixed16(p + 6);
  hello.data_depth = DecodeFixed32(p + 8);
  hello.ctrl_depth = DecodeFixed32(p + 12);
  hello.recv_buffer_bytes = DecodeFixed32(p + 16);
  hello.credit_rkey = DecodeFixed32(p + 20);
  hello.credit_addr = DecodeFixed64(p + 24);
  if (hello.data_depth == 0 || hello.ctrl_depth == 0)
    return Status::Corruption("rdma: hello offers no receive slots");
  if (hello.recv_buffer_bytes <= kMaxControlItemSize) {
    return Status::Corruption(
        fmt::format("rdma: hello offers receive slots of only {} bytes", hello.recv_buffer_bytes));
  }
  return hello;
}

void EncodeBulkSegment(char out[kBulkSegmentBodySize], const BulkSegment& segment) {
  EncodeFixed64(out, segment.remote_addr);
  EncodeFixed32(out + 8, segment.rkey);
  EncodeFixed32(out + 12, 0);
  EncodeFixed64(out + 16, segment.length);
  EncodeFixed64(out + 24, segment.segment_id);
}

Result<BulkSegment> DecodeBulkSegment(std::string_view body) {
  if (body.size() != kBulkSegmentBodySize)
    return Status::Corruption("rdma: bulk segment body has the wrong size");
  const char* p = body.data();
  BulkSegment segment;
  segment.remote_addr = DecodeFixed64(p);
  segment.rkey = DecodeFixed32(p + 8);
  if (DecodeFixed32(p + 12) != 0) return Status::Corruption("rdma: bulk segment reserved bytes are set");
  segment.length = DecodeFixed64(p + 16);
  segment.segment_id = DecodeFixed64(p + 24);
  if (segment.length == 0) return Status::Corruption("rdma: empty bulk segment");
  return segment;
}

void EncodeBulkDone(char out[kBulkDoneBodySize], uint64_t segment_id) { EncodeFixed64(out, segment_id); }

Result<uint64_t> DecodeBulkDone(std::string_view body) {
  if (body.size() != kBulkDoneBodySize) return Status::Corruption("rdma: bulk done body has the wrong size");
  return DecodeFixed64(body.data());
}

}  // namespace canopy::transport::rdma
