// Snapshot and checkpoint format 2 ("CBK1"): a tree at one version as a
// sequence of CRC32C-checked blocks that a reader uses in place.
//
// A stream (and a checkpoint file, which is exactly one stream) is
//   HEAD, NODES*, TAIL
// and every block is
//   fixed32 magic "CBK1" | fixed32 block_length (whole block, CRC included)
//   | u8 kind | fixed64 sequence (0, 1, 2, ...) | payload
//   | fixed32 crc32c(every preceding byte of the block)
// kind 1 HEAD  payload: varint name_len, name, fixed64 version
// kind 2 NODES payload: whole node records (a record never spans blocks)
// kind 3 TAIL  payload: fixed64 node_count, fixed64 body_bytes, fixed64 xxh3-64 of the body
//
// The *body* is the concatenation of the NODES payloads; a record's logical
// offset is its position in the body. Records are in post-order (children
// before their parent, the root last), one per node:
//   varint attr_count, (varint klen, key, varint vlen, value)* (keys strictly
//   increasing), varint child_count, varint delta* (one per child, in order:
//   the record's logical offset minus the child's; each delta in its minimal
//   encoding, as every writer writes it: a padded delta is refused)
// The body, and so its xxh3-64 (the tree's digest, Version::Digest), depends
// only on the tree: not on block size, history or where blocks were cut.
// A subtree's records are one contiguous, position-independent run of the
// body, which is what lets an encoder copy an untouched subtree of an image
// byte for byte.
//
// Reading in place: a checked stream (every block CRC, the sequence, every
// record's syntax, every child delta naming exactly the subtree before it,
// the TAIL counts and the digest) becomes a Version whose root is a lazy node
// over the bytes (tree/node.h, "Lazy nodes"): nothing per node is built up
// front; a node decodes its own record when first read.
//
// Readers never trust their input: any violation is Corruption, and no
// allocation is sized by a count read from the input. The format before this
// one (format 1, "CSN1", tree/legacy_snapshot.h) is recognised and named.
//
// Limits: a block is at most kMaxSnapshotChunkBytes, so a single node record
// (its attributes plus a varint per child) larger than that cannot be
// written (ResourceExhausted from the writer).
//
// Thread safety: a writer or reader is used by one thread at a time; the
// Versions they yield are ordinary immutable Versions.
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

inline constexpr uint32_t kSnapshotMagic = 0x314B4243;        // "CBK1" little-endian
inline constexpr uint32_t kLegacySnapshotMagic = 0x314E5343;  // "CSN1": format 1
inline constexpr int kSnapshotFormat = 2;
inline constexpr int kLegacySnapshotFormat = 1;
inline constexpr size_t kChunkHeaderBytes = 4 + 4 + 1 + 8;
inline constexpr size_t kChunkOverheadBytes = kChunkHeaderBytes + 4;
inline constexpr size_t kDefaultSnapshotChunkBytes = 1 << 20;
// Blocks larger than this are rejected by readers (and never written).
// Writers cut blocks at their chunk size but let one record that is larger
// have a block of its own, up to this limit.
inline constexpr size_t kMaxSnapshotChunkBytes = 255u << 20;
// Large enough for the HEAD block of any valid tree name (<= 200 bytes).
inline constexpr size_t kMinSnapshotChunkBytes = 256;

// xxh3-64 of the body of `root` (see above), computed without holding the
// body. For the untouched root of an image it is the image's checked digest
// (O(1)); untouched lazy subtrees are hashed from their bytes, not decoded.
uint64_t TreeDigest(const NodePtr& root);

// For readers of a byte stream (file, socket): given at least the first 8
// bytes of a block, returns its whole length, or Corruption if the magic is
// wrong (a format 1 chunk is named as such) or the length is outside
// [kChunkOverheadBytes, kMaxSnapshotChunkBytes].
Result<size_t> SnapshotChunkLength(std::string_view chunk_prefix);

// Pull-style encoder. Holds `version` (so the tree stays alive) and a cursor;
// memory use is one block plus the traversal stack. Untouched lazy subtrees
// (a tree opened from an image, then edited) are copied from their image
// byte for byte, not decoded.
class SnapshotWriter {
 public:
  // max_chunk_bytes is clamped to [kMinSnapshotChunkBytes, kMaxSnapshotChunkBytes];
  // it is the size blocks are cut at (see Limits for a larger record).
  explicit SnapshotWriter(Version version, size_t max_chunk_bytes = kDefaultSnapshotChunkBytes);
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  // The next encoded block, or nullopt once the TAIL block has been
  // returned or on error (then status() says why).
  std::optional<std::string> Next();
  // Same, into *chunk; false (and *chunk untouched) once TAIL was returned or
  // on error. A caller that hands the same string back each time streams
  // with no allocation per block.
  bool NextInto(std::string* chunk);
  bool done() const;
  // Ok, or why the stream stopped (ResourceExhausted: a record too large).
  const Status& status() const;
  uint64_t chunks_emitted() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Push-style convenience: feeds every block of `version` to `sink` in order,
// stopping at (and returning) the first error of the sink or the writer.
Status WriteSnapshot(const Version& version, size_t max_chunk_bytes,
                     const std::function<Status(std::string_view chunk)>& sink);

// Incremental checker: AddChunk() each block in order as it arrives (each is
// checked completely, CRC first, before the next is taken), then Finish().
// After an error the reader is dead (every later call returns the error).
class SnapshotReader {
 public:
  enum class Keep {
    kBytes,    // appends every block to one buffer; Finish() reads it in place
    kNothing,  // checks only; FinishFromFile() maps the file the caller wrote the blocks to
  };
  explicit SnapshotReader(Keep keep = Keep::kBytes);
  ~SnapshotReader();
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;

  // `chunk` must be exactly one whole block.
  Status AddChunk(std::string_view chunk);
  // AddChunk for the block of `length` bytes (its whole length, from its
  // header) at `offset` in the file `fd`, which is read, not mapped whole:
  // a block of up to 2 MiB (every block cut at the default chunk size) with
  // pread into a buffer lent by a process-wide pool; a larger one (a record
  // bigger than the chunk size, in a block of its own) has its CRC and
  // digest taken the same way, piece by piece, and its records checked
  // through a mapping of its pages that touches only those holding record
  // structure (not a large value's). The same verdicts as AddChunk.
  // Keep::kNothing only (InvalidArgument otherwise); IOError if a read fails.
  Status AddChunkFromFile(int fd, uint64_t offset, size_t length);
  // True once HEAD has been read; then tree() and version() are known.
  bool begun() const;
  const std::string& tree() const;
  uint64_t version() const;
  // True once TAIL has been accepted.
  bool complete() const;
  // Bytes accepted so far (the stream's length once complete).
  uint64_t bytes() const;
  // The tree, lazily over the kept buffer. Corruption if TAIL has not been
  // received; InvalidArgument with Keep::kNothing.
  Result<Version> Finish();
  // The tree, lazily over a read-only mapping of `path`, which must hold
  // exactly the blocks accepted (its length is checked, its content is not
  // checked again). Corruption if incomplete; IOError from the file system.
  Result<Version> FinishFromFile(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A whole stream in one buffer (taken): checked in one pass, then used in place.
Result<Version> OpenSnapshotImage(std::string bytes);
// A checkpoint file: mapped read-only, checked in one pass, used in place.
// A format 1 (CSN1) file is refused with a message naming both formats
// (Store::Open migrates those; see tree/legacy_snapshot.h).
Result<Version> OpenSnapshotFile(const std::string& path);

// Encodes a whole snapshot into memory (tests and small trees).
std::vector<std::string> EncodeSnapshotChunks(const Version& version,
                                              size_t max_chunk_bytes = kDefaultSnapshotChunkBytes);
// Checks and opens blocks produced by SnapshotWriter.
Result<Version> DecodeSnapshotChunks(const std::vector<std::string>& chunks);

// For tests: whether the record check may use the CPU's vector unit (AVX2 on
// x86-64 where the CPU has it: the default). Both forms accept and refuse
// exactly the same streams, with the same messages; tests run both. Affects
// checks that start after the call, in every thread.
void AllowSnapshotCheckVectors(bool allowed);

}  // namespace canopy::tree
