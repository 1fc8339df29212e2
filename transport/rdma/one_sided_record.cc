#include "transport/rdma/one_sided_record.h"

#include <fmt/format.h>

#include "base/coding.h"
#include "transport/rdma/log_ring_layout.h"

namespace canopy::transport::rdma {

void EncodeOneSidedMessage(uint16_t type, std::string_view payload, std::string* out) {
  out->clear();
  out->reserve(kOneSidedRecordHeaderSize + payload.size());
  PutFixed8(out, static_cast<uint8_t>(OneSidedRecordKind::kMessage));
  PutFixed16(out, type);
  out->append(payload);
}

std::string EncodeOneSidedMarker(OneSidedRecordKind kind) {
  std::string out;
  PutFixed8(&out, static_cast<uint8_t>(kind));
  PutFixed16(&out, 0);
  return out;
}

Result<OneSidedRecord> DecodeOneSidedRecord(std::string_view record) {
  if (record.size() < kOneSidedRecordHeaderSize) {
    return Status::Corruption(fmt::format("rdma: one-sided record of {} bytes is too short", record.size()));
  }
  OneSidedRecord r;
  const auto kind = static_cast<uint8_t>(record[0]);
  r.type = DecodeFixed16(record.data() + 1);
  r.payload = record.substr(kOneSidedRecordHeaderSize);
  switch (kind) {
    case static_cast<uint8_t>(OneSidedRecordKind::kMessage):
      r.kind = OneSidedRecordKind::kMessage;
      return r;
    case static_cast<uint8_t>(OneSidedRecordKind::kOnStream):
    case static_cast<uint8_t>(OneSidedRecordKind::kEnd):
      if (r.type != 0 || !r.payload.empty()) {
        return Status::Corruption(fmt::format("rdma: one-sided marker {} carries {} bytes and type {}", kind,
                                              r.payload.size(), r.type));
      }
      r.kind = static_cast<OneSidedRecordKind>(kind);
      return r;
    default:
      return Status::Corruption(fmt::format("rdma: one-sided record of unknown kind {}", kind));
  }
}

uint64_t OneSidedMaxInlinePayload(uint64_t ring_bytes) {
  const uint64_t quarter = ring_bytes / 4 / 8 * 8;
  const uint64_t overhead = kRingRecordHeaderSize + kRingRecordTrailerSize + kOneSidedRecordHeaderSize;
  return quarter > overhead ? quarter - overhead : 0;
}

}  // namespace canopy::transport::rdma
