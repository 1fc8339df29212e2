// PersistentVector: every edit checked against std::vector, and every
// earlier copy checked to be unchanged by later edits (structural sharing
// must never let an edit show through another holder).
#include "tree/persistent_vector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <random>
#include <set>
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

// A keyed vector whose key is the element itself: separators must track
// every edit, so PartitionPoint must agree with std::lower_bound over a
// sorted model after any mix of edits, in the vector and in every copy.
struct IdentityKey {
  uint64_t operator()(uint64_t x) const noexcept { return x; }
};
using KeyedVec = PersistentVector<uint64_t, IdentityKey>;

void ExpectSearchesMatch(const KeyedVec& v, const std::vector<uint64_t>& model, std::mt19937_64& rng) {
  ASSERT_EQ(v.size(), model.size());
  for (size_t i = 0; i < model.size(); ++i) ASSERT_EQ(v[i], model[i]) << "at " << i;
  std::vector<uint64_t> probes{0, ~uint64_t{0}};
  for (uint64_t x : model) {
    probes.push_back(x);
    probes.push_back(x + 1);
  }
  for (int k = 0; k < 200; ++k) probes.push_back(rng() % (model.empty() ? 1 : model.back() + 2));
  for (uint64_t q : probes) {
    size_t want = static_cast<size_t>(std::lower_bound(model.begin(), model.end(), q) - model.begin());
    ASSERT_EQ(v.PartitionPoint([q](uint64_t key) { return key < q; }), want) << "probe " << q;
  }
}

TEST(PersistentVector, KeyedSearchesFollowEveryEdit) {
  std::mt19937_64 rng(777);
  for (int round = 0; round < 3; ++round) {
    KeyedVec v;
    std::vector<uint64_t> model;  // sorted, unique, spaced so Set can move a key between neighbours
    std::vector<std::pair<KeyedVec, std::vector<uint64_t>>> kept;
    for (int step = 0; step < 5000; ++step) {
      unsigned what = rng() % 10;
      if (model.empty() || what < 5) {
        uint64_t x = (rng() % 1000000) * 4;
        auto it = std::lower_bound(model.begin(), model.end(), x);
        if (it != model.end() && *it == x) continue;
        size_t at = static_cast<size_t>(it - model.begin());
        v.Insert(at, x);
        model.insert(it, x);
      } else if (what < 8) {
        // Erase, often at the front of the vector or of a leaf (a separator).
        size_t at = (what == 5) ? 0 : (rng() % 2 ? (rng() % model.size()) & ~size_t{31} : rng() % model.size());
        at = std::min(at, model.size() - 1);
        v.Erase(at);
        model.erase(model.begin() + static_cast<std::ptrdiff_t>(at));
      } else {
        // Set a new key that keeps the order: one more than the old one when free.
        size_t at = (what == 8) ? (rng() % model.size()) & ~size_t{31} : rng() % model.size();
        at = std::min(at, model.size() - 1);
        uint64_t x = model[at] + 1;
        if (at + 1 < model.size() && model[at + 1] == x) continue;
        v.Set(at, x);
        model[at] = x;
      }
      if (step % 500 == 0) kept.emplace_back(v, model);
    }
    ExpectSearchesMatch(v, model, rng);
    for (const auto& [copy, copy_model] : kept) ExpectSearchesMatch(copy, copy_model, rng);
  }
  // Built in bulk, then edited at the front of every leaf.
  std::vector<uint64_t> items(100000);
  for (size_t i = 0; i < items.size(); ++i) items[i] = i * 4;
  std::vector<uint64_t> model = items;
  KeyedVec bulk = KeyedVec::FromVector(std::move(items));
  KeyedVec before = bulk;
  std::vector<uint64_t> before_model = model;
  for (size_t i = 0; i < model.size(); i += 32) {
    bulk.Set(i, model[i] + 1);
    model[i] += 1;
  }
  ExpectSearchesMatch(bulk, model, rng);
  ExpectSearchesMatch(before, before_model, rng);
}

TEST(PersistentVector, AttributeSeparatorsNeverOutliveTheirSlots) {
  // Run under ASan: a separator points at the first slot of a leaf (and a
  // large attribute's slot at its blob), so every edit that moves, frees or
  // replaces a leaf's first slot (Set, Insert with growth and splits, Erase
  // with merges) must refresh the separators above it.
  auto key = [](size_t i) {
    std::string digits = std::to_string(i);
    return "k" + std::string(7 - std::min<size_t>(7, digits.size()), '0') + digits;
  };
  // Every third value is too large for its slot: a blob.
  auto value = [](size_t i, char c) { return i % 3 == 0 ? std::string(40, c) : std::string(1, c); };
  AttributeVector attrs;
  for (size_t i = 0; i < 20000; i += 2) attrs.PushBack(AttributeSlot::Make(key(i), value(i, 'v')));
  for (size_t i = 1; i < 20000; i += 4)
    attrs.Insert(AttributeLowerBound(attrs, key(i)), AttributeSlot::Make(key(i), value(i, 'i')));
  for (size_t i = 0; i < attrs.size(); i += 32)
    attrs.Set(i, AttributeSlot::Make(std::string(attrs[i].key()), value(i, 'w')));
  for (int k = 0; k < 300; ++k) attrs.Erase(static_cast<size_t>(k) * 31 % attrs.size());
  AttributeVector copy = attrs;
  for (size_t i = 0; i < copy.size(); i += 16)
    copy.Set(i, AttributeSlot::Make(std::string(copy[i].key()), value(i, 'x')));
  for (size_t i = 3; i < 20000; i += 40)
    copy.Insert(AttributeLowerBound(copy, key(i)), AttributeSlot::Make(key(i), value(i, 'y')));
  attrs = AttributeVector();  // the leaves only the old version held are gone
  for (size_t i = 0; i < copy.size(); i += 7) {
    std::string k(copy[i].key());
    size_t at = AttributeLowerBound(copy, k);
    ASSERT_EQ(at, i);
    ASSERT_TRUE(copy[i].value() == value(0, copy[i].value()[0]) ||
                copy[i].value() == value(1, copy[i].value()[0]));
  }
}

TEST(PersistentVector, AttributeSlotsHoldSmallAttributesInline) {
  AttributeSlot small = AttributeSlot::Make("key", std::string(AttributeSlot::kInlineBytes - 3, 'v'));
  EXPECT_EQ(small.blob(), nullptr);
  EXPECT_EQ(small.key(), "key");
  EXPECT_EQ(small.value(), std::string(AttributeSlot::kInlineBytes - 3, 'v'));
  EXPECT_EQ(small.HeapBytes(), 0u);
  AttributeSlot large = AttributeSlot::Make("key", std::string(AttributeSlot::kInlineBytes - 2, 'v'));
  ASSERT_NE(large.blob(), nullptr);
  EXPECT_EQ(large.value(), std::string(AttributeSlot::kInlineBytes - 2, 'v'));
  AttributeSlot copy = large;  // shares the blob
  EXPECT_EQ(copy.blob(), large.blob());
  AttributeSlot moved = std::move(copy);
  EXPECT_EQ(moved.blob(), large.blob());
  EXPECT_EQ(copy.blob(), nullptr);  // NOLINT(bugprone-use-after-move): a moved-from slot is empty
  EXPECT_EQ(copy.key(), "");
  AttributeSlot empty = AttributeSlot::Make("", "");
  EXPECT_EQ(empty.key(), "");
  EXPECT_EQ(empty.value(), "");
  small = large;  // inline <- blob, and back
  EXPECT_EQ(small.blob(), large.blob());
  small = AttributeSlot::Make("a", "b");
  EXPECT_EQ(small.key(), "a");
  EXPECT_EQ(small.value(), "b");
}

// Separators compare the first eight key bytes as a number before reading a
// blob: lookups must still order keys byte by byte (unsigned), with keys
// shorter than eight bytes, zero bytes inside keys ("ab" < "ab\0" <
// "ab\0c"), 0xff bytes and long shared prefixes.
TEST(PersistentVector, AttributeLookupsOrderKeysByteWise) {
  std::mt19937_64 rng(11);
  const std::string alphabet("\0\x01" "ab\x7f\x80\xff", 7);
  std::set<std::string> keys;
  while (keys.size() < 6000) {
    std::string k = (rng() % 3 == 0) ? "common-prefix/" : "";
    for (size_t n = rng() % 11; n > 0; --n) k += alphabet[rng() % alphabet.size()];
    keys.insert(k);
  }
  std::vector<std::string> sorted(keys.begin(), keys.end());
  std::vector<AttributeSlot> slots;
  for (const auto& k : sorted) slots.push_back(AttributeSlot::Make(k, "v"));
  AttributeVector attrs = AttributeVector::FromVector(std::move(slots));
  auto probe = [&](const std::string& k) {
    size_t got = AttributeLowerBound(attrs, k);
    size_t want = static_cast<size_t>(std::lower_bound(sorted.begin(), sorted.end(), k) - sorted.begin());
    ASSERT_EQ(got, want) << "key of " << k.size() << " bytes";
  };
  for (const auto& k : sorted) {
    probe(k);
    probe(k + std::string(1, '\0'));
    probe(k + "\xff");
    if (!k.empty()) probe(k.substr(0, k.size() - 1));
  }
  for (int i = 0; i < 2000; ++i) {
    std::string k;
    for (size_t n = rng() % 12; n > 0; --n) k += alphabet[rng() % alphabet.size()];
    probe(k);
  }
  // And after edits (separators refreshed on every path).
  for (size_t i = 0; i < 500; ++i) {
    size_t at = rng() % attrs.size();
    attrs.Erase(at);
    sorted.erase(sorted.begin() + static_cast<std::ptrdiff_t>(at));
  }
  for (const auto& k : sorted) probe(k);
}

}  // namespace
}  // namespace canopy::tree
