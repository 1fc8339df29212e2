// Immutable tree nodes and paths.
//
// A Node has an ordered sequence of children and an attribute map (string key
// -> bytes value, keys unique and kept sorted). Nodes are immutable once
// published and shared between versions through NodePtr, an 8-byte intrusive
// reference-counted handle.
//
// Representation (what a node costs):
// - a Node is 24 bytes: its reference count, a PersistentVector of children
//   and a PersistentVector of attributes (tree/persistent_vector.h: 32-way
//   chunked, O(log32 n) edits with structural sharing);
// - an attribute is a 32-byte slot in its node's attribute sequence
//   (AttributeSlot): a small one (key and value up to 30 bytes) is held in
//   the slot itself; a larger one is one immutable blob holding key and
//   value (or, when it was decoded from a block image, pointing at them in
//   the image), shared by reference between every version (and every copy
//   of a node) that has it;
//   the attribute sequence is keyed (AttributeVector): its inner chunks keep
//   each child's first key prefix, so attribute(key) and a put read one
//   separator per probe, not the first leaf of every probed child;
// - every childless node without attributes is the one shared Node::Empty().
// A commit therefore copies, for each node on the path it edits, one Node and
// the O(log n) chunks of its child or attribute sequence that lead to the
// edit: its cost does not grow with the number of children or attributes, and
// a retained old version costs only what later commits changed.
//
// A NodePath addresses a node by child indexes from the root: {} is the root,
// {2} the root's third child, {2, 0} that child's first child.
//
// Lazy nodes: a tree opened from a block image (tree/snapshot.h,
// OpenSnapshotImage / OpenSnapshotFile) starts as one node that only points
// at its record in the image. A lazy node decodes its own record (attributes,
// and one lazy node per child) the first time anything reads it, then drops
// its reference to the image; until then it costs its 40 bytes and nothing
// else. Decoding copies small attributes into their slots (up to 30 bytes)
// or onto the heap; a large one (key and
// value at least kImageAttributeBytes) stays in the image, and its blob holds
// a reference to the image instead. So an image (a checkpoint file's
// mapping: its disk space too, once the store has deleted the file) lives as
// long as any lazy node or any such attribute of it does, in any version. Decoding is thread-safe (a striped
// lock; readers of an already decoded node pay one acquire load) and cannot fail: the image was fully checked
// (CRCs and structure) before any lazy node was made.
//
// Deep trees are safe: releasing the last reference to a chain of any depth
// does not recurse once per level (nodes are torn down from a work list), and
// every walk in canopy::tree uses an explicit stack.
//
// Thread safety: a Node is immutable and may be read from any number of
// threads; NodePtr copies follow std::shared_ptr rules.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "tree/persistent_vector.h"
#include "tree/ref_ptr.h"

namespace canopy::tree {

using NodePath = std::vector<uint64_t>;

// "/" for the root, else "/2/0".
std::string NodePathToString(const NodePath& path);

// An attribute by value (for building nodes).
struct Attribute {
  std::string key;
  std::string value;
  bool operator==(const Attribute&) const = default;
};

// An attribute as stored: views into an immutable blob that lives as long as
// any node (of any version) holding it.
struct AttributeView {
  std::string_view key;
  std::string_view value;
  bool operator==(const AttributeView&) const = default;
};

class NodeImage;  // tree/node_image.h (private): a checked block image

// One stored attribute: a reference count and the two lengths, then either
// the key and value bytes in the same allocation (Make), or, for an
// attribute decoded from a block image (InImage), a pointer to its bytes in
// that image and one counted reference to the image, which keeps those
// bytes (a heap buffer, or the mapping of a checkpoint file) alive as long
// as the blob is. Editing a node opened lazily from a checkpoint therefore
// copies none of its values, however large. Private to canopy::tree's node
// code; public only so that NodePtr-holding containers can name it.
class AttributeBlob {
 public:
  // Decoding a lazy node leaves attributes of at least this many bytes (key
  // plus value) in the image rather than copying them.
  static constexpr size_t kImageAttributeBytes = 256;
  static RefPtr<const AttributeBlob> Make(std::string_view key, std::string_view value);
  // key and value lie inside `image`'s bytes; takes one reference to `image`.
  static RefPtr<const AttributeBlob> InImage(const NodeImage* image, std::string_view key, std::string_view value);
  std::string_view key() const {
    if (in_image()) [[unlikely]]
      return {image_bytes()->key, key_len_};
    return {inline_bytes(), key_len_};
  }
  std::string_view value() const {
    if (in_image()) [[unlikely]]
      return {image_bytes()->value, value_len_ & ~kInImage};
    return {inline_bytes() + key_len_, value_len_};
  }
  // Whether the bytes live in a block image rather than in this allocation.
  bool in_image() const { return (value_len_ & kInImage) != 0; }
  // Heap bytes this blob takes (an image-backed blob's bytes are the image's).
  size_t HeapBytes() const;

 private:
  static constexpr uint64_t kInImage = uint64_t{1} << 63;  // flag in value_len_
  // What follows the header of an image-backed blob instead of the bytes.
  struct ImageBytes {
    const char* key;
    const char* value;
    const NodeImage* image;
  };
  AttributeBlob(uint32_t key_len, uint64_t value_len) : key_len_(key_len), value_len_(value_len) {}
  const char* inline_bytes() const { return reinterpret_cast<const char*>(this + 1); }
  const ImageBytes* image_bytes() const { return reinterpret_cast<const ImageBytes*>(this + 1); }
  friend void RefAdd(const AttributeBlob* b) noexcept;
  friend void RefRelease(const AttributeBlob* b) noexcept;
  mutable std::atomic<uint32_t> refs_{1};
  uint32_t key_len_;
  uint64_t value_len_;  // top bit: kInImage
};
using AttributePtr = RefPtr<const AttributeBlob>;

// One attribute as a node's attribute sequence holds it: 32 bytes. A small
// attribute (key and value together at most kInlineBytes) lives inside the
// slot, so the chunk of slots that holds it is all a copy or a release of
// that chunk touches: at this size copying the bytes costs less than a
// counted reference to memory elsewhere (in a node of 10^6 attributes each
// such reference is a cache miss when a commit copies the chunk, and again
// when the old version is released). A larger attribute is a counted
// reference to its AttributeBlob, shared by every version and copy that has
// it. Copyable (a blob reference is counted) and movable (a moved-from slot
// is an empty inline attribute); thread safety as RefPtr.
class AttributeSlot {
 public:
  static constexpr size_t kInlineBytes = 30;

  AttributeSlot() noexcept { std::memset(bytes_, 0, sizeof bytes_); }
  // Inline when key and value fit, else a new heap blob.
  static AttributeSlot Make(std::string_view key, std::string_view value);
  // Holds `blob` (non-null) by reference, whatever its size.
  static AttributeSlot Of(AttributePtr blob) noexcept;

  AttributeSlot(const AttributeSlot& o) noexcept {
    std::memcpy(bytes_, o.bytes_, sizeof bytes_);
    if (const AttributeBlob* b = blob()) RefAdd(b);
  }
  AttributeSlot(AttributeSlot&& o) noexcept {
    std::memcpy(bytes_, o.bytes_, sizeof bytes_);
    std::memset(o.bytes_, 0, sizeof o.bytes_);
  }
  AttributeSlot& operator=(const AttributeSlot& o) noexcept {
    AttributeSlot(o).swap(*this);
    return *this;
  }
  AttributeSlot& operator=(AttributeSlot&& o) noexcept {
    AttributeSlot(std::move(o)).swap(*this);
    return *this;
  }
  ~AttributeSlot() {
    if (const AttributeBlob* b = blob()) RefRelease(b);
  }
  void swap(AttributeSlot& o) noexcept {
    char t[sizeof bytes_];
    std::memcpy(t, bytes_, sizeof t);
    std::memcpy(bytes_, o.bytes_, sizeof t);
    std::memcpy(o.bytes_, t, sizeof t);
  }

  std::string_view key() const {
    if (const AttributeBlob* b = blob()) [[unlikely]]
      return b->key();
    return {bytes_, static_cast<uint8_t>(bytes_[kKeyLen])};
  }
  std::string_view value() const {
    if (const AttributeBlob* b = blob()) [[unlikely]]
      return b->value();
    return {bytes_ + static_cast<uint8_t>(bytes_[kKeyLen]), static_cast<uint8_t>(bytes_[kTag])};
  }
  // The blob this slot refers to, or nullptr for an inline attribute.
  const AttributeBlob* blob() const noexcept {
    if (static_cast<uint8_t>(bytes_[kTag]) != kBlobTag) [[likely]]
      return nullptr;
    const AttributeBlob* b;
    std::memcpy(&b, bytes_, sizeof b);
    return b;
  }
  // What copying, releasing or keying this slot touches outside it
  // (PersistentVector prefetches it): its blob, or nullptr.
  const void* prefetch_address() const noexcept { return blob(); }
  // Heap bytes outside the slot (its blob's; image-backed bytes not counted).
  size_t HeapBytes() const { return blob() ? blob()->HeapBytes() : 0; }

 private:
  // Inline: key then value from byte 0, the key's length at kKeyLen and the
  // value's at kTag (<= kInlineBytes). By reference: the blob pointer in
  // bytes 0-7 and kBlobTag at kTag.
  static constexpr size_t kKeyLen = 30;
  static constexpr size_t kTag = 31;
  static constexpr uint8_t kBlobTag = 0xff;
  alignas(8) char bytes_[32];
};
static_assert(sizeof(AttributeSlot) == 32);

// The search key of an attribute in a node's AttributeVector: where its slot
// is and its key's first sixteen bytes as two big-endian numbers,
// zero-padded. The numbers order like the keys they come from wherever they
// differ, so a search decides most comparisons from them alone and reads the
// key only on a tie: keys that share their first eight bytes are common
// ("user:000123", "k000000123": a hundred keys to each eight-byte prefix),
// and each such tie in an inner chunk is a read of a leaf elsewhere, a cache
// miss in a large node. The vector keeps one such key per child in every
// inner chunk (its separators), so a lookup in a node of 10^6 attributes
// reads the separators of the chunks on its path, not one leaf per probe.
// The slot address is one inside a leaf chunk: PersistentVector refreshes
// the separators of every chunk an edit writes, and a chunk keeps the leaves
// its separators point into alive (see its keyed-vector contract).
struct AttributeKey {
  uint64_t high;  // bytes 0-7 of the key
  uint64_t low;   // bytes 8-15
  const AttributeSlot* slot;

  // Bytes [from, from + 8) of `key` as a big-endian number, zero-padded.
  static uint64_t PrefixOf(std::string_view key, size_t from) noexcept {
    uint64_t v = 0;
    if (key.size() >= from + 8) {
      std::memcpy(&v, key.data() + from, 8);
    } else if (key.size() > from) {
      std::memcpy(&v, key.data() + from, key.size() - from);
    }
    if constexpr (std::endian::native == std::endian::little) v = __builtin_bswap64(v);
    return v;
  }
  // Whether this attribute's key orders before `key`; key_high and key_low
  // must be PrefixOf(key, 0) and PrefixOf(key, 8).
  bool Before(std::string_view key, uint64_t key_high, uint64_t key_low) const {
    if (high != key_high) return high < key_high;
    if (low != key_low) return low < key_low;
    return slot->key() < key;
  }
};
struct AttributeKeyOf {
  AttributeKey operator()(const AttributeSlot& s) const noexcept {
    const std::string_view key = s.key();
    return AttributeKey{AttributeKey::PrefixOf(key, 0), AttributeKey::PrefixOf(key, 8), &s};
  }
};
using AttributeVector = PersistentVector<AttributeSlot, AttributeKeyOf>;

// The index of the first attribute whose key is not before `key` (its index
// when present): one descent, O(log n).
inline size_t AttributeLowerBound(const AttributeVector& attrs, std::string_view key) {
  const uint64_t high = AttributeKey::PrefixOf(key, 0), low = AttributeKey::PrefixOf(key, 8);
  return attrs.PartitionPoint([key, high, low](const AttributeKey& a) { return a.Before(key, high, low); });
}

class Node;
using NodePtr = RefPtr<const Node>;

void RefAdd(const Node* n) noexcept;
void RefRelease(const Node* n) noexcept;

class Node {
 public:
  // For building nodes: attributes sorted by key, keys unique.
  using Attributes = std::vector<Attribute>;

  // REQUIRES: `attributes` sorted by key with unique keys; no null children.
  static NodePtr Make(const Attributes& attributes, std::vector<NodePtr> children);
  // From stored attributes (sorted, unique keys) and children, built in O(n).
  static NodePtr Make(std::vector<AttributeSlot> attributes, std::vector<NodePtr> children);
  // The shared empty node (a fresh tree's root, every new child).
  static const NodePtr& Empty();

  size_t child_count() const {
    Load();
    return children_.size();
  }
  // REQUIRES: i < child_count(). O(log32 n).
  const NodePtr& child(size_t i) const {
    Load();
    return children_[i];
  }
  // Calls f(const NodePtr&) for every child in order; O(children).
  template <typename F>
  void ForEachChild(F&& f) const {
    Load();
    children_.ForEach(f);
  }

  size_t attribute_count() const {
    Load();
    return attributes_.size();
  }
  // REQUIRES: i < attribute_count(). Attributes are in key order. O(log32 n).
  AttributeView attribute_at(size_t i) const {
    Load();
    const AttributeSlot& s = attributes_[i];
    return {s.key(), s.value()};
  }
  // The value for `key`, or nullopt. The view lives as long as this node.
  std::optional<std::string_view> attribute(std::string_view key) const;
  // Calls f(AttributeView) for every attribute in key order.
  template <typename F>
  void ForEachAttribute(F&& f) const {
    Load();
    attributes_.ForEach([&](const AttributeSlot& s) { f(AttributeView{s.key(), s.value()}); });
  }
  // All attributes as a random-access view (index-based; for small maps and tests).
  class AttributeList;
  AttributeList attributes() const;

  // The children and attributes sequences (tree internals: codecs, edits).
  const PersistentVector<NodePtr>& child_vector() const {
    Load();
    return children_;
  }
  const AttributeVector& attribute_vector() const {
    Load();
    return attributes_;
  }

  // True while this node has not decoded its record (see "Lazy nodes").
  bool lazy() const { return lazy_image_.load(std::memory_order_acquire) != nullptr; }

  // Bytes this node's own storage takes: the Node, its sequences' chunks
  // and its attribute blobs, counting shared ones too (not its children).
  size_t OwnBytes() const;

 private:
  friend class NodeBuilderAccess;  // tree internals edit nodes not yet published
  friend class NodeImageAccess;    // lazy nodes over a block image
  friend void RefAdd(const Node* n) noexcept;
  friend void RefRelease(const Node* n) noexcept;
  Node() = default;
  Node(const Node& o) : children_((o.Load(), o.children_)), attributes_(o.attributes_) {}
  Node& operator=(const Node&) = delete;
  ~Node();

  void Load() const {
    if (lazy_image_.load(std::memory_order_acquire) != nullptr) [[unlikely]]
      Decode();
  }
  // Decodes the record this lazy node points at (once; under a striped lock).
  void Decode() const;

  mutable std::atomic<uint64_t> refs_{1};
  // Written once, by Decode, before lazy_image_ is cleared (release); read
  // only after Load() (acquire), so every reader sees them complete.
  mutable PersistentVector<NodePtr> children_;
  mutable AttributeVector attributes_;
  // While lazy: the image (one counted reference) and the record's offset in it.
  mutable std::atomic<const NodeImage*> lazy_image_{nullptr};
  uint64_t lazy_offset_ = 0;
};

class Node::AttributeList {
 public:
  explicit AttributeList(const Node* n) : n_(n) {}
  size_t size() const { return n_->attribute_count(); }
  bool empty() const { return size() == 0; }
  AttributeView operator[](size_t i) const { return n_->attribute_at(i); }
  class iterator {
   public:
    iterator(const Node* n, size_t i) : n_(n), i_(i) {}
    AttributeView operator*() const { return n_->attribute_at(i_); }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const iterator& o) const { return i_ != o.i_; }
    bool operator==(const iterator& o) const { return i_ == o.i_; }

   private:
    const Node* n_;
    size_t i_;
  };
  iterator begin() const { return {n_, 0}; }
  iterator end() const { return {n_, size()}; }

 private:
  const Node* n_;
};

inline Node::AttributeList Node::attributes() const { return AttributeList(this); }

// The node at `path` under `root`, or NotFound naming the first index that is
// out of range.
Result<NodePtr> FindNode(const NodePtr& root, const NodePath& path);

// Number of nodes in the subtree (root included). Iterative; O(nodes).
uint64_t CountNodes(const NodePtr& root);

// Structural equality (attributes and children, recursively; iterative).
bool TreesEqual(const NodePtr& a, const NodePtr& b);

}  // namespace canopy::tree
