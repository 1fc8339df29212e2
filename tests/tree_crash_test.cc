// Crash safety and full disks: a committer SIGKILLed at random points loses
// no acknowledged commit and leaves nothing half-applied; a full disk gives
// ResourceExhausted and the store stays readable (tree/store.h).
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "base/coding.h"
#include "base/file.h"
#include "tests/testing/test_util.h"
#include "tree/store.h"

namespace canopy::tree {
namespace {

using canopy::testing::TempDir;

constexpr uint64_t kBuckets = 64;

// Commit v appends a node with n=v under bucket (v-1) % 64 of the root
// (creating the bucket when v <= 64) and sets the root's last=v, in one
// transaction. Buckets keep every node's child list short.
Result<CommitResult> CommitNumbered(Store& store, size_t payload_bytes) {
  CANOPY_ASSIGN_OR_RETURN(Transaction txn, store.Begin("t"));
  uint64_t v = txn.base().number() + 1;
  std::string n = std::to_string(v);
  if (v <= kBuckets) CANOPY_RETURN_IF_ERROR(txn.AppendChild({}).status());
  CANOPY_ASSIGN_OR_RETURN(NodePath node, txn.AppendChild({(v - 1) % kBuckets}));
  CANOPY_RETURN_IF_ERROR(txn.PutAttribute(node, "n", n));
  if (payload_bytes)
    CANOPY_RETURN_IF_ERROR(txn.PutAttribute(node, "payload", std::string(payload_bytes, 'x')));
  CANOPY_RETURN_IF_ERROR(txn.PutAttribute({}, "last", n));
  return store.Commit(std::move(txn));
}

// True when version v is exactly v whole numbered commits.
::testing::AssertionResult IsNumbered(const Version& v) {
  const Node& root = *v.root();
  if (root.child_count() != std::min(v.number(), kBuckets)) {
    return ::testing::AssertionFailure()
           << "version " << v.number() << " has " << root.child_count() << " buckets";
  }
  auto last = root.attribute("last");
  if (v.number() > 0 && (!last || *last != std::to_string(v.number()))) {
    return ::testing::AssertionFailure() << "root attribute last is wrong at version " << v.number();
  }
  uint64_t total = 0;
  for (uint64_t b = 0; b < root.child_count(); ++b) {
    const Node& bucket = *root.child(b);
    for (uint64_t j = 0; j < bucket.child_count(); ++j) {
      auto n = bucket.child(j)->attribute("n");
      if (!n || *n != std::to_string(b + 1 + kBuckets * j)) {
        return ::testing::AssertionFailure()
               << "node " << b << "/" << j << " is wrong at version " << v.number();
      }
      ++total;
    }
  }
  if (total != v.number()) {
    return ::testing::AssertionFailure() << "version " << v.number() << " holds " << total << " commits";
  }
  return ::testing::AssertionSuccess();
}

TEST(TreeCrash, KilledCommitterLosesNoAcknowledgedCommit) {
  TempDir tmp;
  StoreOptions o;
  o.fsync = FsyncPolicy::kAlways;
  o.wal_segment_bytes = 4096;       // segment rollovers happen during the run
  o.checkpoint_every_commits = 25;  // and background checkpoints + WAL truncation
  o.wal_retain_versions = 10;
  {
    auto store = Store::Open(tmp.path(), o);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->CreateTree("t").ok());
  }
  std::mt19937 rng(12345);
  uint64_t acked_max = 0;
  for (int round = 0; round < 5; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = testing::ForkChild([&]() -> int {
      ::close(fds[0]);
      auto store = Store::Open(tmp.path(), o);
      if (!store.ok()) return 2;
      // Four committers share the tree (group commit), each acks what it got.
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
          for (int i = 0; i < 100000; ++i) {
            auto r = CommitNumbered(**store, static_cast<size_t>(i % 200));
            if (!r.ok()) {
              if (r.status().IsConflict()) continue;
              ::_exit(3);
            }
            char buf[8];
            EncodeFixed64(buf, r->version);
            if (::write(fds[1], buf, 8) != 8) ::_exit(4);
          }
        });
      }
      for (auto& th : threads) th.join();
      return 0;
    });
    ASSERT_GT(pid, 0);
    ::close(fds[1]);
    // Wait for its first acknowledgement (recovery is done, commits flow),
    // let it run a random while longer, then kill it mid-flight.
    uint64_t round_acks = 0;
    char buf[8];
    struct pollfd pfd {
      fds[0], POLLIN, 0
    };
    if (::poll(&pfd, 1, 60000) == 1 && ::read(fds[0], buf, 8) == 8) {
      acked_max = std::max(acked_max, DecodeFixed64(buf));
      ++round_acks;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 200));
    ::kill(pid, SIGKILL);
    int status = testing::WaitChild(pid, std::chrono::seconds(30));
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with status " << status;
    while (::read(fds[0], buf, 8) == 8) {
      acked_max = std::max(acked_max, DecodeFixed64(buf));
      ++round_acks;
    }
    ::close(fds[0]);
    EXPECT_GT(round_acks, 0u) << "round " << round << " acknowledged nothing";

    auto store = Store::Open(tmp.path(), o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto v = (*store)->Latest("t");
    ASSERT_TRUE(v.ok());
    EXPECT_GE(v->number(), acked_max) << "round " << round << ": an acknowledged commit is missing";
    EXPECT_TRUE(IsNumbered(*v)) << "round " << round;
    std::fprintf(stderr, "round %d: %llu acks, newest acked %llu, recovered version %llu\n", round,
                 static_cast<unsigned long long>(round_acks), static_cast<unsigned long long>(acked_max),
                 static_cast<unsigned long long>(v->number()));
    // The recovered store accepts commits right away.
    auto r = CommitNumbered(**store, 10);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    acked_max = r->version;
  }
}

// Fills the disk (or the file size limit) with commits. Returns 0 when the
// store behaved: ResourceExhausted, still readable at the last good version,
// later commits fail the same way, a checkpoint attempt fails cleanly. The
// last good version is written to `ack_fd`.
int FillUntilFull(const std::string& dir, int ack_fd, bool full_disk) {
  StoreOptions o;
  o.fsync = FsyncPolicy::kAlways;
  o.checkpoint_every_commits = 0;
  o.wal_segment_bytes = 1 << 30;
  auto store = Store::Open(dir, o);
  if (!store.ok()) return 10;
  if (!(*store)->HasTree("t") && !(*store)->CreateTree("t").ok()) return 11;
  Status failure;
  for (int i = 0; i < 100000; ++i) {
    auto r = CommitNumbered(**store, 1000);
    if (!r.ok()) {
      failure = r.status();
      break;
    }
  }
  if (failure.ok()) return 12;
  std::fprintf(stderr, "full: %s\n", failure.ToString().c_str());
  if (failure.code() != StatusCode::kResourceExhausted) {
    std::fprintf(stderr, "unexpected error: %s\n", failure.ToString().c_str());
    return 13;
  }
  auto v = (*store)->Latest("t");
  if (!v.ok() || !IsNumbered(*v)) return 14;
  if (v->number() < 10) return 15;
  if (CommitNumbered(**store, 1000).status().code() != StatusCode::kResourceExhausted) return 16;
  // A checkpoint needs room too: on a full disk it must fail cleanly (under
  // RLIMIT_FSIZE, a per-file limit, the smaller checkpoint file may fit).
  auto cp = (*store)->Checkpoint("t");
  if (!cp.ok() && cp.status().code() != StatusCode::kResourceExhausted) return 17;
  if (!full_disk && !cp.ok()) return 21;
  if (full_disk && cp.ok()) return 22;
  if (!IsNumbered(*(*store)->Latest("t"))) return 18;
  if ((*store)->Latest("t")->number() != v->number()) return 19;
  char buf[8];
  EncodeFixed64(buf, v->number());
  if (::write(ack_fd, buf, 8) != 8) return 20;
  return 0;
}

TEST(TreeCrash, FileSizeLimitGivesResourceExhaustedAndTheStoreStaysReadable) {
  TempDir tmp;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = testing::ForkChild([&]() -> int {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {
      64 << 10, 64 << 10
    };
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 30;
    return FillUntilFull(tmp.path(), fds[1], /*full_disk=*/false);
  });
  ::close(fds[1]);
  int status = testing::WaitChild(pid, std::chrono::seconds(60));
  char buf[8];
  bool got = ::read(fds[0], buf, 8) == 8;
  ::close(fds[0]);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ASSERT_TRUE(got);
  uint64_t last_good = DecodeFixed64(buf);

  // Reopened without the limit: exactly the last good version, and writable.
  auto store = Store::Open(tmp.path(), StoreOptions{});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto v = (*store)->Latest("t");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->number(), last_good);
  EXPECT_TRUE(IsNumbered(*v));
  EXPECT_TRUE(CommitNumbered(**store, 1000).ok());
  EXPECT_TRUE((*store)->Checkpoint("t").ok());
}

TEST(TreeCrash, ABatchThatDoesNotFitIsNotAppliedAtAll) {
  TempDir tmp;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  // Batches of 4 commits of 1000 bytes under a 64 KiB file size limit: the
  // batch that does not fit fails whole, and nothing of it is applied.
  pid_t pid = testing::ForkChild([&]() -> int {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {
      64 << 10, 64 << 10
    };
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 30;
    StoreOptions o;
    o.checkpoint_every_commits = 0;
    o.wal_segment_bytes = 1 << 30;
    auto store = Store::Open(tmp.path(), o);
    if (!store.ok()) return 10;
    if (!(*store)->CreateTree("t").ok()) return 11;
    for (int b = 0; b < 1000; ++b) {
      const uint64_t before = *(*store)->LatestVersion("t");
      std::vector<Store::OpsCommit> batch;
      for (int i = 0; i < 4; ++i) {
        batch.push_back(Store::OpsCommit{{Op::PutAttribute({}, "k" + std::to_string(before + i), std::string(1000, 'v'))}, {}, 0});
      }
      auto results = (*store)->CommitOpsBatch("t", std::move(batch));
      if (results.size() != 4) return 12;
      if (results[0].ok()) {
        for (auto& r : results) {
          if (!r.ok()) return 13;  // all or nothing
        }
        continue;
      }
      for (auto& r : results) {
        if (r.status().code() != StatusCode::kResourceExhausted) return 14;
      }
      if (*(*store)->LatestVersion("t") != before) return 15;
      if ((*store)->Latest("t")->root()->attribute_count() != before) return 16;
      char buf[8];
      EncodeFixed64(buf, before);
      if (::write(fds[1], buf, 8) != 8) return 20;
      return 0;
    }
    return 17;  // never full
  });
  ::close(fds[1]);
  int status = testing::WaitChild(pid, std::chrono::seconds(60));
  char buf[8];
  bool got = ::read(fds[0], buf, 8) == 8;
  ::close(fds[0]);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  ASSERT_TRUE(got);
  const uint64_t last_good = DecodeFixed64(buf);
  EXPECT_EQ(last_good % 4, 0u);
  // Reopened without the limit: exactly the last good version, every key of it.
  auto store = Store::Open(tmp.path(), StoreOptions{});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto v = (*store)->Latest("t");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->number(), last_good);
  EXPECT_EQ(v->root()->attribute_count(), last_good);
  EXPECT_TRUE((*store)->CommitOps("t", {Op::PutAttribute({}, "after", "x")}).ok());
}

TEST(TreeCrash, FullTmpfsGivesResourceExhaustedAndTheStoreStaysReadable) {
  TempDir tmp;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  // The child gets a private mount namespace with a 256 KiB tmpfs on tmp.
  pid_t pid = testing::ForkChild([&]() -> int {
    ::close(fds[0]);
    if (::unshare(CLONE_NEWNS) != 0) return 77;
    if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
    if (::mount("canopy-test", tmp.path().c_str(), "tmpfs", 0, "size=256k") != 0) return 77;
    int rc = FillUntilFull(tmp.path(), fds[1], /*full_disk=*/true);
    if (rc != 0) return rc;
    // Reopen inside the namespace (the parent cannot see this tmpfs).
    auto store = Store::Open(tmp.path(), StoreOptions{});
    if (!store.ok()) return 40;
    auto v = (*store)->Latest("t");
    if (!v.ok() || !IsNumbered(*v)) return 41;
    return 0;
  });
  ::close(fds[1]);
  int status = testing::WaitChild(pid, std::chrono::seconds(60));
  ::close(fds[0]);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    GTEST_SKIP() << "cannot mount a private tmpfs here (needs CAP_SYS_ADMIN); "
                    "the RLIMIT_FSIZE test covers the full-disk path";
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace canopy::tree
