// The block format used in place (tree/snapshot.h format 2, lazy nodes in
// tree/node.h): opening checks everything and builds nothing per node;
// nodes decode on first touch; encoders copy untouched subtrees; forged
// structure behind valid CRCs is refused; format 1 directories migrate.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "base/coding.h"
#include "base/crc32c.h"
#include "tests/testing/test_util.h"
#include "tree/legacy_snapshot.h"
#include "tree/snapshot.h"
#include "tree/store.h"
#include "tree/transaction.h"
#include "tree/xxh3.h"

namespace canopy::tree {
namespace {

using canopy::testing::TempDir;

Version RandomTree(int nodes, uint64_t seed, size_t max_value = 40) {
  std::mt19937_64 rng(seed);
  Transaction txn(Version("rand", 0, Node::Empty()));
  std::vector<NodePath> paths{{}};
  for (int i = 1; i < nodes; ++i) {
    const NodePath& parent = paths[rng() % paths.size()];
    auto child = txn.AppendChild(parent);
    EXPECT_TRUE(child.ok());
    int attrs = static_cast<int>(rng() % 4);
    for (int a = 0; a < attrs; ++a) {
      std::string key = "k" + std::to_string(rng() % 10);
      EXPECT_TRUE(txn.PutAttribute(*child, key, testing::RandomBytes(rng() % (max_value + 1), rng())).ok());
    }
    paths.push_back(*child);
  }
  return Version("rand", 7, txn.root());
}

std::string Join(const std::vector<std::string>& chunks) {
  std::string all;
  for (const auto& c : chunks) all += c;
  return all;
}

// A block with a valid CRC around `payload` (for forging structure).
std::string Block(uint8_t kind, uint64_t seq, std::string_view payload) {
  std::string b(kChunkHeaderBytes, '\0');
  b += payload;
  EncodeFixed32(b.data(), kSnapshotMagic);
  EncodeFixed32(b.data() + 4, static_cast<uint32_t>(b.size() + 4));
  b[8] = static_cast<char>(kind);
  EncodeFixed64(b.data() + 9, seq);
  PutFixed32(&b, crc32c::Value(b));
  return b;
}

std::string HeadPayload() {
  std::string p;
  PutLengthPrefixed(&p, "t");
  PutFixed64(&p, 1);
  return p;
}

TEST(TreeBlocks, OpenedTreeIsLazyUntilTouched) {
  Version v = RandomTree(2000, 11);
  auto opened = OpenSnapshotImage(Join(EncodeSnapshotChunks(v, 4096)));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const NodePtr& root = opened->root();
  EXPECT_TRUE(root->lazy());
  // The digest of an untouched image is its checked digest: still lazy.
  EXPECT_EQ(opened->Digest(), v.Digest());
  EXPECT_TRUE(root->lazy());
  ASSERT_GT(root->child_count(), 0u);  // decodes the root only
  EXPECT_FALSE(root->lazy());
  const NodePtr& first = root->child(0);
  if (first != Node::Empty()) {
    EXPECT_TRUE(first->lazy());
  }
  EXPECT_TRUE(TreesEqual(root, v.root()));
  EXPECT_EQ(CountNodes(root), CountNodes(v.root()));
  EXPECT_EQ(opened->Digest(), v.Digest());
}

// A decoded node leaves large attributes in the image (no copy) and copies
// small ones; an image-backed value outlives every node of the image, the
// file's name and the version it came from, and an edited copy shares it.
TEST(TreeBlocks, LargeAttributesStayInTheImageAndKeepItAlive) {
  TempDir tmp;
  const std::string big = testing::RandomBytes(64 << 10, 3);
  Transaction txn(Version("t", 0, Node::Empty()));
  ASSERT_TRUE(txn.PutAttribute({}, "big", big).ok());
  ASSERT_TRUE(txn.PutAttribute({}, "small", "s").ok());
  auto child = txn.AppendChild({});
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(txn.PutAttribute(*child, "big", big).ok());
  Version v("t", 1, txn.root());
  std::string path = tmp.File("checkpoint.snap");
  std::ofstream(path, std::ios::binary) << Join(EncodeSnapshotChunks(v));

  NodePtr edited;
  {
    auto opened = OpenSnapshotFile(path);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    std::filesystem::remove(path);
    const Node& root = *opened->root();
    ASSERT_EQ(root.attribute_count(), 2u);
    const AttributeVector& attrs = root.attribute_vector();
    ASSERT_NE(attrs[0].blob(), nullptr);
    EXPECT_TRUE(attrs[0].blob()->in_image());  // "big"
    EXPECT_EQ(attrs[1].blob(), nullptr);       // "small": in its slot
    EXPECT_LT(root.OwnBytes(), size_t{4096});  // the value is not on the heap
    Transaction t(*opened);
    ASSERT_TRUE(t.PutAttribute({}, "small", "changed").ok());
    edited = t.root();
    EXPECT_EQ(edited->attribute_vector()[0].blob(), attrs[0].blob());  // shared, not copied
  }
  // The version, its lazy nodes and the file's name are gone; the edited
  // root's big values (the root's own, and its still lazy child's) remain.
  EXPECT_EQ(*edited->attribute("big"), big);
  EXPECT_EQ(*edited->attribute("small"), "changed");
  EXPECT_EQ(*edited->child(0)->attribute("big"), big);
  // Re-encoding reads the values from the image.
  Version again("t", 2, edited);
  auto back = DecodeSnapshotChunks(EncodeSnapshotChunks(again, 4096));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(TreesEqual(back->root(), edited));
}

TEST(TreeBlocks, EncodingAnOpenedTreeCopiesItsBytesAndEditsStayCorrect) {
  Version v = RandomTree(3000, 12, 200);
  auto chunks = EncodeSnapshotChunks(v, 8192);
  auto opened = OpenSnapshotImage(Join(chunks));
  ASSERT_TRUE(opened.ok());
  // Untouched: the same body (the digest is of the body), whatever the block size.
  auto again = OpenSnapshotImage(Join(EncodeSnapshotChunks(*opened, 1 << 20)));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->Digest(), v.Digest());
  EXPECT_TRUE(TreesEqual(again->root(), v.root()));

  // Edit the opened tree and the original the same way: the bodies (hence
  // digests) agree; block cuts may differ, as copied runs are cut at the
  // source's block boundaries.
  std::mt19937_64 rng(5);
  Transaction a(*opened), b(v);
  for (int i = 0; i < 40; ++i) {
    NodePath path;
    const Node* n = a.root().get();
    while (n->child_count() > 0 && rng() % 3 != 0) {
      uint64_t k = rng() % n->child_count();
      path.push_back(k);
      n = n->child(k).get();
    }
    std::string val = std::to_string(i);
    ASSERT_TRUE(a.PutAttribute(path, "edit", val).ok());
    ASSERT_TRUE(b.PutAttribute(path, "edit", val).ok());
    if (i % 5 == 0) {
      ASSERT_TRUE(a.AppendChild(path).ok());
      ASSERT_TRUE(b.AppendChild(path).ok());
    }
  }
  Version ea("rand", 8, a.root()), eb("rand", 8, b.root());
  EXPECT_EQ(ea.Digest(), eb.Digest());
  auto ca = EncodeSnapshotChunks(ea, 8192);
  auto back = DecodeSnapshotChunks(ca);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Digest(), eb.Digest());
  EXPECT_TRUE(TreesEqual(back->root(), eb.root()));
  // The original opened version is unchanged by the edits.
  EXPECT_TRUE(TreesEqual(opened->root(), v.root()));
}

TEST(TreeBlocks, EveryFlipAndTruncationOfAWholeImageIsCaught) {
  Version v = RandomTree(60, 13);
  std::string all = Join(EncodeSnapshotChunks(v, 256));
  ASSERT_TRUE(OpenSnapshotImage(all).ok());
  for (size_t i = 0; i < all.size(); ++i) {
    std::string bad = all;
    bad[i] ^= 0x20;
    ASSERT_FALSE(OpenSnapshotImage(bad).ok()) << "flip of byte " << i << " went unnoticed";
  }
  for (size_t n = 0; n < all.size(); ++n) {
    ASSERT_FALSE(OpenSnapshotImage(all.substr(0, n)).ok()) << "cut to " << n << " bytes went unnoticed";
  }
  EXPECT_FALSE(OpenSnapshotImage(all + "x").ok());
}

TEST(TreeBlocks, ForgedStructureBehindValidCrcsIsRefused) {
  auto open = [](const std::string& nodes, uint64_t count) {
    std::string tail;
    PutFixed64(&tail, count);
    PutFixed64(&tail, nodes.size());
    PutFixed64(&tail, 0);  // the digest is checked last: structure errors come first
    return OpenSnapshotImage(Block(1, 0, HeadPayload()) + Block(2, 1, nodes) + Block(3, 2, tail));
  };
  // leaf, then a parent whose delta points into the middle of the leaf.
  std::string leaf = std::string("\x01\x01k\x01v\x00", 6);
  EXPECT_TRUE(open(leaf + std::string("\x00\x01\x03", 3), 2).status().IsCorruption());
  // A parent claiming two children where one precedes it.
  EXPECT_TRUE(open(leaf + std::string("\x00\x02\x06\x06", 4), 2).status().IsCorruption());
  // A child delta of zero (itself) and one past the start.
  EXPECT_TRUE(open(leaf + std::string("\x00\x01\x00", 3), 2).status().IsCorruption());
  EXPECT_TRUE(open(leaf + std::string("\x00\x01\x07", 3), 2).status().IsCorruption());
  // Two roots (no parent claims the leaf).
  EXPECT_TRUE(open(leaf + std::string("\x00\x00", 2), 2).status().IsCorruption());
  // Keys out of order, a record cut at the block end.
  EXPECT_TRUE(open(std::string("\x02\x01" "b\x00\x01" "a\x00\x00", 8), 1).status().IsCorruption());
  EXPECT_TRUE(open(std::string("\x01\x05" "ab", 4), 1).status().IsCorruption());
  // A record spanning two blocks is refused even though each block is sound.
  std::string tail;
  PutFixed64(&tail, 1);
  PutFixed64(&tail, 6);
  PutFixed64(&tail, 0);
  auto split = OpenSnapshotImage(Block(1, 0, HeadPayload()) + Block(2, 1, leaf.substr(0, 3)) +
                                 Block(2, 2, leaf.substr(3)) + Block(3, 3, tail));
  EXPECT_TRUE(split.status().IsCorruption());
  // The well-formed stream with the wrong digest.
  auto good = open(leaf + std::string("\x00\x01\x06", 3), 2);
  EXPECT_TRUE(good.status().IsCorruption());
  EXPECT_NE(good.status().message().find("digest"), std::string::npos) << good.status().ToString();
}

// A stream of `leaves` same-shaped leaves (one attribute "id" with a
// value_bytes-byte value, 8 to 127, different in every leaf) and a root
// naming each, built byte by byte with valid CRCs and digest. edit_leaf(i,
// record) may change leaf i; ref_bytes(i, delta) replaces child reference i
// when it returns bytes.
std::string LeafRunImage(int leaves, const std::function<void(int, std::string*)>& edit_leaf,
                         const std::function<std::string(int, uint64_t)>& ref_bytes, size_t value_bytes = 8) {
  std::string body;
  std::vector<uint64_t> at;
  for (int i = 0; i < leaves; ++i) {
    std::string r("\x01\x02id", 4);
    r += static_cast<char>(value_bytes);
    std::string value = "value" + std::to_string(100 + i);
    value.resize(value_bytes, 'x');
    r += value;
    r += '\0';
    edit_leaf(i, &r);
    at.push_back(body.size());
    body += r;
  }
  const uint64_t root = body.size();
  body += std::string("\x00", 1);
  PutVarint64(&body, static_cast<uint64_t>(leaves));
  for (int i = 0; i < leaves; ++i) {
    std::string forged = ref_bytes(i, root - at[i]);
    if (forged.empty()) {
      PutVarint64(&body, root - at[i]);
    } else {
      body += forged;
    }
  }
  std::string tail;
  PutFixed64(&tail, static_cast<uint64_t>(leaves) + 1);
  PutFixed64(&tail, body.size());
  PutFixed64(&tail, XXH3_64bits(body.data(), body.size()));
  return Block(1, 0, HeadPayload()) + Block(2, 1, body) + Block(3, 2, tail);
}

// The checker compares a leaf with the same counts, key bytes and value
// lengths as the leaf before it word by word instead of parsing it (see
// StreamChecker in tree/snapshot.cc): such runs must be read back exactly
// and refused as strictly as any other record.
TEST(TreeBlocks, RunsOfSameShapedLeavesAreCheckedLikeAnyRecord) {
  constexpr int kLeaves = 40;
  auto image = [&](const std::function<void(int, std::string*)>& edit, const std::string& delta20) {
    return LeafRunImage(kLeaves, edit, [&](int i, uint64_t) { return i == 20 ? delta20 : std::string(); });
  };
  auto none = [](int, std::string*) {};
  auto good = OpenSnapshotImage(image(none, ""));
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  ASSERT_EQ(good->root()->child_count(), static_cast<size_t>(kLeaves));
  for (int i = 0; i < kLeaves; ++i) {
    EXPECT_EQ(good->root()->child(i)->attribute("id"), "value" + std::to_string(100 + i));
  }
  // One leaf in the middle of the run made unsound; every other byte, the
  // CRCs and the digest are right, so only the record check can refuse it.
  auto bad = [&](const char* what, const std::function<void(std::string*)>& edit) {
    auto v = OpenSnapshotImage(image([&](int i, std::string* r) { if (i == 20) edit(r); }, ""));
    EXPECT_TRUE(v.status().IsCorruption()) << what << ": " << v.status().ToString();
  };
  bad("claims a child", [](std::string* r) { r->back() = '\x01'; });
  bad("value longer than it is", [](std::string* r) { (*r)[4] = '\x09'; });
  bad("two attributes", [](std::string* r) { (*r)[0] = '\x02'; });
  bad("count not a whole varint", [](std::string* r) { (*r)[0] = '\x81'; });
  // A key that differs is a different shape, checked in full, and sound.
  auto other_key = OpenSnapshotImage(image([](int i, std::string* r) { if (i == 20) (*r)[3] = 'x'; }, ""));
  ASSERT_TRUE(other_key.ok()) << other_key.status().ToString();
  EXPECT_EQ(other_key->root()->child(20)->attribute("ix"), "value120");
  // Child deltas must be minimal varints (what every writer writes): leaf
  // 20 is at 280 and the root at 560, so its delta 280 is 0x98 0x02; here
  // it is padded to three bytes.
  const std::string padded("\x98\x82\x00", 3);
  auto v = OpenSnapshotImage(image(none, padded));
  EXPECT_TRUE(v.status().IsCorruption()) << v.status().ToString();
  // Same-shaped leaves cut into many small blocks read back as built.
  std::vector<NodePtr> leaves;
  for (int i = 0; i < 500; ++i) {
    leaves.push_back(Node::Make(Node::Attributes{{"id", "v" + std::to_string(1000 + i)}}, std::vector<NodePtr>{}));
  }
  Version built("t", 3, Node::Make(Node::Attributes{}, std::move(leaves)));
  for (size_t block : {kMinSnapshotChunkBytes, size_t{4096}, kDefaultSnapshotChunkBytes}) {
    auto back = DecodeSnapshotChunks(EncodeSnapshotChunks(built, block));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(TreesEqual(back->root(), built.root()));
    EXPECT_EQ(back->Digest(), built.Digest());
  }
}

// The record check takes runs of same-shaped leaves four at a time and
// two-byte child references eight at a time where the CPU has vectors
// (AVX2), one at a time otherwise. Both forms must refuse a defect at every
// position of a group, across group ends, and where the references change
// from two bytes to one, with the same message.
TEST(TreeBlocks, ADefectAtAnyPositionOfARunIsRefusedWithAndWithoutVectors) {
  // 14-byte leaves (compared 16 bytes at a time) and 26-byte ones (32 at a
  // time); 100 leaves give deltas from 1400 or 2600 down (two-byte, then one
  // byte at the end), 700 26-byte leaves start with three-byte deltas.
  int leaves = 100;
  size_t value_bytes = 8;
  auto image = [&](const std::function<void(int, std::string*)>& edit_leaf,
                   const std::function<std::string(int, uint64_t)>& ref_bytes) {
    return LeafRunImage(leaves, edit_leaf, ref_bytes, value_bytes);
  };
  auto no_leaf_edit = [](int, std::string*) {};
  auto no_ref_edit = [](int, uint64_t) { return std::string(); };
  auto varint = [](uint64_t v) {
    std::string s;
    PutVarint64(&s, v);
    return s;
  };
  struct Run {
    bool vectors;
    size_t value_bytes;
    int leaves;
  };
  for (Run run : {Run{true, 8, 100}, Run{false, 8, 100}, Run{true, 20, 100}, Run{false, 20, 100},
                  Run{true, 20, 700}, Run{false, 20, 700}}) {
    SCOPED_TRACE(std::string(run.vectors ? "vectors allowed" : "no vectors") + ", " + std::to_string(run.leaves) +
                 " leaves of " + std::to_string(run.value_bytes) + "-byte values");
    AllowSnapshotCheckVectors(run.vectors);
    value_bytes = run.value_bytes;
    leaves = run.leaves;
    const int kLeaves = leaves;
    auto good = OpenSnapshotImage(image(no_leaf_edit, no_ref_edit));
    ASSERT_TRUE(good.ok()) << good.status().ToString();
    ASSERT_EQ(good->root()->child_count(), static_cast<size_t>(kLeaves));
    std::string last = "value" + std::to_string(100 + kLeaves - 1);
    last.resize(value_bytes, 'x');
    EXPECT_EQ(good->root()->child(kLeaves - 1)->attribute("id"), last);
    for (int bad = 0; bad < kLeaves; ++bad) {
      auto claims_child = OpenSnapshotImage(image([&](int i, std::string* r) { if (i == bad) r->back() = '\x01'; },
                                                  no_ref_edit));
      ASSERT_TRUE(claims_child.status().IsCorruption()) << "leaf " << bad << ": " << claims_child.status().ToString();
      auto value_len = OpenSnapshotImage(image([&](int i, std::string* r) { if (i == bad) (*r)[4] = static_cast<char>(value_bytes - 1); },
                                               no_ref_edit));
      ASSERT_TRUE(value_len.status().IsCorruption()) << "leaf " << bad << ": " << value_len.status().ToString();
      // A reference one byte off, one naming the leaf before, one off in its
      // third varint byte only.
      for (uint64_t shift : {uint64_t{1}, uint64_t{14}, uint64_t{1} << 14}) {
        auto ref = OpenSnapshotImage(image(no_leaf_edit, [&](int i, uint64_t delta) {
          return i == bad ? varint(delta + shift) : std::string();
        }));
        ASSERT_TRUE(ref.status().IsCorruption()) << "reference " << bad << " + " << shift << ": "
                                                 << ref.status().ToString();
        EXPECT_NE(ref.status().message().find("does not name the subtree before it"), std::string::npos)
            << ref.status().ToString();
      }
    }
  }
  AllowSnapshotCheckVectors(true);
}

// The checker reads a NODES block a piece at a time (its CRC, digest and
// records together), and a record may straddle two pieces. A leaf made
// unsound (CRCs and digest right) around 16, 32, 64, 128 and 256 KiB into
// one large block is refused, with and without vectors.
TEST(TreeBlocks, ADefectAtAPieceBoundaryOfALargeBlockIsRefused) {
  constexpr int kLeaves = 24000;  // 14-byte leaves: a 336 KB run, then the root's references
  constexpr size_t kRecord = 14;
  auto image = [&](int bad_leaf) {
    return LeafRunImage(
        kLeaves,
        [&](int i, std::string* r) {
          if (i == bad_leaf) r->back() = '\x01';
        },
        [](int, uint64_t) { return std::string(); });
  };
  for (bool vectors : {true, false}) {
    SCOPED_TRACE(vectors ? "vectors allowed" : "no vectors");
    AllowSnapshotCheckVectors(vectors);
    auto good = OpenSnapshotImage(image(-1));
    ASSERT_TRUE(good.ok()) << good.status().ToString();
    ASSERT_EQ(good->root()->child_count(), static_cast<size_t>(kLeaves));
    EXPECT_EQ(good->root()->child(kLeaves - 1)->attribute("id"),
              ("value" + std::to_string(100 + kLeaves - 1)).substr(0, 8));
    for (size_t kib : {16, 32, 64, 128, 256}) {
      const int straddling = static_cast<int>((kib << 10) / kRecord);
      for (int bad = straddling - 1; bad <= straddling + 1; ++bad) {
        auto v = OpenSnapshotImage(image(bad));
        ASSERT_TRUE(v.status().IsCorruption())
            << "leaf " << bad << " near " << kib << " KiB: " << v.status().ToString();
        EXPECT_NE(v.status().message().find("record at body offset " + std::to_string(bad * kRecord)),
                  std::string::npos)
            << v.status().ToString();
      }
    }
  }
  AllowSnapshotCheckVectors(true);
}

// Xxh3 (tree/xxh3.h) gives libxxhash's XXH3_64bits values in both of its
// forms (AVX2 where the CPU has it, the library's otherwise), whatever the
// lengths and however the bytes are split across Update calls.
TEST(TreeBlocks, Xxh3MatchesTheLibraryInBothFormsAndAnySplit) {
  const std::string bytes = testing::RandomBytes(300000, 17);
  std::mt19937_64 rng(5);
  const bool has_avx2 = Xxh3UsesAvx2();
  for (bool avx2 : {true, false}) {
    SCOPED_TRACE(avx2 ? "AVX2 form where the CPU has it" : "library form");
    AllowXxh3Avx2(avx2);
    EXPECT_EQ(Xxh3UsesAvx2(), avx2 && has_avx2);
    for (size_t len :
         {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 255, 256, 257, 1023, 1024, 1025, 65536, 300000}) {
      const uint64_t want = XXH3_64bits(bytes.data(), len);
      for (size_t piece : {size_t{0}, size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{16384}}) {
        Xxh3 h;
        if (piece == 0) {  // random pieces
          for (size_t off = 0; off < len;) {
            const size_t n = std::min<size_t>(len - off, rng() % 3000);
            h.Update(bytes.data() + off, n);
            off += n;
          }
        } else {
          for (size_t off = 0; off < len; off += piece)
            h.Update(bytes.data() + off, std::min(piece, len - off));
        }
        ASSERT_EQ(h.Digest(), want) << len << " bytes in pieces of " << piece;
        ASSERT_EQ(h.Digest(), want) << "a second Digest()";
      }
    }
  }
  AllowXxh3Avx2(true);
}

TEST(TreeBlocks, ManyThreadsReadOneLazyTree) {
  Version v = RandomTree(5000, 14);
  auto opened = OpenSnapshotImage(Join(EncodeSnapshotChunks(v, 4096)));
  ASSERT_TRUE(opened.ok());
  const uint64_t want = CountNodes(v.root());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      if (CountNodes(opened->root()) != want || !TreesEqual(opened->root(), v.root())) ++bad;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(TreeBlocks, OpenSnapshotFileReadsInPlaceAndNamesFormatOne) {
  TempDir tmp;
  Version v = RandomTree(500, 15);
  std::string path = tmp.File("checkpoint.snap");
  std::ofstream(path, std::ios::binary) << Join(EncodeSnapshotChunks(v));
  auto opened = OpenSnapshotFile(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::filesystem::remove(path);  // the mapping outlives the name
  EXPECT_TRUE(TreesEqual(opened->root(), v.root()));

  std::string old = tmp.File("old.snap");
  std::ofstream(old, std::ios::binary) << Join(csn1::EncodeSnapshotChunks(v));
  auto refused = OpenSnapshotFile(old);
  ASSERT_TRUE(refused.status().IsCorruption());
  EXPECT_NE(refused.status().message().find("format 1"), std::string::npos) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("format 2"), std::string::npos) << refused.status().ToString();
}

// A checkpoint file is checked block by block as it is read (pread through
// a pooled buffer), and a block larger than that buffer (one record of 3
// MiB) piece by piece for its CRC and digest and through a mapping for its
// records. Every kind of damage is caught on both paths, as OpenSnapshotImage
// catches it in memory: flips in headers, in small and in large blocks, in a
// large value, in its trailer; cuts at and around every block boundary.
TEST(TreeBlocks, CheckpointFileIsCheckedBlockByBlockWhateverTheBlockSize) {
  TempDir tmp;
  Transaction txn(RandomTree(3000, 21));
  auto child = txn.AppendChild({});
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(txn.PutAttribute(*child, "big", testing::RandomBytes(3 << 20, 5)).ok());
  ASSERT_TRUE(txn.PutAttribute(*child, "small", "s").ok());
  Version v("rand", 7, txn.root());
  const std::string all = Join(EncodeSnapshotChunks(v, 8 << 10));
  std::vector<size_t> starts;  // of every block
  size_t largest = 0;
  for (size_t off = 0; off < all.size();) {
    starts.push_back(off);
    auto len = SnapshotChunkLength(std::string_view(all).substr(off));
    ASSERT_TRUE(len.ok());
    largest = std::max(largest, *len);
    off += *len;
  }
  ASSERT_GT(largest, size_t{2} << 20) << "the big record needs a block larger than a read buffer";
  ASSERT_GT(starts.size(), 10u);
  const std::string path = tmp.File("checkpoint.snap");
  auto open_bytes = [&](const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return OpenSnapshotFile(path);
  };
  // One byte of the file written over (the file holds `all` otherwise).
  auto write_byte = [&](size_t at, char byte) {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(byte);
  };
  auto good = open_bytes(all);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(TreesEqual(good->root(), v.root()));
  EXPECT_EQ(good->Digest(), v.Digest());

  std::set<size_t> flips;
  for (size_t start : starts) {
    for (size_t i = 0; i < 24 && start + i < all.size(); ++i)
      flips.insert(start + i);  // header, first records
    if (start >= 4) {
      for (size_t i = start - 4; i < start; ++i) flips.insert(i);  // the previous block's CRC
    }
  }
  for (size_t i = all.size() - 40; i < all.size(); ++i) flips.insert(i);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 300; ++i) flips.insert(rng() % all.size());
  auto big = v.root()->child(v.root()->child_count() - 1)->attribute("big");
  ASSERT_TRUE(big.has_value());
  const size_t value_at = all.find(big->substr(0, 64));
  ASSERT_NE(value_at, std::string::npos);
  for (size_t i = 0; i < 64; ++i) flips.insert(value_at + (i << 15));  // across the big value
  for (size_t i : flips) {
    write_byte(i, static_cast<char>(all[i] ^ 0x20));
    auto opened = OpenSnapshotFile(path);
    write_byte(i, all[i]);
    ASSERT_FALSE(opened.ok()) << "flip of byte " << i << " went unnoticed";
    EXPECT_TRUE(opened.status().IsCorruption()) << i << ": " << opened.status().ToString();
  }
  ASSERT_TRUE(OpenSnapshotFile(path).ok());
  std::set<size_t> cuts;
  for (size_t start : starts) {
    for (size_t d : {size_t{0}, size_t{1}, size_t{8}, size_t{17}}) {
      if (start + d < all.size()) cuts.insert(start + d);
      if (start >= d + 1) cuts.insert(start - d - 1);
    }
  }
  for (int i = 0; i < 100; ++i) cuts.insert(1 + rng() % (all.size() - 1));
  for (auto it = cuts.rbegin(); it != cuts.rend(); ++it) {  // longest first: each cut shortens the file
    const size_t n = *it;
    std::filesystem::resize_file(path, n);
    auto opened = OpenSnapshotFile(path);
    ASSERT_FALSE(opened.ok()) << "cut to " << n << " bytes went unnoticed";
    EXPECT_TRUE(opened.status().IsCorruption()) << n << ": " << opened.status().ToString();
  }
  EXPECT_TRUE(open_bytes(all + "x").status().IsCorruption());

  // Structure that is wrong behind valid CRCs, in a block larger than a
  // read buffer: a value whose length runs past the block's end.
  std::string record("\x01\x01k", 3);
  PutVarint64(&record, (3 << 20) + 10);
  record += std::string(3 << 20, 'v');
  std::string tail;
  PutFixed64(&tail, 1);
  PutFixed64(&tail, record.size());
  PutFixed64(&tail, 0);
  auto forged = open_bytes(Block(1, 0, HeadPayload()) + Block(2, 1, record) + Block(3, 2, tail));
  ASSERT_TRUE(forged.status().IsCorruption()) << forged.status().ToString();
  EXPECT_NE(forged.status().message().find("cut short"), std::string::npos) << forged.status().ToString();
}

// Many checks at once (a joiner's trees all finish landing together) take
// turns for the pooled read buffers; each sees its own file whole.
TEST(TreeBlocks, ManyCheckpointFilesAreCheckedAtOnce) {
  TempDir tmp;
  constexpr int kFiles = 12;
  std::vector<Version> trees;
  for (int i = 0; i < kFiles; ++i) {
    Transaction txn(RandomTree(300, 100 + i));
    auto child = txn.AppendChild({});
    ASSERT_TRUE(child.ok());
    // Every other file has a block larger than a read buffer.
    ASSERT_TRUE(txn.PutAttribute(*child, "v", testing::RandomBytes(i % 2 ? (3 << 20) : 1000, i)).ok());
    trees.emplace_back("rand", 7, txn.root());
    std::ofstream(tmp.File("f" + std::to_string(i)), std::ios::binary)
        << Join(EncodeSnapshotChunks(trees.back()));
  }
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kFiles; ++i) {
      threads.emplace_back([&, i] {
        auto opened = OpenSnapshotFile(tmp.File("f" + std::to_string(i)));
        if (opened.ok() && opened->Digest() == trees[i].Digest() &&
            TreesEqual(opened->root(), trees[i].root())) {
          ++good;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 3 * kFiles);
}

TEST(TreeBlocks, StoreMigratesFormatOneCheckpointsOnOpen) {
  TempDir tmp;
  Version v = RandomTree(800, 16);
  StoreOptions o;
  o.checkpoint_every_commits = 0;
  uint64_t digest = 0;
  {
    auto store = Store::Open(tmp.path(), o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE((*store)->CreateTree("rand").ok());
  }
  // A data directory as an older canopy left it: a CSN1 checkpoint at
  // version 7 and no WAL after it.
  std::string dir = tmp.path() + "/trees/rand";
  for (const auto& e : std::filesystem::directory_iterator(dir)) std::filesystem::remove(e.path());
  std::string path = dir + "/checkpoint-00000000000000000007.snap";
  std::ofstream(path, std::ios::binary) << Join(csn1::EncodeSnapshotChunks(v));
  digest = v.Digest();
  {
    auto store = Store::Open(tmp.path(), o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto latest = (*store)->Latest("rand");
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(latest->number(), 7u);
    EXPECT_TRUE(TreesEqual(latest->root(), v.root()));
    EXPECT_EQ(latest->Digest(), digest);
  }
  // The file is now format 2 and opens in place.
  std::ifstream in(path, std::ios::binary);
  char magic[4];
  in.read(magic, 4);
  EXPECT_EQ(DecodeFixed32(magic), kSnapshotMagic);
  auto opened = OpenSnapshotFile(path);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_TRUE(TreesEqual(opened->root(), v.root()));

  // A file of an unknown format is named as such (and skipped by Open).
  std::string future = dir + "/checkpoint-00000000000000000009.snap";
  std::ofstream(future, std::ios::binary) << "CBK9 and then some bytes";
  auto store = Store::Open(tmp.path(), o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->Latest("rand")->number(), 7u);
}

TEST(TreeBlocks, SnapshotIsTheCheckpointFileThenTheWalTail) {
  TempDir leader_dir, replica_dir;
  StoreOptions o;
  o.checkpoint_every_commits = 0;
  o.fsync = FsyncPolicy::kNone;
  auto leader = Store::Open(leader_dir.path(), o);
  ASSERT_TRUE(leader.ok());
  ASSERT_TRUE((*leader)->CreateTree("t").ok());
  auto commit = [&](int i) {
    auto txn = (*leader)->Begin("t");
    ASSERT_TRUE(txn.ok());
    auto child = txn->AppendChild({});
    ASSERT_TRUE(child.ok());
    ASSERT_TRUE(txn->PutAttribute(*child, "n", std::to_string(i)).ok());
    ASSERT_TRUE((*leader)->Commit(std::move(*txn)).ok());
  };
  for (int i = 1; i <= 30; ++i) commit(i);
  EXPECT_TRUE((*leader)->NewestCheckpoint("t").status().IsNotFound());
  ASSERT_TRUE((*leader)->Checkpoint("t").ok());
  for (int i = 31; i <= 45; ++i) commit(i);

  auto cp = (*leader)->NewestCheckpoint("t");
  ASSERT_TRUE(cp.ok()) << cp.status().ToString();
  EXPECT_EQ(cp->number(), 30u);
  EXPECT_TRUE(cp->root()->lazy());
  // The stream is the checkpoint file, byte for byte.
  std::string file;
  {
    std::ifstream in(leader_dir.path() + "/trees/t/checkpoint-00000000000000000030.snap", std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto chunks = EncodeSnapshotChunks(*cp);
  EXPECT_EQ(Join(chunks), file);

  // A replica installs it and applies the WAL tail: it is then the leader's latest.
  auto replica = Store::Open(replica_dir.path(), o);
  ASSERT_TRUE(replica.ok());
  auto inst = (*replica)->BeginSnapshotInstall("t");
  ASSERT_TRUE(inst.ok());
  for (const auto& c : chunks) ASSERT_TRUE((*inst)->AddChunk(c).ok());
  auto installed = (*inst)->Finish();
  ASSERT_TRUE(installed.ok()) << installed.status().ToString();
  EXPECT_TRUE(installed->root()->lazy());  // served from the file, nothing decoded
  auto tail = (*leader)->ReadDeltasSince("t", 30, 1 << 20);
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  ASSERT_EQ(tail->size(), 15u);
  for (const auto& d : *tail) ASSERT_TRUE((*replica)->ApplyEncodedDelta(d).ok());
  EXPECT_EQ((*replica)->Latest("t")->Digest(), (*leader)->Latest("t")->Digest());
  EXPECT_EQ((*replica)->Latest("t")->number(), 45u);
  // A newer checkpoint replaces the cached one.
  ASSERT_TRUE((*leader)->Checkpoint("t").ok());
  EXPECT_EQ((*leader)->NewestCheckpoint("t")->number(), 45u);
}

}  // namespace
}  // namespace canopy::tree
