// Private to canopy::tree: a checked block image (format 2, tree/snapshot.h)
// and the lazy nodes that read it in place.
//
// A NodeImage owns the bytes of one whole snapshot stream (a heap buffer or a
// read-only mapping of a checkpoint file) whose every block CRC, record and
// child reference has been checked (SnapshotReader / OpenSnapshotImage /
// OpenSnapshotFile); or, made by OverBytes, a buffer of delta records that
// attributes with large values point into (no records to read). Records are addressed by their *logical*
// offset: the position in the concatenation of the NODES payloads, which does not depend on where blocks were
// cut. Because the image was checked, the record parsers here trust it and check nothing.
//
// Lifetime: counted by RefPtr; every lazy node holds one reference, and so
// does a walker (encoder, digest) reading a lazy subtree. The bytes are
// released with the last reference.
//
// Thread safety: immutable after construction; any number of readers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tree/node.h"
#include "tree/ref_ptr.h"

namespace canopy::tree {

class NodeImage {
 public:
  struct Block {
    uint64_t logical;   // logical offset of the payload's first byte
    uint64_t physical;  // offset of the payload in the image bytes
    uint64_t bytes;     // payload length
  };
  struct Summary {
    std::string tree;
    uint64_t version = 0;
    uint64_t nodes = 0;
    uint64_t body_bytes = 0;
    uint64_t digest = 0;
    uint64_t root = 0;  // logical offset of the root record (the last one)
  };

  // Over a heap buffer (taken).
  static RefPtr<const NodeImage> FromBuffer(std::string bytes, std::vector<Block> blocks, Summary summary);
  // Over a mapping (munmap'ed with the last reference).
  static RefPtr<const NodeImage> FromMapping(const char* data, size_t size, std::vector<Block> blocks,
                                             Summary summary);
  // Over bytes that hold no snapshot (no blocks, an empty summary): only the
  // owner of attributes that point into them (ApplyOps with an owner, for
  // delta records a replica received). Takes `bytes`, of which `size` are
  // in use.
  static RefPtr<const NodeImage> OverBytes(std::unique_ptr<char[]> bytes, size_t size);
  // The bytes of an OverBytes image that nothing else refers to any more:
  // taken back, and *image released. Null, *image untouched, while anything
  // else holds a reference (or for any other kind of image).
  static std::unique_ptr<char[]> TakeBackBytes(RefPtr<const NodeImage>* image);

  const Summary& summary() const { return summary_; }
  // The record at `logical`. `hint` (in/out) is a block index to try first.
  const char* Record(uint64_t logical, size_t* hint) const;
  // The block holding `logical` (index into blocks()).
  size_t BlockOf(uint64_t logical) const;
  const std::vector<Block>& blocks() const { return blocks_; }
  const char* data() const { return data_; }
  // The whole stream: HEAD, NODES*, TAIL, exactly as checked.
  size_t size() const { return size_; }

 private:
  friend void RefAdd(const NodeImage* i) noexcept;
  friend void RefRelease(const NodeImage* i) noexcept;
  NodeImage() = default;
  ~NodeImage();
  mutable std::atomic<uint64_t> refs_{1};
  std::string buffer_;
  std::unique_ptr<char[]> raw_;  // OverBytes
  const char* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::vector<Block> blocks_;
  Summary summary_;
};
void RefAdd(const NodeImage* i) noexcept;
void RefRelease(const NodeImage* i) noexcept;
using NodeImagePtr = RefPtr<const NodeImage>;

// Trusted varint (the image was checked).
inline uint64_t TakeVarint(const char** p) {
  const auto* q = reinterpret_cast<const uint8_t*>(*p);
  uint64_t v = *q & 0x7f;
  int shift = 7;
  while (*q++ & 0x80) {
    v |= static_cast<uint64_t>(*q & 0x7f) << shift;
    shift += 7;
  }
  *p = reinterpret_cast<const char*>(q);
  return v;
}

// The parts of one record: attributes [attrs, attrs_end), then child deltas.
struct RecordParts {
  uint64_t attribute_count;
  const char* attrs;
  const char* attrs_end;
  uint64_t child_count;
  const char* deltas;  // child_count varints: parent offset - child offset
  const char* end;     // one past the record
};
RecordParts ParseRecordParts(const char* record);

class NodeImageAccess {
 public:
  // A lazy node for the record at `logical` (takes one reference to img).
  static NodePtr NewLazy(const NodeImage* img, uint64_t logical);
  // The root of a checked image: lazy, or Node::Empty() for an empty root.
  static NodePtr Root(const NodeImagePtr& img);
  // If `n` is still lazy: its image (a new reference) and record offset.
  static bool Source(const Node& n, NodeImagePtr* img, uint64_t* logical);
};

}  // namespace canopy::tree
