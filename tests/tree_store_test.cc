// Store: commits, conflicts, WAL reads and truncation, recovery, checkpoints,
// snapshot installs, policies and concurrency (tree/store.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "base/file.h"
#include "tests/testing/test_util.h"
#include "tree/store.h"
#include "tree/wal_impl.h"

namespace canopy::tree {
namespace {

namespace fs = std::filesystem;
using canopy::testing::TempDir;

StoreOptions Opts(FsyncPolicy p = FsyncPolicy::kAlways) {
  StoreOptions o;
  o.fsync = p;
  o.checkpoint_every_commits = 0;
  return o;
}

std::unique_ptr<Store> OpenOrDie(const std::string& dir, const StoreOptions& o) {
  auto s = Store::Open(dir, o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// Commit i appends a child with attribute n=i and sets root attribute last=i.
Result<CommitResult> CommitNumbered(Store& store, std::string_view tree, std::string payload = "") {
  CANOPY_ASSIGN_OR_RETURN(Transaction txn, store.Begin(tree));
  std::string n = std::to_string(txn.base().number() + 1);
  CANOPY_ASSIGN_OR_RETURN(NodePath child, txn.AppendChild({}));
  CANOPY_RETURN_IF_ERROR(txn.PutAttribute(child, "n", n));
  if (!payload.empty()) CANOPY_RETURN_IF_ERROR(txn.PutAttribute(child, "payload", payload));
  CANOPY_RETURN_IF_ERROR(txn.PutAttribute({}, "last", n));
  return store.Commit(std::move(txn));
}

// The numbered-commit invariant: version v has v children, child i has n=i+1.
void ExpectNumbered(const Version& v) {
  ASSERT_EQ(v.root()->child_count(), v.number());
  if (v.number() > 0) {
    auto last = v.root()->attribute("last");
    ASSERT_TRUE(last.has_value());
    EXPECT_EQ(*last, std::to_string(v.number()));
  }
  for (uint64_t i = 0; i < v.number(); ++i) {
    auto n = v.root()->child(i)->attribute("n");
    ASSERT_TRUE(n.has_value()) << i;
    ASSERT_EQ(*n, std::to_string(i + 1));
  }
}

std::vector<std::string> Files(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TreeStore, CreateCommitAndReopen) {
  TempDir tmp;
  uint64_t digest;
  {
    auto store = OpenOrDie(tmp.path(), Opts());
    EXPECT_TRUE(store->CreateTree("users").ok());
    EXPECT_TRUE(store->CreateTree("orders").ok());
    EXPECT_EQ(store->CreateTree("users").code(), StatusCode::kAlreadyExists);
    EXPECT_EQ(store->CreateTree("../x").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->CreateTree("").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->ListTrees(), (std::vector<std::string>{"orders", "users"}));
    EXPECT_TRUE(store->Latest("nope").status().IsNotFound());
    EXPECT_EQ(*store->LatestVersion("users"), 0u);
    for (int i = 0; i < 20; ++i) {
      auto r = CommitNumbered(*store, "users");
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->version, static_cast<uint64_t>(i + 1));
      auto d = DecodeDelta(r->encoded_delta);
      ASSERT_TRUE(d.ok());
      EXPECT_EQ(d->new_version, r->version);
    }
    EXPECT_EQ(*store->DurableVersion("users"), 20u);
    digest = store->Latest("users")->Digest();
    // A second Store on the same directory is refused.
    EXPECT_TRUE(Store::Open(tmp.path(), Opts()).status().IsUnavailable());
  }
  auto store = OpenOrDie(tmp.path(), Opts());
  EXPECT_EQ(store->ListTrees(), (std::vector<std::string>{"orders", "users"}));
  auto v = store->Latest("users");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->number(), 20u);
  EXPECT_EQ(v->Digest(), digest);
  ExpectNumbered(*v);
  EXPECT_EQ(*store->LatestVersion("orders"), 0u);
  ASSERT_TRUE(CommitNumbered(*store, "users").ok());
  ExpectNumbered(*store->Latest("users"));
}

std::vector<Op> PutRoot(const std::string& key, const std::string& value) {
  return {Op::PutAttribute({}, key, value)};
}

TEST(TreeStore, CommitOpsAppliesOnTheNewestVersionAndChecksAnExpectedBase) {
  TempDir tmp;
  auto store = OpenOrDie(tmp.path(), Opts());
  ASSERT_TRUE(store->CreateTree("t").ok());
  auto a = store->CommitOps("t", PutRoot("a", "1"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->version, 1u);
  EXPECT_FALSE(a->duplicate);
  auto b = store->CommitOps("t", PutRoot("b", "2"), {}, 1);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->version, 2u);
  EXPECT_TRUE(store->CommitOps("t", PutRoot("c", "3"), {}, 1).status().IsConflict());
  EXPECT_EQ(store->CommitOps("t", {Op::DeleteAttribute({}, "nope")}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*store->LatestVersion("t"), 2u);
  EXPECT_TRUE(store->CommitOps("missing", PutRoot("a", "1")).status().IsNotFound());
}

Store::OpsCommit Put(const std::string& key, const std::string& value, RequestId id = {}, uint64_t base = 0) {
  return Store::OpsCommit{PutRoot(key, value), std::move(id), base};
}

TEST(TreeStore, CommitOpsBatchAppliesEachCommitInOrderWithOneWalWrite) {
  TempDir tmp;
  std::vector<std::string> encoded;
  {
    auto store = OpenOrDie(tmp.path(), Opts());
    ASSERT_TRUE(store->CreateTree("t").ok());
    ASSERT_TRUE(store->CommitOps("t", PutRoot("before", "x")).ok());
    std::vector<Store::OpsCommit> batch;
    for (int i = 0; i < 5; ++i) batch.push_back(Put("k" + std::to_string(i), "v" + std::to_string(i)));
    auto results = store->CommitOpsBatch("t", std::move(batch));
    ASSERT_EQ(results.size(), 5u);
    for (size_t i = 0; i < results.size(); ++i) {
      ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status().ToString();
      EXPECT_EQ(results[i]->version, 2 + i);
      EXPECT_FALSE(results[i]->duplicate);
      encoded.push_back(results[i]->encoded_delta);
    }
    EXPECT_EQ(*store->LatestVersion("t"), 6u);
    EXPECT_EQ(*store->DurableVersion("t"), 6u);  // kAlways: synced on return
    // Every version of the batch is readable on its own, each with what it added.
    for (uint64_t v = 2; v <= 6; ++v) {
      auto at = store->At("t", v);
      ASSERT_TRUE(at.ok()) << at.status().ToString();
      EXPECT_EQ(at->root()->attribute_count(), v);
      EXPECT_EQ(at->root()->attribute("k" + std::to_string(v - 2)), "v" + std::to_string(v - 2));
    }
    // The WAL holds them as single commits would: one record per version.
    auto deltas = store->ReadDeltasSince("t", 1);
    ASSERT_TRUE(deltas.ok()) << deltas.status().ToString();
    EXPECT_EQ(*deltas, encoded);
    auto tail = store->ReadDeltasSince("t", 4);
    ASSERT_TRUE(tail.ok());
    EXPECT_EQ(*tail, std::vector<std::string>(encoded.begin() + 3, encoded.end()));
  }
  // A reopen recovers them all.
  auto reopened = OpenOrDie(tmp.path(), Opts());
  auto latest = reopened->Latest("t");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->number(), 6u);
  EXPECT_EQ(latest->root()->attribute("k4"), "v4");
  EXPECT_EQ(latest->root()->attribute("before"), "x");
  // An empty batch is no commit.
  EXPECT_TRUE(reopened->CommitOpsBatch("t", {}).empty());
  EXPECT_EQ(*reopened->LatestVersion("t"), 6u);
}

TEST(TreeStore, CommitOpsBatchFailsCommitsOneByOneAndKnowsItsOwnRequestIds) {
  TempDir tmp;
  auto store = OpenOrDie(tmp.path(), Opts());
  ASSERT_TRUE(store->CreateTree("t").ok());
  const RequestId old_id{"client-b", 1}, new_id{"client-b", 2};
  ASSERT_TRUE(store->CommitOps("t", PutRoot("a", "1"), old_id).ok());  // version 1
  std::vector<Store::OpsCommit> batch;
  batch.push_back(Put("b", "2", new_id));                             // 2
  batch.push_back(Store::OpsCommit{{Op::DeleteAttribute({}, "nope")}, {}, 0});  // InvalidArgument
  batch.push_back(Put("c", "3", {}, 1));                              // stale base: Conflict
  batch.push_back(Put("d", "4", {}, 2));                              // base 2 is the newest by now: 3
  batch.push_back(Put("a", "again", old_id));                         // duplicate of version 1
  batch.push_back(Put("b", "again", new_id));                         // duplicate within the batch: 2
  auto results = store->CommitOpsBatch("t", std::move(batch));
  ASSERT_EQ(results.size(), 6u);
  ASSERT_TRUE(results[0].ok());
  EXPECT_EQ(results[0]->version, 2u);
  EXPECT_EQ(results[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(results[2].status().IsConflict());
  ASSERT_TRUE(results[3].ok()) << results[3].status().ToString();
  EXPECT_EQ(results[3]->version, 3u);
  ASSERT_TRUE(results[4].ok());
  EXPECT_TRUE(results[4]->duplicate);
  EXPECT_EQ(results[4]->version, 1u);
  ASSERT_TRUE(results[5].ok());
  EXPECT_TRUE(results[5]->duplicate);
  EXPECT_EQ(results[5]->version, 2u);
  auto latest = store->Latest("t");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->number(), 3u);
  EXPECT_EQ(latest->root()->attribute("a"), "1");
  EXPECT_EQ(latest->root()->attribute("b"), "2");
  EXPECT_FALSE(latest->root()->attribute("c").has_value());
  EXPECT_EQ(latest->root()->attribute("d"), "4");
  // The batch's ids are remembered like any commit's.
  auto retry = store->CommitOps("t", PutRoot("b", "later"), new_id);
  ASSERT_TRUE(retry.ok());
  EXPECT_TRUE(retry->duplicate);
  EXPECT_EQ(retry->version, 2u);
  // An unknown tree fails every commit.
  std::vector<Store::OpsCommit> lost;
  lost.push_back(Put("x", "1"));
  lost.push_back(Put("y", "2"));
  auto missing = store->CommitOpsBatch("missing", std::move(lost));
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_TRUE(missing[0].status().IsNotFound());
  EXPECT_TRUE(missing[1].status().IsNotFound());
}

TEST(TreeStore, ConcurrentCommitOpsBatchesAndSingleCommitsNeverConflict) {
  TempDir tmp;
  auto store = OpenOrDie(tmp.path(), Opts());
  ASSERT_TRUE(store->CreateTree("t").ok());
  constexpr int kThreads = 4, kBatches = 20, kEach = 5;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      for (int b = 0; b < kBatches; ++b) {
        std::string prefix = std::to_string(k) + "/" + std::to_string(b) + "/";
        if (k % 2 == 0) {
          std::vector<Store::OpsCommit> batch;
          for (int i = 0; i < kEach; ++i) batch.push_back(Put(prefix + std::to_string(i), "v"));
          for (auto& r : store->CommitOpsBatch("t", std::move(batch))) failures += !r.ok();
        } else {
          for (int i = 0; i < kEach; ++i) failures += !store->CommitOps("t", PutRoot(prefix + std::to_string(i), "v")).ok();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  constexpr uint64_t kAll = kThreads * kBatches * kEach;
  EXPECT_EQ(*store->LatestVersion("t"), kAll);
  EXPECT_EQ(*store->DurableVersion("t"), kAll);
  EXPECT_EQ((*store->Latest("t")).root()->attribute_count(), size_t{kAll});
  // The WAL is one record per version, in order, and a reopen agrees.
  auto deltas = store->ReadDeltasSince("t", 0);
  ASSERT_TRUE(deltas.ok());
  EXPECT_EQ(deltas->size(), size_t{kAll});
  store.reset();
  auto reopened = OpenOrDie(tmp.path(), Opts());
  EXPECT_EQ((*reopened->Latest("t")).root()->attribute_count(), size_t{kAll});
}

// `count` commits to tree "t", each putting a ~1 KiB value in the root;
// their encoded deltas (fewer if a commit fails).
std::vector<std::string> CommitKilobyteValues(Store& store, int count) {
  std::vector<std::string> written;
  for (int i = 0; i < count; ++i) {
    auto r = store.CommitOps("t", PutRoot("k" + std::to_string(i), std::string(1000, 'a' + i % 26)));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) break;
    written.push_back(r->encoded_delta);
  }
  return written;
}

TEST(TreeStore, ReadDeltasSinceGivesTheWalsRecordsWhetherRecentOrOld) {
  TempDir tmp;
  auto store = OpenOrDie(tmp.path(), Opts(FsyncPolicy::kNone));
  ASSERT_TRUE(store->CreateTree("t").ok());
  // 300 commits of about 1 KiB: more than the store keeps in memory, so the
  // old ones come from the WAL file and the newest from memory.
  const std::vector<std::string> written = CommitKilobyteValues(*store, 300);
  ASSERT_EQ(written.size(), 300u);
  auto all = store->ReadDeltasSince("t", 0);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, written);
  for (uint64_t from : {0u, 100u, 250u, 295u, 299u}) {
    auto some = store->ReadDeltasSince("t", from, 5000);
    ASSERT_TRUE(some.ok()) << from << ": " << some.status().ToString();
    ASSERT_FALSE(some->empty());
    EXPECT_LE(some->size(), 5u);  // stops once max_bytes are collected
    for (size_t i = 0; i < some->size(); ++i) EXPECT_EQ((*some)[i], written[from + i]) << from << "+" << i;
  }
  // A snapshot install replaces the history: nothing before it is served.
  TempDir other;
  auto source = OpenOrDie(other.path(), Opts(FsyncPolicy::kNone));
  ASSERT_TRUE(source->CreateTree("t").ok());
  for (int i = 0; i < 400; ++i) ASSERT_TRUE(source->CommitOps("t", PutRoot("s", std::to_string(i))).ok());
  auto snapshot = source->Latest("t");
  ASSERT_TRUE(snapshot.ok());
  auto installer = store->BeginSnapshotInstall("t");
  ASSERT_TRUE(installer.ok());
  SnapshotWriter writer(*snapshot, 4096);
  std::string chunk;
  while (writer.NextInto(&chunk)) ASSERT_TRUE((*installer)->AddChunk(chunk).ok());
  ASSERT_TRUE((*installer)->Finish().ok());
  EXPECT_TRUE(store->ReadDeltasSince("t", 299).status().IsNotFound());
  auto next = store->CommitOps("t", PutRoot("after", "install"));
  ASSERT_TRUE(next.ok());
  auto after = store->ReadDeltasSince("t", 400);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(*after, std::vector<std::string>{next->encoded_delta});
}

// LocateDeltasSince names the WAL's own bytes for the deltas after a
// version: consecutive whole records of one segment, byte for byte what
// ReadDeltasSince hands out, so that a leader can send them from the file.
TEST(TreeStore, LocateDeltasSinceNamesTheWalsOwnRecords) {
  TempDir tmp;
  StoreOptions o = Opts(FsyncPolicy::kNone);
  o.wal_segment_bytes = 64 << 10;  // several segments of ~60 records
  auto store = OpenOrDie(tmp.path(), o);
  ASSERT_TRUE(store->CreateTree("t").ok());
  const std::vector<std::string> written = CommitKilobyteValues(*store, 300);
  ASSERT_EQ(written.size(), 300u);
  ASSERT_GT(Files(tmp.path() + "/trees/t", "wal-").size(), 3u);
  auto file_bytes = [](const Store::WalDeltaRange& range) {
    std::string bytes(range.length, '\0');
    EXPECT_EQ(::pread(range.file.get(), bytes.data(), bytes.size(), static_cast<off_t>(range.offset)),
              static_cast<ssize_t>(bytes.size()));
    return bytes;
  };
  auto written_from = [&](uint64_t from, uint64_t count) {
    std::string out;
    for (uint64_t v = from; v < from + count; ++v) out += written[v];
    return out;
  };
  // Old positions (the newest ~64 KiB are in memory: nullopt is allowed there only).
  for (uint64_t from : {0u, 1u, 59u, 60u, 100u, 150u, 200u}) {
    for (size_t max_bytes : {size_t{1}, size_t{5000}, size_t{1} << 20}) {
      auto range = store->LocateDeltasSince("t", from, max_bytes);
      ASSERT_TRUE(range.ok()) << from << ": " << range.status().ToString();
      ASSERT_TRUE(range->has_value()) << from;
      const Store::WalDeltaRange& r = **range;
      ASSERT_GE(r.records, 1u) << from;
      EXPECT_EQ(r.first_version, from + 1);
      EXPECT_EQ(r.last_version, from + r.records);
      EXPECT_EQ(file_bytes(r), written_from(from, r.records)) << from << " " << max_bytes;
      // It stops at the first record that reaches max_bytes.
      EXPECT_LT(r.length - written[from + r.records - 1].size(), std::max<size_t>(max_bytes, 1)) << from;
      if (max_bytes == 1) {
        EXPECT_EQ(r.records, 1u);
      }
    }
  }
  // A stream catching up with it from version 0 gets every record once, in order.
  uint64_t sent = 0;
  std::string streamed;
  for (int guard = 0; guard < 400 && sent < written.size(); ++guard) {
    auto range = store->LocateDeltasSince("t", sent, 8000);
    ASSERT_TRUE(range.ok()) << range.status().ToString();
    if (!range->has_value()) {  // in memory: read as copies
      auto copies = store->ReadDeltasSince("t", sent, 8000);
      ASSERT_TRUE(copies.ok());
      ASSERT_FALSE(copies->empty());
      for (const auto& d : *copies) streamed += d;
      sent += copies->size();
      continue;
    }
    ASSERT_GE((*range)->records, 1u);
    streamed += file_bytes(**range);
    sent = (*range)->last_version;
  }
  EXPECT_EQ(sent, written.size());
  EXPECT_EQ(streamed, written_from(0, written.size()));
  // The newest version: no records. Newer than that: InvalidArgument.
  auto none = store->LocateDeltasSince("t", 300, 1 << 20);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(!none->has_value() || (*none)->records == 0);
  EXPECT_TRUE(store->LocateDeltasSince("t", 301, 1 << 20).status().code() == StatusCode::kInvalidArgument);
  // Records are checked before they are named: a damaged body ends the range
  // before it, and a range that would start there is NotFound.
  uint64_t from = 120;
  auto located = store->LocateDeltasSince("t", from, 1 << 20);
  for (; located.ok() && located->has_value() && (*located)->records < 4 && from < 200; from += 3) {
    located = store->LocateDeltasSince("t", from + 3, 1 << 20);
  }
  ASSERT_TRUE(located.ok() && located->has_value() && (*located)->records >= 4);
  const std::string segment =
      std::filesystem::read_symlink("/proc/self/fd/" + std::to_string((*located)->file.get())).string();
  // Inside the third record of the range (written[from + 2], version from + 3).
  const uint64_t damaged = (*located)->offset + written[from].size() + written[from + 1].size() + 40;
  {
    UniqueFd fd(::open(segment.c_str(), O_WRONLY));
    ASSERT_TRUE(fd.valid()) << segment;
    ASSERT_EQ(::pwrite(fd.get(), "X", 1, static_cast<off_t>(damaged)), 1);
  }
  auto before = store->LocateDeltasSince("t", from, 1 << 20);
  ASSERT_TRUE(before.ok() && before->has_value()) << before.status().ToString();
  EXPECT_EQ((*before)->records, 2u);
  EXPECT_TRUE(store->LocateDeltasSince("t", from + 2, 1 << 20).status().IsNotFound());
}

TEST(TreeStore, ConcurrentCommitOpsNeverConflict) {
  TempDir tmp;
  auto store = OpenOrDie(tmp.path(), Opts());
  ASSERT_TRUE(store->CreateTree("t").ok());
  constexpr int kThreads = 8, kEach = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < kEach; ++i) {
        if (!store->CommitOps("t", PutRoot(std::to_string(k) + "/" + std::to_string(i), "v")).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(*store->LatestVersion("t"), uint64_t{kThreads * kEach});
  EXPECT_EQ(*store->DurableVersion("t"), uint64_t{kThreads * kEach});
  EXPECT_EQ((*store->Latest("t")).root()->attribute_count(), size_t{kThreads * kEach});
}

TEST(TreeStore, ARequestIdIsAppliedOnceHereOnAReplicaAndAfterReopen) {
  TempDir tmp;
  const RequestId id{"client-a-1234", 7};
  std::vector<std::string> replicated;
  {
    auto leader = OpenOrDie(tmp.path() + "/leader", Opts());
    ASSERT_TRUE(leader->CreateTree("t").ok());
    auto first = leader->CommitOps("t", PutRoot("k", "v1"), id);
    ASSERT_TRUE(first.ok());
    EXPECT_FALSE(first->duplicate);
    replicated.push_back(first->encoded_delta);
    // The retry: nothing applied, the first version returned (even with a
    // base that is stale by now, and through Commit as well).
    ASSERT_TRUE(leader->CommitOps("t", PutRoot("other", "x")).ok());
    auto again = leader->CommitOps("t", PutRoot("k", "v2"), id, 1);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(again->duplicate);
    EXPECT_EQ(again->version, 1u);
    EXPECT_TRUE(again->encoded_delta.empty());
    auto txn = leader->Begin("t");
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE(txn->PutAttribute({}, "k", "v3").ok());
    auto via_txn = leader->Commit(std::move(*txn), id);
    ASSERT_TRUE(via_txn.ok());
    EXPECT_TRUE(via_txn->duplicate);
    EXPECT_EQ(*leader->LatestVersion("t"), 2u);
    EXPECT_EQ(*(*leader->Latest("t")).root()->attribute("k"), "v1");
    // Another sequence of the same client is a new commit.
    auto next = leader->CommitOps("t", PutRoot("k", "v4"), RequestId{id.client, 8});
    ASSERT_TRUE(next.ok());
    EXPECT_FALSE(next->duplicate);
    EXPECT_EQ(next->version, 3u);
    auto rest = leader->ReadDeltasSince("t", 1);
    ASSERT_TRUE(rest.ok()) << rest.status().ToString();
    replicated.insert(replicated.end(), rest->begin(), rest->end());
  }
  {
    // A replica that applied the deltas (one batch, one sync) knows the ids:
    // were it to take over, the retry would not land twice.
    auto replica = OpenOrDie(tmp.path() + "/replica", Opts());
    ASSERT_TRUE(replica->CreateTree("t").ok());
    auto reached = replica->ApplyEncodedDeltas(std::vector<std::string_view>(replicated.begin(), replicated.end()));
    ASSERT_TRUE(reached.ok()) << reached.status().ToString();
    EXPECT_EQ(*reached, 3u);
    EXPECT_EQ(*replica->DurableVersion("t"), 3u);
    auto retry = replica->CommitOps("t", PutRoot("k", "v5"), id);
    ASSERT_TRUE(retry.ok());
    EXPECT_TRUE(retry->duplicate);
    EXPECT_EQ(retry->version, 1u);
    EXPECT_EQ(*replica->LatestVersion("t"), 3u);
  }
  // After a restart the ids come back from the WAL replay.
  auto reopened = OpenOrDie(tmp.path() + "/replica", Opts());
  auto retry = reopened->CommitOps("t", PutRoot("k", "v6"), RequestId{id.client, 8});
  ASSERT_TRUE(retry.ok());
  EXPECT_TRUE(retry->duplicate);
  EXPECT_EQ(retry->version, 3u);
  EXPECT_EQ(*reopened->LatestVersion("t"), 3u);
}

TEST(TreeStore, ApplyEncodedDeltasStopsAtTheFirstBadDelta) {
  TempDir tmp;
  auto leader = OpenOrDie(tmp.path() + "/l", Opts());
  ASSERT_TRUE(leader->CreateTree("t").ok());
  std::vector<std::string> deltas;
  for (int i = 0; i < 3; ++i) deltas.push_back(leader->CommitOps("t", PutRoot("k", std::to_string(i)))->encoded_delta);
  auto replica = OpenOrDie(tmp.path() + "/r", Opts());
  ASSERT_TRUE(replica->CreateTree("t").ok());
  std::vector<std::string_view> gap = {deltas[0], deltas[2]};
  EXPECT_TRUE(replica->ApplyEncodedDeltas(gap).status().IsConflict());
  EXPECT_EQ(*replica->LatestVersion("t"), 1u);  // the first one stays applied
  EXPECT_EQ(*replica->DurableVersion("t"), 1u);
  std::vector<std::string_view> bad = {deltas[1], "garbage"};
  EXPECT_TRUE(replica->ApplyEncodedDeltas(bad).status().IsCorruption());
  EXPECT_EQ(*replica->LatestVersion("t"), 2u);
  EXPECT_EQ(replica->ApplyEncodedDeltas({}).status().code(), StatusCode::kInvalidArgument);
}

// A run of deltas in the caller's buffer (as a replica receives its
// leader's WAL records): large values are kept where they lie and the store
// takes the buffer only when they are at least half of it; otherwise, or
// when no version kept one, the buffer is the caller's again and the tree
// holds copies. Either way the tree, its WAL and a reopened replica are the
// leader's.
TEST(TreeStore, ApplyEncodedDeltasInPlaceKeepsLargeValuesInTheBufferTheyLandedIn) {
  TempDir tmp;
  auto leader = OpenOrDie(tmp.path() + "/l", Opts(FsyncPolicy::kNone));
  ASSERT_TRUE(leader->CreateTree("t").ok());
  // A run laid end to end in a heap buffer, as a replica receives it.
  struct Run {
    std::unique_ptr<char[]> buffer;
    size_t bytes = 0;
    std::vector<std::string_view> deltas;
  };
  auto run_of = [](const std::vector<std::string>& encoded) {
    Run r;
    for (const auto& e : encoded) r.bytes += e.size();
    r.buffer = std::make_unique<char[]>(r.bytes);
    size_t at = 0;
    for (const auto& e : encoded) {
      std::memcpy(r.buffer.get() + at, e.data(), e.size());
      r.deltas.emplace_back(r.buffer.get() + at, e.size());
      at += e.size();
    }
    return r;
  };
  auto commit = [&](std::vector<Op> ops) {
    auto c = leader->CommitOps("t", std::move(ops));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? c->encoded_delta : std::string();
  };
  const std::string big_a = testing::RandomBytes(300 << 10, 1), big_b = testing::RandomBytes(200 << 10, 2);
  // 1: two large values and a small one: kept in place, buffer taken.
  const std::vector<std::string> large_encoded = {
      commit({Op::PutAttribute({}, "a", big_a), Op::PutAttribute({}, "s", "small")}),
      commit({Op::AppendChild({}), Op::PutAttribute({0}, "b", big_b)})};
  Run large = run_of(large_encoded);
  // 2: small values only: copied, buffer left.
  Run small = run_of({commit(PutRoot("s", "one")), commit(PutRoot("s2", std::string(1000, 'x')))});
  // 3: a large value that is less than half of its run: copied.
  std::vector<Op> many;
  for (int i = 0; i < 200; ++i)
    many.push_back(Op::PutAttribute({}, "m" + std::to_string(i), std::string(2000, 'm')));
  Run mostly_small =
      run_of({commit(many), commit({Op::PutAttribute({0}, "c", testing::RandomBytes(70 << 10, 3))})});
  // 4: a large value, then a delta that does not decode.
  const std::string big_d = testing::RandomBytes(100 << 10, 4);
  const std::string with_d = commit({Op::PutAttribute({}, "d", big_d)});
  std::string broken = commit(PutRoot("d2", "d2"));
  broken[broken.size() / 2] ^= 1;
  Run half_bad = run_of({with_d, broken});

  auto replica = OpenOrDie(tmp.path() + "/r", Opts(FsyncPolicy::kNone));
  ASSERT_TRUE(replica->CreateTree("t").ok());
  auto reached = replica->ApplyEncodedDeltasInPlace(large.deltas, &large.buffer, large.bytes);
  ASSERT_TRUE(reached.ok()) << reached.status().ToString();
  EXPECT_EQ(*reached, 2u);
  EXPECT_EQ(large.buffer, nullptr) << "large values are most of the run: the store keeps its buffer";
  for (Run* copied : {&small, &mostly_small}) {
    const char* before = copied->buffer.get();
    reached = replica->ApplyEncodedDeltasInPlace(copied->deltas, &copied->buffer, copied->bytes);
    ASSERT_TRUE(reached.ok()) << reached.status().ToString();
    ASSERT_EQ(copied->buffer.get(), before) << "the buffer stays the caller's";
    std::memset(copied->buffer.get(), 0, copied->bytes);  // the tree must not refer to it
  }
  EXPECT_EQ(*reached, 6u);
  // A run that fails at its first delta (already applied: Conflict) keeps
  // nothing, so the buffer is the caller's again.
  Run replayed = run_of(large_encoded);
  EXPECT_TRUE(replica->ApplyEncodedDeltasInPlace(replayed.deltas, &replayed.buffer, replayed.bytes)
                  .status()
                  .IsConflict());
  EXPECT_NE(replayed.buffer, nullptr);
  // One that fails after a delta with a large value keeps that value.
  auto partly = replica->ApplyEncodedDeltasInPlace(half_bad.deltas, &half_bad.buffer, half_bad.bytes);
  EXPECT_TRUE(partly.status().IsCorruption()) << partly.status().ToString();
  EXPECT_EQ(half_bad.buffer, nullptr);
  EXPECT_EQ(*replica->LatestVersion("t"), 7u);
  auto latest = replica->Latest("t");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->root()->attribute("a"), big_a);
  EXPECT_EQ(latest->root()->child(0)->attribute("b"), big_b);
  EXPECT_EQ(latest->root()->attribute("s2"), std::string(1000, 'x'));
  EXPECT_EQ(latest->root()->attribute("d"), big_d);
  auto leaders_7 = leader->At("t", 7);
  ASSERT_TRUE(leaders_7.ok()) << leaders_7.status().ToString();
  EXPECT_EQ(latest->Digest(), leaders_7->Digest());

  // The replica's WAL holds the records as they came: reopened, the same tree.
  const uint64_t digest = latest->Digest();
  replica.reset();
  replica = OpenOrDie(tmp.path() + "/r", Opts(FsyncPolicy::kNone));
  EXPECT_EQ(replica->Latest("t")->Digest(), digest);
}

// A replica's run of its leader's WAL records written straight into a file
// (as a transport splices it) becomes a segment of its WAL once checked and
// applied; its large values are read through the file, even after the
// segment is gone. A run that is short, damaged, not consecutive, based on
// another version or whose ops do not apply commits nothing, and leaves
// neither a segment nor a staged file behind.
TEST(TreeStore, WalRunLandsInAFileThatBecomesASegmentOnceChecked) {
  TempDir tmp;
  StoreOptions o = Opts(FsyncPolicy::kAlways);
  o.checkpoint_every_commits = 0;
  o.checkpoint_wal_bytes = 0;
  o.wal_segment_bytes = 64 << 10;  // the run's segment is full: later records start another
  o.retention.keep_versions = 1;
  auto leader = OpenOrDie(tmp.path() + "/l", Opts(FsyncPolicy::kNone));
  auto replica = OpenOrDie(tmp.path() + "/r", o);
  ASSERT_TRUE(leader->CreateTree("t").ok());
  ASSERT_TRUE(replica->CreateTree("t").ok());
  auto commit = [&](std::vector<Op> ops, RequestId id = {}) {
    auto c = leader->CommitOps("t", std::move(ops), id);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? c->encoded_delta : std::string();
  };
  const std::string big = testing::RandomBytes(300 << 10, 9);
  const RequestId id{"client-9", 3};
  std::vector<std::string> first = {commit({Op::PutAttribute({}, "big", big)}, id),
                                    commit({Op::AppendChild({}), Op::PutAttribute({0}, "s", "small")})};
  std::vector<std::string> second = {commit({Op::PutAttribute({}, "big", "replaced")}),
                                     commit(PutRoot("x", "y"))};
  auto join = [](const std::vector<std::string>& records) {
    std::string all;
    for (const auto& r : records) all += r;
    return all;
  };
  auto files_in = [](const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      names.push_back(e.path().filename().string());
    return names;
  };
  auto tmp_files = [&] { return files_in(tmp.path() + "/r/tmp").size(); };
  // Runs the bytes as a WalRunWriter would receive them; Commit's result.
  auto run = [&](const std::string& bytes, uint64_t announced_bytes, uint64_t count) {
    auto w = replica->BeginWalRun("t", announced_bytes);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) return Result<uint64_t>(w.status());
    EXPECT_EQ(::pwrite((*w)->fd(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    return (*w)->Commit(count);
  };
  const std::string one = join(first);
  EXPECT_EQ(replica->BeginWalRun("nope", 10).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(replica->BeginWalRun("t", 0).status().code(), StatusCode::kInvalidArgument);
  // Refused, each committing nothing:
  EXPECT_TRUE(run(one.substr(0, one.size() - 1), one.size(), 2).status().IsCorruption());  // short file
  EXPECT_TRUE(run(one, one.size(), 3).status().IsCorruption());                            // count
  std::string flipped = one;
  flipped[one.size() - 10] ^= 1;
  EXPECT_TRUE(run(flipped, one.size(), 2).status().IsCorruption());                     // a record's CRC
  EXPECT_TRUE(run(join({first[1], first[0]}), one.size(), 2).status().IsCorruption());  // order
  EXPECT_TRUE(run(join({first[1]}), first[1].size(), 1).status().IsConflict());         // base
  Delta bad{"t", 0, 1, {Op::DeleteChild({}, 5)}, {}};
  const std::string bad_one = EncodeDelta(bad);
  EXPECT_EQ(run(bad_one, bad_one.size(), 1).status().code(), StatusCode::kInvalidArgument);  // ops
  EXPECT_EQ(*replica->LatestVersion("t"), 0u);
  EXPECT_EQ(tmp_files(), 0u);
  auto segments = [&] {
    size_t n = 0;
    for (const auto& name : files_in(tmp.path() + "/r/trees/t")) n += name.starts_with("wal-") ? 1 : 0;
    return n;
  };
  EXPECT_EQ(segments(), 0u);
  {  // destroyed uncommitted: its file goes
    auto w = replica->BeginWalRun("t", 100);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(tmp_files(), 1u);
  }
  EXPECT_EQ(tmp_files(), 0u);

  auto writer = replica->BeginWalRun("t", one.size());
  ASSERT_TRUE(writer.ok());
  ASSERT_EQ(::pwrite((*writer)->fd(), one.data(), one.size(), 0), static_cast<ssize_t>(one.size()));
  struct stat landed {};
  ASSERT_EQ(::fstat((*writer)->fd(), &landed), 0);
  auto reached = (*writer)->Commit(2);
  ASSERT_TRUE(reached.ok()) << reached.status().ToString();
  EXPECT_EQ(*reached, 2u);
  struct stat segment {};
  ASSERT_EQ(::stat((tmp.path() + "/r/trees/t/" + WalSegmentName(1)).c_str(), &segment), 0);
  EXPECT_EQ(segment.st_ino, landed.st_ino) << "the file the run landed in is the segment: not copied";
  EXPECT_TRUE((*writer)->Commit(2).status().code() == StatusCode::kInvalidArgument);
  writer->reset();
  EXPECT_EQ(*replica->DurableVersion("t"), 2u);
  EXPECT_EQ(segments(), 1u);
  EXPECT_EQ(tmp_files(), 0u);
  Version v2 = *replica->Latest("t");
  EXPECT_EQ(v2.Digest(), leader->At("t", 2)->Digest());
  EXPECT_EQ(v2.root()->attribute("big"), big);
  // The request id came with the record: a retry is a duplicate.
  auto retry = replica->CommitOps("t", PutRoot("k", "v"), id);
  ASSERT_TRUE(retry.ok());
  EXPECT_TRUE(retry->duplicate);
  // Later records append after the run's, in its segment.
  auto next = replica->ApplyEncodedDeltas(std::vector<std::string_view>(second.begin(), second.end()));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(segments(), 2u);
  EXPECT_EQ(replica->Latest("t")->Digest(), leader->Latest("t")->Digest());
  // A checkpoint and the WAL's truncation delete the run's segment; version
  // 2's value, read through the file's mapping, is still there.
  ASSERT_TRUE(replica->Checkpoint("t").ok());
  ASSERT_TRUE(replica->TruncateWalBefore("t", 4).ok());
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/r/trees/t/" + WalSegmentName(1)));
  EXPECT_EQ(v2.root()->attribute("big"), big);
  // Reopened, the checkpoint and the WAL give the same tree.
  replica.reset();
  replica = OpenOrDie(tmp.path() + "/r", o);
  EXPECT_EQ(replica->Latest("t")->Digest(), leader->Latest("t")->Digest());
}

TEST(TreeStore, StaleBaseIsAConflictAndOldVersionsStayReadable) {
  TempDir tmp;
  auto store = OpenOrDie(tmp.path(), Opts(FsyncPolicy::kNone));
  ASSERT_TRUE(store->CreateTree("t").ok());
  ASSERT_TRUE(CommitNumbered(*store, "t").ok());
  Version v1 = *store->Latest("t");

  Transaction a = *store->Begin("t");
  Transaction b = *store->Begin("t");
  ASSERT_TRUE(a.PutAttribute({}, "who", "a").ok());
  ASSERT_TRUE(b.PutAttribute({}, "who", "b").ok());
  ASSERT_TRUE(store->Commit(std::move(a)).ok());
  auto rb = store->Commit(std::move(b));
  EXPECT_TRUE(rb.status().IsConflict()) << rb.status().ToString();
  EXPECT_EQ(*store->Latest("t")->root()->attribute("who"), "a");

  for (int i = 0; i < 10; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
  // v1 is untouched by the eleven later commits.
  EXPECT_EQ(v1.number(), 1u);
  ExpectNumbered(v1);
  EXPECT_FALSE(v1.root()->attribute("who").has_value());
  EXPECT_EQ(store->Latest("t")->number(), 12u);
}

TEST(TreeStore, ReplicaAppliesTheLeadersDeltas) {
  TempDir leader_dir, replica_dir;
  auto leader = OpenOrDie(leader_dir.path(), Opts(FsyncPolicy::kNone));
  auto replica = OpenOrDie(replica_dir.path(), Opts(FsyncPolicy::kNone));
  ASSERT_TRUE(leader->CreateTree("t").ok());
  ASSERT_TRUE(replica->CreateTree("t").ok());
  std::vector<std::string> deltas;
  for (int i = 0; i < 30; ++i) {
    auto r = CommitNumbered(*leader, "t", std::string(static_cast<size_t>(i), 'x'));
    ASSERT_TRUE(r.ok());
    deltas.push_back(r->encoded_delta);
  }
  EXPECT_TRUE(replica->ApplyEncodedDelta(deltas[1]).status().IsConflict());  // base 1, replica at 0
  for (int i = 0; i < 15; ++i) {
    auto applied = replica->ApplyEncodedDelta(deltas[i]);
    ASSERT_TRUE(applied.ok());
    EXPECT_EQ(applied->version, static_cast<uint64_t>(i + 1));
    EXPECT_TRUE(applied->encoded_delta.empty());  // the caller holds those bytes: not copied back
  }
  for (int i = 15; i < 30; ++i) ASSERT_TRUE(replica->ApplyDelta(*DecodeDelta(deltas[i])).ok());
  EXPECT_TRUE(replica->ApplyEncodedDelta(deltas[29]).status().IsConflict());  // duplicate
  EXPECT_EQ(replica->Latest("t")->Digest(), leader->Latest("t")->Digest());

  Delta skip{"t", 30, 32, {}, {}};
  EXPECT_EQ(replica->ApplyDelta(skip).status().code(), StatusCode::kInvalidArgument);
  Delta bad{"t", 30, 31, {Op::DeleteChild({}, 999)}, {}};
  EXPECT_EQ(replica->ApplyDelta(bad).status().code(), StatusCode::kInvalidArgument);
  Delta other{"nope", 30, 31, {}, {}};
  EXPECT_TRUE(replica->ApplyDelta(other).status().IsNotFound());
  std::string corrupt = deltas[0];
  corrupt[10] ^= 1;
  EXPECT_TRUE(replica->ApplyEncodedDelta(corrupt).status().IsCorruption());
  EXPECT_EQ(*replica->LatestVersion("t"), 30u);
}

// A replica applies an encoded delta from its bytes in place (values copied
// once, into the tree); what it commits, the errors it gives and the request
// ids it records are those of the general path.
TEST(TreeStore, ApplyEncodedDeltaInPlaceKeepsTheGeneralPathsResults) {
  TempDir leader_dir, replica_dir;
  auto leader = OpenOrDie(leader_dir.path(), Opts(FsyncPolicy::kNone));
  auto replica = OpenOrDie(replica_dir.path(), Opts(FsyncPolicy::kNone));
  ASSERT_TRUE(leader->CreateTree("t").ok());
  ASSERT_TRUE(replica->CreateTree("t").ok());
  const RequestId request{"client-1", 7};
  std::vector<std::string> deltas;
  for (int i = 0; i < 6; ++i) {
    std::vector<Op> ops = {Op::AppendChild({}),
                           Op::PutAttribute({}, "big" + std::to_string(i), std::string(300000, 'a' + i))};
    auto r = leader->CommitOps("t", ops, i == 3 ? request : RequestId{});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    deltas.push_back(r->encoded_delta);
  }
  ASSERT_TRUE(replica->ApplyEncodedDelta(deltas[0]).ok());
  std::vector<std::string_view> rest(deltas.begin() + 1, deltas.end());
  auto reached = replica->ApplyEncodedDeltas(rest);
  ASSERT_TRUE(reached.ok()) << reached.status().ToString();
  EXPECT_EQ(*reached, 6u);
  EXPECT_EQ(replica->Latest("t")->Digest(), leader->Latest("t")->Digest());
  // The request id of version 4 came with its delta: a retry is a duplicate.
  auto retry = replica->CommitOps("t", {Op::AppendChild({})}, request);
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  EXPECT_TRUE(retry->duplicate);
  EXPECT_EQ(retry->version, 4u);
  // Ops that do not apply to the base: InvalidArgument, nothing committed.
  Delta bad{"t", 6, 7, {Op::DeleteChild({}, 999)}, {}};
  auto refused = replica->ApplyEncodedDelta(EncodeDelta(bad));
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("does not apply"), std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(*replica->LatestVersion("t"), 6u);
  // A delta on another base: Conflict.
  EXPECT_TRUE(replica->ApplyEncodedDelta(deltas[2]).status().IsConflict());
  // The replica's WAL holds the leader's records as they were: a reopened
  // replica recovers the same tree.
  replica.reset();
  replica = OpenOrDie(replica_dir.path(), Opts(FsyncPolicy::kNone));
  EXPECT_EQ(replica->Latest("t")->Digest(), leader->Latest("t")->Digest());
}

// A replica's stream reads the deltas after the version it was last sent,
// batch after batch, while commits go on; the store resumes each read where
// the last one stopped. Every batch must still be exactly the next deltas,
// across segment ends, and after a snapshot install replaced the WAL (the
// remembered positions then point into other files).
TEST(TreeStore, ReadDeltasSinceResumesWhereTheLastReadStopped) {
  TempDir tmp;
  StoreOptions o = Opts();
  o.wal_segment_bytes = 4096;  // a few segments, each holding many deltas
  auto store = OpenOrDie(tmp.path(), o);
  ASSERT_TRUE(store->CreateTree("t").ok());
  std::vector<std::string> committed;
  uint64_t sent = 0;
  auto stream_catch_up = [&](size_t max_bytes) {
    for (int guard = 0; guard < 1000 && sent < committed.size(); ++guard) {
      auto batch = store->ReadDeltasSince("t", sent, max_bytes);
      ASSERT_TRUE(batch.ok()) << batch.status().ToString();
      ASSERT_FALSE(batch->empty());
      for (const std::string& d : *batch) {
        ASSERT_LT(sent, committed.size());
        ASSERT_EQ(d, committed[sent]) << "delta after version " << sent;
        ++sent;
      }
    }
    ASSERT_EQ(sent, committed.size());
  };
  for (int i = 0; i < 200; ++i) {
    committed.push_back(CommitNumbered(*store, "t", std::string(static_cast<size_t>(i % 50), 'v'))->encoded_delta);
    if (i % 3 == 0) stream_catch_up(i % 2 == 0 ? 1 : 200);
  }
  stream_catch_up(1 << 20);
  EXPECT_GT(Files(tmp.path() + "/trees/t", "wal-").size(), 2u);
  // A second reader behind the first, and a re-read of an old position.
  auto again = store->ReadDeltasSince("t", 100);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, std::vector<std::string>(committed.begin() + 100, committed.end()));
  auto early = store->ReadDeltasSince("t", 3, 1);
  ASSERT_TRUE(early.ok());
  ASSERT_EQ(early->size(), 1u);
  EXPECT_EQ((*early)[0], committed[3]);

  // Replace the tree by a snapshot of a different history at version 150,
  // then commit on: the positions remembered for versions >= 150 are stale.
  TempDir other_dir;
  auto other = OpenOrDie(other_dir.path(), o);
  ASSERT_TRUE(other->CreateTree("t").ok());
  for (int i = 0; i < 150; ++i) ASSERT_TRUE(CommitNumbered(*other, "t", "other history").ok());
  {
    auto inst = store->BeginSnapshotInstall("t");
    ASSERT_TRUE(inst.ok()) << inst.status().ToString();
    SnapshotWriter w(*other->Latest("t"), 4096);
    while (auto c = w.Next()) ASSERT_TRUE((*inst)->AddChunk(*c).ok());
    ASSERT_TRUE((*inst)->Finish().ok());
  }
  std::vector<std::string> fresh;
  for (int i = 0; i < 80; ++i) fresh.push_back(CommitNumbered(*store, "t", "fresh")->encoded_delta);
  for (uint64_t from : {150u, 160u, 199u, 229u}) {
    auto r = store->ReadDeltasSince("t", from);
    ASSERT_TRUE(r.ok()) << "from " << from << ": " << r.status().ToString();
    EXPECT_EQ(*r, std::vector<std::string>(fresh.begin() + static_cast<long>(from - 150), fresh.end())) << from;
  }
}

// A read of the deltas after a version passes over the records at or
// before it on their headers alone (tree/wal_impl.h, ScanSegment's
// skip_through_version): their bodies are neither read nor checked, so
// damage there does not touch such a read, while a read that needs the
// damaged record still stops before it, and a damaged length still ends
// the scan.
TEST(TreeStore, ReadDeltasSincePassesOverEarlierRecordsUnread) {
  TempDir tmp;
  auto store = OpenOrDie(tmp.path(), Opts(FsyncPolicy::kNone));
  ASSERT_TRUE(store->CreateTree("t").ok());
  // Records of 200 KiB (more than the scan reads ahead while it skips)
  // between records of a few bytes.
  std::vector<std::string> written;
  for (int i = 0; i < 40; ++i) {
    const size_t value_bytes = i % 2 == 0 ? 200u << 10 : 10u;
    auto r = store->CommitOps("t", PutRoot("k" + std::to_string(i), std::string(value_bytes, 'a' + i % 26)));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    written.push_back(r->encoded_delta);
  }
  const auto wals = Files(tmp.path() + "/trees/t", "wal-");
  ASSERT_EQ(wals.size(), 1u);
  uint64_t at = 0;  // file offset of version 11's record (200 KiB)
  for (int i = 0; i < 10; ++i) at += written[i].size();
  ASSERT_GT(written[10].size(), 200u << 10);
  auto flip = [&](uint64_t offset) {
    auto fd = OpenFile(wals[0], O_RDWR);
    ASSERT_TRUE(fd.ok());
    char c;
    ASSERT_EQ(::pread(fd->get(), &c, 1, static_cast<off_t>(offset)), 1);
    c ^= 0x10;
    ASSERT_EQ(::pwrite(fd->get(), &c, 1, static_cast<off_t>(offset)), 1);
  };
  auto from = [&](uint64_t version) { return std::vector<std::string>(written.begin() + version, written.end()); };
  // The scan says where each record it hands on ends (where a later read
  // resumes), counting the records it passed over.
  {
    std::vector<uint64_t> ends;
    uint64_t end = 0;
    auto scan = ScanSegment(
        wals[0], UINT64_MAX,
        [&](const Delta& d, std::string_view record) {
          EXPECT_EQ(record, written[d.new_version - 1]);
          ends.push_back(end);
          return Status::Ok();
        },
        0, /*headers_only=*/true, /*skip_through_version=*/11, &end);
    ASSERT_TRUE(scan.ok()) << scan.status().ToString();
    ASSERT_EQ(ends.size(), 29u);  // versions 12..40
    uint64_t want = at + written[10].size();
    for (size_t i = 0; i < ends.size(); ++i) {
      want += written[11 + i].size();
      EXPECT_EQ(ends[i], want) << i;
    }
  }
  // 1. A flipped byte in the value of version 11's record.
  flip(at + written[10].size() / 2);
  for (uint64_t version : {11u, 12u, 25u, 38u}) {
    auto deltas = store->ReadDeltasSince("t", version);
    ASSERT_TRUE(deltas.ok()) << version << ": " << deltas.status().ToString();
    EXPECT_EQ(*deltas, from(version)) << version;
  }
  auto before = store->ReadDeltasSince("t", 5);  // needs version 11: ends before it
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_EQ(*before, std::vector<std::string>(written.begin() + 5, written.begin() + 10));
  EXPECT_TRUE(store->ReadDeltasSince("t", 10).status().IsNotFound());
  // 2. The value mended, its length field damaged: the record after it is
  // not found where the length points, so the scan ends there as torn.
  flip(at + written[10].size() / 2);
  auto mended = store->ReadDeltasSince("t", 12);
  ASSERT_TRUE(mended.ok()) << mended.status().ToString();
  EXPECT_EQ(*mended, from(12));
  flip(at + 4);
  EXPECT_TRUE(store->ReadDeltasSince("t", 14).status().IsNotFound());
}

TEST(TreeStore, ReadDeltasSinceAndTruncation) {
  TempDir tmp;
  StoreOptions o = Opts();
  o.wal_segment_bytes = 512;  // many segments
  o.retention.keep_versions = 1;  // no past versions hold the WAL (tree_versions_test covers those)
  std::vector<std::string> committed;
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int i = 0; i < 60; ++i) committed.push_back(CommitNumbered(*store, "t", "p")->encoded_delta);
    EXPECT_GT(Files(tmp.path() + "/trees/t", "wal-").size(), 5u);

    auto all = store->ReadDeltasSince("t", 0);
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    EXPECT_EQ(*all, committed);
    auto tail = store->ReadDeltasSince("t", 57);
    ASSERT_TRUE(tail.ok());
    EXPECT_EQ(*tail, std::vector<std::string>(committed.begin() + 57, committed.end()));
    auto some = store->ReadDeltasSince("t", 10, 1);  // byte budget: at least one delta
    ASSERT_TRUE(some.ok());
    ASSERT_EQ(some->size(), 1u);
    EXPECT_EQ((*some)[0], committed[10]);
    EXPECT_TRUE(store->ReadDeltasSince("t", 60)->empty());
    EXPECT_EQ(store->ReadDeltasSince("t", 61).status().code(), StatusCode::kInvalidArgument);

    // No checkpoint yet: truncation may not drop anything.
    ASSERT_TRUE(store->TruncateWalBefore("t", 50).ok());
    EXPECT_TRUE(store->ReadDeltasSince("t", 0).ok());

    auto cp = store->Checkpoint("t");
    ASSERT_TRUE(cp.ok()) << cp.status().ToString();
    EXPECT_EQ(*cp, 60u);
    ASSERT_TRUE(store->TruncateWalBefore("t", 40).ok());
    EXPECT_TRUE(store->ReadDeltasSince("t", 0).status().IsNotFound());
    EXPECT_TRUE(store->ReadDeltasSince("t", 20).status().IsNotFound());
    auto after = store->ReadDeltasSince("t", 45);
    ASSERT_TRUE(after.ok()) << after.status().ToString();
    EXPECT_EQ(after->size(), 15u);
    for (int i = 0; i < 5; ++i) committed.push_back(CommitNumbered(*store, "t", "q")->encoded_delta);
  }
  // Recovery: checkpoint 60 + the retained WAL, then the five later commits.
  auto store = OpenOrDie(tmp.path(), o);
  auto v = store->Latest("t");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->number(), 65u);
  ExpectNumbered(*v);
  auto after = store->ReadDeltasSince("t", 45);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, std::vector<std::string>(committed.begin() + 45, committed.end()));
  // Truncating everything the checkpoint covers (whole segments only, so the
  // one holding 60 and 61 survives); later deltas stay readable.
  ASSERT_TRUE(store->TruncateWalBefore("t", 1000).ok());
  EXPECT_TRUE(store->ReadDeltasSince("t", 45).status().IsNotFound());
  EXPECT_EQ(store->ReadDeltasSince("t", 60)->size(), 5u);
}

TEST(TreeStore, TornAndCorruptWalTailsAreCutNotApplied) {
  TempDir tmp;
  std::string seg;
  {
    auto store = OpenOrDie(tmp.path(), Opts());
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
    seg = Files(tmp.path() + "/trees/t", "wal-").back();
  }
  // 1. Half of an eleventh record (a torn write) plus zeros.
  {
    auto store = OpenOrDie(tmp.path(), Opts());
    std::string rec = CommitNumbered(*store, "t")->encoded_delta;  // version 11, in a new segment
    EXPECT_EQ(store->Latest("t")->number(), 11u);
  }
  std::string newest = Files(tmp.path() + "/trees/t", "wal-").back();
  ASSERT_NE(newest, seg);
  auto size = *FileSize(newest);
  ASSERT_EQ(::truncate(newest.c_str(), static_cast<off_t>(size - 5)), 0);
  {
    auto fd = OpenFile(newest, O_WRONLY | O_APPEND);
    std::string zeros(100, '\0');
    ASSERT_TRUE(WriteAll(fd->get(), zeros.data(), zeros.size(), newest).ok());
  }
  {
    auto store = OpenOrDie(tmp.path(), Opts());
    auto v = store->Latest("t");
    EXPECT_EQ(v->number(), 10u);  // the torn version 11 is gone, never half-applied
    ExpectNumbered(*v);
    ASSERT_TRUE(CommitNumbered(*store, "t").ok());  // a new 11
    ASSERT_TRUE(CommitNumbered(*store, "t").ok());  // 12
  }
  // 2. A flipped byte in the middle of the last record.
  newest = Files(tmp.path() + "/trees/t", "wal-").back();
  size = *FileSize(newest);
  {
    auto fd = OpenFile(newest, O_RDWR);
    char c;
    ASSERT_EQ(::pread(fd->get(), &c, 1, static_cast<off_t>(size - 10)), 1);
    c ^= 0x10;
    ASSERT_EQ(::pwrite(fd->get(), &c, 1, static_cast<off_t>(size - 10)), 1);
  }
  auto store = OpenOrDie(tmp.path(), Opts());
  auto v = store->Latest("t");
  EXPECT_EQ(v->number(), 11u);
  ExpectNumbered(*v);
  EXPECT_LT(*FileSize(newest), size);  // the bad record was cut off the file
}

TEST(TreeStore, DamagedNewestCheckpointFallsBackToTheOlderOne) {
  TempDir tmp;
  uint64_t digest;
  // Only the newest version retained, so recovery starts from the newest
  // checkpoint (not from version 0, which the whole WAL still reaches).
  StoreOptions o = Opts();
  o.retention.keep_versions = 1;
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
    ASSERT_TRUE(store->Checkpoint("t").ok());
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
    ASSERT_TRUE(store->Checkpoint("t").ok());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
    digest = store->Latest("t")->Digest();
  }
  auto cps = Files(tmp.path() + "/trees/t", "checkpoint-");
  ASSERT_EQ(cps.size(), 2u);
  ASSERT_EQ(::truncate(cps.back().c_str(), 30), 0);
  auto store = OpenOrDie(tmp.path(), o);
  auto v = store->Latest("t");
  EXPECT_EQ(v->number(), 25u);
  EXPECT_EQ(v->Digest(), digest);
  ExpectNumbered(*v);
}

// Recovery reads and checks the newest checkpoint; NewestCheckpoint (what a
// leader sends a joiner) answers from that reading, not from a second pass
// over the file. Damage done to the file after recovery is seen by the
// receiver's block checks, not here; damage before it still falls back.
// Renames a copy of the file at `path`, one byte flipped at offset 20000,
// over it: a new inode (the store may have the old one mapped), which a
// second reading would refuse.
void RenameDamagedCopyOver(const std::string& path) {
  const std::string damaged = path + ".damaged";
  std::filesystem::copy_file(path, damaged);
  auto fd = OpenFile(damaged, O_WRONLY);
  ASSERT_TRUE(fd.ok());
  char c = 'X';
  ASSERT_EQ(::pwrite(fd->get(), &c, 1, 20000), 1);
  ASSERT_EQ(::rename(damaged.c_str(), path.c_str()), 0);
}

TEST(TreeStore, NewestCheckpointAfterRecoveryIsTheOneRecoveryChecked) {
  TempDir tmp;
  StoreOptions o = Opts();
  o.retention.keep_versions = 1;
  uint64_t digest;
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(CommitNumbered(*store, "t", std::string(4000, 'c')).ok());
    ASSERT_TRUE(store->Checkpoint("t").ok());
    digest = store->Latest("t")->Digest();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
  }
  auto cps = Files(tmp.path() + "/trees/t", "checkpoint-");
  ASSERT_EQ(cps.size(), 1u);
  auto store = OpenOrDie(tmp.path(), o);
  EXPECT_EQ(store->Latest("t")->number(), 13u);
  // A damaged copy renamed over the file.
  RenameDamagedCopyOver(cps.back());
  auto newest = store->NewestCheckpoint("t");
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->number(), 10u);
  EXPECT_EQ(newest->Digest(), digest);
  // A new checkpoint replaces it, and is read (and checked) when first asked for.
  ASSERT_TRUE(store->Checkpoint("t").ok());
  newest = store->NewestCheckpoint("t");
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->number(), 13u);
  EXPECT_EQ(newest->Digest(), store->Latest("t")->Digest());
}

// The file this process has mapped at `p` (from /proc/self/maps), or "" if
// `p` lies in no file mapping.
std::string MappedFileAt(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &from, &to) != 2 || at < from || at >= to)
      continue;
    size_t path = line.find('/');
    return path == std::string::npos ? "" : line.substr(path);
  }
  return "";
}

// True once this process maps the file at `path` (from /proc/self/maps).
bool FileIsMapped(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t at = line.find('/');
    if (at != std::string::npos && line.compare(at, std::string::npos, path) == 0) return true;
  }
  return false;
}

// Recovery that starts from an older checkpoint (the base of the retained
// window) never reads the newest one; the store's background thread reads
// and checks it right after Open, so the first joiner's leader answers
// NewestCheckpoint without doing so (20-60 ms a 16 MiB file, gating each
// tree's transfer).
TEST(TreeStore, NewestCheckpointIsCheckedInTheBackgroundAfterRecovery) {
  TempDir tmp;
  StoreOptions o = Opts();  // keeps 1000 versions: recovery starts from the first checkpoint
  uint64_t digest;
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(CommitNumbered(*store, "t", std::string(4000, 'a')).ok());
    ASSERT_TRUE(store->Checkpoint("t").ok());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(CommitNumbered(*store, "t", std::string(4000, 'b')).ok());
    ASSERT_TRUE(store->Checkpoint("t").ok());
    digest = store->Latest("t")->Digest();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
  }
  auto cps = Files(tmp.path() + "/trees/t", "checkpoint-");
  ASSERT_EQ(cps.size(), 2u);
  const std::string newest_path = std::filesystem::canonical(cps.back()).string();
  auto store = OpenOrDie(tmp.path(), o);
  EXPECT_EQ(store->Latest("t")->number(), 13u);
  EXPECT_TRUE(store->At("t", 3).ok()) << "recovery rebuilt the retained window from the first checkpoint";
  // Checked and mapped (NodeImage::FromMapping) by the background thread.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!FileIsMapped(newest_path) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(FileIsMapped(newest_path)) << newest_path << " not read within 10 s of Open";
  // A damaged copy renamed over it now is not read: the answer is the file checked.
  RenameDamagedCopyOver(cps.back());
  auto newest = store->NewestCheckpoint("t");
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->number(), 10u);
  EXPECT_EQ(newest->Digest(), digest);
}
// Recovery replays a large value from the WAL in place: the tree refers into
// a mapping of the segment rather than a copy (a restart of a node holding
// MiB-sized values ran at ~0.2 GB/s, nearly all of it spent copying them into
// fresh pages). Small values are copied. The values stay readable once the
// segment is removed, and a checkpoint taken from them is whole.
TEST(TreeStore, RecoveryReplaysLargeValuesInPlace) {
  TempDir tmp;
  StoreOptions o = Opts(FsyncPolicy::kNone);
  o.retention.keep_versions = 1;  // so that the WAL can go once checkpointed
  o.checkpoint_wal_bytes = 0;     // and no checkpoint but the test's own
  const std::string big = testing::RandomBytes(300 << 10, 7), bigger = testing::RandomBytes(1 << 20, 8);
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    ASSERT_TRUE(
        store->CommitOps("t", {Op::PutAttribute({}, "big", big), Op::PutAttribute({}, "s", "small")}).ok());
    ASSERT_TRUE(store->CommitOps("t", {Op::AppendChild({}), Op::PutAttribute({0}, "bigger", bigger)}).ok());
  }
  auto wal = Files(tmp.path() + "/trees/t", "wal-");
  ASSERT_EQ(wal.size(), 1u);
  auto store = OpenOrDie(tmp.path(), o);
  auto v = store->Latest("t");
  ASSERT_TRUE(v.ok());
  auto a = v->root()->attribute("big");
  auto b = v->root()->child(0)->attribute("bigger");
  auto s = v->root()->attribute("s");
  ASSERT_TRUE(a && b && s);
  EXPECT_EQ(*a, big);
  EXPECT_EQ(*b, bigger);
  EXPECT_EQ(*s, "small");
  const std::string wal_name = std::filesystem::path(wal[0]).filename();
  EXPECT_NE(MappedFileAt(a->data()).find(wal_name), std::string::npos) << MappedFileAt(a->data());
  EXPECT_NE(MappedFileAt(b->data()).find(wal_name), std::string::npos) << MappedFileAt(b->data());
  EXPECT_EQ(MappedFileAt(s->data()), "");

  // Checkpoint, and the segment goes: the values stay, and the checkpoint
  // holds them (recovered from it alone, the same tree).
  const uint64_t digest = v->Digest();
  ASSERT_TRUE(store->Checkpoint("t").ok());
  ASSERT_TRUE(store->TruncateWalBefore("t", 2).ok());
  EXPECT_TRUE(Files(tmp.path() + "/trees/t", "wal-").empty());
  EXPECT_EQ(*v->root()->attribute("big"), big);
  EXPECT_EQ(*store->Latest("t")->root()->child(0)->attribute("bigger"), bigger);
  v = Status::Aborted("released");
  store.reset();
  store = OpenOrDie(tmp.path(), o);
  EXPECT_EQ(store->Latest("t")->Digest(), digest);
  EXPECT_EQ(*store->Latest("t")->root()->attribute("big"), big);
}

TEST(TreeStore, SnapshotInstallStreamsAndPublishesAtomically) {
  TempDir leader_dir, replica_dir;
  auto leader = OpenOrDie(leader_dir.path(), Opts(FsyncPolicy::kNone));
  ASSERT_TRUE(leader->CreateTree("t").ok());
  for (int i = 0; i < 300; ++i) ASSERT_TRUE(CommitNumbered(*leader, "t", std::string(100, 'p')).ok());
  Version snap = *leader->Latest("t");
  {
    auto replica = OpenOrDie(replica_dir.path(), Opts());
    // A replica with its own, different history of the tree.
    ASSERT_TRUE(replica->CreateTree("t").ok());
    for (int i = 0; i < 400; ++i) ASSERT_TRUE(CommitNumbered(*replica, "t").ok());
    Version before = *replica->Latest("t");

    // 1. A corrupt stream changes nothing.
    {
      auto inst = replica->BeginSnapshotInstall("t");
      ASSERT_TRUE(inst.ok());
      SnapshotWriter w(snap, 4096);
      int n = 0;
      Status s;
      while (auto c = w.Next()) {
        if (++n == 3) (*c)[20] ^= 1;
        s = (*inst)->AddChunk(*c);
        if (!s.ok()) break;
      }
      EXPECT_TRUE(s.IsCorruption()) << s.ToString();
      EXPECT_FALSE((*inst)->Finish().ok());
    }
    // 2. An abandoned install changes nothing either, and leaves no files.
    {
      auto inst = replica->BeginSnapshotInstall("t");
      SnapshotWriter w(snap, 4096);
      ASSERT_TRUE((*inst)->AddChunk(*w.Next()).ok());
      ASSERT_TRUE((*inst)->AddChunk(*w.Next()).ok());
    }
    EXPECT_TRUE(fs::is_empty(replica_dir.path() + "/tmp"));
    EXPECT_EQ(replica->Latest("t")->root(), before.root());
    // 3. A snapshot of another tree is refused.
    {
      auto inst = replica->BeginSnapshotInstall("other");
      SnapshotWriter w(snap, 4096);
      EXPECT_FALSE((*inst)->AddChunk(*w.Next()).ok());
    }
    // 4. The real install: chunk by chunk; the tree is unchanged until Finish.
    auto inst = replica->BeginSnapshotInstall("t");
    ASSERT_TRUE(inst.ok());
    SnapshotWriter w(snap, 4096);
    while (auto c = w.Next()) {
      ASSERT_TRUE((*inst)->AddChunk(*c).ok());
      EXPECT_EQ(*replica->LatestVersion("t"), 400u);
    }
    auto installed = (*inst)->Finish();
    ASSERT_TRUE(installed.ok()) << installed.status().ToString();
    EXPECT_EQ(installed->number(), 300u);
    EXPECT_EQ(replica->Latest("t")->Digest(), snap.Digest());
    EXPECT_EQ(*replica->DurableVersion("t"), 300u);
    ExpectNumbered(before);  // the held handle on the replaced history still reads fine
    EXPECT_TRUE(replica->ReadDeltasSince("t", 299).status().IsNotFound());
    // Deltas after the snapshot apply.
    for (int i = 0; i < 5; ++i) {
      auto r = CommitNumbered(*leader, "t");
      ASSERT_TRUE(replica->ApplyEncodedDelta(r->encoded_delta).ok());
    }
    EXPECT_EQ(replica->ReadDeltasSince("t", 300)->size(), 5u);
    // A tree that did not exist yet is created by an install.
    auto fresh = replica->BeginSnapshotInstall("copy");
    SnapshotWriter w2(Version("copy", snap.number(), snap.root()), 4096);
    while (auto c = w2.Next()) ASSERT_TRUE((*fresh)->AddChunk(*c).ok());
    ASSERT_TRUE((*fresh)->Finish().ok());
  }
  auto replica = OpenOrDie(replica_dir.path(), Opts());
  EXPECT_EQ(replica->Latest("t")->Digest(), leader->Latest("t")->Digest());
  EXPECT_EQ(*replica->LatestVersion("t"), 305u);
  EXPECT_EQ(*replica->LatestVersion("copy"), 300u);
  EXPECT_EQ(replica->ListTrees(), (std::vector<std::string>{"copy", "t"}));
}

TEST(TreeStore, GroupCommitFromManyThreads) {
  TempDir tmp;
  {
    auto store = OpenOrDie(tmp.path(), Opts(FsyncPolicy::kAlways));
    ASSERT_TRUE(store->CreateTree("t").ok());
    std::atomic<int> failures{0};
    std::atomic<bool> done{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        int mine = 0;
        for (int attempt = 0; mine < 40 && attempt < 100000; ++attempt) {
          auto r = CommitNumbered(*store, "t");
          if (r.ok()) {
            ++mine;
            // Acknowledged means durable under kAlways.
            if (*store->DurableVersion("t") < r->version) ++failures;
          } else if (!r.status().IsConflict()) {
            ++failures;
          }
        }
        if (mine != 40) ++failures;
      });
    }
    std::thread reader([&] {
      while (!done) {
        Version v = *store->Latest("t");
        ExpectNumbered(v);
      }
    });
    std::thread wal_reader([&] {
      while (!done) {
        auto deltas = store->ReadDeltasSince("t", 0);
        if (!deltas.ok()) {
          ++failures;
          continue;
        }
        uint64_t expect = 1;
        for (const auto& enc : *deltas) {
          auto d = DecodeDelta(enc);
          if (!d.ok() || d->new_version != expect++) ++failures;
        }
      }
    });
    for (auto& th : threads) th.join();
    done = true;
    reader.join();
    wal_reader.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(*store->LatestVersion("t"), 160u);
  }
  auto store = OpenOrDie(tmp.path(), Opts());
  ExpectNumbered(*store->Latest("t"));
  EXPECT_EQ(*store->LatestVersion("t"), 160u);
}

TEST(TreeStore, BatchAndNonePolicies) {
  TempDir a, b;
  {
    StoreOptions o = Opts(FsyncPolicy::kBatch);
    o.batch_interval = std::chrono::milliseconds(5);
    auto store = OpenOrDie(a.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (*store->DurableVersion("t") < 50 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(*store->DurableVersion("t"), 50u);
  }
  {
    auto store = OpenOrDie(b.path(), Opts(FsyncPolicy::kNone));
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
    EXPECT_EQ(*store->DurableVersion("t"), 50u);
    EXPECT_TRUE(store->SyncAll().ok());
  }
  EXPECT_EQ(*OpenOrDie(a.path(), Opts())->LatestVersion("t"), 50u);
  EXPECT_EQ(*OpenOrDie(b.path(), Opts())->LatestVersion("t"), 50u);
  EXPECT_EQ(ParseFsyncPolicy("batch").value(), FsyncPolicy::kBatch);
  EXPECT_EQ(ParseFsyncPolicy("sometimes").status().code(), StatusCode::kInvalidArgument);
}

TEST(TreeStore, AutomaticCheckpointsBoundTheWal) {
  TempDir tmp;
  StoreOptions o = Opts();
  o.checkpoint_every_commits = 10;
  o.wal_retain_versions = 5;
  o.wal_segment_bytes = 300;
  o.retention.keep_versions = 1;  // no past versions hold the WAL (tree_versions_test covers those)
  std::string dir = tmp.path() + "/trees/t";
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(CommitNumbered(*store, "t").ok());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline &&
           (Files(dir, "checkpoint-").empty() || store->ReadDeltasSince("t", 0).ok())) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_FALSE(Files(dir, "checkpoint-").empty());
    EXPECT_TRUE(store->ReadDeltasSince("t", 0).status().IsNotFound());
    EXPECT_TRUE(store->ReadDeltasSince("t", 99).ok());
  }
  // Once the store is closed (background work finished), at most two checkpoints remain.
  EXPECT_LE(Files(dir, "checkpoint-").size(), 2u);
  auto store = OpenOrDie(tmp.path(), o);
  EXPECT_EQ(*store->LatestVersion("t"), 100u);
  ExpectNumbered(*store->Latest("t"));
}

TEST(TreeStore, CheckpointIsStaleOnceTheWalReachesHalfTheFileAndTheFloor) {
  EXPECT_FALSE(CheckpointIsStale(0, 0, 0));
  EXPECT_TRUE(CheckpointIsStale(0, 1, 0));          // no file: any WAL
  EXPECT_FALSE(CheckpointIsStale(0, 99, 100));      // ... once at the floor
  EXPECT_TRUE(CheckpointIsStale(0, 100, 100));
  EXPECT_FALSE(CheckpointIsStale(1000, 499, 100));  // half the file
  EXPECT_TRUE(CheckpointIsStale(1000, 500, 100));
  EXPECT_FALSE(CheckpointIsStale(1000, 999, 1000));  // or the floor, whichever is more
  EXPECT_TRUE(CheckpointIsStale(1000, 1000, 1000));
}

// StoreOptions::checkpoint_wal_bytes: a checkpoint once the WAL records
// since the last one reach the floor or half that checkpoint's size,
// counted across a restart too.
// The newest checkpoint file's wal_bytes_after is exactly the size of the
// WAL records after it (what a sender would otherwise read to weigh it).
void ExpectWalBytesAfterNewestCheckpoint(Store& store) {
  auto file = store.OpenNewestCheckpointFile("t");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto tail = store.ReadDeltasSince("t", file->info.version);
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  uint64_t bytes = 0;
  for (const auto& d : *tail) bytes += d.size();
  EXPECT_EQ(file->wal_bytes_after, bytes) << "after checkpoint " << file->info.version;
}

TEST(TreeStore, CheckpointsFollowTheWalBytesSinceTheLastOne) {
  TempDir tmp;
  StoreOptions o = Opts(FsyncPolicy::kNone);
  o.checkpoint_wal_bytes = 64 << 10;
  const std::string small(20000, 's'), big(210000, 'b');
  auto newest = [](Store& store) { return store.NewestCheckpoint("t").ok() ? store.NewestCheckpoint("t")->number() : 0; };
  // Commits one numbered edit, then gives a (wrongly) queued checkpoint
  // time to land before the next one, so that it would show.
  auto commit = [](Store& store, const std::string& payload) {
    ASSERT_TRUE(CommitNumbered(store, "t", payload).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  auto wait_for = [&](Store& store, uint64_t v) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (newest(store) != v && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(newest(store), v);
  };
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    // The floor: three records (~60 KB) are not enough, the fourth is.
    for (int i = 0; i < 3; ++i) commit(*store, small);
    EXPECT_EQ(newest(*store), 0u);
    commit(*store, small);
    wait_for(*store, 4);
    // One record over the floor: checkpoint 5 (~290 KB).
    commit(*store, big);
    wait_for(*store, 5);
    // Now half of that file counts: 7 records (~140 KB) are not enough.
    for (int i = 0; i < 4; ++i) commit(*store, small);
    EXPECT_EQ(newest(*store), 5u);
    ExpectWalBytesAfterNewestCheckpoint(*store);
  }
  // The WAL since checkpoint 5 is counted again on recovery.
  auto store = OpenOrDie(tmp.path(), o);
  ASSERT_EQ(*store->LatestVersion("t"), 9u);
  EXPECT_EQ(newest(*store), 5u);
  for (int i = 0; i < 3; ++i) commit(*store, small);
  EXPECT_EQ(newest(*store), 5u);
  ExpectWalBytesAfterNewestCheckpoint(*store);  // counted on recovery too
  commit(*store, small);
  wait_for(*store, 13);
  ExpectWalBytesAfterNewestCheckpoint(*store);
  ExpectNumbered(*store->Latest("t"));
}

TEST(TreeStore, NoCheckpointByWalBytesWhenTurnedOff) {
  TempDir tmp;
  StoreOptions o = Opts(FsyncPolicy::kNone);
  o.checkpoint_wal_bytes = 0;
  auto store = OpenOrDie(tmp.path(), o);
  ASSERT_TRUE(store->CreateTree("t").ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(CommitNumbered(*store, "t", std::string(100000, 'x')).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(store->NewestCheckpoint("t").status().IsNotFound());
}

// Random edits of every kind, checkpoints at random points and small WAL
// segments: recovery and a replica fed from ReadDeltasSince end up with the
// same tree as the leader had in memory.
TEST(TreeStore, RandomHistoriesRecoverAndReplicateIdentically) {
  TempDir leader_dir, replica_dir;
  StoreOptions o = Opts(FsyncPolicy::kNone);
  o.wal_segment_bytes = 2048;
  std::mt19937_64 rng(77);
  uint64_t digest = 0;
  {
    auto store = OpenOrDie(leader_dir.path(), o);
    ASSERT_TRUE(store->CreateTree("r").ok());
    for (int c = 0; c < 300; ++c) {
      Transaction txn = *store->Begin("r");
      int ops = 1 + static_cast<int>(rng() % 6);
      for (int i = 0; i < ops; ++i) {
        // Walk to a random existing node.
        NodePath path;
        NodePtr node = txn.root();
        while (node->child_count() > 0 && rng() % 3 != 0) {
          uint64_t k = rng() % node->child_count();
          path.push_back(k);
          node = node->child(k);
        }
        switch (rng() % 5) {
          case 0:
            ASSERT_TRUE(txn.InsertChild(path, rng() % (node->child_count() + 1)).ok());
            break;
          case 1:
            ASSERT_TRUE(txn.AppendChild(path).ok());
            break;
          case 2:
            if (node->child_count() > 0) {
              ASSERT_TRUE(txn.DeleteChild(path, rng() % node->child_count()).ok());
            }
            break;
          case 3:
            ASSERT_TRUE(txn.PutAttribute(path, "k" + std::to_string(rng() % 4),
                                         testing::RandomBytes(rng() % 50, rng()))
                            .ok());
            break;
          case 4:
            if (!node->attributes().empty()) {
              ASSERT_TRUE(
                  txn.DeleteAttribute(path, node->attributes()[rng() % node->attributes().size()].key).ok());
            }
            break;
        }
      }
      ASSERT_TRUE(store->Commit(std::move(txn)).ok());
      if (rng() % 40 == 0) {
        ASSERT_TRUE(store->Checkpoint("r").ok());
      }
    }
    digest = store->Latest("r")->Digest();
  }
  auto leader = OpenOrDie(leader_dir.path(), o);
  EXPECT_EQ(*leader->LatestVersion("r"), 300u);
  EXPECT_EQ(leader->Latest("r")->Digest(), digest);
  auto replica = OpenOrDie(replica_dir.path(), o);
  ASSERT_TRUE(replica->CreateTree("r").ok());
  for (int guard = 0; guard < 1000 && *replica->LatestVersion("r") < 300; ++guard) {
    auto batch = leader->ReadDeltasSince("r", *replica->LatestVersion("r"), 4096);
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    for (const auto& d : *batch) ASSERT_TRUE(replica->ApplyEncodedDelta(d).ok());
  }
  EXPECT_EQ(replica->Latest("r")->Digest(), digest);
  EXPECT_TRUE(TreesEqual(replica->Latest("r")->root(), leader->Latest("r")->root()));
}

}  // namespace
}  // namespace canopy::tree
