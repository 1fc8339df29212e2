// PersistentVector: every edit checked against std::vector, and every
// earlier copy checked to be unchanged by later edits (structural sharing
// must never let an edit show through another holder).
#include "tree/persistent_vector.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tree/node.h"

namespace canopy::tree {
namespace {

using Vec = PersistentVector<uint64_t>;

void ExpectEqual(const Vec& v, const std::vector<uint64_t>& model) {
  ASSERT_EQ(v.size(), model.size());
  for (size_t i = 0; i < model.size(); ++i) ASSERT_EQ(v[i], model[i]) << "at " << i;
  size_t i = 0;
  v.ForEach([&](uint64_t x) { ASSERT_EQ(x, model[i++]); });
  ASSERT_EQ(i, model.size());
  for (size_t k = 0; k < model.size();) {
    auto span = v.SpanAt(k);
    ASSERT_LE(span.first, k);
    ASSERT_LT(k, span.first + span.count);
    for (size_t j = k - span.first; j < span.count; ++j, ++k) ASSERT_EQ(span.items[j], model[k]);
  }
}

TEST(PersistentVector, RandomEditsMatchAModelAndNeverShowThroughCopies) {
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 4; ++round) {
    Vec v;
    std::vector<uint64_t> model;
    std::vector<std::pair<Vec, std::vector<uint64_t>>> kept;
    uint64_t next = 1;
    for (int step = 0; step < 6000; ++step) {
      unsigned what = rng() % 10;
      if (model.empty() || what < 4) {
        size_t at = (round % 2 == 0 || model.empty()) ? rng() % (model.size() + 1) : model.size();
        v.Insert(at, next);
        model.insert(model.begin() + static_cast<std::ptrdiff_t>(at), next++);
      } else if (what < 7) {
        size_t at = rng() % model.size();
        v.Erase(at);
        model.erase(model.begin() + static_cast<std::ptrdiff_t>(at));
      } else {
        size_t at = rng() % model.size();
        v.Set(at, next);
        model[at] = next++;
      }
      if (step % 250 == 0) kept.emplace_back(v, model);
    }
    ExpectEqual(v, model);
    for (const auto& [copy, copy_model] : kept) ExpectEqual(copy, copy_model);
  }
}

TEST(PersistentVector, GrowsAndShrinksThroughManyLevels) {
  Vec v;
  std::vector<uint64_t> model;
  for (uint64_t i = 0; i < 100000; ++i) {
    v.PushBack(i);
    model.push_back(i);
  }
  Vec before = v;
  for (uint64_t i = 0; i < 1000; ++i) {
    v.Insert(0, 1000000 + i);
    model.insert(model.begin(), 1000000 + i);
  }
  ExpectEqual(v, model);
  while (model.size() > 3) {
    v.Erase(model.size() / 2);
    model.erase(model.begin() + static_cast<std::ptrdiff_t>(model.size() / 2));
  }
  ExpectEqual(v, model);
  while (!model.empty()) {
    v.Erase(0);
    model.erase(model.begin());
  }
  EXPECT_TRUE(v.empty());
  ASSERT_EQ(before.size(), 100000u);
  for (uint64_t i = 0; i < 100000; i += 997) EXPECT_EQ(before[i], i);
}

TEST(PersistentVector, AppendsPackLeavesFull) {
  Vec v;
  for (uint64_t i = 0; i < 32 * 1024; ++i) v.PushBack(i);
  // 1024 full leaves of 32 eight-byte slots plus 33 inner chunks: about 9 bytes a slot.
  EXPECT_LT(v.ChunkBytes(), size_t{32 * 1024} * 19 / 2);
  Vec bulk = Vec::FromVector(std::vector<uint64_t>(32 * 1024, 7));
  EXPECT_LT(bulk.ChunkBytes(), size_t{32 * 1024} * 19 / 2);
}

TEST(PersistentVector, AnEditCopiesOnlyItsPath) {
  std::vector<uint64_t> items(1 << 20);
  for (size_t i = 0; i < items.size(); ++i) items[i] = i;
  Vec v = Vec::FromVector(std::move(items));
  Vec edited = v;
  edited.Set(12345, 7);
  edited.Insert(0, 9);
  edited.Erase(500000);
  EXPECT_EQ(v[12345], 12345u);
  EXPECT_EQ(v.size(), size_t{1} << 20);
  EXPECT_EQ(edited[0], 9u);
  EXPECT_EQ(edited[12346], 7u);
  EXPECT_EQ(edited.size(), size_t{1} << 20);
}

TEST(PersistentVector, HoldsReferenceCountedNodesWithoutLeaks) {
  // Run under ASan: every node and chunk must be freed, shared or not.
  PersistentVector<NodePtr> kids;
  for (int i = 0; i < 5000; ++i) kids.PushBack(Node::Make(Node::Attributes{{"i", std::to_string(i)}}, {}));
  PersistentVector<NodePtr> copy = kids;
  for (int i = 0; i < 2000; ++i) copy.Erase(static_cast<size_t>(i * 7) % copy.size());
  EXPECT_EQ(kids.size(), 5000u);
  EXPECT_EQ(copy.size(), 3000u);
  EXPECT_EQ(kids[4999]->attribute("i"), "4999");
}

}  // namespace
}  // namespace canopy::tree
