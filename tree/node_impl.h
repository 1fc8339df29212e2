// Private to canopy::tree: in-place editing of nodes that are not yet shared.
//
// A node may be edited in place only while the caller holds the one and only
// reference to it (reference count 1) and reached it from a root it alone
// owns: nobody else can then observe the change. Path copying (ApplyOpInPlace
// in delta.cc) makes that so before it edits.
#pragma once

#include "base/status.h"
#include "tree/delta.h"
#include "tree/node.h"

namespace canopy::tree {

class NodeBuilderAccess {
 public:
  // A new node with no children and no attributes, not yet shared.
  static NodePtr New();
  // Makes *slot a node that the caller alone holds (copying it if shared:
  // O(1), the copy shares both sequences) and returns it for editing.
  static Node& Unique(NodePtr* slot);
  static PersistentVector<NodePtr>& children(Node& n) {
    n.Load();
    return n.children_;
  }
  static AttributeVector& attributes(Node& n) {
    n.Load();
    return n.attributes_;
  }
  // True if the caller's reference is the only one.
  static bool IsUnique(const NodePtr& p) { return p->refs_.load(std::memory_order_acquire) == 1; }
};

// Applies one op to *root (path copying; nodes uniquely owned through *root
// are edited in place). On error *root is unchanged.
Status ApplyOpInPlace(NodePtr* root, const Op& op);

}  // namespace canopy::tree
