// Format 1 snapshot streams ("CSN1"): the chunked pre-order encoding that
// checkpoint files and snapshot streams used before the block format of
// tree/snapshot.h (format 2, "CBK1").
//
// Kept for one purpose: a data directory written by an older canopy holds
// CSN1 checkpoint files, and Store::Open migrates them (decodes with this
// reader, rewrites the checkpoint in format 2). The writer exists so that
// tests can produce such directories. Nothing else speaks CSN1.
//
//   fixed32 magic "CSN1" | fixed32 chunk_length (whole chunk, CRC included)
//   | u8 kind | fixed64 sequence | payload | fixed32 crc32c
//   kind 1 BEGIN: varint name_len, name, fixed64 version
//   kind 2 NODES: the next slice of the pre-order body (records may span chunks)
//   kind 3 END:   fixed64 node_count, fixed64 body_bytes, fixed64 xxh3-64(body)
//   body record: varint attr_count, (varint klen, key, varint vlen, value)*, varint child_count
//
// The reader trusts nothing: every chunk's length, CRC, kind and sequence,
// the body's syntax, the END counts and the digest are checked (Corruption).
// Thread safety: one thread per reader or writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "base/status.h"
#include "tree/node.h"
#include "tree/version.h"

namespace canopy::tree::csn1 {

inline constexpr uint32_t kMagic = 0x314E5343;  // "CSN1" little-endian
inline constexpr size_t kChunkHeaderBytes = 4 + 4 + 1 + 8;
inline constexpr size_t kChunkOverheadBytes = kChunkHeaderBytes + 4;
inline constexpr size_t kDefaultSnapshotChunkBytes = 1 << 20;
inline constexpr size_t kMaxSnapshotChunkBytes = 64 << 20;
inline constexpr size_t kMinSnapshotChunkBytes = 256;

// Given at least 8 bytes of a CSN1 chunk: its whole length, or Corruption.
Result<size_t> SnapshotChunkLength(std::string_view chunk_prefix);

// The CSN1 END digest of a tree (xxh3-64 of its pre-order body).
uint64_t BodyDigest(const NodePtr& root);

class SnapshotWriter {
 public:
  explicit SnapshotWriter(Version version, size_t max_chunk_bytes = kDefaultSnapshotChunkBytes);
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;
  std::optional<std::string> Next();
  bool NextInto(std::string* chunk);
  bool done() const;
  uint64_t chunks_emitted() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

Status WriteSnapshot(const Version& version, size_t max_chunk_bytes,
                     const std::function<Status(std::string_view chunk)>& sink);

class SnapshotReader {
 public:
  SnapshotReader();
  ~SnapshotReader();
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;
  Status AddChunk(std::string_view chunk);
  bool begun() const;
  const std::string& tree() const;
  uint64_t version() const;
  bool complete() const;
  Result<Version> Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::vector<std::string> EncodeSnapshotChunks(const Version& version,
                                              size_t max_chunk_bytes = kDefaultSnapshotChunkBytes);
Result<Version> DecodeSnapshotChunks(const std::vector<std::string>& chunks);

}  // namespace canopy::tree::csn1
