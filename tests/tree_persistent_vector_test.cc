// PersistentVector: every edit checked against std::vector, and every
// earlier copy checked to be unchanged by later edits (structural sharing
// must never let an edit show through another holder).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tree/node.h"
#include "tree/persistent_vector.h"

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

// Elements that count themselves, so that a test can tell a leak or a
// double release (ASan tells a use after free).
struct Counted {
  explicit Counted(uint64_t v) : value(v) { ++live; }
  ~Counted() { --live; }
  uint64_t value;
  mutable std::atomic<uint32_t> refs_{1};
  static inline int64_t live = 0;
};
void RefAdd(const Counted* c) noexcept { c->refs_.fetch_add(1, std::memory_order_relaxed); }
void RefRelease(const Counted* c) noexcept {
  if (c->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete c;
}
using CountedPtr = RefPtr<const Counted>;

// A copy of an inner chunk borrows the children it shares with the chunk
// it was copied from (persistent_vector.h, Borrow). Every version here is a
// copy of the one before with one edit, so chains of borrowing chunks form
// at every level; versions are then dropped in any order, and each that is
// left must still hold exactly what it held, with nothing leaked.
TEST(PersistentVector, CopiesThatBorrowFromTheirOriginalsSurviveAnyReleaseOrder) {
  std::mt19937_64 rng(4242);
  for (int round = 0; round < 3; ++round) {
    const size_t start = round == 0 ? 40 : (round == 1 ? 3000 : 40000);  // 2, 3 and 4 levels
    std::vector<CountedPtr> items;
    for (size_t i = 0; i < start; ++i) items.push_back(CountedPtr::Adopt(new Counted(i)));
    std::vector<std::pair<PersistentVector<CountedPtr>, std::vector<uint64_t>>> versions;
    {
      std::vector<uint64_t> model;
      for (const auto& p : items) model.push_back(p->value);
      versions.emplace_back(PersistentVector<CountedPtr>::FromVector(std::move(items)), std::move(model));
    }
    uint64_t next = 1000000;
    for (int step = 0; step < 3000; ++step) {
      auto [v, model] = versions.back();  // a copy: shares every chunk
      // Mostly edits near one place (the same chunks copied again and again,
      // so chains grow to their limit), sometimes anywhere.
      size_t at = model.empty() ? 0 : (rng() % 4 ? (step * 37) % model.size() : rng() % model.size());
      unsigned what = rng() % 10;
      if (model.empty() || what < 3) {
        v.Insert(at, CountedPtr::Adopt(new Counted(next)));
        model.insert(model.begin() + static_cast<std::ptrdiff_t>(at), next++);
      } else if (what < 6) {
        v.Erase(at);
        model.erase(model.begin() + static_cast<std::ptrdiff_t>(at));
      } else if (what < 8) {
        v.Set(at, CountedPtr::Adopt(new Counted(next)));
        model[at] = next++;
      } else {
        v.MutableAt(at) = CountedPtr::Adopt(new Counted(next));
        model[at] = next++;
      }
      versions.emplace_back(std::move(v), std::move(model));
      // Drop an old version now and then: the oldest, the newest but one,
      // or any (a chunk's base can then go before or after its copies).
      if (versions.size() > 40 && rng() % 2) {
        size_t drop = rng() % 3 == 0 ? 0 : (rng() % 2 ? versions.size() - 2 : rng() % (versions.size() - 1));
        versions.erase(versions.begin() + static_cast<std::ptrdiff_t>(drop));
      }
    }
    for (const auto& version : versions) {
      const auto& v = version.first;
      const auto& model = version.second;
      ASSERT_EQ(v.size(), model.size());
      size_t i = 0;
      v.ForEach([&](const CountedPtr& p) { ASSERT_EQ(p->value, model[i++]); });
    }
    // Drop the rest in any order.
    while (!versions.empty())
      versions.erase(versions.begin() + static_cast<std::ptrdiff_t>(rng() % versions.size()));
    EXPECT_EQ(Counted::live, 0) << "elements leaked or released twice";
  }
}

// Erasing a whole leaf from a copy can leave its root with one child that
// the root borrows from the original; the copy's new root must then hold
// that child by a reference of its own, or the child goes with the original.
TEST(PersistentVector, ARootLeftWithOneBorrowedChildKeepsIt) {
  {
    std::vector<CountedPtr> items;
    for (uint64_t i = 0; i < 64; ++i) items.push_back(CountedPtr::Adopt(new Counted(i)));
    auto original = std::make_unique<PersistentVector<CountedPtr>>(
        PersistentVector<CountedPtr>::FromVector(std::move(items)));
    PersistentVector<CountedPtr> v = *original;          // two full leaves under one root
    for (int i = 0; i < 32; ++i) v.Erase(v.size() - 1);  // the second leaf, down to nothing
    original.reset();
    ASSERT_EQ(v.size(), 32u);
    for (uint64_t i = 0; i < 32; ++i) ASSERT_EQ(v[i]->value, i);
    v.Insert(0, CountedPtr::Adopt(new Counted(99)));
    ASSERT_EQ(v[0]->value, 99u);
    ASSERT_EQ(v[32]->value, 31u);
  }
  EXPECT_EQ(Counted::live, 0);
}

// A chain of borrowing copies keeps older chunks alive past their versions,
// but only up to kMaxBorrowDepth of them per chunk: a vector edited and
// copied many times (each old copy dropped) stays near the size of the same
// vector built fresh.
TEST(PersistentVector, ChainsOfBorrowingCopiesStayShort) {
  std::mt19937_64 rng(99);
  std::vector<uint64_t> items(32 * 1024);
  for (size_t i = 0; i < items.size(); ++i) items[i] = i;
  Vec v = Vec::FromVector(std::vector<uint64_t>(items));
  const size_t fresh = Vec::FromVector(std::move(items)).ChunkBytes();
  for (int step = 0; step < 20000; ++step) {
    Vec copy = v;
    copy.Set(rng() % copy.size(), static_cast<uint64_t>(step));
    v = std::move(copy);  // the old version goes
  }
  EXPECT_LT(v.ChunkBytes(), fresh * 3 / 2);
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

// Separators compare the first sixteen key bytes as two numbers before
// reading the key: lookups must still order keys byte by byte (unsigned),
// with keys shorter than eight or sixteen bytes, zero bytes inside keys
// ("ab" < "ab\0" < "ab\0c"), 0xff bytes and shared prefixes that end
// before, across and after byte 16.
TEST(PersistentVector, AttributeLookupsOrderKeysByteWise) {
  std::mt19937_64 rng(11);
  const std::string alphabet("\0\x01" "ab\x7f\x80\xff", 7);
  std::set<std::string> keys;
  while (keys.size() < 6000) {
    static const char* const kPrefixes[] = {"", "", "", "common-prefix/", "a-longer-common-prefix/"};
    std::string k = kPrefixes[rng() % 5];
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
