// The bulletin-board HTTP API of `canopy node --http` (tools/canopy/board.h)
// on 3-node clusters on 127.0.0.1: boards and messages written through one
// node are read back through another, every error status, a write at ALL
// with a node SIGKILLed, and tools/load posting with --method POST --body;
// reads at LEADER and QUORUM see a write at once from any node, and a write
// waiting for its consistency level does not hold up the node's other clients.
#include <chrono>
#include <algorithm>
#include <future>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include <gtest/gtest.h>

#include "tests/cluster_harness.h"
#include "tests/http_test_util.h"

namespace canopy::testing {
namespace {

using nlohmann::json;

class BoardCluster {
 public:
  // metrics: every node also serves --metrics (see Metric).
  explicit BoardCluster(size_t nodes, std::vector<std::string> extra_args = {}, bool metrics = false)
      : nodes_(nodes), extra_args_(std::move(extra_args)), metrics_(metrics) {}

  // Adds and starts the nodes one by one (each seeded with the ones before)
  // and reads their HTTP ports.
  bool Start() {
    for (size_t i = 0; i < nodes_; ++i) {
      std::string port_file = cluster_.dir() + "/http" + std::to_string(i + 1) + ".port";
      std::string metrics_port_file = cluster_.dir() + "/metrics" + std::to_string(i + 1) + ".port";
      std::vector<std::string> args = {"--http", "127.0.0.1:0", "--http-port-file", port_file};
      if (metrics_) {
        args.insert(args.end(), {"--metrics", "127.0.0.1:0", "--metrics-port-file", metrics_port_file});
      }
      args.insert(args.end(), extra_args_.begin(), extra_args_.end());
      cluster_.AddNode(args);
      if (!cluster_.Start(i)) return false;
      auto port = ReadPort(port_file, i);
      if (!port) return false;
      ports_.push_back(*port);
      if (metrics_) {
        auto m = ReadPort(metrics_port_file, i);
        if (!m) return false;
        metrics_ports_.push_back(*m);
      }
    }
    return cluster_.WaitForMembers(cluster_.size());
  }

  // The value of the metric line that starts with `series` (name and
  // labels) on node `node`'s /metrics; -1 when absent.
  double Metric(size_t node, const std::string& series) {
    RawResponse r;
    std::string request = "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    if (!RoundTrip(metrics_ports_.at(node), request, &r) || r.status != 200) return -1;
    size_t at = r.body.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(r.body.substr(at + series.size() + 2));
  }

  RawResponse Call(size_t node, const std::string& method, const std::string& target, const std::string& body = "",
                   const std::string& extra_headers = "") {
    std::string request = method + " " + target + " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + extra_headers;
    if (method == "POST" || method == "PUT") request += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    request += "\r\n" + body;
    RawResponse r;
    EXPECT_TRUE(RoundTrip(ports_.at(node), request, &r)) << method << " " << target << " to node " << node + 1;
    return r;
  }

  static json Body(const RawResponse& r) { return json::parse(r.body, nullptr, false); }

  TestCluster& cluster() { return cluster_; }
  uint16_t port(size_t i) const { return ports_.at(i); }

 private:
  std::optional<uint16_t> ReadPort(const std::string& file, size_t node) {
    std::string text;
    if (!WaitUntil([&] {
          auto t = ReadFileToString(file);
          if (t.ok()) text = *t;
          return t.ok() && !text.empty();
        }, std::chrono::seconds(10))) {
      ADD_FAILURE() << "no port file " << file << " from node " << node + 1 << "; log:\n" << cluster_.Log(node);
      return std::nullopt;
    }
    return static_cast<uint16_t>(std::stoul(text));
  }

  size_t nodes_;
  std::vector<std::string> extra_args_;
  bool metrics_;
  TestCluster cluster_;
  std::vector<uint16_t> ports_;
  std::vector<uint16_t> metrics_ports_;
};

std::string Message(const std::string& author, const std::string& text) {
  return json{{"author", author}, {"text", text}}.dump();
}

TEST(BulletinTest, PostedOnOneNodeListedOnAnother) {
  BoardCluster b(3);
  ASSERT_TRUE(b.Start());
  auto created = b.Call(0, "POST", "/boards", R"({"name": "news"})");
  ASSERT_EQ(created.status, 201) << created.body;
  EXPECT_EQ(BoardCluster::Body(created)["owners"].size(), 3u);
  for (int i = 1; i <= 5; ++i) {
    auto posted = b.Call(0, "POST", "/boards/news/messages?cl=QUORUM", Message("ann", "hello " + std::to_string(i)));
    ASSERT_EQ(posted.status, 201) << posted.body;
    json j = BoardCluster::Body(posted);
    EXPECT_EQ(j["id"], i);
    EXPECT_EQ(j["version"], i);
    EXPECT_GE(j["acks"].get<int>(), 2);
  }
  // Node 2 reads at ONE from its own replica: wait (bounded) for all five.
  json listed;
  ASSERT_TRUE(WaitUntil([&] {
    auto r = b.Call(1, "GET", "/boards/news/messages");
    if (r.status != 200) return false;
    listed = BoardCluster::Body(r);
    return listed["count"] == 5;
  }, std::chrono::seconds(10))) << listed.dump();
  ASSERT_EQ(listed["messages"].size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(listed["messages"][i]["id"], i + 1);
    EXPECT_EQ(listed["messages"][i]["author"], "ann");
    EXPECT_EQ(listed["messages"][i]["text"], "hello " + std::to_string(i + 1));
  }
  // Paging from node 3.
  json page;
  ASSERT_TRUE(WaitUntil([&] {
    auto r = b.Call(2, "GET", "/boards/news/messages?after=2&limit=2");
    if (r.status != 200) return false;
    page = BoardCluster::Body(r);
    return page["count"] == 5;
  }, std::chrono::seconds(10))) << page.dump();
  ASSERT_EQ(page["messages"].size(), 2u);
  EXPECT_EQ(page["messages"][0]["text"], "hello 3");
  EXPECT_EQ(page["messages"][1]["text"], "hello 4");
  EXPECT_EQ(page["next_after"], 4);
  // The board as it was at version 3, from node 2's retained versions.
  auto old = b.Call(1, "GET", "/boards/news/messages?version=3");
  ASSERT_EQ(old.status, 200) << old.body;
  json at3 = BoardCluster::Body(old);
  EXPECT_EQ(at3["version"], 3);
  EXPECT_EQ(at3["count"], 3);
  ASSERT_EQ(at3["messages"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(at3["messages"][i]["text"], "hello " + std::to_string(i + 1));
  auto ahead = b.Call(1, "GET", "/boards/news/messages?version=99");
  EXPECT_EQ(ahead.status, 404) << ahead.body;
  EXPECT_NE(ahead.body.find("not held yet"), std::string::npos) << ahead.body;
  EXPECT_EQ(b.Call(1, "GET", "/boards/news/messages?version=0").status, 400);
  EXPECT_EQ(b.Call(1, "GET", "/boards/news/messages?version=x").status, 400);
  EXPECT_EQ(b.Call(1, "GET", "/boards/nosuch/messages?version=2").status, 404);
  // The board list, from another node.
  json boards;
  ASSERT_TRUE(WaitUntil([&] {
    auto r = b.Call(2, "GET", "/boards");
    boards = BoardCluster::Body(r);
    return r.status == 200 && boards["boards"] == json::array({"news"});
  }, std::chrono::seconds(10))) << boards.dump();
}

// A node that retains two versions: older listings are refused with the
// oldest version it still holds.
TEST(BulletinTest, ListingAtAVersionPastTheRetention) {
  BoardCluster b(1, {"--keep-versions", "2"});
  ASSERT_TRUE(b.Start());
  ASSERT_EQ(b.Call(0, "POST", "/boards", R"({"name": "short"})").status, 201);
  for (int i = 1; i <= 5; ++i) {
    ASSERT_EQ(b.Call(0, "POST", "/boards/short/messages?cl=ONE", Message("bo", "m" + std::to_string(i))).status, 201);
  }
  auto kept = b.Call(0, "GET", "/boards/short/messages?version=4");
  ASSERT_EQ(kept.status, 200) << kept.body;
  EXPECT_EQ(BoardCluster::Body(kept)["count"], 4);
  EXPECT_EQ(BoardCluster::Body(kept)["messages"].size(), 4u);
  auto gone = b.Call(0, "GET", "/boards/short/messages?version=2");
  EXPECT_EQ(gone.status, 404) << gone.body;
  EXPECT_NE(gone.body.find("oldest version held is 4"), std::string::npos) << gone.body;
  auto newest = b.Call(0, "GET", "/boards/short/messages");
  ASSERT_EQ(newest.status, 200) << newest.body;
  EXPECT_EQ(BoardCluster::Body(newest)["count"], 5);
}

TEST(BulletinTest, ErrorStatuses) {
  BoardCluster b(3);
  ASSERT_TRUE(b.Start());
  ASSERT_EQ(b.Call(0, "POST", "/boards", R"({"name": "errs"})").status, 201);
  // 400: malformed JSON, not an object, missing / wrong-typed / empty fields, bad names and parameters.
  EXPECT_EQ(b.Call(0, "POST", "/boards", "{not json").status, 400);
  EXPECT_EQ(b.Call(0, "POST", "/boards", "[1, 2]").status, 400);
  EXPECT_EQ(b.Call(0, "POST", "/boards", R"({"title": "x"})").status, 400);
  EXPECT_EQ(b.Call(0, "POST", "/boards", R"({"name": "bad/name"})").status, 400);
  EXPECT_EQ(b.Call(0, "POST", "/boards/errs/messages", R"({"author": "a")").status, 400);
  auto missing = b.Call(0, "POST", "/boards/errs/messages", R"({"author": "a"})");
  EXPECT_EQ(missing.status, 400);
  EXPECT_NE(missing.body.find("text"), std::string::npos) << missing.body;
  EXPECT_EQ(b.Call(0, "POST", "/boards/errs/messages", R"({"author": "a", "text": 7})").status, 400);
  EXPECT_EQ(b.Call(0, "POST", "/boards/errs/messages", R"({"author": "", "text": "x"})").status, 400);
  EXPECT_EQ(b.Call(0, "POST", "/boards/errs/messages?cl=SOME", Message("a", "x")).status, 400);
  EXPECT_EQ(b.Call(0, "POST", "/boards/errs/messages?timeout_ms=0", Message("a", "x")).status, 400);
  EXPECT_EQ(b.Call(0, "GET", "/boards/errs/messages?limit=0").status, 400);
  EXPECT_EQ(b.Call(0, "GET", "/boards/errs/messages?after=-1").status, 400);
  // 404: unknown board (read and write) and unknown resource.
  EXPECT_EQ(b.Call(0, "GET", "/boards/nosuch/messages").status, 404);
  EXPECT_EQ(b.Call(1, "POST", "/boards/nosuch/messages", Message("a", "x")).status, 404);
  EXPECT_EQ(b.Call(0, "GET", "/elsewhere").status, 404);
  // 405 with Allow.
  auto wrong = b.Call(0, "DELETE", "/boards/errs/messages");
  EXPECT_EQ(wrong.status, 405);
  ASSERT_NE(wrong.headers.Find("Allow"), nullptr);
  EXPECT_EQ(*wrong.headers.Find("Allow"), "GET, POST");
  EXPECT_EQ(b.Call(0, "PUT", "/boards", "{}").status, 405);
  // 413: a field over its limit, and a body over the server's limit.
  EXPECT_EQ(b.Call(0, "POST", "/boards/errs/messages", Message("a", std::string(5000, 'x'))).status, 413);
  EXPECT_EQ(b.Call(0, "POST", "/boards/errs/messages", Message("a", std::string(100000, 'x'))).status, 413);
  // 409: the board exists (also when asked through another node).
  EXPECT_EQ(b.Call(1, "POST", "/boards", R"({"name": "errs"})").status, 409);
  // Nothing above was posted (node 1 reads at ONE: wait until its replica has the board).
  RawResponse list;
  ASSERT_TRUE(WaitUntil([&] {
    list = b.Call(0, "GET", "/boards/errs/messages");
    return list.status == 200;
  }, std::chrono::seconds(10))) << list.status << " " << list.body;
  EXPECT_EQ(BoardCluster::Body(list)["count"], 0);
}

TEST(BulletinTest, AllFailsWithANodeKilledAndTheNodeKeepsServing) {
  BoardCluster b(3);
  ASSERT_TRUE(b.Start());
  ASSERT_EQ(b.Call(0, "POST", "/boards", R"({"name": "alltest"})").status, 201);
  ASSERT_EQ(b.Call(0, "POST", "/boards/alltest/messages?cl=ALL", Message("a", "before")).status, 201);
  auto state = b.cluster().TreeState(0, "board.alltest");
  ASSERT_TRUE(state.has_value());
  size_t leader = b.cluster().IndexOfId(state->leader);
  ASSERT_LT(leader, 3u);
  size_t victim = (leader + 1) % 3;
  size_t serving = (leader + 2) % 3;
  b.cluster().Kill(victim);

  auto failed = b.Call(serving, "POST", "/boards/alltest/messages?cl=ALL&timeout_ms=500", Message("a", "at all"));
  EXPECT_EQ(failed.status, 504) << failed.body;
  json j = BoardCluster::Body(failed);
  ASSERT_TRUE(j.is_object()) << failed.body;
  EXPECT_NE(j["error"].get<std::string>().find("ALL"), std::string::npos) << failed.body;
  EXPECT_EQ(j["acks"], 2);
  EXPECT_EQ(j["committed_on_leader"], true);

  // The node keeps serving: QUORUM writes succeed and reads answer.
  auto quorum = b.Call(serving, "POST", "/boards/alltest/messages?cl=QUORUM", Message("a", "at quorum"));
  EXPECT_EQ(quorum.status, 201) << quorum.body;
  json listed;
  ASSERT_TRUE(WaitUntil([&] {
    auto r = b.Call(serving, "GET", "/boards/alltest/messages");
    listed = BoardCluster::Body(r);
    return r.status == 200 && listed["count"] == 3;
  }, std::chrono::seconds(10))) << listed.dump();
  EXPECT_EQ(listed["messages"][2]["text"], "at quorum");
  EXPECT_EQ(b.Call(leader, "GET", "/boards").status, 200);
}

// Reads at LEADER and QUORUM through any node see a QUORUM write at once
// (no waiting for replicas to catch up, unlike ONE).
TEST(BulletinTest, LeaderAndQuorumReadsSeeAcknowledgedPosts) {
  BoardCluster b(3);
  ASSERT_TRUE(b.Start());
  ASSERT_EQ(b.Call(0, "POST", "/boards", R"({"name": "fresh"})").status, 201);
  for (int i = 1; i <= 6; ++i) {
    size_t writer = static_cast<size_t>(i) % 3;
    auto posted = b.Call(writer, "POST", "/boards/fresh/messages?cl=QUORUM", Message("w", "m" + std::to_string(i)));
    ASSERT_EQ(posted.status, 201) << posted.body;
    for (const char* cl : {"LEADER", "QUORUM"}) {
      size_t reader = (writer + 1) % 3;
      auto r = b.Call(reader, "GET", std::string("/boards/fresh/messages?limit=3&after=") +
                                         std::to_string(i > 3 ? i - 3 : 0) + "&cl=" + cl);
      ASSERT_EQ(r.status, 200) << cl << " " << r.body;
      json j = BoardCluster::Body(r);
      EXPECT_EQ(j["count"], i) << cl << " read through node " << reader + 1 << ": " << r.body;
      EXPECT_EQ(j["cl"], cl);
      ASSERT_FALSE(j["messages"].empty()) << r.body;
      EXPECT_EQ(j["messages"].back()["text"], "m" + std::to_string(i)) << cl << ": " << r.body;
    }
  }
  // Text that needs escaping survives the listing's JSON rendering.
  const std::string odd = "quote \" backslash \\ newline \n tab \t ctrl \x01 utf8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82";
  ASSERT_EQ(b.Call(0, "POST", "/boards/fresh/messages", json{{"author", "w"}, {"text", odd}}.dump()).status, 201);
  auto listed = b.Call(0, "GET", "/boards/fresh/messages?after=6&cl=LEADER");
  ASSERT_EQ(listed.status, 200) << listed.body;
  json lj = BoardCluster::Body(listed);
  ASSERT_TRUE(lj.is_object()) << listed.body;
  ASSERT_EQ(lj["messages"].size(), 1u) << listed.body;
  EXPECT_EQ(lj["messages"][0]["text"], odd);
  EXPECT_EQ(b.Call(0, "GET", "/boards?cl=QUORUM").status, 200);
  EXPECT_EQ(b.Call(0, "GET", "/boards/fresh/messages?cl=ALL").status, 400);
  EXPECT_EQ(b.Call(0, "GET", "/boards/fresh/messages?cl=LEADER&version=2").status, 400);
  EXPECT_EQ(b.Call(1, "GET", "/boards/nosuch/messages?cl=QUORUM").status, 404);
  EXPECT_EQ(b.Call(1, "GET", "/boards/nosuch/messages?cl=LEADER").status, 404);
}

// A post waiting for ALL (one replica killed) holds one board worker; the
// same node keeps answering reads and other posts meanwhile.
TEST(BulletinTest, AWaitingWriteDoesNotBlockOtherClients) {
  BoardCluster b(3);
  ASSERT_TRUE(b.Start());
  ASSERT_EQ(b.Call(0, "POST", "/boards", R"({"name": "busy"})").status, 201);
  ASSERT_EQ(b.Call(0, "POST", "/boards/busy/messages?cl=ALL", Message("a", "first")).status, 201);
  auto state = b.cluster().TreeState(0, "board.busy");
  ASSERT_TRUE(state.has_value());
  size_t leader = b.cluster().IndexOfId(state->leader);
  ASSERT_LT(leader, 3u);
  size_t victim = (leader + 1) % 3;
  b.cluster().Kill(victim);
  const auto start = std::chrono::steady_clock::now();
  auto slow = std::async(std::launch::async, [&] {
    return b.Call(leader, "POST", "/boards/busy/messages?cl=ALL&timeout_ms=3000", Message("a", "at all"));
  });
  // Give the slow post time to reach the leader and start waiting.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = b.Call(leader, "GET", "/boards/busy/messages");
    EXPECT_EQ(r.status, 200) << r.body;
    auto q = b.Call(leader, "POST", "/boards/busy/messages?cl=QUORUM", Message("b", "quick " + std::to_string(i)));
    EXPECT_EQ(q.status, 201) << q.body;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500))
        << "a read and a QUORUM post waited behind the post at ALL";
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2900))
      << "the other requests were not answered while the post at ALL waited";
  auto slow_reply = slow.get();
  EXPECT_EQ(slow_reply.status, 504) << slow_reply.body;
}

// A node that owns no copy of a board sends its listings at ONE on to an
// owner from its HTTP thread, many at once on a few connections (the
// board's SliceForwarder), and gathers QUORUM listings from the owners the
// same way (Node::SliceAsync): each answer is that listing, also under
// load, and once an owner is killed the listings come from the other one.
TEST(BulletinTest, ListingsAtANodeWithoutACopyAreForwardedToAnOwner) {
  BoardCluster b(4, {"--rf", "2"}, /*metrics=*/true);
  ASSERT_TRUE(b.Start());
  auto created = b.Call(0, "POST", "/boards", R"({"name": "far"})");
  ASSERT_EQ(created.status, 201) << created.body;
  std::vector<size_t> owners;
  const json created_body = BoardCluster::Body(created);
  for (const auto& id : created_body["owners"]) {
    owners.push_back(b.cluster().IndexOfId(id.get<std::string>()));
  }
  ASSERT_EQ(owners.size(), 2u) << created.body;
  size_t reader = 0;
  while (std::find(owners.begin(), owners.end(), reader) != owners.end()) ++reader;
  ASSERT_LT(reader, 4u);
  constexpr int kPosts = 30;
  for (int i = 1; i <= kPosts; ++i) {
    auto posted = b.Call(owners[0], "POST", "/boards/far/messages?cl=ALL", Message("f", "far " + std::to_string(i)));
    ASSERT_EQ(posted.status, 201) << posted.body;
  }
  const std::string forwarded = R"(canopy_board_listings_total{answered="forwarded"})";
  // Checks listings of every page through `reader`; true when each was right.
  auto pages_are_right = [&](bool quiet, const std::string& cl = "ONE") {
    for (int after = 0; after < kPosts; after += 7) {
      auto r = b.Call(reader, "GET", "/boards/far/messages?limit=5&cl=" + cl + "&after=" + std::to_string(after));
      json j = BoardCluster::Body(r);
      if (quiet && r.status != 200) return false;
      EXPECT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(j["count"], kPosts) << r.body;
      const int expected = std::min(5, kPosts - after);
      EXPECT_EQ(j["messages"].size(), static_cast<size_t>(expected)) << r.body;
      for (int k = 0; k < expected && k < static_cast<int>(j["messages"].size()); ++k) {
        EXPECT_EQ(j["messages"][k]["id"], after + k + 1) << r.body;
        EXPECT_EQ(j["messages"][k]["text"], "far " + std::to_string(after + k + 1)) << r.body;
      }
    }
    return true;
  };
  // The first listings go through a worker, which opens the forwarder's
  // links; then they are forwarded.
  ASSERT_TRUE(WaitUntil([&] { return pages_are_right(true) && b.Metric(reader, forwarded) > 0; },
                        std::chrono::seconds(10)))
      << "no listing was forwarded: " << b.Metric(reader, forwarded);
  pages_are_right(false);
  // Under load: 64 connections, every listing answered 200.
  std::string url = "http://127.0.0.1:" + std::to_string(b.port(reader)) + "/boards/far/messages?limit=10";
  const double before_load = b.Metric(reader, forwarded);
  std::string output;
  int rc = RunCommand(BinaryPath("tools/load/load") + " -n 3000 -c 64 -t 2 -k --json '" + url + "'", &output);
  ASSERT_EQ(rc, 0) << output;
  json l = json::parse(output, nullptr, false);
  ASSERT_TRUE(l.is_object()) << output;
  EXPECT_EQ(l["status_codes"]["200"], 3000) << output;
  EXPECT_GE(b.Metric(reader, forwarded) - before_load, 2900) << "most listings under load went to a worker";
  // QUORUM listings gather both owners' answers from the HTTP thread too
  // (once a worker's QUORUM read has opened the node's links to them).
  const double before_quorum = b.Metric(reader, forwarded);
  ASSERT_TRUE(WaitUntil([&] { return pages_are_right(true, "QUORUM") && b.Metric(reader, forwarded) > before_quorum; },
                        std::chrono::seconds(10)))
      << "no QUORUM listing was answered without a worker";
  pages_are_right(false, "QUORUM");
  output.clear();
  rc = RunCommand(BinaryPath("tools/load/load") + " -n 2000 -c 64 -t 2 -k --json '" + url + "&cl=QUORUM'", &output);
  ASSERT_EQ(rc, 0) << output;
  l = json::parse(output, nullptr, false);
  ASSERT_TRUE(l.is_object()) << output;
  EXPECT_EQ(l["status_codes"]["200"], 2000) << output;
  // Kill the owners one at a time... the reads move to the one still up.
  b.cluster().Kill(owners[0]);
  ASSERT_TRUE(WaitUntil([&] { return pages_are_right(true); }, std::chrono::seconds(15)))
      << "listings through node " << reader + 1 << " failed after owner " << owners[0] + 1 << " was killed";
  const double before = b.Metric(reader, forwarded);
  pages_are_right(false);
  ASSERT_TRUE(WaitUntil([&] { return pages_are_right(true) && b.Metric(reader, forwarded) > before; },
                        std::chrono::seconds(10)))
      << "listings were not forwarded to the owner still up";
}

TEST(BulletinTest, LoadPostsMessages) {
  BoardCluster b(3);
  ASSERT_TRUE(b.Start());
  ASSERT_EQ(b.Call(0, "POST", "/boards", R"({"name": "loaded"})").status, 201);
  std::string url = "http://127.0.0.1:" + std::to_string(b.port(0)) + "/boards/loaded/messages?cl=QUORUM";
  std::string output;
  int rc = RunCommand(BinaryPath("tools/load/load") + " -n 40 -c 4 -t 2 -k --json --method POST --body '" +
                          Message("loadgen", "hi") + "' -H 'Content-Type: application/json' '" + url + "'",
                      &output);
  ASSERT_EQ(rc, 0) << output;
  json r = json::parse(output, nullptr, false);
  ASSERT_TRUE(r.is_object()) << output;
  EXPECT_EQ(r["errors"]["total"], 0) << output;
  EXPECT_EQ(r["status_codes"]["201"], 40) << output;
  // Reads are at ONE: node 1 may be a replica a few versions behind.
  json l;
  ASSERT_TRUE(WaitUntil([&] {
    auto list = b.Call(0, "GET", "/boards/loaded/messages?limit=200");
    l = BoardCluster::Body(list);
    return list.status == 200 && l["count"] == 40;
  }, std::chrono::seconds(10))) << l.dump();
  ASSERT_EQ(l["messages"].size(), 40u);
  EXPECT_EQ(l["messages"][39]["author"], "loadgen");
  // --body without POST/PUT is a usage error.
  std::string usage;
  EXPECT_NE(RunCommand(BinaryPath("tools/load/load") + " -n 1 --body x '" + url + "'", &usage), 0);
  EXPECT_NE(usage.find("--body needs --method POST or PUT"), std::string::npos) << usage;
}

}  // namespace
}  // namespace canopy::testing
