#include "tree/node_image.h"

#include <sys/mman.h>

#include <algorithm>
#include <mutex>
#include <utility>

namespace canopy::tree {

// ---------------------------------------------------------------- images

RefPtr<const NodeImage> NodeImage::FromBuffer(std::string bytes, std::vector<Block> blocks, Summary summary) {
  auto* img = new NodeImage();
  img->buffer_ = std::move(bytes);
  img->data_ = img->buffer_.data();
  img->size_ = img->buffer_.size();
  img->blocks_ = std::move(blocks);
  img->summary_ = std::move(summary);
  return RefPtr<const NodeImage>::Adopt(img);
}

RefPtr<const NodeImage> NodeImage::FromMapping(const char* data, size_t size, std::vector<Block> blocks,
                                               Summary summary) {
  auto* img = new NodeImage();
  img->data_ = data;
  img->size_ = size;
  img->mapped_ = true;
  img->blocks_ = std::move(blocks);
  img->summary_ = std::move(summary);
  return RefPtr<const NodeImage>::Adopt(img);
}

RefPtr<const NodeImage> NodeImage::OverBytes(std::unique_ptr<char[]> bytes, size_t size) {
  auto* img = new NodeImage();
  img->data_ = bytes.get();
  img->size_ = size;
  img->raw_ = std::move(bytes);
  return RefPtr<const NodeImage>::Adopt(img);
}

std::unique_ptr<char[]> NodeImage::TakeBackBytes(RefPtr<const NodeImage>* image) {
  const NodeImage* img = image->get();
  // One reference, ours: nothing else can take another meanwhile.
  if (img == nullptr || !img->raw_ || img->refs_.load(std::memory_order_acquire) != 1) return nullptr;
  std::unique_ptr<char[]> bytes = std::move(const_cast<NodeImage*>(img)->raw_);
  image->reset();
  return bytes;
}

NodeImage::~NodeImage() {
  if (mapped_ && size_ > 0) ::munmap(const_cast<char*>(data_), size_);
}

void RefAdd(const NodeImage* i) noexcept { i->refs_.fetch_add(1, std::memory_order_relaxed); }
void RefRelease(const NodeImage* i) noexcept {
  if (i->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete i;
}

size_t NodeImage::BlockOf(uint64_t logical) const {
  // The last block whose logical start is <= logical.
  auto it = std::upper_bound(blocks_.begin(), blocks_.end(), logical,
                             [](uint64_t l, const Block& b) { return l < b.logical; });
  return static_cast<size_t>(it - blocks_.begin()) - 1;
}

const char* NodeImage::Record(uint64_t logical, size_t* hint) const {
  size_t b = *hint;
  if (b >= blocks_.size() || logical < blocks_[b].logical || logical >= blocks_[b].logical + blocks_[b].bytes) {
    b = BlockOf(logical);
    *hint = b;
  }
  const Block& blk = blocks_[b];
  return data_ + blk.physical + (logical - blk.logical);
}

RecordParts ParseRecordParts(const char* p) {
  RecordParts r;
  r.attribute_count = TakeVarint(&p);
  r.attrs = p;
  for (uint64_t i = 0; i < r.attribute_count; ++i) {
    uint64_t k = TakeVarint(&p);
    p += k;
    uint64_t v = TakeVarint(&p);
    p += v;
  }
  r.attrs_end = p;
  r.child_count = TakeVarint(&p);
  r.deltas = p;
  for (uint64_t i = 0; i < r.child_count; ++i) (void)TakeVarint(&p);
  r.end = p;
  return r;
}

// ---------------------------------------------------------------- lazy nodes

namespace {
// Decoding a lazy node, and reading its lazy state from a walker, take the
// stripe of its address. No code holds two stripes at once.
std::mutex& StripeFor(const void* p) {
  static std::mutex stripes[64];
  return stripes[(reinterpret_cast<uintptr_t>(p) >> 5) % 64];
}

bool IsEmptyRecord(const char* rec) { return rec[0] == 0 && rec[1] == 0; }
}  // namespace

NodePtr NodeImageAccess::NewLazy(const NodeImage* img, uint64_t logical) {
  Node* n = new Node();
  n->lazy_offset_ = logical;
  RefAdd(img);
  n->lazy_image_.store(img, std::memory_order_relaxed);
  return NodePtr::Adopt(n);
}

NodePtr NodeImageAccess::Root(const NodeImagePtr& img) {
  size_t hint = 0;
  if (IsEmptyRecord(img->Record(img->summary().root, &hint))) return Node::Empty();
  return NewLazy(img.get(), img->summary().root);
}

bool NodeImageAccess::Source(const Node& n, NodeImagePtr* img, uint64_t* logical) {
  if (n.lazy_image_.load(std::memory_order_acquire) == nullptr) return false;
  std::lock_guard lk(StripeFor(&n));
  const NodeImage* i = n.lazy_image_.load(std::memory_order_relaxed);
  if (i == nullptr) return false;
  *img = NodeImagePtr(const_cast<NodeImage*>(i));
  *logical = n.lazy_offset_;
  return true;
}

Node::~Node() {
  if (const NodeImage* img = lazy_image_.load(std::memory_order_relaxed)) RefRelease(img);
}

void Node::Decode() const {
  std::lock_guard lk(StripeFor(this));
  const NodeImage* img = lazy_image_.load(std::memory_order_relaxed);
  if (img == nullptr) return;  // another thread decoded it meanwhile
  size_t hint = 0;
  RecordParts r = ParseRecordParts(img->Record(lazy_offset_, &hint));
  std::vector<AttributeSlot> attrs;
  attrs.reserve(r.attribute_count);
  const char* p = r.attrs;
  for (uint64_t i = 0; i < r.attribute_count; ++i) {
    uint64_t k = TakeVarint(&p);
    std::string_view key(p, k);
    p += k;
    uint64_t v = TakeVarint(&p);
    std::string_view value(p, v);
    p += v;
    if (key.size() + value.size() >= AttributeBlob::kImageAttributeBytes) {
      attrs.push_back(AttributeSlot::Of(AttributeBlob::InImage(img, key, value)));
    } else {
      attrs.push_back(AttributeSlot::Make(key, value));
    }
  }
  std::vector<NodePtr> kids;
  kids.reserve(r.child_count);
  p = r.deltas;
  for (uint64_t i = 0; i < r.child_count; ++i) {
    uint64_t child = lazy_offset_ - TakeVarint(&p);
    if (IsEmptyRecord(img->Record(child, &hint))) {
      kids.push_back(Node::Empty());
    } else {
      kids.push_back(NodeImageAccess::NewLazy(img, child));
    }
  }
  attributes_ = AttributeVector::FromVector(std::move(attrs));
  children_ = PersistentVector<NodePtr>::FromVector(std::move(kids));
  lazy_image_.store(nullptr, std::memory_order_release);
  RefRelease(img);
}

}  // namespace canopy::tree
