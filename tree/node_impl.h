// Private to canopy::tree: in-place editing of nodes that are not yet shared.
//
// A node may be edited in place only while the caller holds the one and only
// reference to it (use_count() == 1) and reached it from a root it alone
// owns: nobody else can then observe the change. Path copying (see
// edit.cc) makes that so before it edits.
#pragma once

#include "base/status.h"
#include "tree/delta.h"
#include "tree/node.h"

namespace canopy::tree {

class NodeBuilderAccess {
 public:
  static Node::Attributes& attributes(const Node& n) { return const_cast<Node&>(n).attributes_; }
  static std::vector<NodePtr>& children(const Node& n) { return const_cast<Node&>(n).children_; }
};

// Applies one op to *root (path copying; nodes uniquely owned through *root
// are edited in place). On error *root is unchanged.
Status ApplyOpInPlace(NodePtr* root, const Op& op);

}  // namespace canopy::tree
