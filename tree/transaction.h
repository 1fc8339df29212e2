// Transaction: a batch of edit ops built against one base Version.
//
// Ops are applied to a private working copy as they are added (path copying;
// nodes this transaction alone owns are edited in place until commit, so a
// batch of many ops on one node costs O(ops), not O(ops * fanout)). Each op
// is validated when added: an op on a path that does not exist returns
// InvalidArgument and is not recorded, leaving the transaction as it was.
// Reads through Find() see the transaction's own writes. The base Version is
// never modified.
//
// Store::Commit(std::move(txn)) publishes the result atomically as version
// base + 1, or fails with Conflict if the tree moved past the base meanwhile.
//
// Thread safety: a Transaction is used by one thread at a time. Move-only.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "base/status.h"
#include "tree/delta.h"
#include "tree/node.h"
#include "tree/version.h"

namespace canopy::tree {

class Transaction {
 public:
  explicit Transaction(Version base);
  Transaction(Transaction&&) noexcept = default;
  Transaction& operator=(Transaction&&) noexcept = default;
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  const Version& base() const { return base_; }
  const std::vector<Op>& ops() const { return ops_; }
  // The working root with every op so far applied.
  const NodePtr& root() const { return root_; }

  // Inserts an empty child of `parent` at `index` (0..child_count).
  Status InsertChild(const NodePath& parent, uint64_t index);
  // Appends an empty child to `parent`; returns the new child's path.
  Result<NodePath> AppendChild(const NodePath& parent);
  // Deletes child `index` of `parent` with its whole subtree.
  Status DeleteChild(const NodePath& parent, uint64_t index);
  Status PutAttribute(const NodePath& node, std::string_view key, std::string_view value);
  // InvalidArgument if the attribute does not exist.
  Status DeleteAttribute(const NodePath& node, std::string_view key);
  // Any op (what the typed methods above build).
  Status Apply(Op op);

  // The node at `path` in the working tree (own writes included).
  Result<NodePtr> Find(const NodePath& path) const { return FindNode(root_, path); }

  // The ops as a Delta from base().number() to base().number() + 1.
  Delta ToDelta() const;

 private:
  Version base_;
  NodePtr root_;
  std::vector<Op> ops_;
};

}  // namespace canopy::tree
