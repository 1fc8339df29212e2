// SliceForwarder (tools/canopy/slice_forwarder.h) against a real node in
// this process (tcp://127.0.0.1, one member, RF 1): many SLICEs in flight on
// its links each get their own reply, in any number; nothing goes out before
// Connect; a stopped node fails what is out and refuses what comes; a dial
// that failed is not retried within the redial interval; destroying the
// forwarder fails what it still holds, each waiter exactly once.
#include "tools/canopy/slice_forwarder.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "replication/client.h"
#include "replication/node.h"
#include "tests/testing/test_util.h"
#include "transport/builtin.h"

namespace canopy::board {
namespace {

using replication::Edit;
using replication::SliceReply;
using replication::SliceRequest;

constexpr char kCluster[] = "forwarder-test";
constexpr char kSecret[] = "forwarder test secret, loopback only";
constexpr uint32_t kChildren = 50;

// Collects the results of many waiters, by request number.
class Results {
 public:
  class Waiter : public SliceForwarder::Waiter {
   public:
    Waiter(Results* results, int id) : results_(results), id_(id) {}
    void Done(Result<SliceReply> reply) override { results_->Add(id_, std::move(reply)); }

   private:
    Results* results_;
    int id_;
  };

  void Add(int id, Result<SliceReply> reply) {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_[id];
    if (reply.ok()) {
      replies_.emplace(id, std::move(*reply));
    } else {
      errors_.emplace(id, reply.status());
    }
    cv_.notify_all();
  }

  // Waits (bounded) until `n` waiters are done.
  bool WaitFor(size_t n, std::chrono::seconds limit = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return done_.size() >= n; });
  }

  std::map<int, int> done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  std::map<int, SliceReply> replies() {
    std::lock_guard<std::mutex> lock(mu_);
    return replies_;
  }
  std::map<int, Status> errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, int> done_;  // id -> times Done was called
  std::map<int, SliceReply> replies_;
  std::map<int, Status> errors_;
};

class SliceForwarderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport::RegisterBuiltinTransports();
    replication::NodeOptions o;
    o.listen_uri = "tcp://127.0.0.1:0";
    o.data_dir = dir_.File("node");
    o.cluster = kCluster;
    o.node_id = "1";
    o.secret = kSecret;
    o.ring.replication_factor = 1;
    auto node = replication::Node::Start(o);
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    node_ = std::move(*node);
    auto client = replication::Client::Connect(node_->uri(), ClientOptions());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto created = (*client)->CreateTree("t");
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    // One commit: children 0 .. kChildren-1, child k with attribute n = k.
    replication::CommitRequest c;
    c.tree = "t";
    c.level = replication::ConsistencyLevel::kOne;
    for (uint32_t k = 0; k < kChildren; ++k) {
      c.edits.push_back(Edit{Edit::Kind::kAppendChild, {}, "", "", 0});
      c.edits.push_back(Edit{Edit::Kind::kPutAttribute, {k}, "n", std::to_string(k), 0});
    }
    auto committed = (*client)->Commit(c);
    ASSERT_TRUE(committed.ok()) << committed.status().ToString();
    ASSERT_EQ(committed->status.code, StatusCode::kOk) << committed->status.message;
  }

  static replication::ClientOptions ClientOptions() {
    replication::ClientOptions c;
    c.cluster = kCluster;
    c.secret = kSecret;
    c.timeout = std::chrono::milliseconds(5000);
    return c;
  }

  static SliceForwarderOptions ForwarderOptions() {
    SliceForwarderOptions f;
    f.client = ClientOptions();
    return f;
  }

  // Child k (mod kChildren) of tree t, alone.
  static SliceRequest ChildRequest(int k) {
    SliceRequest r;
    r.tree = "t";
    r.child_from = static_cast<uint32_t>(k) % kChildren;
    r.child_limit = 1;
    return r;
  }

  testing::TempDir dir_;
  std::unique_ptr<replication::Node> node_;
};

TEST_F(SliceForwarderTest, NothingIsSentBeforeConnect) {
  SliceForwarder f(ForwarderOptions());
  Results results;
  std::unique_ptr<SliceForwarder::Waiter> w = std::make_unique<Results::Waiter>(&results, 0);
  EXPECT_FALSE(f.TrySend(node_->uri(), ChildRequest(0), w));
  EXPECT_NE(w, nullptr) << "a refused waiter stays with the caller";
  EXPECT_EQ(f.in_flight(), 0u);
}

TEST_F(SliceForwarderTest, ManyReadsInFlightEachGetTheirOwnReply) {
  SliceForwarderOptions o = ForwarderOptions();
  o.links_per_peer = 3;
  o.max_in_flight = 100;
  SliceForwarder f(o);
  ASSERT_TRUE(f.Connect(node_->uri()).ok());
  Results results;
  constexpr int kReads = 900;
  int sent = 0;
  // Rounds of up to 3 x 100 queued reads, then one flush, as the board does
  // after each round of HTTP events; a full round refuses the rest.
  while (sent < kReads) {
    int queued = 0;
    for (;;) {
      std::unique_ptr<SliceForwarder::Waiter> w = std::make_unique<Results::Waiter>(&results, sent);
      if (!f.TrySend(node_->uri(), ChildRequest(sent), w)) {
        ASSERT_NE(w, nullptr);
        break;
      }
      ++sent;
      ++queued;
      if (sent == kReads) break;
    }
    ASSERT_GT(queued, 0) << "nothing could be queued after " << sent << " reads";
    EXPECT_LE(queued, 300) << "more than links_per_peer x max_in_flight queued at once";
    f.Flush();
    ASSERT_TRUE(results.WaitFor(static_cast<size_t>(sent))) << results.done().size() << " of " << sent << " done";
  }
  auto done = results.done();
  ASSERT_EQ(done.size(), static_cast<size_t>(kReads));
  for (const auto& [id, times] : done) EXPECT_EQ(times, 1) << "read " << id;
  EXPECT_TRUE(results.errors().empty()) << results.errors().begin()->second.ToString();
  for (const auto& [id, reply] : results.replies()) {
    ASSERT_EQ(reply.status.code, StatusCode::kOk) << "read " << id << ": " << reply.status.message;
    EXPECT_EQ(reply.version, 1u);
    EXPECT_EQ(reply.child_count, kChildren);
    EXPECT_EQ(reply.child_start, static_cast<uint32_t>(id) % kChildren) << "read " << id;
    ASSERT_EQ(reply.children.size(), 1u) << "read " << id;
    EXPECT_EQ(reply.children[0].attributes.at("n"), std::to_string(id % kChildren)) << "read " << id;
  }
  EXPECT_EQ(f.in_flight(), 0u);
}

TEST_F(SliceForwarderTest, AStoppedNodeFailsWhatIsOutAndRefusesTheRest) {
  SliceForwarderOptions o = ForwarderOptions();
  o.redial_interval = std::chrono::milliseconds(60000);
  SliceForwarder f(o);
  const std::string uri = node_->uri();
  ASSERT_TRUE(f.Connect(uri).ok());
  Results results;
  constexpr int kReads = 200;
  for (int k = 0; k < kReads; ++k) {
    std::unique_ptr<SliceForwarder::Waiter> w = std::make_unique<Results::Waiter>(&results, k);
    ASSERT_TRUE(f.TrySend(uri, ChildRequest(k), w)) << "read " << k;
  }
  f.Flush();
  node_->Stop();
  // Every read ends once, answered (if the node got to it) or failed.
  ASSERT_TRUE(results.WaitFor(kReads)) << results.done().size() << " of " << kReads << " done";
  for (const auto& [id, times] : results.done()) EXPECT_EQ(times, 1) << "read " << id;
  for (const auto& [id, reply] : results.replies()) EXPECT_EQ(reply.child_start, static_cast<uint32_t>(id) % kChildren);
  // The links broke: nothing more is taken.
  Results late;
  bool refused = false;
  size_t taken = 0;
  for (int attempt = 0; attempt < 200 && !refused; ++attempt) {
    std::unique_ptr<SliceForwarder::Waiter> w = std::make_unique<Results::Waiter>(&late, attempt);
    refused = !f.TrySend(uri, ChildRequest(0), w);
    if (!refused) {
      ++taken;
      f.Flush();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_TRUE(refused) << "a forwarder to a stopped node still took reads after 2 s";
  // Reads taken while the links were breaking end too, none answered.
  ASSERT_TRUE(late.WaitFor(taken)) << late.done().size() << " of " << taken << " done";
  EXPECT_EQ(late.errors().size(), taken);
  // Dialling the stopped node fails, and is not tried again at once.
  Status first = f.Connect(uri);
  EXPECT_FALSE(first.ok());
  Status second = f.Connect(uri);
  EXPECT_EQ(second.code(), StatusCode::kUnavailable) << second.ToString();
  EXPECT_NE(second.message().find("last dial failed"), std::string::npos) << second.ToString();
}

TEST_F(SliceForwarderTest, DestroyingTheForwarderFailsWhatItHolds) {
  Results results;
  constexpr int kReads = 50;
  {
    SliceForwarder f(ForwarderOptions());
    ASSERT_TRUE(f.Connect(node_->uri()).ok());
    for (int k = 0; k < kReads; ++k) {
      std::unique_ptr<SliceForwarder::Waiter> w = std::make_unique<Results::Waiter>(&results, k);
      ASSERT_TRUE(f.TrySend(node_->uri(), ChildRequest(k), w));
    }
    EXPECT_EQ(f.in_flight(), static_cast<size_t>(kReads));
    // Never flushed: none of them can have been answered.
  }
  auto done = results.done();
  ASSERT_EQ(done.size(), static_cast<size_t>(kReads));
  for (const auto& [id, times] : done) EXPECT_EQ(times, 1) << "read " << id;
  auto errors = results.errors();
  ASSERT_EQ(errors.size(), static_cast<size_t>(kReads));
  EXPECT_EQ(errors.begin()->second.code(), StatusCode::kAborted) << errors.begin()->second.ToString();
}

}  // namespace
}  // namespace canopy::board
