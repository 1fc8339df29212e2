// http::Server deferred responses (Handler::HandleAsync + Responder), in
// process: a pending deferred answer holds up only its own connection, pipelined
// requests behind it stay in order, a dropped Responder answers 500, and
// answers for a closed connection or a stopped server are dropped safely.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/http_test_util.h"
#include "tools/http/server.h"

namespace canopy::testing {
namespace {

using namespace std::chrono_literals;

// GET /fast answers at once; /slow answers from another thread after 50 ms;
// /drop defers and drops the Responder; /keep defers and parks it.
class DeferringHandler : public http::Handler {
 public:
  ~DeferringHandler() override {
    for (auto& t : threads_) t.join();
  }
  http::Response Handle(const http::Request&) override { return http::Response::Json(200, "{}"); }
  std::optional<http::Response> HandleAsync(const http::Request& request, http::Responder& responder) override {
    std::string path(request.path());
    if (path == "/slow") {
      threads_.emplace_back([r = std::move(responder)]() mutable {
        std::this_thread::sleep_for(50ms);
        r.Respond(http::Response::Json(200, "\"slow\""));
      });
      return std::nullopt;
    }
    if (path == "/drop") {
      http::Responder dropped = std::move(responder);
      return std::nullopt;
    }
    if (path == "/keep") {
      std::lock_guard<std::mutex> lock(mu_);
      parked_.push_back(std::move(responder));
      return std::nullopt;
    }
    return http::Response::Json(200, "\"fast\"");
  }
  std::vector<http::Responder> TakeParked() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(parked_);
  }
  size_t parked() {
    std::lock_guard<std::mutex> lock(mu_);
    return parked_.size();
  }

 private:
  std::vector<std::thread> threads_;  // only touched on the server thread, joined at the end
  std::mutex mu_;
  std::vector<http::Responder> parked_;
};

struct RunningServer {
  explicit RunningServer(DeferringHandler* handler) {
    auto s = http::Server::Listen(http::ServerOptions{}, handler);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return;
    server = std::move(*s);
    thread = std::thread([this] { (void)server->Run(); });
  }
  ~RunningServer() { Stop(); }
  void Stop() {
    if (!thread.joinable()) return;
    server->Stop();
    thread.join();
  }
  std::unique_ptr<http::Server> server;
  std::thread thread;
};

TEST(HttpDeferredTest, SlowAnswerHoldsOnlyItsConnectionAndPipelinedStayInOrder) {
  DeferringHandler handler;
  RunningServer s(&handler);
  ASSERT_TRUE(s.server);
  UniqueFd waiting = ConnectLoopback(s.server->port());
  ASSERT_TRUE(waiting);
  // /keep is parked until the test answers it; /fast is pipelined behind it.
  ASSERT_TRUE(SendString(waiting.get(), Get("/keep") + Get("/fast")));
  for (int i = 0; i < 1000 && handler.parked() == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(handler.parked(), 1u);
  // Another connection is answered while /keep is pending.
  RawResponse other;
  ASSERT_TRUE(RoundTrip(s.server->port(), Get("/fast", "Connection: close\r\n"), &other));
  EXPECT_EQ(other.body, "\"fast\"");
  // And one answered from another thread later.
  RawResponse slow;
  ASSERT_TRUE(RoundTrip(s.server->port(), Get("/slow", "Connection: close\r\n"), &slow));
  EXPECT_EQ(slow.body, "\"slow\"");
  for (auto& r : handler.TakeParked()) r.Respond(http::Response::Json(200, "\"kept\""));
  std::string pending;
  RawResponse first, second;
  ASSERT_TRUE(ReadResponse(waiting.get(), &pending, &first));
  ASSERT_TRUE(ReadResponse(waiting.get(), &pending, &second));
  EXPECT_EQ(first.body, "\"kept\"");
  EXPECT_EQ(second.body, "\"fast\"");
  s.Stop();
  EXPECT_GE(s.server->stats().deferred, 2u);
}

TEST(HttpDeferredTest, DroppedResponderAnswers500) {
  DeferringHandler handler;
  RunningServer s(&handler);
  ASSERT_TRUE(s.server);
  RawResponse r;
  ASSERT_TRUE(RoundTrip(s.server->port(), Get("/drop"), &r));
  EXPECT_EQ(r.status, 500);
}

TEST(HttpDeferredTest, AnswersForGoneClientsAndAStoppedServerAreDropped) {
  DeferringHandler handler;
  RunningServer s(&handler);
  ASSERT_TRUE(s.server);
  {
    UniqueFd c = ConnectLoopback(s.server->port());
    ASSERT_TRUE(c);
    ASSERT_TRUE(SendString(c.get(), Get("/keep")));
    for (int i = 0; i < 200 && handler.parked() == 0; ++i) std::this_thread::sleep_for(5ms);
    ASSERT_EQ(handler.parked(), 1u);
  }  // the client goes away before the answer
  std::this_thread::sleep_for(50ms);
  for (auto& r : handler.TakeParked()) r.Respond(http::Response::Json(200, "\"late\""));
  // The server still serves.
  RawResponse ok;
  ASSERT_TRUE(RoundTrip(s.server->port(), Get("/fast"), &ok));
  EXPECT_EQ(ok.status, 200);
  // A responder outliving the server answers into nothing.
  UniqueFd c = ConnectLoopback(s.server->port());
  ASSERT_TRUE(c);
  ASSERT_TRUE(SendString(c.get(), Get("/keep")));
  for (int i = 0; i < 200 && handler.parked() == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(handler.parked(), 1u);
  auto parked = handler.TakeParked();
  s.Stop();
  s.server.reset();
  for (auto& r : parked) r.Respond(http::Response::Json(200, "\"after stop\""));
}

}  // namespace
}  // namespace canopy::testing
