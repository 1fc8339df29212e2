// Path copying, transactions and op validation (tree/node.h, tree/transaction.h, tree/delta.h).
#include <gtest/gtest.h>

#include "tree/delta.h"
#include "tree/node.h"
#include "tree/transaction.h"
#include "tree/version.h"

namespace canopy::tree {
namespace {

std::string Attr(const NodePtr& n, std::string_view key) {
  auto v = n->attribute(key);
  return v ? std::string(*v) : std::string("<none>");
}

// root{a=1} -> [child0{name=x} -> [grandchild{}], child1{name=y}]
Version SmallTree() {
  Transaction txn(Version("t", 0, Node::Empty()));
  EXPECT_TRUE(txn.PutAttribute({}, "a", "1").ok());
  EXPECT_TRUE(txn.AppendChild({}).ok());
  EXPECT_TRUE(txn.AppendChild({}).ok());
  EXPECT_TRUE(txn.PutAttribute({0}, "name", "x").ok());
  EXPECT_TRUE(txn.PutAttribute({1}, "name", "y").ok());
  EXPECT_TRUE(txn.AppendChild({0}).ok());
  return Version("t", 1, txn.root());
}

TEST(TreeNode, FindAndAttributes) {
  Version v = SmallTree();
  EXPECT_EQ(Attr(v.root(), "a"), "1");
  EXPECT_EQ(v.root()->child_count(), 2u);
  auto c1 = v.Find({1});
  ASSERT_TRUE(c1.ok());
  EXPECT_EQ(Attr(*c1, "name"), "y");
  auto gc = v.Find({0, 0});
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ((*gc)->child_count(), 0u);
  auto missing = v.Find({0, 1});
  EXPECT_TRUE(missing.status().IsNotFound()) << missing.status().ToString();
  EXPECT_EQ(CountNodes(v.root()), 4u);
  EXPECT_EQ(NodePathToString({}), "/");
  EXPECT_EQ(NodePathToString({2, 0}), "/2/0");
}

TEST(TreeNode, PathCopyingLeavesTheBaseUnchangedAndSharesUntouchedSubtrees) {
  Version v1 = SmallTree();
  NodePtr old_child0 = *v1.Find({0});
  NodePtr old_child1 = *v1.Find({1});

  Transaction txn(v1);
  ASSERT_TRUE(txn.PutAttribute({1}, "name", "changed").ok());
  ASSERT_TRUE(txn.AppendChild({1}).ok());
  Version v2("t", 2, txn.root());

  // The old version is exactly as it was.
  EXPECT_EQ(Attr(*v1.Find({1}), "name"), "y");
  EXPECT_EQ((*v1.Find({1}))->child_count(), 0u);
  EXPECT_EQ(v1.Find({1})->get(), old_child1.get());
  // The new one has the edits.
  EXPECT_EQ(Attr(*v2.Find({1}), "name"), "changed");
  EXPECT_EQ((*v2.Find({1}))->child_count(), 1u);
  // Untouched subtree is shared, not copied; the edited path is new.
  EXPECT_EQ(v2.Find({0})->get(), old_child0.get());
  EXPECT_NE(v2.root().get(), v1.root().get());
  EXPECT_NE(v2.Find({1})->get(), old_child1.get());
}

TEST(TreeNode, NodesHandedOutAreNeverEditedLater) {
  Transaction txn(Version("t", 0, Node::Empty()));
  ASSERT_TRUE(txn.AppendChild({}).ok());
  ASSERT_TRUE(txn.PutAttribute({0}, "k", "before").ok());
  NodePtr held = *txn.Find({0});
  NodePtr held_root = txn.root();
  ASSERT_TRUE(txn.PutAttribute({0}, "k", "after").ok());
  ASSERT_TRUE(txn.AppendChild({}).ok());
  EXPECT_EQ(Attr(held, "k"), "before");
  EXPECT_EQ(held_root->child_count(), 1u);
  EXPECT_EQ(Attr(*txn.Find({0}), "k"), "after");
  EXPECT_EQ(txn.root()->child_count(), 2u);
}

TEST(TreeNode, InvalidOpsAreRejectedAndNotRecorded) {
  Transaction txn(SmallTree());
  NodePtr before = txn.root();
  EXPECT_EQ(txn.InsertChild({}, 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(txn.DeleteChild({}, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(txn.PutAttribute({5}, "k", "v").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(txn.DeleteAttribute({}, "nope").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(txn.AppendChild({0, 0, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(txn.ops().empty());
  EXPECT_EQ(txn.root().get(), before.get());
}

TEST(TreeNode, InsertDeleteAndAttributeOps) {
  Transaction txn(SmallTree());
  ASSERT_TRUE(txn.InsertChild({}, 0).ok());  // new first child
  ASSERT_TRUE(txn.PutAttribute({0}, "name", "w").ok());
  ASSERT_TRUE(txn.DeleteChild({}, 1).ok());  // removes "x" with its grandchild
  ASSERT_TRUE(txn.DeleteAttribute({}, "a").ok());
  ASSERT_TRUE(txn.PutAttribute({}, "b", "2").ok());
  ASSERT_TRUE(txn.PutAttribute({}, "a", "3").ok());
  NodePtr r = txn.root();
  ASSERT_EQ(r->child_count(), 2u);
  EXPECT_EQ(Attr(r->child(0), "name"), "w");
  EXPECT_EQ(Attr(r->child(1), "name"), "y");
  ASSERT_EQ(r->attributes().size(), 2u);
  EXPECT_EQ(r->attributes()[0].key, "a");  // kept sorted
  EXPECT_EQ(r->attributes()[1].key, "b");
  EXPECT_EQ(CountNodes(r), 3u);

  // Replaying the recorded ops on the base gives the same tree.
  auto replay = ApplyOps(txn.base().root(), txn.ops());
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  EXPECT_TRUE(TreesEqual(*replay, r));
  EXPECT_EQ(Version("t", 2, *replay).Digest(), Version("t", 2, r).Digest());
  EXPECT_NE(txn.base().Digest(), Version("t", 2, r).Digest());
}

TEST(TreeNode, ApplyOpsFailureLeavesNoTrace) {
  Version v = SmallTree();
  std::vector<Op> ops{Op::PutAttribute({0}, "k", "v"), Op::DeleteChild({}, 7)};
  auto r = ApplyOps(v.root(), ops);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Attr(*v.Find({0}), "k"), "<none>");
}

TEST(TreeNode, ManyAppendsInOneTransactionAreLinear) {
  Transaction txn(Version("t", 0, Node::Empty()));
  for (int i = 0; i < 200000; ++i) ASSERT_TRUE(txn.AppendChild({}).ok());
  EXPECT_EQ(txn.root()->child_count(), 200000u);
}

TEST(TreeNode, VeryDeepTreesDoNotOverflowTheStack) {
  // A chain 300000 nodes deep (far past what recursion survives): building, counting, digesting, comparing
  // and destroying it must all be iterative.
  NodePtr chain = Node::Empty();
  for (int i = 0; i < 300000; ++i)
    chain = Node::Make(Node::Attributes{}, std::vector<NodePtr>{chain});
  EXPECT_EQ(CountNodes(chain), 300001u);
  EXPECT_TRUE(TreesEqual(chain, chain));
  Version v("deep", 1, chain);
  EXPECT_NE(v.Digest(), Version().Digest());
  chain.reset();
}

}  // namespace
}  // namespace canopy::tree
