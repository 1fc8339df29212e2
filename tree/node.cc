#include "tree/node.h"

#include <algorithm>
#include <utility>

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

Node::Node(Attributes attributes, std::vector<NodePtr> children)
    : attributes_(std::move(attributes)), children_(std::move(children)) {}

Node::~Node() {
  // Tear down uniquely owned descendants with an explicit stack so that a
  // deep chain does not recurse once per level.
  if (children_.empty()) return;
  std::vector<NodePtr> pending = std::move(children_);
  while (!pending.empty()) {
    NodePtr n = std::move(pending.back());
    pending.pop_back();
    if (n && n.use_count() == 1) {
      auto& kids = NodeBuilderAccess::children(*n);
      for (auto& k : kids) pending.push_back(std::move(k));
      kids.clear();
    }
  }
}

NodePtr Node::Empty() {
  static const NodePtr empty = std::make_shared<const Node>();
  return empty;
}

std::optional<std::string_view> Node::attribute(std::string_view key) const {
  auto it = std::lower_bound(attributes_.begin(), attributes_.end(), key,
                             [](const Attribute& a, std::string_view k) { return a.key < k; });
  if (it == attributes_.end() || it->key != key) return std::nullopt;
  return std::string_view(it->value);
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
    for (const auto& c : n->children()) stack.push_back(c.get());
  }
  return count;
}

bool TreesEqual(const NodePtr& a, const NodePtr& b) {
  std::vector<std::pair<const Node*, const Node*>> stack{{a.get(), b.get()}};
  while (!stack.empty()) {
    auto [x, y] = stack.back();
    stack.pop_back();
    if (x == y) continue;  // shared subtree
    if (x->attributes() != y->attributes() || x->child_count() != y->child_count()) return false;
    for (size_t i = 0; i < x->child_count(); ++i) stack.emplace_back(x->child(i).get(), y->child(i).get());
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
