// Version: a read-only handle on one tree at one version number.
//
// A Version holds its root with a shared_ptr, so the whole tree as of that
// version stays alive and readable, unchanged, for as long as the handle (or
// a copy) exists — regardless of later commits, checkpoints or snapshot
// installs. Handles are cheap to copy (two shared_ptrs and a number).
//
// Thread safety: immutable; any number of threads may read one Version.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/result.h"
#include "tree/node.h"

namespace canopy::tree {

class Version {
 public:
  // An empty tree named "" at version 0 (a placeholder; Store hands out real ones).
  Version();
  Version(std::string tree, uint64_t number, NodePtr root);

  const std::string& tree() const { return *tree_; }
  uint64_t number() const { return number_; }
  const NodePtr& root() const { return root_; }

  // The node at `path` at this version; NotFound if the path does not exist.
  Result<NodePtr> Find(const NodePath& path) const { return FindNode(root_, path); }

  // xxh3-64 over the canonical pre-order encoding of the tree (see
  // TreeDigest in tree/snapshot.h): equal trees give equal digests, whatever
  // their history. O(nodes).
  uint64_t Digest() const;

 private:
  std::shared_ptr<const std::string> tree_;
  uint64_t number_ = 0;
  NodePtr root_;
};

}  // namespace canopy::tree
