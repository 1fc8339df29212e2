// Store: past versions readable under the retention policy (count, time,
// pins), checked against an independent model of every version; the window
// surviving restarts, checkpoints and WAL truncation; replicas retaining the
// deltas they apply; snapshot installs dropping the history (tree/store.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/file.h"
#include "tests/testing/test_util.h"
#include "tree/store.h"

namespace canopy::tree {
namespace {

namespace fs = std::filesystem;
using canopy::testing::TempDir;
using namespace std::chrono_literals;

// ---------------------------------------------------------------- the model

// A plain value tree, copied whole for every version: nothing shared, so it
// cannot share a bug with the store's structural sharing.
struct ModelNode {
  std::map<std::string, std::string> attributes;
  std::vector<ModelNode> children;
};

// Empty when equal; else where and how the store's tree differs.
std::string Compare(const ModelNode& want, const NodePtr& got, const std::string& where = "/") {
  if (got->attributes().size() != want.attributes.size()) {
    return where + ": " + std::to_string(got->attributes().size()) + " attributes, want " +
           std::to_string(want.attributes.size());
  }
  for (AttributeView a : got->attributes()) {
    auto it = want.attributes.find(std::string(a.key));
    if (it == want.attributes.end() || it->second != a.value) {
      return where + ": attribute " + std::string(a.key) + " differs";
    }
  }
  if (got->child_count() != want.children.size()) {
    return where + ": " + std::to_string(got->child_count()) + " children, want " +
           std::to_string(want.children.size());
  }
  for (size_t i = 0; i < want.children.size(); ++i) {
    std::string d = Compare(want.children[i], got->child(i), where + std::to_string(i) + "/");
    if (!d.empty()) return d;
  }
  return "";
}

// One random op applied to both the transaction and the model.
void RandomOp(std::mt19937_64& rng, Transaction& txn, ModelNode& model) {
  NodePath path;
  ModelNode* node = &model;
  while (!node->children.empty() && rng() % 3 != 0) {
    uint64_t k = rng() % node->children.size();
    path.push_back(k);
    node = &node->children[k];
  }
  switch (rng() % 5) {
    case 0: {
      uint64_t at = rng() % (node->children.size() + 1);
      ASSERT_TRUE(txn.InsertChild(path, at).ok());
      node->children.insert(node->children.begin() + static_cast<std::ptrdiff_t>(at), ModelNode{});
      break;
    }
    case 1:
      ASSERT_TRUE(txn.AppendChild(path).ok());
      node->children.emplace_back();
      break;
    case 2:
      if (!node->children.empty()) {
        uint64_t at = rng() % node->children.size();
        ASSERT_TRUE(txn.DeleteChild(path, at).ok());
        node->children.erase(node->children.begin() + static_cast<std::ptrdiff_t>(at));
      }
      break;
    case 3: {
      std::string key = "k" + std::to_string(rng() % 4);
      std::string value = canopy::testing::RandomBytes(rng() % 20, rng());
      ASSERT_TRUE(txn.PutAttribute(path, key, value).ok());
      node->attributes[key] = value;
      break;
    }
    case 4:
      if (!node->attributes.empty()) {
        auto it = node->attributes.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % node->attributes.size()));
        ASSERT_TRUE(txn.DeleteAttribute(path, it->first).ok());
        node->attributes.erase(it);
      }
      break;
  }
}

// ---------------------------------------------------------------- helpers

// Polls `done` every 10 ms until it is true or `timeout` passes.
bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

StoreOptions Opts(uint64_t keep_versions) {
  StoreOptions o;
  o.fsync = FsyncPolicy::kNone;
  o.checkpoint_every_commits = 0;
  o.retention.keep_versions = keep_versions;
  return o;
}

std::unique_ptr<Store> OpenOrDie(const std::string& dir, const StoreOptions& o) {
  auto s = Store::Open(dir, o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

// Commit v sets the root attribute v=<v> and appends one child (so version v
// has v children and v root attributes).
void CommitNumbered(Store& store, const std::string& tree, int count = 1) {
  for (int i = 0; i < count; ++i) {
    Transaction txn = *store.Begin(tree);
    std::string v = std::to_string(txn.base().number() + 1);
    ASSERT_TRUE(txn.PutAttribute({}, "v" + v, v).ok());
    ASSERT_TRUE(txn.AppendChild({}).ok());
    auto r = store.Commit(std::move(txn));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
}

// Version v of a numbered tree as read through At().
void ExpectNumberedAt(const Store& store, const std::string& tree, uint64_t v) {
  auto got = store.At(tree, v);
  ASSERT_TRUE(got.ok()) << "version " << v << ": " << got.status().ToString();
  EXPECT_EQ(got->number(), v);
  EXPECT_EQ(got->root()->child_count(), v);
  EXPECT_EQ(got->root()->attributes().size(), v);
  if (v > 0) {
    EXPECT_EQ(got->root()->attribute("v" + std::to_string(v)), std::to_string(v));
  }
  EXPECT_FALSE(got->root()->attribute("v" + std::to_string(v + 1)).has_value());
}

// At(v) is NotFound and names the oldest version held.
void ExpectGone(const Store& store, const std::string& tree, uint64_t v, uint64_t oldest) {
  auto got = store.At(tree, v);
  ASSERT_TRUE(got.status().IsNotFound()) << "version " << v << ": " << got.status().ToString();
  EXPECT_NE(got.status().message().find("oldest version held is " + std::to_string(oldest)), std::string::npos)
      << got.status().ToString();
}

RetainedVersions Window(const Store& store, const std::string& tree) {
  auto r = store.Retained(tree);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.value_or(RetainedVersions{});
}

std::vector<std::string> Files(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------- tests

// Random commits of every op kind against the model; every retained version
// reads back as the model had it, every older one is NotFound naming the
// oldest held, and a restart (with checkpoints and WAL truncation at random
// points) rebuilds the same window.
TEST(TreeVersions, RandomCommitsMatchTheModelAtEveryRetainedVersion) {
  TempDir tmp;
  constexpr uint64_t kKeep = 40;
  constexpr int kCommits = 250;
  StoreOptions o = Opts(kKeep);
  o.wal_segment_bytes = 1024;  // many segments, so truncation has whole files to drop
  std::mt19937_64 rng(20261203);
  std::vector<ModelNode> model(1);  // model[v]: the tree at version v
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("r").ok());
    for (int c = 0; c < kCommits; ++c) {
      Transaction txn = *store->Begin("r");
      ModelNode next = model.back();
      int ops = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < ops; ++i) ASSERT_NO_FATAL_FAILURE(RandomOp(rng, txn, next));
      ASSERT_TRUE(store->Commit(std::move(txn)).ok());
      model.push_back(std::move(next));
      if (rng() % 30 == 0) {
        ASSERT_TRUE(store->Checkpoint("r").ok());
        ASSERT_TRUE(store->TruncateWalBefore("r", *store->LatestVersion("r")).ok());
      }
      // A few random reads of older versions as the history grows.
      uint64_t latest = model.size() - 1;
      uint64_t v = latest - rng() % std::min<uint64_t>(latest + 1, kKeep);
      auto got = store->At("r", v);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_EQ(Compare(model[v], got->root()), "") << "version " << v << " at latest " << latest;
    }
    const uint64_t latest = kCommits;
    EXPECT_EQ(Window(*store, "r"), (RetainedVersions{latest - kKeep + 1, latest}));
    for (uint64_t v = latest - kKeep + 1; v <= latest; ++v) {
      auto got = store->At("r", v);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(Compare(model[v], got->root()), "") << "version " << v;
    }
    for (uint64_t v : {uint64_t{0}, uint64_t{1}, latest - kKeep}) ExpectGone(*store, "r", v, latest - kKeep + 1);
    auto ahead = store->At("r", latest + 1);
    EXPECT_TRUE(ahead.status().IsNotFound());
    EXPECT_NE(ahead.status().message().find("newest version is " + std::to_string(latest)), std::string::npos)
        << ahead.status().ToString();
  }
  auto store = OpenOrDie(tmp.path(), o);
  EXPECT_EQ(Window(*store, "r"), (RetainedVersions{kCommits - kKeep + 1, kCommits}));
  for (uint64_t v = kCommits - kKeep + 1; v <= kCommits; ++v) {
    auto got = store->At("r", v);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(Compare(model[v], got->root()), "") << "version " << v << " after restart";
  }
  ExpectGone(*store, "r", kCommits - kKeep, kCommits - kKeep + 1);
}

TEST(TreeVersions, RetentionByCount) {
  TempDir tmp;
  auto store = OpenOrDie(tmp.path(), Opts(3));
  ASSERT_TRUE(store->CreateTree("t").ok());
  EXPECT_EQ(Window(*store, "t"), (RetainedVersions{0, 0}));
  ExpectNumberedAt(*store, "t", 0);
  CommitNumbered(*store, "t", 10);
  EXPECT_EQ(Window(*store, "t"), (RetainedVersions{8, 10}));
  for (uint64_t v = 8; v <= 10; ++v) ExpectNumberedAt(*store, "t", v);
  ExpectGone(*store, "t", 7, 8);
  ExpectGone(*store, "t", 0, 8);
  EXPECT_TRUE(store->At("nope", 1).status().IsNotFound());
  EXPECT_EQ(Store::Open(tmp.path() + "/other", Opts(0)).status().code(), StatusCode::kInvalidArgument);

  // keep_versions 1: only the newest, as before retention existed.
  TempDir one;
  auto latest_only = OpenOrDie(one.path(), Opts(1));
  ASSERT_TRUE(latest_only->CreateTree("t").ok());
  CommitNumbered(*latest_only, "t", 4);
  EXPECT_EQ(Window(*latest_only, "t"), (RetainedVersions{4, 4}));
  auto gone = latest_only->At("t", 3);
  ASSERT_TRUE(gone.status().IsNotFound());
  EXPECT_NE(gone.status().message().find("only version 4 is held"), std::string::npos) << gone.status().ToString();
}

TEST(TreeVersions, RetentionByTime) {
  TempDir tmp;
  StoreOptions o = Opts(1);
  o.retention.keep_for = 800ms;
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    CommitNumbered(*store, "t", 5);
    // Every version superseded within the last 800 ms is held.
    EXPECT_EQ(Window(*store, "t").oldest, 0u);
    for (uint64_t v = 0; v <= 5; ++v) ExpectNumberedAt(*store, "t", v);
    // Once they are older, the background pass (about once a second) drops them.
    EXPECT_TRUE(WaitFor([&] { return Window(*store, "t").oldest == 5; }, 5s));
    EXPECT_EQ(Window(*store, "t"), (RetainedVersions{5, 5}));
    ExpectGone(*store, "t", 4, 5);
    // A commit prunes too.
    CommitNumbered(*store, "t", 2);
    EXPECT_EQ(Window(*store, "t"), (RetainedVersions{5, 7}));
    std::this_thread::sleep_for(900ms);
    CommitNumbered(*store, "t");
    EXPECT_EQ(Window(*store, "t"), (RetainedVersions{7, 8}));
  }
  // After a restart, replayed versions count from when their successor's WAL
  // segment was written: a long keep_for holds them all...
  StoreOptions hour = Opts(1);
  hour.retention.keep_for = std::chrono::hours(1);
  {
    auto store = OpenOrDie(tmp.path(), hour);
    EXPECT_EQ(Window(*store, "t"), (RetainedVersions{0, 8}));
    for (uint64_t v = 0; v <= 8; ++v) ExpectNumberedAt(*store, "t", v);
  }
  // ...and a short one none of them, once the segment is older than it.
  std::this_thread::sleep_for(900ms);
  auto store = OpenOrDie(tmp.path(), o);
  EXPECT_EQ(Window(*store, "t"), (RetainedVersions{8, 8}));
}

TEST(TreeVersions, PinsHoldAVersionAndEverythingAfter) {
  TempDir tmp;
  auto store = OpenOrDie(tmp.path(), Opts(1));
  ASSERT_TRUE(store->CreateTree("t").ok());
  CommitNumbered(*store, "t", 3);
  auto pin = store->Pin("t", 3);
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  EXPECT_TRUE(pin->held());
  EXPECT_EQ(pin->version(), 3u);
  EXPECT_EQ(pin->tree(), "t");
  // Not retained any more: no pin.
  auto late = store->Pin("t", 2);
  ASSERT_TRUE(late.status().IsNotFound());
  EXPECT_NE(late.status().message().find("oldest version held is 3"), std::string::npos);
  EXPECT_TRUE(store->Pin("t", 9).status().IsNotFound());

  CommitNumbered(*store, "t", 5);
  EXPECT_EQ(Window(*store, "t"), (RetainedVersions{3, 8}));
  for (uint64_t v = 3; v <= 8; ++v) ExpectNumberedAt(*store, "t", v);
  // A second, newer pin; moving a pin keeps it.
  VersionPin newer = std::move(*store->Pin("t", 6));
  VersionPin moved = std::move(*pin);
  EXPECT_FALSE(pin->held());
  moved.Release();
  EXPECT_FALSE(moved.held());
  CommitNumbered(*store, "t");
  EXPECT_EQ(Window(*store, "t"), (RetainedVersions{6, 9}));
  ExpectGone(*store, "t", 5, 6);
  {
    VersionPin released = std::move(newer);
  }
  CommitNumbered(*store, "t");
  EXPECT_EQ(Window(*store, "t"), (RetainedVersions{10, 10}));

  // A pin may outlive its store.
  auto last = store->Pin("t", 10);
  ASSERT_TRUE(last.ok());
  store.reset();
  last->Release();
}

// Checkpoints and WAL truncation (explicit and automatic) keep what a restart
// needs to rebuild the window: a checkpoint at or before its oldest version
// and the WAL after it.
TEST(TreeVersions, RestartRebuildsTheWindowAfterCheckpointsAndTruncation) {
  TempDir tmp;
  StoreOptions o = Opts(30);
  o.wal_segment_bytes = 300;
  const std::string dir = tmp.path() + "/trees/t";
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int round = 0; round < 5; ++round) {
      CommitNumbered(*store, "t", 20);
      ASSERT_TRUE(store->Checkpoint("t").ok());
      ASSERT_TRUE(store->TruncateWalBefore("t", 1000).ok());
    }
    EXPECT_EQ(Window(*store, "t"), (RetainedVersions{71, 100}));
  }
  // Checkpoints 100 and 80 (the newest two) and 60 (the base for 71..100).
  EXPECT_EQ(Files(dir, "checkpoint-"),
            (std::vector<std::string>{"checkpoint-00000000000000000060.snap", "checkpoint-00000000000000000080.snap",
                                      "checkpoint-00000000000000000100.snap"}));
  {
    auto store = OpenOrDie(tmp.path(), o);
    EXPECT_EQ(Window(*store, "t"), (RetainedVersions{71, 100}));
    for (uint64_t v = 71; v <= 100; ++v) ExpectNumberedAt(*store, "t", v);
    ExpectGone(*store, "t", 70, 71);
    CommitNumbered(*store, "t", 5);
    EXPECT_EQ(Window(*store, "t"), (RetainedVersions{76, 105}));
  }
  // Reopened with a smaller retention: the window shrinks, and the next
  // checkpoint deletes the base that is no longer needed.
  StoreOptions small = Opts(2);
  small.wal_segment_bytes = 300;
  {
    auto store = OpenOrDie(tmp.path(), small);
    EXPECT_EQ(Window(*store, "t"), (RetainedVersions{104, 105}));
    ExpectNumberedAt(*store, "t", 104);
    ASSERT_TRUE(store->Checkpoint("t").ok());
    ASSERT_TRUE(store->TruncateWalBefore("t", 1000).ok());
  }
  EXPECT_EQ(Files(dir, "checkpoint-"),
            (std::vector<std::string>{"checkpoint-00000000000000000100.snap", "checkpoint-00000000000000000105.snap"}));
  // The larger retention again: only what the disk still holds comes back.
  auto store = OpenOrDie(tmp.path(), o);
  auto w = Window(*store, "t");
  EXPECT_EQ(w.newest, 105u);
  EXPECT_LE(w.oldest, 104u);
  for (uint64_t v = w.oldest; v <= 105; ++v) ExpectNumberedAt(*store, "t", v);
}

// A damaged base checkpoint costs part of the window, never the newest data.
TEST(TreeVersions, DamagedBaseCheckpointShrinksTheWindow) {
  TempDir tmp;
  StoreOptions o = Opts(30);
  o.wal_segment_bytes = 300;
  const std::string dir = tmp.path() + "/trees/t";
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    for (int round = 0; round < 5; ++round) {
      CommitNumbered(*store, "t", 20);
      ASSERT_TRUE(store->Checkpoint("t").ok());
      ASSERT_TRUE(store->TruncateWalBefore("t", 1000).ok());
    }
  }
  // The base of 71..100 is checkpoint 60; the WAL no longer reaches version 1.
  ASSERT_EQ(::truncate((dir + "/checkpoint-00000000000000000060.snap").c_str(), 40), 0);
  auto store = OpenOrDie(tmp.path(), o);
  EXPECT_EQ(Window(*store, "t"), (RetainedVersions{80, 100}));  // from checkpoint 80 on
  for (uint64_t v = 80; v <= 100; ++v) ExpectNumberedAt(*store, "t", v);
  ExpectGone(*store, "t", 71, 80);
}

TEST(TreeVersions, AutomaticCheckpointsKeepTheWindowOnDisk) {
  TempDir tmp;
  StoreOptions o = Opts(25);
  o.checkpoint_every_commits = 10;
  o.wal_retain_versions = 0;  // replicas' catch-up needs nothing: only the retention holds the WAL
  o.wal_segment_bytes = 300;
  const std::string dir = tmp.path() + "/trees/t";
  auto checkpoint_file = [](uint64_t v) {
    std::string n = std::to_string(v);
    return "checkpoint-" + std::string(20 - n.size(), '0') + n + ".snap";
  };
  {
    auto store = OpenOrDie(tmp.path(), o);
    ASSERT_TRUE(store->CreateTree("t").ok());
    // Ten rounds of ten commits, each followed by its background checkpoint
    // (and the WAL truncation after it).
    for (uint64_t round = 1; round <= 10; ++round) {
      CommitNumbered(*store, "t", 10);
      ASSERT_TRUE(WaitFor([&] { return PathExists(dir + "/" + checkpoint_file(round * 10)); }, 10s)) << round;
    }
    // At the checkpoint of 100 the window is 76..100: a checkpoint at or
    // before 76 stays as the base, with the WAL after it; older WAL goes.
    EXPECT_TRUE(WaitFor([&] { return store->ReadDeltasSince("t", 0).status().IsNotFound(); }, 10s));
    EXPECT_EQ(Window(*store, "t"), (RetainedVersions{76, 100}));
  }
  // Without racing commits: 100, 90 (the newest two), 80 (the next base) and
  // 70 (the base); with them the bases may have moved further.
  auto files = Files(dir, "checkpoint-");
  ASSERT_GE(files.size(), 3u);
  ASSERT_LE(files.size(), 4u);
  EXPECT_EQ(files[files.size() - 2], checkpoint_file(90));
  EXPECT_EQ(files.back(), checkpoint_file(100));
  EXPECT_LE(files[0], checkpoint_file(76));
  auto store = OpenOrDie(tmp.path(), o);
  EXPECT_EQ(Window(*store, "t"), (RetainedVersions{76, 100}));
  for (uint64_t v = 76; v <= 100; ++v) ExpectNumberedAt(*store, "t", v);
}

// A replica applying the leader's deltas retains the same window; a snapshot
// install replaces the history with the installed version alone.
TEST(TreeVersions, ReplicasRetainAppliedDeltasAndSnapshotsResetTheHistory) {
  TempDir leader_dir, replica_dir;
  auto leader = OpenOrDie(leader_dir.path(), Opts(10));
  auto replica = OpenOrDie(replica_dir.path(), Opts(10));
  ASSERT_TRUE(leader->CreateTree("t").ok());
  ASSERT_TRUE(replica->CreateTree("t").ok());
  CommitNumbered(*leader, "t", 25);
  auto deltas = leader->ReadDeltasSince("t", 0);
  ASSERT_TRUE(deltas.ok());
  for (const auto& d : *deltas) ASSERT_TRUE(replica->ApplyEncodedDelta(d).ok());
  EXPECT_EQ(Window(*replica, "t"), (RetainedVersions{16, 25}));
  for (uint64_t v = 16; v <= 25; ++v) {
    ExpectNumberedAt(*replica, "t", v);
    EXPECT_EQ(replica->At("t", v)->Digest(), leader->At("t", v)->Digest());
  }
  ExpectGone(*replica, "t", 15, 16);

  // The replica falls behind and is sent a snapshot of version 40.
  CommitNumbered(*leader, "t", 15);
  auto installer = replica->BeginSnapshotInstall("t");
  ASSERT_TRUE(installer.ok());
  ASSERT_TRUE(WriteSnapshot(*leader->Latest("t"), 256, [&](std::string_view chunk) {
                return (*installer)->AddChunk(chunk);
              }).ok());
  ASSERT_TRUE((*installer)->Finish().ok());
  EXPECT_EQ(Window(*replica, "t"), (RetainedVersions{40, 40}));
  ExpectGone(*replica, "t", 39, 40);
  CommitNumbered(*leader, "t", 3);
  auto more = leader->ReadDeltasSince("t", 40);
  ASSERT_TRUE(more.ok());
  for (const auto& d : *more) ASSERT_TRUE(replica->ApplyEncodedDelta(d).ok());
  EXPECT_EQ(Window(*replica, "t"), (RetainedVersions{40, 43}));
  for (uint64_t v = 40; v <= 43; ++v) ExpectNumberedAt(*replica, "t", v);
  replica.reset();
  // After a restart the replica holds what it held: the snapshot's version on.
  auto reopened = OpenOrDie(replica_dir.path(), Opts(10));
  EXPECT_EQ(Window(*reopened, "t"), (RetainedVersions{40, 43}));
  for (uint64_t v = 40; v <= 43; ++v) ExpectNumberedAt(*reopened, "t", v);
}

}  // namespace
}  // namespace canopy::tree
