// The rcopy wire protocol: a small versioned request/response codec carried
// in transport frames (transport/transport.h), explicit little-endian.
//
// One connection carries one stream of one transfer. A transfer copies one
// file; with N parallel streams the file is split into N byte ranges
// (SplitRange), each sent over its own connection and written with pwrite
// into one temporary file on the server.
//
//   client                              server
//   OPEN(name, size, mode, streams,
//        stream index, range, flags) -->
//                                   <-- RESULT(ok | error)
//   DATA(offset) + bulk bytes       -->   (repeated; offsets ascending and
//   ...                                    contiguous inside the range)
//   COMMIT(bytes, checksum)         -->
//                                   <-- RESULT(final status of the transfer)
//
// The server may send an error RESULT at any time (disk full, another stream
// failed); the client then stops sending. A RESULT for COMMIT is sent only
// when every stream of the transfer has committed and the file is published
// under its final name (or the transfer failed).
//
// Every payload starts with kProtocolVersion. Decoders never trust the input:
// each length and count is bounded, trailing bytes are rejected, and any
// violation is Corruption with the reason.
//
// Thread safety: pure functions and plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"
#include "base/status.h"

namespace canopy::rcopy {

inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr uint16_t kDefaultPort = 7471;

// Message types (transport frame type field).
inline constexpr uint16_t kMsgOpen = 0x5201;
inline constexpr uint16_t kMsgResult = 0x5202;
inline constexpr uint16_t kMsgData = 0x5203;
inline constexpr uint16_t kMsgCommit = 0x5204;

// Limits enforced by the decoders.
inline constexpr size_t kMaxNameBytes = 4096;
inline constexpr size_t kMaxResultTextBytes = 4096;
inline constexpr uint16_t kMaxStreams = 64;
inline constexpr uint64_t kMaxChunkBytes = 1ull << 30;  // one DATA message's bulk
inline constexpr uint64_t kMinChunkBytes = 4096;

// Range boundaries are multiples of this (except the file end), so that
// parallel streams write whole pages.
inline constexpr uint64_t kRangeAlignment = 4096;

enum class ChecksumAlgorithm : uint8_t {
  kNone = 0,
  kXxh3 = 1,    // XXH3-64 (xxhash)
  kCrc32c = 2,  // CRC32C (Castagnoli), zero-extended to 64 bits
};
// "none", "xxh3-64", "crc32c".
const char* ChecksumAlgorithmName(ChecksumAlgorithm algorithm);
// Accepts "xxh3", "xxh3-64", "crc32c"; InvalidArgument otherwise.
Result<ChecksumAlgorithm> ParseChecksumAlgorithm(std::string_view name);

// OPEN flags.
inline constexpr uint32_t kOpenFlagVerify = 1u << 0;  // compare checksums at COMMIT
inline constexpr uint32_t kOpenFlagSink = 1u << 1;    // server discards the data
inline constexpr uint32_t kOpenKnownFlags = kOpenFlagVerify | kOpenFlagSink;

struct OpenRequest {
  uint64_t transfer_id = 0;  // random, the same on every stream of a transfer
  std::string name;          // destination path relative to the server's root
  uint64_t file_size = 0;
  uint32_t mode = 0644;      // permission bits for the published file (& 07777 on the wire)
  uint16_t streams = 1;      // 1..kMaxStreams
  uint16_t stream_index = 0; // < streams
  uint64_t range_offset = 0; // this stream's byte range, inside [0, file_size)
  uint64_t range_length = 0;
  uint32_t flags = 0;        // kOpenFlag*
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kNone;

  bool verify() const { return (flags & kOpenFlagVerify) != 0; }
  bool sink() const { return (flags & kOpenFlagSink) != 0; }
  bool operator==(const OpenRequest&) const = default;
};

struct DataHeader {
  uint64_t offset = 0;  // file offset of the first bulk byte
  bool operator==(const DataHeader&) const = default;
};

struct CommitRequest {
  uint64_t bytes = 0;  // bulk bytes this stream sent (== its range length)
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kNone;
  uint64_t digest = 0;  // of this stream's range; 0 when checksum == kNone
  bool operator==(const CommitRequest&) const = default;
};

struct ResultMessage {
  StatusCode code = StatusCode::kOk;
  std::string text;     // empty when ok; the reason otherwise
  uint64_t bytes = 0;   // bytes the server received on this stream
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kNone;
  uint64_t digest = 0;  // the server's digest of this stream's range

  bool ok() const { return code == StatusCode::kOk; }
  // The Status this message describes (OK, or code + text).
  Status ToStatus() const;
  static ResultMessage FromStatus(const Status& status);
  bool operator==(const ResultMessage&) const = default;
};

std::string EncodeOpen(const OpenRequest& open);
std::string EncodeData(const DataHeader& data);
std::string EncodeCommit(const CommitRequest& commit);
std::string EncodeResult(const ResultMessage& result);

// Corruption on a wrong version, truncation, trailing bytes, a bound exceeded,
// unknown flags/algorithms/status codes, or an inconsistent OPEN (stream
// index out of range, range outside the file, range not SplitRange's).
Result<OpenRequest> DecodeOpen(std::string_view payload);
Result<DataHeader> DecodeData(std::string_view payload);
Result<CommitRequest> DecodeCommit(std::string_view payload);
Result<ResultMessage> DecodeResult(std::string_view payload);

// The byte range of stream `index` of `streams` for a file of `size` bytes:
// consecutive ranges of equal length rounded up to kRangeAlignment, the last
// ones shorter (possibly empty). The ranges of all streams cover [0, size)
// exactly once. REQUIRES: 1 <= streams, index < streams.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const ByteRange&) const = default;
};
ByteRange SplitRange(uint64_t size, uint16_t streams, uint16_t index);

}  // namespace canopy::rcopy
