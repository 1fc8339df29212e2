#include "tree/node.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "tree/node_image.h"
#include "tree/node_impl.h"
#include "tree/snapshot.h"
#include "tree/version.h"

namespace canopy::tree {

std::string NodePathToString(const NodePath& path) {
  if (path.empty()) return "/";
  std::string out;
  for (uint64_t i : path) {
    out += '/';
    out += std::to_string(i);
  }
  return out;
}

// ---------------------------------------------------------------- attributes

AttributePtr AttributeBlob::Make(std::string_view key, std::string_view value) {
  void* mem = ::operator new(sizeof(AttributeBlob) + key.size() + value.size());
  auto* b = new (mem) AttributeBlob(static_cast<uint32_t>(key.size()), value.size());
  char* data = reinterpret_cast<char*>(b + 1);
  if (!key.empty()) std::memcpy(data, key.data(), key.size());
  if (!value.empty()) std::memcpy(data + key.size(), value.data(), value.size());
  return AttributePtr::Adopt(b);
}

AttributePtr AttributeBlob::InImage(const NodeImage* image, std::string_view key, std::string_view value) {
  void* mem = ::operator new(sizeof(AttributeBlob) + sizeof(ImageBytes));
  auto* b = new (mem) AttributeBlob(static_cast<uint32_t>(key.size()), value.size() | kInImage);
  RefAdd(image);
  new (b + 1) ImageBytes{key.data(), value.data(), image};
  return AttributePtr::Adopt(b);
}

size_t AttributeBlob::HeapBytes() const {
  return sizeof(AttributeBlob) + (in_image() ? sizeof(ImageBytes) : key_len_ + value().size());
}

AttributeSlot AttributeSlot::Make(std::string_view key, std::string_view value) {
  if (key.size() + value.size() > kInlineBytes) return Of(AttributeBlob::Make(key, value));
  AttributeSlot s;
  if (!key.empty()) std::memcpy(s.bytes_, key.data(), key.size());
  if (!value.empty()) std::memcpy(s.bytes_ + key.size(), value.data(), value.size());
  s.bytes_[kKeyLen] = static_cast<char>(key.size());
  s.bytes_[kTag] = static_cast<char>(value.size());
  return s;
}

AttributeSlot AttributeSlot::Of(AttributePtr blob) noexcept {
  AttributeSlot s;
  const AttributeBlob* b = blob.release();  // the slot holds this reference now
  std::memcpy(s.bytes_, &b, sizeof b);
  s.bytes_[kTag] = static_cast<char>(kBlobTag);
  return s;
}

void RefAdd(const AttributeBlob* b) noexcept { b->refs_.fetch_add(1, std::memory_order_relaxed); }

void RefRelease(const AttributeBlob* b) noexcept {
  if (b->refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  const NodeImage* image = b->in_image() ? b->image_bytes()->image : nullptr;
  b->~AttributeBlob();
  ::operator delete(const_cast<AttributeBlob*>(b));
  if (image != nullptr) RefRelease(image);
}

// ---------------------------------------------------------------- nodes

void RefAdd(const Node* n) noexcept { n->refs_.fetch_add(1, std::memory_order_relaxed); }

namespace {
// Set while this thread tears nodes down: releases found meanwhile are queued
// here instead of recursing, so freeing a deep chain uses a flat work list.
thread_local std::vector<const Node*>* teardown_queue = nullptr;
}  // namespace

void RefRelease(const Node* n) noexcept {
  if (n->refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (teardown_queue != nullptr) {
    teardown_queue->push_back(n);
    return;
  }
  // Empty until a release inside queues a node (no allocation when it
  // frees none: a commit's old path nodes share their sequences' chunks).
  std::vector<const Node*> queue;
  teardown_queue = &queue;
  delete n;
  while (!queue.empty()) {
    const Node* x = queue.back();
    queue.pop_back();
    delete x;  // releases its sequences, which queue children that reach zero
  }
  teardown_queue = nullptr;
}

NodePtr NodeBuilderAccess::New() { return NodePtr::Adopt(new Node()); }

Node& NodeBuilderAccess::Unique(NodePtr* slot) {
  if (!IsUnique(*slot)) *slot = NodePtr::Adopt(new Node(**slot));
  return const_cast<Node&>(**slot);
}

const NodePtr& Node::Empty() {
  // Never freed: every reference to it is counted, but the last is never dropped.
  static const NodePtr* empty = new NodePtr(NodePtr::Adopt(new Node()));
  return *empty;
}

NodePtr Node::Make(const Attributes& attributes, std::vector<NodePtr> children) {
  std::vector<AttributeSlot> slots;
  slots.reserve(attributes.size());
  for (const Attribute& a : attributes) slots.push_back(AttributeSlot::Make(a.key, a.value));
  return Make(std::move(slots), std::move(children));
}

NodePtr Node::Make(std::vector<AttributeSlot> attributes, std::vector<NodePtr> children) {
  if (attributes.empty() && children.empty()) return Empty();
  NodePtr p = NodeBuilderAccess::New();
  Node& n = const_cast<Node&>(*p);
  n.attributes_ = AttributeVector::FromVector(std::move(attributes));
  n.children_ = PersistentVector<NodePtr>::FromVector(std::move(children));
  return p;
}

std::optional<std::string_view> Node::attribute(std::string_view key) const {
  Load();
  size_t i = AttributeLowerBound(attributes_, key);
  if (i == attributes_.size()) return std::nullopt;
  const AttributeSlot& s = attributes_[i];
  if (s.key() != key) return std::nullopt;
  return s.value();
}

size_t Node::OwnBytes() const {
  Load();
  size_t bytes = sizeof(Node) + children_.ChunkBytes() + attributes_.ChunkBytes();
  attributes_.ForEach([&](const AttributeSlot& s) { bytes += s.HeapBytes(); });
  return bytes;
}

Result<NodePtr> FindNode(const NodePtr& root, const NodePath& path) {
  const NodePtr* cur = &root;
  for (size_t depth = 0; depth < path.size(); ++depth) {
    const Node& n = **cur;
    if (path[depth] >= n.child_count()) {
      NodePath prefix(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(depth));
      return Status::NotFound("no child " + std::to_string(path[depth]) + " under " +
                              NodePathToString(prefix) + " (it has " + std::to_string(n.child_count()) + ")");
    }
    cur = &n.child(static_cast<size_t>(path[depth]));
  }
  return *cur;
}

uint64_t CountNodes(const NodePtr& root) {
  uint64_t count = 0;
  std::vector<const Node*> stack{root.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    ++count;
    n->ForEachChild([&](const NodePtr& c) { stack.push_back(c.get()); });
  }
  return count;
}

namespace {

// Calls f(x[i], y[i]) for i in [0, size), walking both vectors a leaf at a
// time; stops and returns false as soon as f does. REQUIRES: equal sizes.
template <typename T, typename K, typename F>
bool AllPairs(const PersistentVector<T, K>& x, const PersistentVector<T, K>& y, F&& f) {
  for (size_t i = 0, n = x.size(); i < n;) {
    auto xs = x.SpanAt(i);
    auto ys = y.SpanAt(i);
    size_t xo = i - xs.first, yo = i - ys.first;
    size_t run = std::min(xs.count - xo, ys.count - yo);
    for (size_t k = 0; k < run; ++k) {
      if (!f(xs.items[xo + k], ys.items[yo + k])) return false;
    }
    i += run;
  }
  return true;
}

}  // namespace

bool TreesEqual(const NodePtr& a, const NodePtr& b) {
  std::vector<std::pair<const Node*, const Node*>> stack{{a.get(), b.get()}};
  while (!stack.empty()) {
    auto [x, y] = stack.back();
    stack.pop_back();
    if (x == y) continue;  // shared subtree
    if (x->child_count() != y->child_count() || x->attribute_count() != y->attribute_count()) return false;
    bool same_attributes = AllPairs(x->attribute_vector(), y->attribute_vector(),
                                    [](const AttributeSlot& p, const AttributeSlot& q) {
                                      return (p.blob() != nullptr && p.blob() == q.blob()) ||
                                             (p.key() == q.key() && p.value() == q.value());
                                    });
    if (!same_attributes) return false;
    AllPairs(x->child_vector(), y->child_vector(), [&](const NodePtr& p, const NodePtr& q) {
      stack.emplace_back(p.get(), q.get());
      return true;
    });
  }
  return true;
}

Version::Version() : tree_(std::make_shared<const std::string>()), root_(Node::Empty()) {}

Version::Version(std::string tree, uint64_t number, NodePtr root)
    : tree_(std::make_shared<const std::string>(std::move(tree))),
      number_(number),
      root_(root ? std::move(root) : Node::Empty()) {}

uint64_t Version::Digest() const { return TreeDigest(root_); }

}  // namespace canopy::tree
