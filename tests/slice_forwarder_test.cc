// SliceForwarder (replication/slice_forwarder.h) against a real node in
// this process (tcp://127.0.0.1, one member, RF 1): many SLICEs in flight on
// its links each get their own reply, in any number; nothing goes out before
// Connect; a stopped node fails what is out and refuses what comes; a dial
// that failed is not retried within the redial interval; destroying the
// forwarder fails what it still holds, each waiter exactly once. And
// Node::SliceAsync, which gathers a QUORUM read over such links, on three
// nodes in this process: the same answer as the blocking Slice, nothing
// started before the links exist, and every read that started ends once
// when an owner stops.
#include "replication/slice_forwarder.h"

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

namespace canopy::replication {
namespace {

using replication::Edit;
using replication::SliceReply;
using replication::SliceRequest;

constexpr char kCluster[] = "forwarder-test";
constexpr char kSecret[] = "forwarder test secret, loopback only";
constexpr uint32_t kChildren = 50;

// Creates tree t and fills it in one commit at `level`: children
// 0 .. kChildren-1, child k with attribute n = k.
void FillTree(Client& client, ConsistencyLevel level) {
  auto created = client.CreateTree("t");
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  CommitRequest c;
  c.tree = "t";
  c.level = level;
  for (uint32_t k = 0; k < kChildren; ++k) {
    c.edits.push_back(Edit{Edit::Kind::kAppendChild, {}, "", "", 0});
    c.edits.push_back(Edit{Edit::Kind::kPutAttribute, {k}, "n", std::to_string(k), 0});
  }
  auto committed = client.Commit(c);
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  ASSERT_EQ(committed->status.code, StatusCode::kOk) << committed->status.message;
}

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
    FillTree(**client, ConsistencyLevel::kOne);
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

// Three nodes in this process (RF 3), tree t with kChildren children
// committed at ALL.
class SliceAsyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    transport::RegisterBuiltinTransports();
    for (int i = 1; i <= 3; ++i) {
      NodeOptions o;
      o.listen_uri = "tcp://127.0.0.1:0";
      o.data_dir = dir_.File("node" + std::to_string(i));
      o.cluster = kCluster;
      o.node_id = std::to_string(i);
      o.secret = kSecret;
      o.ring.replication_factor = 3;
      o.heartbeat_interval = std::chrono::milliseconds(50);
      if (!nodes_.empty()) o.seeds = {nodes_[0]->uri()};
      auto node = Node::Start(o);
      ASSERT_TRUE(node.ok()) << node.status().ToString();
      nodes_.push_back(std::move(*node));
    }
    ClientOptions co;
    co.cluster = kCluster;
    co.secret = kSecret;
    auto client = Client::Connect(nodes_[0]->uri(), co);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    // Every node sees the other two alive.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    bool joined = false;
    while (!joined && std::chrono::steady_clock::now() < deadline) {
      joined = true;
      for (auto& n : nodes_) {
        auto c = Client::Connect(n->uri(), co);
        auto st = c.ok() ? (*c)->GetStatus() : Result<StatusReply>(c.status());
        size_t alive = 0;
        if (st.ok()) {
          for (const auto& m : st->nodes) alive += m.alive ? 1 : 0;
        }
        joined = joined && alive == 3;
      }
      if (!joined) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(joined) << "the three nodes did not see each other alive within 15 s";
    FillTree(**client, ConsistencyLevel::kAll);
  }

  static SliceRequest Quorum(int k) {
    SliceRequest r;
    r.tree = "t";
    r.level = ReadLevel::kQuorum;
    r.child_from = static_cast<uint32_t>(k) % kChildren;
    r.child_limit = 1;
    r.timeout_ms = 2000;
    return r;
  }

  // Collects SliceAsync answers by read number.
  struct Answers {
    std::mutex mu;
    std::condition_variable cv;
    std::map<int, int> times;
    std::map<int, std::optional<SliceReply>> replies;
    std::function<void(std::optional<SliceReply>)> For(int id) {
      return [this, id](std::optional<SliceReply> r) {
        std::lock_guard<std::mutex> lock(mu);
        ++times[id];
        replies[id] = std::move(r);
        cv.notify_all();
      };
    }
    bool WaitFor(size_t n) {
      std::unique_lock<std::mutex> lock(mu);
      return cv.wait_for(lock, std::chrono::seconds(10), [&] { return times.size() >= n; });
    }
  };

  testing::TempDir dir_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

TEST_F(SliceAsyncTest, QuorumReadsStartedWithoutBlockingAnswerAsSliceDoes) {
  Node& node = *nodes_[0];
  Answers answers;
  // No link yet: it does not start (and `done` is never called).
  EXPECT_FALSE(node.SliceAsync(Quorum(0), answers.For(-1)));
  // Other levels are not started this way.
  SliceRequest one = Quorum(0);
  one.level = ReadLevel::kOne;
  EXPECT_FALSE(node.SliceAsync(one, answers.For(-2)));
  // A blocking QUORUM read opens the links.
  SliceReply blocking = node.Slice(Quorum(0));
  ASSERT_EQ(blocking.status.code, StatusCode::kOk) << blocking.status.message;
  constexpr int kReads = 300;
  for (int k = 0; k < kReads; ++k) {
    ASSERT_TRUE(node.SliceAsync(Quorum(k), answers.For(k))) << "read " << k;
    if (k % 50 == 49) node.FlushSlices();
  }
  node.FlushSlices();
  ASSERT_TRUE(answers.WaitFor(kReads)) << answers.times.size() << " of " << kReads << " answered";
  std::lock_guard<std::mutex> lock(answers.mu);
  EXPECT_EQ(answers.times.count(-1) + answers.times.count(-2), 0u) << "a read that did not start was answered";
  for (int k = 0; k < kReads; ++k) {
    EXPECT_EQ(answers.times[k], 1) << "read " << k;
    const auto& r = answers.replies[k];
    ASSERT_TRUE(r.has_value()) << "read " << k << " was left to the blocking path";
    ASSERT_EQ(r->status.code, StatusCode::kOk) << r->status.message;
    EXPECT_EQ(r->version, blocking.version);
    EXPECT_EQ(r->child_count, kChildren);
    EXPECT_EQ(r->child_start, static_cast<uint32_t>(k) % kChildren);
    ASSERT_EQ(r->children.size(), 1u);
    EXPECT_EQ(r->children[0].attributes.at("n"), std::to_string(k % kChildren));
  }
}

TEST_F(SliceAsyncTest, ReadsOutWhenAnOwnerStopsEndOnce) {
  Node& node = *nodes_[0];
  ASSERT_EQ(node.Slice(Quorum(0)).status.code, StatusCode::kOk);
  Answers answers;
  int started = 0;
  for (int k = 0; k < 200; ++k) {
    // Stop both other owners midway: a quorum of 3 needs one of them.
    if (k == 100) {
      nodes_[1]->Stop();
      nodes_[2]->Stop();
    }
    if (node.SliceAsync(Quorum(k), answers.For(k))) ++started;
    node.FlushSlices();
  }
  ASSERT_GE(started, 100);
  ASSERT_TRUE(answers.WaitFor(static_cast<size_t>(started)))
      << answers.times.size() << " of " << started << " started reads ended";
  std::lock_guard<std::mutex> lock(answers.mu);
  EXPECT_EQ(answers.times.size(), static_cast<size_t>(started));
  for (const auto& [k, times] : answers.times) EXPECT_EQ(times, 1) << "read " << k;
  // What settled is right; a read that could not settle is left to Slice.
  for (const auto& [k, r] : answers.replies) {
    if (r && r->status.code == StatusCode::kOk) {
      EXPECT_EQ(r->child_start, static_cast<uint32_t>(k) % kChildren);
    }
  }
  // With both peers gone, Slice itself cannot reach a quorum.
  EXPECT_EQ(node.Slice(Quorum(0)).status.code, StatusCode::kUnavailable);
}

}  // namespace
}  // namespace canopy::replication
