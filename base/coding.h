// Explicit little-endian encoding of integers and length-prefixed bytes.
//
// Every wire format and file format in canopy is little-endian, encoded byte
// by byte (no struct casts, no host-order assumptions). Writers append to a
// std::string that the caller owns. ByteReader reads from a view it does not
// own (the bytes must outlive it) and never trusts the input: every read is
// bounds-checked and a short or malformed input yields Corruption, never a
// read past the end.
//
// Thread safety: none needed; each object is used by one thread.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "base/result.h"
#include "base/status.h"

namespace canopy {

inline void EncodeFixed16(char* dst, uint16_t v) {
  dst[0] = static_cast<char>(v);
  dst[1] = static_cast<char>(v >> 8);
}
inline void EncodeFixed32(char* dst, uint32_t v) {
  for (int i = 0; i < 4; ++i) dst[i] = static_cast<char>(v >> (8 * i));
}
inline void EncodeFixed64(char* dst, uint64_t v) {
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<char>(v >> (8 * i));
}
inline uint16_t DecodeFixed16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
inline uint32_t DecodeFixed32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | u[i];
  return v;
}
inline uint64_t DecodeFixed64(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | u[i];
  return v;
}

void PutFixed8(std::string* dst, uint8_t v);
void PutFixed16(std::string* dst, uint16_t v);
void PutFixed32(std::string* dst, uint32_t v);
void PutFixed64(std::string* dst, uint64_t v);
// LEB128-style unsigned varint (1..10 bytes).
void PutVarint64(std::string* dst, uint64_t v);
// varint length followed by the bytes.
void PutLengthPrefixed(std::string* dst, std::string_view bytes);

// Number of bytes PutVarint64 writes for v.
int VarintLength(uint64_t v);

// Sequential, bounds-checked reader over bytes it does not own.
class ByteReader {
 public:
  explicit ByteReader(std::string_view input) : input_(input) {}

  size_t remaining() const { return input_.size() - pos_; }
  size_t position() const { return pos_; }
  bool empty() const { return remaining() == 0; }

  Result<uint8_t> ReadFixed8();
  Result<uint16_t> ReadFixed16();
  Result<uint32_t> ReadFixed32();
  Result<uint64_t> ReadFixed64();
  // Corruption on overlong (>10 bytes) or truncated varints.
  Result<uint64_t> ReadVarint64();
  // Reads a varint that must be <= max (e.g. a count or length limit).
  Result<uint64_t> ReadVarintBounded(uint64_t max, std::string_view what);
  // Returns a view into the input (valid while the input is).
  Result<std::string_view> ReadBytes(size_t n);
  // varint length (bounded by remaining() and by max_len) + bytes.
  Result<std::string_view> ReadLengthPrefixed(size_t max_len = SIZE_MAX);

 private:
  Status Short(size_t need) const;
  std::string_view input_;
  size_t pos_ = 0;
};

}  // namespace canopy
