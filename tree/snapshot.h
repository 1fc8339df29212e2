// Snapshot codec: a tree at one version as a stream of self-checking chunks.
//
// The tree is serialised in pre-order into a "body" byte stream; per node:
//   varint attribute_count, (varint key_len, key, varint value_len, value)*
//   (keys strictly increasing), varint child_count.
// The body is cut into chunks of bounded size (a record may span chunks), so
// a tree of any size encodes and installs one chunk at a time without the
// whole encoding ever being held in memory. Each chunk is
//   fixed32 magic "CSN1" | fixed32 chunk_length (whole chunk, CRC included)
//   | u8 kind | fixed64 sequence (0, 1, 2, ...) | payload
//   | fixed32 crc32c(every preceding byte of the chunk)
// kind 1 BEGIN payload: varint name_len, name, fixed64 version
// kind 2 NODES payload: the next slice of the body
// kind 3 END   payload: fixed64 node_count, fixed64 body_bytes, fixed64 xxh3-64 of the body
// A stream is BEGIN, NODES*, END. A checkpoint file is exactly such a stream.
//
// SnapshotReader never trusts its input: a chunk whose length, CRC, magic,
// kind or sequence is wrong, a body that does not parse, counts that do not
// add up, a digest mismatch, or a stream that stops before END all yield
// Corruption. No allocation is sized by a count read from the input.
//
// Thread safety: a writer or reader is used by one thread at a time.
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

namespace canopy::tree {

inline constexpr uint32_t kSnapshotMagic = 0x314E5343;  // "CSN1" little-endian
inline constexpr size_t kChunkHeaderBytes = 4 + 4 + 1 + 8;
inline constexpr size_t kChunkOverheadBytes = kChunkHeaderBytes + 4;
inline constexpr size_t kDefaultSnapshotChunkBytes = 1 << 20;
// Chunks larger than this are rejected by readers (and never written).
inline constexpr size_t kMaxSnapshotChunkBytes = 64 << 20;
// Large enough for the BEGIN chunk of any valid tree name (<= 200 bytes).
inline constexpr size_t kMinSnapshotChunkBytes = 256;

// xxh3-64 of the body stream of `root` (computed without materialising it).
// The digest of a tree's content: Version::Digest() returns it.
uint64_t TreeDigest(const NodePtr& root);

// For readers of a byte stream (file, socket): given at least the first 8
// bytes of a chunk, returns its whole length, or Corruption if the magic is
// wrong or the length is outside [kChunkOverheadBytes, kMaxSnapshotChunkBytes].
Result<size_t> SnapshotChunkLength(std::string_view chunk_prefix);

// Pull-style encoder. Holds `version` (so the tree stays alive) and a cursor;
// memory use is one chunk plus the traversal stack.
class SnapshotWriter {
 public:
  // max_chunk_bytes is clamped to [kMinSnapshotChunkBytes, kMaxSnapshotChunkBytes];
  // every chunk, framing included, is at most that long.
  explicit SnapshotWriter(Version version, size_t max_chunk_bytes = kDefaultSnapshotChunkBytes);
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  // The next encoded chunk, or nullopt once the END chunk has been returned.
  std::optional<std::string> Next();
  // Same, into *chunk; false (and *chunk untouched) once END was returned.
  // Whatever *chunk held before is discarded and its buffer reused for a
  // later chunk: a caller that hands the same string back each time streams
  // with no allocation (and no page faults) per chunk.
  bool NextInto(std::string* chunk);
  bool done() const;
  uint64_t chunks_emitted() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Push-style convenience: feeds every chunk of `version` to `sink` in order,
// stopping at (and returning) the first error the sink returns.
Status WriteSnapshot(const Version& version, size_t max_chunk_bytes,
                     const std::function<Status(std::string_view chunk)>& sink);

// Incremental decoder: AddChunk() each chunk in order, then Finish().
// Decoded nodes are built as chunks arrive; after an error the reader is dead
// (every later call returns the same error).
class SnapshotReader {
 public:
  SnapshotReader();
  ~SnapshotReader();
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;

  // `chunk` must be exactly one whole chunk.
  Status AddChunk(std::string_view chunk);
  // True once BEGIN has been read; then tree() and version() are known.
  bool begun() const;
  const std::string& tree() const;
  uint64_t version() const;
  // True once END has been accepted.
  bool complete() const;
  // The decoded tree. Corruption if END has not been received.
  Result<Version> Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Encodes a whole snapshot into memory (tests and small trees).
std::vector<std::string> EncodeSnapshotChunks(const Version& version,
                                              size_t max_chunk_bytes = kDefaultSnapshotChunkBytes);
// Decodes chunks produced by SnapshotWriter.
Result<Version> DecodeSnapshotChunks(const std::vector<std::string>& chunks);

}  // namespace canopy::tree
