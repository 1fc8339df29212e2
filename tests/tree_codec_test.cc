// Delta and snapshot codecs: round trips, and detection of every single-byte
// flip and every truncation (tree/delta.h, tree/snapshot.h).
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "base/coding.h"
#include "base/crc32c.h"
#include "tests/testing/test_util.h"
#include "tree/delta.h"
#include "tree/snapshot.h"
#include "tree/transaction.h"

namespace canopy::tree {
namespace {

Delta SampleDelta() {
  Delta d;
  d.tree = "users";
  d.base_version = 41;
  d.new_version = 42;
  d.ops = {Op::AppendChild({}),
           Op::InsertChild({0}, 0),
           Op::PutAttribute({0, 0}, "name", std::string("bin\0ary", 7)),
           Op::PutAttribute({0}, "", ""),
           Op::DeleteAttribute({1, 2, 300}, "gone"),
           Op::DeleteChild({7}, 123456789)};
  return d;
}

// A pseudo-random tree of about `nodes` nodes with attributes of varied sizes.
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

TEST(TreeCodec, DeltaRoundTrip) {
  Delta d = SampleDelta();
  std::string enc = EncodeDelta(d);
  auto back = DecodeDelta(enc);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, d);

  Delta empty;
  auto e = DecodeDelta(EncodeDelta(empty));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, empty);
  EXPECT_EQ(EncodeDelta(empty).size(), kDeltaMinBytes);
}

// DecodeDeltaView reads what DecodeDelta reads, without copying: names,
// keys and values are views into the encoding; the same inputs are refused.
TEST(TreeCodec, DeltaViewReadsTheEncodingInPlace) {
  Delta d = SampleDelta();
  d.request = RequestId{"client-7-00ff", 42};
  const std::string enc = EncodeDelta(d);
  auto view = DecodeDeltaView(enc);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  auto inside = [&](std::string_view v) {
    return v.empty() || (v.data() >= enc.data() && v.data() + v.size() <= enc.data() + enc.size());
  };
  EXPECT_EQ(view->tree, d.tree);
  EXPECT_TRUE(inside(view->tree));
  EXPECT_EQ(view->base_version, d.base_version);
  EXPECT_EQ(view->new_version, d.new_version);
  EXPECT_EQ(view->request_client, d.request.client);
  EXPECT_TRUE(inside(view->request_client));
  EXPECT_EQ(view->request_sequence, 42u);
  ASSERT_EQ(view->ops.size(), d.ops.size());
  for (size_t i = 0; i < d.ops.size(); ++i) {
    EXPECT_EQ(view->ops[i].type, d.ops[i].type) << i;
    EXPECT_EQ(view->ops[i].path, d.ops[i].path) << i;
    EXPECT_EQ(view->ops[i].index, d.ops[i].index) << i;
    EXPECT_EQ(view->ops[i].key, d.ops[i].key) << i;
    EXPECT_EQ(view->ops[i].value, d.ops[i].value) << i;
    EXPECT_TRUE(inside(view->ops[i].key) && inside(view->ops[i].value)) << i;
  }
  // Applied, the views give the tree the Ops give.
  auto by_ops =
      ApplyOps(Node::Empty(), std::vector<Op>{Op::AppendChild({}), Op::PutAttribute({0}, "k", "v")});
  Delta two{"t", 0, 1, {Op::AppendChild({}), Op::PutAttribute({0}, "k", std::string(100000, 'v'))}, {}};
  const std::string two_enc = EncodeDelta(two);
  auto two_view = DecodeDeltaView(two_enc);
  ASSERT_TRUE(two_view.ok());
  auto a = ApplyOps(Node::Empty(), two.ops);
  auto b = ApplyOps(Node::Empty(), two_view->ops);
  ASSERT_TRUE(a.ok() && b.ok() && by_ops.ok());
  EXPECT_EQ(Version("t", 1, *a).Digest(), Version("t", 1, *b).Digest());
  auto bad = ApplyOps(Node::Empty(),
                      DecodeDeltaView(EncodeDelta(Delta{"t", 0, 1, {Op::DeleteChild({}, 3)}, {}}))->ops);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  // Every truncation and every flipped byte is refused, as by DecodeDelta.
  for (size_t n = 0; n < enc.size(); ++n)
    EXPECT_TRUE(DecodeDeltaView(enc.substr(0, n)).status().IsCorruption()) << n;
  for (size_t i = 0; i < enc.size(); ++i) {
    std::string flipped = enc;
    flipped[i] ^= 0x01;
    EXPECT_FALSE(DecodeDeltaView(flipped).ok()) << i;
  }
}

TEST(TreeCodec, DeltaWithRequestIdRoundTripsAndKeepsTheOldFormatWithout) {
  Delta d = SampleDelta();
  std::string plain = EncodeDelta(d);
  EXPECT_EQ(DecodeFixed32(plain.data()), kDeltaMagic);  // no request id: the format older WALs hold
  d.request = RequestId{"client-7-00ff", 42};
  std::string enc = EncodeDelta(d);
  EXPECT_EQ(DecodeFixed32(enc.data()), kDeltaWithRequestMagic);
  auto back = DecodeDelta(enc);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, d);
  EXPECT_EQ(back->request.sequence, 42u);
  for (size_t n = 0; n < enc.size(); ++n) EXPECT_TRUE(DecodeDelta(enc.substr(0, n)).status().IsCorruption()) << n;
  for (size_t i = 0; i < enc.size(); ++i) {
    std::string bad = enc;
    bad[i] = static_cast<char>(bad[i] ^ 0x80);
    EXPECT_TRUE(DecodeDelta(bad).status().IsCorruption()) << i;
  }
}

TEST(TreeCodec, DeltaEverySingleByteFlipIsDetected) {
  std::string enc = EncodeDelta(SampleDelta());
  for (size_t i = 0; i < enc.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      std::string bad = enc;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      auto r = DecodeDelta(bad);
      ASSERT_FALSE(r.ok()) << "flip of byte " << i << " mask " << int(mask) << " went unnoticed";
      EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
    }
  }
}

TEST(TreeCodec, DeltaEveryTruncationAndExtensionIsDetected) {
  std::string enc = EncodeDelta(SampleDelta());
  for (size_t n = 0; n < enc.size(); ++n) {
    auto r = DecodeDelta(std::string_view(enc).substr(0, n));
    ASSERT_FALSE(r.ok()) << "truncation to " << n << " bytes went unnoticed";
    EXPECT_TRUE(r.status().IsCorruption());
  }
  EXPECT_TRUE(DecodeDelta(enc + "x").status().IsCorruption());
}

// A run of encodings laid end to end (WAL records as a replica receives
// them) splits back into exactly those encodings; a run cut anywhere but
// at a record's end, or with a bad magic or length field, is refused.
TEST(TreeCodec, DeltaRunSplitsIntoItsRecordsAndRefusesBrokenOnes) {
  std::vector<std::string> records;
  for (int i = 0; i < 4; ++i) {
    Delta d = SampleDelta();
    d.base_version = 10 + static_cast<uint64_t>(i);
    d.new_version = d.base_version + 1;
    if (i == 2) d.request = RequestId{"client-9", 3};
    if (i == 3) d.ops.resize(1);
    records.push_back(EncodeDelta(d));
  }
  std::string run;
  std::set<size_t> ends;
  for (const auto& r : records) {
    run += r;
    ends.insert(run.size());
  }
  auto split = SplitDeltaRun(run);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  ASSERT_EQ(split->size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) EXPECT_EQ((*split)[i], records[i]) << i;
  EXPECT_TRUE(SplitDeltaRun("").status().IsCorruption());
  for (size_t n = 1; n < run.size(); ++n) {
    auto cut = SplitDeltaRun(std::string_view(run).substr(0, n));
    if (ends.count(n)) {
      EXPECT_TRUE(cut.ok()) << n;  // a shorter run of whole records (the count in the message catches it)
    } else {
      EXPECT_TRUE(cut.status().IsCorruption()) << "cut at " << n;
    }
  }
  // Bad magic or length field in the second record.
  const size_t second = records[0].size();
  for (size_t at : {second, second + 4, second + 5, second + 7}) {
    std::string bad = run;
    bad[at] = static_cast<char>(bad[at] ^ 0x40);
    EXPECT_TRUE(SplitDeltaRun(bad).status().IsCorruption()) << at;
  }
  std::string small = run;
  small[second + 4] = 3;  // a length below any delta's size
  small[second + 5] = small[second + 6] = small[second + 7] = 0;
  EXPECT_TRUE(SplitDeltaRun(small).status().IsCorruption());
}

// The header-only read (WAL scans that hand records on whole) sees the same
// identity as DecodeDelta, with or without a request id, and refuses every
// flipped byte and every truncation just as DecodeDelta does.
TEST(TreeCodec, DeltaHeaderReadsTheIdentityAndCatchesEveryFlipAndCut) {
  for (bool with_request : {false, true}) {
    Delta d = SampleDelta();
    if (with_request) d.request = RequestId{"client-9", 3};
    const std::string enc = EncodeDelta(d);
    auto h = DecodeDeltaHeader(enc);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->tree, d.tree);
    EXPECT_EQ(h->base_version, d.base_version);
    EXPECT_EQ(h->new_version, d.new_version);
    for (size_t n = 0; n < enc.size(); ++n) {
      EXPECT_TRUE(DecodeDeltaHeader(std::string_view(enc).substr(0, n)).status().IsCorruption()) << n;
    }
    EXPECT_TRUE(DecodeDeltaHeader(enc + "x").status().IsCorruption());
    for (size_t i = 0; i < enc.size(); ++i) {
      std::string bad = enc;
      bad[i] = static_cast<char>(bad[i] ^ 0x01);
      EXPECT_TRUE(DecodeDeltaHeader(bad).status().IsCorruption()) << i;
    }
  }
}

TEST(TreeCodec, DeltaHugeCountsWithValidCrcDoNotAllocate) {
  // A well-formed frame (right length and CRC) whose op count claims 2^60 ops.
  std::string body;
  PutFixed32(&body, kDeltaMagic);
  PutFixed32(&body, 0);
  PutLengthPrefixed(&body, "t");
  PutFixed64(&body, 1);
  PutFixed64(&body, 2);
  PutVarint64(&body, uint64_t{1} << 60);
  EncodeFixed32(body.data() + 4, static_cast<uint32_t>(body.size() + 4));
  PutFixed32(&body, crc32c::Value(body));
  auto r = DecodeDelta(body);
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
}

TEST(TreeCodec, SnapshotRoundTripAcrossChunkSizes) {
  Version v = RandomTree(3000, 1, 300);
  for (size_t chunk : {size_t{64}, size_t{100}, size_t{4096}, kDefaultSnapshotChunkBytes}) {
    auto chunks = EncodeSnapshotChunks(v, chunk);
    ASSERT_GE(chunks.size(), 3u);  // HEAD, NODES..., TAIL
    // Blocks are cut at the chunk size; only a block holding one record
    // larger than that (here at most 4 attributes of 300 bytes) is longer.
    for (const auto& c : chunks) EXPECT_LE(c.size(), std::max({chunk, kMinSnapshotChunkBytes, size_t{1400}}));
    auto back = DecodeSnapshotChunks(chunks);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->tree(), "rand");
    EXPECT_EQ(back->number(), 7u);
    EXPECT_TRUE(TreesEqual(back->root(), v.root()));
    EXPECT_EQ(back->Digest(), v.Digest());
  }
}

TEST(TreeCodec, SnapshotOfAnEmptyTreeAndOfAHugeAttribute) {
  Version empty("e", 0, Node::Empty());
  auto back = DecodeSnapshotChunks(EncodeSnapshotChunks(empty, 64));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(CountNodes(back->root()), 1u);

  // A record never spans blocks: the 3 MiB value gets a block of its own,
  // and the other records stay in blocks of at most 64 KiB.
  Transaction txn(Version("big", 0, Node::Empty()));
  ASSERT_TRUE(txn.AppendChild({}).ok());
  ASSERT_TRUE(txn.PutAttribute({0}, "blob", testing::RandomBytes(3 << 20, 9)).ok());
  Version big("big", 1, txn.root());
  auto chunks = EncodeSnapshotChunks(big, 64 << 10);
  size_t large = 0;
  for (const auto& c : chunks) large += c.size() > (64 << 10) ? 1 : 0;
  EXPECT_EQ(large, 1u);
  auto b = DecodeSnapshotChunks(chunks);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(TreesEqual(b->root(), big.root()));
}

TEST(TreeCodec, EveryChunkRespectsTheSizeBoundEvenWithTheLongestName) {
  Version v = RandomTree(500, 4, 30);  // every record fits in the smallest block
  Version named(std::string(200, 'n'), 3, v.root());
  auto chunks = EncodeSnapshotChunks(named, 1);  // clamped to kMinSnapshotChunkBytes
  ASSERT_GT(chunks.size(), 10u);
  for (const auto& c : chunks) EXPECT_LE(c.size(), kMinSnapshotChunkBytes);
  auto back = DecodeSnapshotChunks(chunks);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tree(), named.tree());
  EXPECT_EQ(back->Digest(), v.Digest());
}

TEST(TreeCodec, DigestIsIndependentOfHistory) {
  Transaction a(Version("t", 0, Node::Empty()));
  ASSERT_TRUE(a.AppendChild({}).ok());
  ASSERT_TRUE(a.PutAttribute({0}, "x", "1").ok());
  Transaction b(Version("t", 0, Node::Empty()));
  ASSERT_TRUE(b.AppendChild({}).ok());
  ASSERT_TRUE(b.AppendChild({}).ok());
  ASSERT_TRUE(b.PutAttribute({1}, "x", "0").ok());
  ASSERT_TRUE(b.PutAttribute({1}, "x", "1").ok());
  ASSERT_TRUE(b.DeleteChild({}, 0).ok());
  EXPECT_EQ(Version("t", 1, a.root()).Digest(), Version("t", 9, b.root()).Digest());
  ASSERT_TRUE(b.PutAttribute({0}, "x", "2").ok());
  EXPECT_NE(Version("t", 1, a.root()).Digest(), Version("t", 9, b.root()).Digest());
}

// Feeds chunks to a fresh reader; returns the first error (AddChunk or Finish).
Status DecodeAll(const std::vector<std::string>& chunks) {
  SnapshotReader reader;
  for (const auto& c : chunks) CANOPY_RETURN_IF_ERROR(reader.AddChunk(c));
  return reader.Finish().status();
}

TEST(TreeCodec, SnapshotEverySingleByteFlipIsDetected) {
  Version v = RandomTree(40, 2);
  auto chunks = EncodeSnapshotChunks(v, 128);
  ASSERT_GE(chunks.size(), 4u);
  ASSERT_TRUE(DecodeAll(chunks).ok());
  size_t checked = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (size_t i = 0; i < chunks[c].size(); ++i) {
      auto bad = chunks;
      bad[c][i] = static_cast<char>(bad[c][i] ^ 0x5a);
      Status s = DecodeAll(bad);
      ASSERT_FALSE(s.ok()) << "flip of chunk " << c << " byte " << i << " went unnoticed";
      EXPECT_TRUE(s.IsCorruption()) << s.ToString();
      ++checked;
    }
  }
  EXPECT_GT(checked, 500u);
}

TEST(TreeCodec, SnapshotEveryTruncationIsDetected) {
  Version v = RandomTree(40, 3);
  auto chunks = EncodeSnapshotChunks(v, 128);
  // Truncating any chunk at any offset.
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (size_t n = 0; n < chunks[c].size(); ++n) {
      auto bad = chunks;
      bad[c].resize(n);
      Status s = DecodeAll(bad);
      ASSERT_FALSE(s.ok()) << "chunk " << c << " cut to " << n << " bytes went unnoticed";
      EXPECT_TRUE(s.IsCorruption());
    }
  }
  // Stopping the stream after any number of whole chunks, dropping or
  // repeating a chunk.
  for (size_t keep = 0; keep < chunks.size(); ++keep) {
    std::vector<std::string> prefix(chunks.begin(), chunks.begin() + static_cast<std::ptrdiff_t>(keep));
    EXPECT_TRUE(DecodeAll(prefix).IsCorruption()) << keep;
  }
  for (size_t drop = 0; drop < chunks.size(); ++drop) {
    auto bad = chunks;
    bad.erase(bad.begin() + static_cast<std::ptrdiff_t>(drop));
    EXPECT_TRUE(DecodeAll(bad).IsCorruption()) << drop;
    auto dup = chunks;
    dup.insert(dup.begin() + static_cast<std::ptrdiff_t>(drop), chunks[drop]);
    EXPECT_TRUE(DecodeAll(dup).IsCorruption()) << drop;
  }
}

TEST(TreeCodec, SnapshotChunkLengthChecksTheFrame) {
  auto chunks = EncodeSnapshotChunks(Version("t", 1, Node::Empty()));
  auto len = SnapshotChunkLength(chunks[0]);
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(*len, chunks[0].size());
  EXPECT_TRUE(SnapshotChunkLength("abc").status().IsCorruption());
  std::string huge = chunks[0].substr(0, 8);
  EncodeFixed32(huge.data() + 4, 0xffffffffu);
  EXPECT_TRUE(SnapshotChunkLength(huge).status().IsCorruption());
}

TEST(TreeCodec, RandomGarbageNeverCrashesTheDecoders) {
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    std::string junk = testing::RandomBytes(seed % 300, seed);
    EXPECT_FALSE(DecodeDelta(junk).ok());
    SnapshotReader r;
    (void)r.AddChunk(junk);
    EXPECT_FALSE(r.Finish().ok());
  }
}

}  // namespace
}  // namespace canopy::tree
