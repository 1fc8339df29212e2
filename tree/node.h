// Immutable tree nodes and paths.
//
// A Node has an ordered list of children and an attribute map (string key ->
// bytes value, keys unique and kept sorted). Nodes are immutable once
// published and shared between versions through NodePtr
// (std::shared_ptr<const Node>): a commit copies only the nodes on the paths
// it changes (path copying) and shares every other subtree with the version
// it was based on.
//
// A NodePath addresses a node by child indexes from the root: {} is the root,
// {2} the root's third child, {2, 0} that child's first child.
//
// Deep trees are safe: destroying a chain of any depth does not recurse
// (~Node tears down uniquely owned descendants iteratively), and every walk in
// canopy::tree uses an explicit stack.
//
// Thread safety: a Node is immutable and may be read from any number of
// threads; NodePtr copies follow std::shared_ptr rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace canopy::tree {

using NodePath = std::vector<uint64_t>;

// "/" for the root, else "/2/0".
std::string NodePathToString(const NodePath& path);

struct Attribute {
  std::string key;
  std::string value;
  bool operator==(const Attribute&) const = default;
};

class Node;
using NodePtr = std::shared_ptr<const Node>;

class Node {
 public:
  // Attributes sorted by key, keys unique.
  using Attributes = std::vector<Attribute>;

  // A node with no attributes and no children.
  Node() = default;
  // REQUIRES: `attributes` sorted by key with unique keys; no null children.
  Node(Attributes attributes, std::vector<NodePtr> children);
  ~Node();
  Node(const Node&) = default;
  Node& operator=(const Node&) = delete;

  // The shared empty node (a fresh tree's root).
  static NodePtr Empty();

  const Attributes& attributes() const { return attributes_; }
  // The value for `key`, or nullopt. The view lives as long as this node.
  std::optional<std::string_view> attribute(std::string_view key) const;
  const std::vector<NodePtr>& children() const { return children_; }
  size_t child_count() const { return children_.size(); }
  // REQUIRES: i < child_count().
  const NodePtr& child(size_t i) const { return children_[i]; }

 private:
  friend class NodeBuilderAccess;  // lets tree internals edit nodes not yet published
  Attributes attributes_;
  std::vector<NodePtr> children_;
};

// The node at `path` under `root`, or NotFound naming the first index that is
// out of range.
Result<NodePtr> FindNode(const NodePtr& root, const NodePath& path);

// Number of nodes in the subtree (root included). Iterative; O(nodes).
uint64_t CountNodes(const NodePtr& root);

// Structural equality (attributes and children, recursively; iterative).
bool TreesEqual(const NodePtr& a, const NodePtr& b);

}  // namespace canopy::tree
