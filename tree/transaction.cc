#include "tree/transaction.h"

#include <utility>

#include "tree/node_impl.h"

namespace canopy::tree {

Transaction::Transaction(Version base) : base_(std::move(base)), root_(base_.root()) {}

Status Transaction::Apply(Op op) {
  CANOPY_RETURN_IF_ERROR(ApplyOpInPlace(&root_, op));
  ops_.push_back(std::move(op));
  return Status::Ok();
}

Status Transaction::InsertChild(const NodePath& parent, uint64_t index) {
  return Apply(Op::InsertChild(parent, index));
}

Result<NodePath> Transaction::AppendChild(const NodePath& parent) {
  CANOPY_RETURN_IF_ERROR(Apply(Op::AppendChild(parent)));
  CANOPY_ASSIGN_OR_RETURN(NodePtr p, FindNode(root_, parent));
  NodePath child = parent;
  child.push_back(p->child_count() - 1);
  return child;
}

Status Transaction::DeleteChild(const NodePath& parent, uint64_t index) {
  return Apply(Op::DeleteChild(parent, index));
}

Status Transaction::PutAttribute(const NodePath& node, std::string_view key, std::string_view value) {
  return Apply(Op::PutAttribute(node, std::string(key), std::string(value)));
}

Status Transaction::DeleteAttribute(const NodePath& node, std::string_view key) {
  return Apply(Op::DeleteAttribute(node, std::string(key)));
}

Delta Transaction::ToDelta() const {
  Delta d;
  d.tree = base_.tree();
  d.base_version = base_.number();
  d.new_version = base_.number() + 1;
  d.ops = ops_;
  return d;
}

}  // namespace canopy::tree
