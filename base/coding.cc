#include "base/coding.h"

#include <string>

namespace canopy {

void PutFixed8(std::string* dst, uint8_t v) { dst->push_back(static_cast<char>(v)); }
void PutFixed16(std::string* dst, uint16_t v) {
  char buf[2];
  EncodeFixed16(buf, v);
  dst->append(buf, 2);
}
void PutFixed32(std::string* dst, uint32_t v) {
  char buf[4];
  EncodeFixed32(buf, v);
  dst->append(buf, 4);
}
void PutFixed64(std::string* dst, uint64_t v) {
  char buf[8];
  EncodeFixed64(buf, v);
  dst->append(buf, 8);
}
void PutVarint64(std::string* dst, uint64_t v) {
  while (v >= 0x80) {
    dst->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  dst->push_back(static_cast<char>(v));
}
void PutLengthPrefixed(std::string* dst, std::string_view bytes) {
  PutVarint64(dst, bytes.size());
  dst->append(bytes.data(), bytes.size());
}
int VarintLength(uint64_t v) {
  int n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

Status ByteReader::Short(size_t need) const {
  return Status::Corruption("truncated input: need " + std::to_string(need) + " bytes at offset " +
                            std::to_string(pos_) + ", have " + std::to_string(remaining()));
}

Result<uint8_t> ByteReader::ReadFixed8() {
  if (remaining() < 1) return Short(1);
  return static_cast<uint8_t>(input_[pos_++]);
}
Result<uint16_t> ByteReader::ReadFixed16() {
  if (remaining() < 2) return Short(2);
  uint16_t v = DecodeFixed16(input_.data() + pos_);
  pos_ += 2;
  return v;
}
Result<uint32_t> ByteReader::ReadFixed32() {
  if (remaining() < 4) return Short(4);
  uint32_t v = DecodeFixed32(input_.data() + pos_);
  pos_ += 4;
  return v;
}
Result<uint64_t> ByteReader::ReadFixed64() {
  if (remaining() < 8) return Short(8);
  uint64_t v = DecodeFixed64(input_.data() + pos_);
  pos_ += 8;
  return v;
}
Result<uint64_t> ByteReader::ReadVarint64() {
  uint64_t result = 0;
  for (int shift = 0; shift <= 63; shift += 7) {
    if (remaining() < 1) return Short(1);
    auto byte = static_cast<uint8_t>(input_[pos_++]);
    if (shift == 63 && byte > 1) return Status::Corruption("varint overflows 64 bits");
    result |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return result;
  }
  return Status::Corruption("varint longer than 10 bytes");
}
Result<uint64_t> ByteReader::ReadVarintBounded(uint64_t max, std::string_view what) {
  CANOPY_ASSIGN_OR_RETURN(uint64_t v, ReadVarint64());
  if (v > max) {
    return Status::Corruption(std::string(what) + " " + std::to_string(v) + " exceeds limit " +
                              std::to_string(max));
  }
  return v;
}
Result<std::string_view> ByteReader::ReadBytes(size_t n) {
  if (remaining() < n) return Short(n);
  std::string_view v = input_.substr(pos_, n);
  pos_ += n;
  return v;
}
Result<std::string_view> ByteReader::ReadLengthPrefixed(size_t max_len) {
  CANOPY_ASSIGN_OR_RETURN(uint64_t len, ReadVarint64());
  if (len > max_len) {
    return Status::Corruption("length " + std::to_string(len) + " exceeds limit " +
                              std::to_string(max_len));
  }
  if (len > remaining()) return Short(static_cast<size_t>(len));
  return ReadBytes(static_cast<size_t>(len));
}

}  // namespace canopy
