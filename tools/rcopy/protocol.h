// The rcopy wire protocol: a small versioned request/response codec carried
// in transport frames (transport/transport.h), explicit little-endian.
//
// One connection carries one stream of one transfer. A transfer copies one
// file; with N parallel streams the bytes to send are split into N byte
// ranges (StreamRange), each sent over its own connection and written with
// pwrite into one temporary file on the server.
//
//   client                              server
//   OPEN(name, size, mode, streams,
//        stream index, range, flags,
//        resume offset + base)      -->
//                                   <-- RESULT(ok | error)
//   DATA(offset) + bulk bytes       -->   (repeated; offsets ascending and
//   ...                                    contiguous inside the range)
//   COMMIT(bytes, checksum,
//          whole-file checksum)     -->
//                                   <-- RESULT(final status of the transfer)
//
// The server may send an error RESULT at any time (disk full, another stream
// failed, server busy); the client then stops sending. A RESULT for COMMIT is
// sent only when every stream of the transfer has committed and the file is
// published under its final name (or the transfer failed).
//
// Resuming (rcopy --resume) adds one exchange on a connection of its own,
// before the OPENs:
//
//   QUERY(name, checksum, source size) -->
//                                   <-- RESUME_INFO(what the server holds for
//                                       the name: its partial file, else the
//                                       target itself, else nothing; its size,
//                                       the checksum of all of it when it is
//                                       not longer than the source, and an
//                                       identity) | RESULT(error)
//
// When the client's checksum of the same prefix of its source agrees, its
// OPENs carry resume_offset = that size, the base (partial or target) and the
// identity; the server then starts the temporary file from that base (taking
// over the partial file, or copying the target's prefix) instead of an empty
// one, refusing with Conflict when the base is no longer the file the QUERY
// described, and the streams send only [resume_offset, file_size).
//
// Every payload starts with kProtocolVersion. Decoders never trust the input:
// each length and count is bounded, trailing bytes are rejected, and any
// violation is Corruption with the reason.
//
// Version history: 1 = OPEN/DATA/COMMIT/RESULT; 2 = resume (QUERY,
// RESUME_INFO, OPEN resume fields, whole-file digests in COMMIT and RESULT)
// and the keep-partial flag. Peers of different versions refuse each other
// with a Corruption naming both versions.
//
// Thread safety: pure functions and plain values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"
#include "base/status.h"

namespace canopy::rcopy {

inline constexpr uint8_t kProtocolVersion = 2;
inline constexpr uint16_t kDefaultPort = 7471;

// Message types (transport frame type field).
inline constexpr uint16_t kMsgOpen = 0x5201;
inline constexpr uint16_t kMsgResult = 0x5202;
inline constexpr uint16_t kMsgData = 0x5203;
inline constexpr uint16_t kMsgCommit = 0x5204;
inline constexpr uint16_t kMsgQuery = 0x5205;       // client -> server, resume
inline constexpr uint16_t kMsgResumeInfo = 0x5206;  // server -> client, answer to QUERY

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
// When the transfer is interrupted (the client disconnects or goes silent,
// the server stops), keep the bytes received so far as the partial file
// (PartialFileName) for a later resume instead of removing them.
inline constexpr uint32_t kOpenFlagKeepPartial = 1u << 2;
inline constexpr uint32_t kOpenKnownFlags = kOpenFlagVerify | kOpenFlagSink | kOpenFlagKeepPartial;

// What a resumed transfer starts from (RESUME_INFO, OPEN).
enum class ResumeBase : uint8_t {
  kNone = 0,     // nothing: the whole file is sent
  kPartial = 1,  // the partial file an interrupted transfer left
  kTarget = 2,   // the existing file under the destination name
};
// "none", "partial", "target".
const char* ResumeBaseName(ResumeBase base);

// The partial file an interrupted transfer to `file` (a final path
// component) leaves in the destination directory: ".<file>.rcopy-partial";
// names over 230 bytes are cut to 200 and get a hash of the whole name.
std::string PartialFileName(std::string_view file);

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
  // Resume: the bytes [0, resume_offset) come from `resume_base`, whose
  // identity (RESUME_INFO.base_id) must still be base_id. resume_offset is 0
  // exactly when resume_base is kNone; never with the sink flag.
  uint64_t resume_offset = 0;
  ResumeBase resume_base = ResumeBase::kNone;
  uint64_t base_id = 0;

  bool verify() const { return (flags & kOpenFlagVerify) != 0; }
  bool sink() const { return (flags & kOpenFlagSink) != 0; }
  bool keep_partial() const { return (flags & kOpenFlagKeepPartial) != 0; }
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
  // Of the whole source file [0, file_size), when verifying a resumed
  // transfer (the server checks the whole published file against it); 0
  // otherwise.
  uint64_t file_digest = 0;
  bool operator==(const CommitRequest&) const = default;
};

struct ResultMessage {
  StatusCode code = StatusCode::kOk;
  std::string text;     // empty when ok; the reason otherwise
  uint64_t bytes = 0;   // bytes the server received on this stream
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kNone;
  uint64_t digest = 0;  // the server's digest of this stream's range
  uint64_t file_digest = 0;  // the server's digest of the whole file (verified resumes)

  bool ok() const { return code == StatusCode::kOk; }
  // The Status this message describes (OK, or code + text).
  Status ToStatus() const;
  static ResultMessage FromStatus(const Status& status);
  bool operator==(const ResultMessage&) const = default;
};

// QUERY: what does the server hold for `name` to resume from?
struct QueryRequest {
  std::string name;  // destination path relative to the server's root
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kXxh3;  // never kNone
  uint64_t source_size = 0;  // the server checksums nothing longer than this
  bool operator==(const QueryRequest&) const = default;
};

// RESUME_INFO: the answer to QUERY.
struct ResumeInfo {
  ResumeBase base = ResumeBase::kNone;  // kNone: nothing to resume from
  uint64_t size = 0;                    // of the base
  ChecksumAlgorithm checksum = ChecksumAlgorithm::kNone;
  // Of the base's bytes [0, size) when size <= the query's source_size
  // (checksum is then the query's), else 0 with checksum kNone.
  uint64_t digest = 0;
  uint64_t base_id = 0;  // identity of the base file (inode, size, mtime), for OPEN
  bool operator==(const ResumeInfo&) const = default;
};

std::string EncodeOpen(const OpenRequest& open);
std::string EncodeData(const DataHeader& data);
std::string EncodeCommit(const CommitRequest& commit);
std::string EncodeResult(const ResultMessage& result);
std::string EncodeQuery(const QueryRequest& query);
std::string EncodeResumeInfo(const ResumeInfo& info);

// Corruption on a wrong version, truncation, trailing bytes, a bound exceeded,
// unknown flags/algorithms/status codes/bases, or an inconsistent message
// (OPEN: stream index out of range, range outside the file or not
// StreamRange's, resume offset past the end or without a base, resume with
// sink; QUERY without a checksum; RESUME_INFO with a base but no identity).
Result<OpenRequest> DecodeOpen(std::string_view payload);
Result<DataHeader> DecodeData(std::string_view payload);
Result<CommitRequest> DecodeCommit(std::string_view payload);
Result<ResultMessage> DecodeResult(std::string_view payload);
Result<QueryRequest> DecodeQuery(std::string_view payload);
Result<ResumeInfo> DecodeResumeInfo(std::string_view payload);

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

// The range stream `index` sends when the bytes [0, resume_offset) are
// already on the server: SplitRange of the remaining file_size -
// resume_offset bytes, shifted by resume_offset (so boundaries are aligned
// relative to resume_offset). REQUIRES: resume_offset <= file_size.
ByteRange StreamRange(uint64_t file_size, uint64_t resume_offset, uint16_t streams, uint16_t index);

}  // namespace canopy::rcopy
