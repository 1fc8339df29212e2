// tools/get and tools/load against tools/httpd, and canopy_http's Server with
// custom handlers (in-process, on a thread): resume, redirects, servers that
// ignore Range, chunked bodies, request bodies, load's JSON report, the --json
// documents against tools/{get,load}/*.schema.json in every outcome, load's
// --warmup, -i and -a, and Server's max_duration.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include <gtest/gtest.h>

#include "base/file.h"
#include "tests/http_test_util.h"
#include "tests/testing/json_schema.h"
#include "tests/testing/test_util.h"
#include "tools/http/server.h"

namespace canopy::testing {
namespace {

// Runs an http::Server with `handler` on a thread for the test's lifetime.
class InProcessServer {
 public:
  explicit InProcessServer(http::Handler* handler, http::ServerOptions options = {}) {
    auto s = http::Server::Listen(options, handler);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return;
    server_ = std::move(*s);
    thread_ = std::thread([this] { run_status_ = server_->Run(); });
  }
  ~InProcessServer() {
    if (server_) {
      server_->Stop();
      thread_.join();
      EXPECT_TRUE(run_status_.ok()) << run_status_.ToString();
    }
  }
  uint16_t port() const { return server_ ? server_->port() : 0; }
  std::string Url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port()) + path; }

 private:
  std::unique_ptr<http::Server> server_;
  std::thread thread_;
  Status run_status_;
};

// Always answers the whole content with 200, ignoring Range; /old redirects
// to /new, /loop redirects to itself.
class IgnoresRangeHandler : public http::Handler {
 public:
  explicit IgnoresRangeHandler(std::string content) : content_(std::move(content)) {}
  http::Response Handle(const http::Request& request) override {
    ++requests_;
    if (request.path() == "/old") {
      http::Response r = http::Response::Error(302);
      r.headers.Add("Location", "/new");
      return r;
    }
    if (request.path() == "/loop") {
      http::Response r = http::Response::Error(307);
      r.headers.Add("Location", "/loop");
      return r;
    }
    if (request.path() == "/busy") return http::Response::Error(503);
    http::Response r;
    r.headers.Add("Content-Type", "application/octet-stream");
    r.body = content_;
    return r;
  }
  std::atomic<int> requests_{0};

 private:
  std::string content_;
};

// A JSON API in the shape `canopy node` would serve: echoes the request.
class EchoJsonHandler : public http::Handler {
 public:
  http::Response Handle(const http::Request& request) override {
    nlohmann::json j = {{"method", request.method}, {"path", std::string(request.path())},
                        {"body", request.body}};
    return http::Response::Json(request.method == "POST" ? 201 : 200, j.dump());
  }
};

// Answers every request with a small body after `delay` (blocking the
// server thread: requests take at least that long each, one at a time).
class SlowHandler : public http::Handler {
 public:
  explicit SlowHandler(std::chrono::milliseconds delay) : delay_(delay) {}
  http::Response Handle(const http::Request&) override {
    std::this_thread::sleep_for(delay_);
    http::Response r;
    r.body = "slow";
    return r;
  }

 private:
  std::chrono::milliseconds delay_;
};

const nlohmann::json& GetSchema() {
  static const nlohmann::json schema = LoadJsonSchema("tools/get/get.schema.json");
  return schema;
}

const nlohmann::json& LoadSchema() {
  static const nlohmann::json schema = LoadJsonSchema("tools/load/load.schema.json");
  return schema;
}

// A loopback port nothing listens on (bound, then closed).
uint16_t ClosedPort() {
  UniqueFd probe(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(probe.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return 0;
  socklen_t len = sizeof a;
  ::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// Runs a tool with stderr dropped, so *out is its stdout alone (the JSON document).
int RunStdout(const std::string& tool, const std::string& args, std::string* out) {
  out->clear();
  return RunCommand("{ " + BinaryPath(tool) + " " + args + " 2>/dev/null; }", out);
}

std::string JsonLine(const std::string& output) {
  size_t start = output.find('{');
  if (start == std::string::npos) return "{}";
  return output.substr(start, output.find('\n', start) - start);
}

class HttpToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.File("root");
    ASSERT_TRUE(CreateDirs(root_).ok());
    content_ = RandomBytes(3 * 1024 * 1024 + 17, 11);
    ASSERT_TRUE(WriteFileAtomic(root_ + "/file.bin", content_).ok());
    ::chmod((root_ + "/file.bin").c_str(), 0644);
    std::string error;
    ASSERT_TRUE(httpd_.Start({"--root", root_}, &error)) << error;
  }

  int Get(const std::string& args, std::string* output) {
    return RunCommand(BinaryPath("tools/get/get") + " " + args, output);
  }

  TempDir dir_;
  std::string root_;
  std::string content_;
  HttpdProcess httpd_;
};

TEST_F(HttpToolsTest, GetDownloadsByteExactAndReportsJson) {
  std::string out_file = dir_.File("copy.bin");
  std::string output;
  ASSERT_EQ(Get(httpd_.Url("/file.bin") + " -O " + out_file + " --json", &output), 0) << output;
  EXPECT_EQ(*ReadFileToString(out_file), content_);
  auto j = nlohmann::json::parse(JsonLine(output));
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["status"], 200);
  EXPECT_EQ(j["bytes"], content_.size());
  EXPECT_GT(j["seconds"].get<double>(), 0);
  EXPECT_GT(j["gbit_per_s"].get<double>(), 0);
  // The plain summary names bytes, seconds and Gbit/s.
  output.clear();
  ASSERT_EQ(Get(httpd_.Url("/file.bin") + " -O " + out_file, &output), 0) << output;
  EXPECT_NE(output.find(std::to_string(content_.size()) + " bytes in "), std::string::npos) << output;
  EXPECT_NE(output.find("Gbit/s"), std::string::npos) << output;
}

TEST_F(HttpToolsTest, ContinueCompletesPartialFileByteExact) {
  std::string out_file = dir_.File("partial.bin");
  size_t have = 1234567;
  ASSERT_TRUE(WriteFileAtomic(out_file, content_.substr(0, have)).ok());
  std::string output;
  ASSERT_EQ(Get(httpd_.Url("/file.bin") + " -O " + out_file + " --continue --json", &output), 0) << output;
  EXPECT_EQ(*ReadFileToString(out_file), content_);
  auto j = nlohmann::json::parse(JsonLine(output));
  EXPECT_EQ(j["status"], 206);
  EXPECT_EQ(j["resumed_from"], have);
  EXPECT_EQ(j["bytes"], content_.size() - have);
  // Again on the complete file: 416 means done, nothing changes.
  output.clear();
  ASSERT_EQ(Get(httpd_.Url("/file.bin") + " -O " + out_file + " -c --json", &output), 0) << output;
  j = nlohmann::json::parse(JsonLine(output));
  EXPECT_TRUE(j["already_complete"].get<bool>());
  EXPECT_EQ(j["bytes"], 0);
  EXPECT_EQ(*ReadFileToString(out_file), content_);
  // A local file larger than the remote one is an error, not "done".
  ASSERT_TRUE(WriteFileAtomic(out_file, content_ + "junk").ok());
  output.clear();
  EXPECT_NE(Get(httpd_.Url("/file.bin") + " -O " + out_file + " -c -q", &output), 0);
  EXPECT_NE(output.find("remote"), std::string::npos) << output;
}

TEST_F(HttpToolsTest, ContinueRestartsWhenServerIgnoresRange) {
  IgnoresRangeHandler handler(content_);
  InProcessServer server(&handler);
  std::string out_file = dir_.File("restart.bin");
  ASSERT_TRUE(WriteFileAtomic(out_file, content_.substr(0, 1000)).ok());
  std::string output;
  ASSERT_EQ(Get(server.Url("/x") + " -O " + out_file + " -c --json", &output), 0) << output;
  EXPECT_EQ(*ReadFileToString(out_file), content_);  // rewritten from 0, not appended
  auto j = nlohmann::json::parse(JsonLine(output));
  EXPECT_EQ(j["status"], 200);
  EXPECT_EQ(j["bytes"], content_.size());
}

TEST_F(HttpToolsTest, RedirectsAreFollowedAndBounded) {
  IgnoresRangeHandler handler("the new content");
  InProcessServer server(&handler);
  std::string out_file = dir_.File("redirected.txt");
  std::string output;
  ASSERT_EQ(Get(server.Url("/old") + " -O " + out_file + " --json", &output), 0) << output;
  EXPECT_EQ(*ReadFileToString(out_file), "the new content");
  auto j = nlohmann::json::parse(JsonLine(output));
  EXPECT_EQ(j["redirects"], 1);
  EXPECT_EQ(j["final_url"], server.Url("/new"));
  output.clear();
  int before = handler.requests_.load();
  EXPECT_NE(Get(server.Url("/loop") + " -O " + out_file + " --max-redirect 3 -q", &output), 0);
  EXPECT_NE(output.find("redirects"), std::string::npos) << output;
  EXPECT_EQ(handler.requests_.load() - before, 4);
}

TEST_F(HttpToolsTest, ErrorsExitNonZeroAndRetriesAreBounded) {
  std::string output;
  EXPECT_NE(Get(httpd_.Url("/missing") + " -O " + dir_.File("x") + " -q", &output), 0);
  EXPECT_NE(output.find("404"), std::string::npos) << output;
  IgnoresRangeHandler handler("x");
  InProcessServer server(&handler);
  output.clear();
  EXPECT_NE(Get(server.Url("/busy") + " -O " + dir_.File("y") + " --tries 3 -q", &output), 0);
  EXPECT_EQ(handler.requests_.load(), 3);  // 5xx is retried, --tries times
  output.clear();
  // Nothing listens on a port we just closed: fails after 2 tries.
  uint16_t dead_port = ClosedPort();
  ASSERT_NE(dead_port, 0);
  std::string dead = "http://127.0.0.1:" + std::to_string(dead_port) + "/";
  EXPECT_NE(Get(dead + " -O " + dir_.File("z") + " --tries 2 --timeout 2 -q", &output), 0);
  EXPECT_NE(output.find("refused"), std::string::npos) << output;
  output.clear();
  EXPECT_NE(Get("https://127.0.0.1/ -O " + dir_.File("z"), &output), 0);
  EXPECT_NE(output.find("https"), std::string::npos) << output;
}

TEST_F(HttpToolsTest, ChunkedResponseBody) {
  // A minimal server thread that answers one request with a chunked body.
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len);
  std::string payload = content_.substr(0, 300000);
  std::thread server([&] {
    UniqueFd c(::accept(listener.get(), nullptr, nullptr));
    if (!c) return;
    char buf[4096];
    std::string req;
    while (req.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::recv(c.get(), buf, sizeof buf, 0);
      if (n <= 0) return;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string resp = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (size_t off = 0; off < payload.size(); off += 70000) {
      std::string piece = payload.substr(off, 70000);
      char size[32];
      std::snprintf(size, sizeof size, "%zx;note=1\r\n", piece.size());
      resp += size + piece + "\r\n";
    }
    resp += "0\r\nX-Trailer: t\r\n\r\n";
    SendString(c.get(), resp);
  });
  std::string out_file = dir_.File("chunked.bin");
  std::string output;
  int rc = Get("http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/c -O " + out_file + " -q", &output);
  server.join();
  ASSERT_EQ(rc, 0) << output;
  EXPECT_EQ(*ReadFileToString(out_file), payload);
}

TEST_F(HttpToolsTest, RetryResumesAfterTheConnectionDrops) {
  // Connection 1 sends half the body and drops; connection 2 must ask for
  // the rest with Range and gets it as 206.
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len);
  const std::string payload = content_.substr(0, 1000000);
  const size_t half = 400000;
  std::string second_request;
  std::thread server([&] {
    for (int round = 0; round < 2; ++round) {
      UniqueFd c(::accept(listener.get(), nullptr, nullptr));
      if (!c) return;
      char buf[4096];
      std::string req;
      while (req.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::recv(c.get(), buf, sizeof buf, 0);
        if (n <= 0) return;
        req.append(buf, static_cast<size_t>(n));
      }
      if (round == 0) {
        SendString(c.get(), "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(payload.size()) + "\r\n\r\n" +
                                payload.substr(0, half));
      } else {
        second_request = req;
        SendString(c.get(), "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes " + std::to_string(half) + "-" +
                                std::to_string(payload.size() - 1) + "/" + std::to_string(payload.size()) +
                                "\r\nContent-Length: " + std::to_string(payload.size() - half) + "\r\n\r\n" +
                                payload.substr(half));
      }
    }
  });
  std::string out_file = dir_.File("dropped.bin");
  std::string output;
  int rc = Get("http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/f -O " + out_file + " --tries 3 --json",
               &output);
  server.join();
  ASSERT_EQ(rc, 0) << output;
  EXPECT_EQ(*ReadFileToString(out_file), payload);
  EXPECT_NE(second_request.find("Range: bytes=" + std::to_string(half) + "-\r\n"), std::string::npos)
      << second_request;
  auto j = nlohmann::json::parse(JsonLine(output));
  EXPECT_EQ(j["attempts"], 2);
  EXPECT_EQ(j["resumed_from"], half);
  EXPECT_EQ(j["bytes"], payload.size());
}

TEST_F(HttpToolsTest, Ipv6Literal) {
  HttpdProcess v6;
  std::string error;
  if (!v6.Start({"--root", root_, "--bind", "::1"}, &error)) {
    GTEST_SKIP() << "cannot listen on ::1 here: " << error;
  }
  std::string out_file = dir_.File("v6.bin");
  std::string output;
  ASSERT_EQ(Get("http://[::1]:" + std::to_string(v6.port()) + "/file.bin -O " + out_file + " -q", &output), 0)
      << output;
  EXPECT_EQ(*ReadFileToString(out_file), content_);
}

TEST_F(HttpToolsTest, ServerLibraryServesJsonApiWithRequestBodies) {
  EchoJsonHandler handler;
  InProcessServer server(&handler);
  RawResponse r;
  ASSERT_TRUE(RoundTrip(server.port(), "POST /v1/trees/t HTTP/1.1\r\nHost: t\r\nContent-Length: 7\r\n\r\n{\"a\":1}", &r));
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(*r.headers.Find("Content-Type"), "application/json");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["path"], "/v1/trees/t");
  EXPECT_EQ(j["body"], "{\"a\":1}");
  // Chunked request body after "Expect: 100-continue".
  UniqueFd fd = ConnectLoopback(server.port());
  ASSERT_TRUE(SendString(fd.get(),
                         "POST /v1/x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"));
  std::string pending;
  RawResponse interim;
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &interim));
  EXPECT_EQ(interim.status, 100);
  ASSERT_TRUE(SendString(fd.get(), "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r));
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(nlohmann::json::parse(r.body)["body"], "abcde");
}

TEST_F(HttpToolsTest, LoadReportsSaneJson) {
  ASSERT_TRUE(WriteFileAtomic(root_ + "/small.txt", std::string(100, 's')).ok());
  ::chmod((root_ + "/small.txt").c_str(), 0644);
  for (const char* mode : {"-k", ""}) {
    std::string output;
    int rc = RunCommand(BinaryPath("tools/load/load") + " -n 300 -c 4 -t 2 " + mode + " --duration 20 --json " +
                            httpd_.Url("/small.txt"),
                        &output);
    ASSERT_EQ(rc, 0) << output;
    auto j = nlohmann::json::parse(JsonLine(output));
    EXPECT_EQ(j["completed"], 300) << output;
    EXPECT_EQ(j["ok_2xx"], 300);
    EXPECT_EQ(j["status_codes"]["200"], 300);
    EXPECT_EQ(j["errors"]["total"], 0);
    EXPECT_FALSE(j["time_capped"].get<bool>());
    double p50 = j["latency_ms"]["p50"], p99 = j["latency_ms"]["p99"], max = j["latency_ms"]["max"];
    EXPECT_GT(p50, 0);
    EXPECT_LE(p50, p99);
    EXPECT_LE(p99, max);
    EXPECT_GT(j["requests_per_s"].get<double>(), 0);
    EXPECT_GE(j["bytes"].get<uint64_t>(), 300u * 100u);
    if (std::string(mode) == "-k") {
      EXPECT_LE(j["connections_opened"].get<int>(), 4 + 2);
    } else {
      EXPECT_EQ(j["connections_opened"], 300);
    }
  }
  // Non-2xx answers are counted by code; the run still completes.
  std::string output;
  RunCommand(BinaryPath("tools/load/load") + " -n 50 -c 2 -k --json " + httpd_.Url("/nope"), &output);
  auto j = nlohmann::json::parse(JsonLine(output));
  EXPECT_EQ(j["status_codes"]["404"], 50) << output;
  EXPECT_EQ(j["ok_2xx"], 0);
  // Connection errors are counted, not fatal, and the run is bounded.
  output.clear();
  IgnoresRangeHandler none("");
  uint16_t dead_port;
  {
    InProcessServer s(&none);
    dead_port = s.port();
  }
  int rc = RunCommand(BinaryPath("tools/load/load") + " -n 20 -c 2 --json http://127.0.0.1:" +
                          std::to_string(dead_port) + "/",
                      &output);
  EXPECT_NE(rc, 0);
  j = nlohmann::json::parse(JsonLine(output));
  EXPECT_EQ(j["errors"]["connect"], 20) << output;
}

TEST_F(HttpToolsTest, GetJsonConformsToTheSchemaInEveryOutcome) {
  const std::string get = "tools/get/get";
  std::string out;
  // Success.
  ASSERT_EQ(RunStdout(get, httpd_.Url("/file.bin") + " -O " + dir_.File("ok.bin") + " --json", &out), 0) << out;
  EXPECT_EQ(JsonConforms(GetSchema(), out), "") << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["units"]["gbit_per_s"], "decimal Gbit/s (10^9 bit/s)");
  // 404: an error status, not retried, exit status 8 (wget's "server error response").
  EXPECT_EQ(RunStdout(get, httpd_.Url("/missing") + " -O " + dir_.File("404") + " --tries 3 --json", &out), 8);
  EXPECT_EQ(JsonConforms(GetSchema(), out), "") << out;
  j = nlohmann::json::parse(out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["error_code"], "http_status");
  EXPECT_EQ(j["status"], 404);
  EXPECT_EQ(j["attempts"], 1);
  EXPECT_NE(j["error"].get<std::string>().find("404"), std::string::npos) << out;
  // Nothing listens: connect, exit status 4 (wget's "network failure").
  std::string dead = "http://127.0.0.1:" + std::to_string(ClosedPort()) + "/x";
  EXPECT_EQ(RunStdout(get, dead + " -O " + dir_.File("dead") + " --tries 1 --json", &out), 4);
  EXPECT_EQ(JsonConforms(GetSchema(), out), "") << out;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["error_code"], "connect");
  EXPECT_EQ(j["status"], 0);
  EXPECT_EQ(j["final_url"], "");
  // A listener that never answers (its accept queue holds the connection): timeout.
  UniqueFd mute(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(mute.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(mute.get(), 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(mute.get(), reinterpret_cast<sockaddr*>(&a), &len);
  std::string mute_url = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/x";
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(RunStdout(get, mute_url + " -O " + dir_.File("mute") + " --tries 1 --timeout 0.3 --json", &out), 4);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(JsonConforms(GetSchema(), out), "") << out;
  EXPECT_EQ(nlohmann::json::parse(out)["error_code"], "timeout") << out;
  // Redirect loop (exit status 7, wget's "protocol error"), and an output
  // file that cannot be created (3, wget's "file I/O error").
  IgnoresRangeHandler handler("content");
  InProcessServer server(&handler);
  EXPECT_EQ(RunStdout(get, server.Url("/loop") + " -O " + dir_.File("loop") + " --max-redirect 2 --json", &out), 7);
  EXPECT_EQ(JsonConforms(GetSchema(), out), "") << out;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["error_code"], "redirects");
  EXPECT_EQ(j["redirects"], 2);
  EXPECT_EQ(RunStdout(get, server.Url("/x") + " -O " + dir_.File("no/such/dir/f") + " --json", &out), 3);
  EXPECT_EQ(JsonConforms(GetSchema(), out), "") << out;
  EXPECT_EQ(nlohmann::json::parse(out)["error_code"], "file") << out;
  // Usage errors: exit status 2 and one JSON document with "usage": true.
  for (const std::string& args :
       {std::string("--json --no-such-option ") + httpd_.Url("/file.bin"), std::string("--json"),
        "--json --tries 0 -O " + dir_.File("u") + " " + httpd_.Url("/file.bin"),
        "--json --tries many " + httpd_.Url("/file.bin"), "--json -O - " + httpd_.Url("/file.bin"),
        "--json https://127.0.0.1/ -O " + dir_.File("u")}) {
    EXPECT_EQ(RunStdout(get, args, &out), 2) << args;
    EXPECT_EQ(JsonConforms(GetSchema(), out), "") << args << ": " << out;
    j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;  // JsonConforms reported it
    EXPECT_EQ(j.value("usage", false), true) << args;
    EXPECT_EQ(j.value("error_code", ""), "usage") << args;
  }
  // Without --json a usage error prints nothing on stdout; the message is on stderr.
  EXPECT_EQ(RunStdout(get, "--no-such-option", &out), 2);
  EXPECT_EQ(out, "");
}

TEST_F(HttpToolsTest, LoadJsonConformsToTheSchemaInEveryOutcome) {
  const std::string load = "tools/load/load";
  ASSERT_TRUE(WriteFileAtomic(root_ + "/small.txt", std::string(100, 's')).ok());
  ::chmod((root_ + "/small.txt").c_str(), 0644);
  std::string out;
  // Success, several concurrent connections on two threads.
  ASSERT_EQ(RunStdout(load, "-n 400 -c 8 -t 2 -k --json " + httpd_.Url("/small.txt"), &out), 0) << out;
  EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["ok_2xx"], 400);
  EXPECT_EQ(j["intervals"].size(), 0u);
  EXPECT_TRUE(j["affinity"].is_null());
  EXPECT_EQ(j["units"]["gbit_per_s"], "decimal Gbit/s (10^9 bit/s)");
  // 404s are answers: counted by code, the run is ok.
  EXPECT_EQ(RunStdout(load, "-n 20 -c 2 -k --json " + httpd_.Url("/nope"), &out), 0) << out;
  EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << out;
  EXPECT_EQ(nlohmann::json::parse(out)["status_codes"]["404"], 20);
  // Nothing listens: every request fails to connect.
  std::string dead = "http://127.0.0.1:" + std::to_string(ClosedPort()) + "/";
  EXPECT_EQ(RunStdout(load, "-n 20 -c 2 --json " + dead, &out), 1);
  EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << out;
  j = nlohmann::json::parse(out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["error_code"], "connect");
  EXPECT_EQ(j["errors"]["connect"], 20);
  // -d ends the run before -n: ok false, error_code duration.
  SlowHandler slow(std::chrono::milliseconds(5));
  InProcessServer server(&slow);
  EXPECT_EQ(RunStdout(load, "-n 1000000 -c 1 -k -d 0.3 -i 0.1 --json " + server.Url("/"), &out), 1);
  EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << out;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["error_code"], "duration") << out;
  EXPECT_TRUE(j["time_capped"].get<bool>());
  EXPECT_GT(j["completed"].get<uint64_t>(), 0u);
  EXPECT_GE(j["intervals"].size(), 2u);
  // A run by time alone (no -n, as with wrk): -d ending it is success.
  EXPECT_EQ(RunStdout(load, "-c 1 -k -d 0.2 --json " + server.Url("/"), &out), 0) << out;
  EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << out;
  j = nlohmann::json::parse(out);
  EXPECT_TRUE(j["ok"].get<bool>()) << out;
  EXPECT_TRUE(j["time_capped"].get<bool>());
  EXPECT_TRUE(j["requests"].is_null()) << out;
  EXPECT_GT(j["completed"].get<uint64_t>(), 0u);
  // Usage errors: exit status 2 and one JSON document with "usage": true.
  std::string url = httpd_.Url("/small.txt");
  for (const std::string& args :
       {"--json --no-such-option " + url, std::string("--json"), "--json -n 0 " + url, "--json -c 2 -t 3 " + url,
        "--json --warmup -1 " + url, "--json -i 0.001 " + url, "--json -a 100000 " + url, "--json -a 1-0 " + url,
        "--json -a x " + url, "--json --method DELETE " + url, "--json -n lots " + url}) {
    EXPECT_EQ(RunStdout(load, args, &out), 2) << args;
    EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << args << ": " << out;
    j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;  // JsonConforms reported it
    EXPECT_EQ(j.value("usage", false), true) << args;
  }
}

TEST_F(HttpToolsTest, LoadWarmupRequestsAreMadeButLeftOut) {
  IgnoresRangeHandler handler("warm");
  InProcessServer server(&handler);
  std::string out;
  // The size of one response, from a run of one request.
  ASSERT_EQ(RunStdout("tools/load/load", "-n 1 -c 1 -k --json " + server.Url("/w"), &out), 0) << out;
  uint64_t one_response = nlohmann::json::parse(out)["bytes"];
  ASSERT_GT(one_response, 0u);
  int before = handler.requests_.load();
  ASSERT_EQ(RunStdout("tools/load/load", "-n 50 -c 2 -k --warmup 0.3 --json " + server.Url("/w"), &out), 0) << out;
  EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << out;
  auto j = nlohmann::json::parse(out);
  uint64_t warm = j["warmup"]["requests"];
  EXPECT_GT(warm, 0u) << out;
  EXPECT_EQ(j["warmup"]["errors"], 0);
  EXPECT_EQ(j["warmup"]["seconds"], 0.3);
  // The server saw the warm-up requests; no figure counts them.
  EXPECT_EQ(static_cast<uint64_t>(handler.requests_.load() - before), warm + 50);
  EXPECT_EQ(j["completed"], 50);
  EXPECT_EQ(j["status_codes"]["200"], 50);
  EXPECT_EQ(j["bytes"], 50 * one_response);
  EXPECT_LT(j["seconds"].get<double>(), 0.3 + 10);
}

// A dead port during --warmup (no request budget ends it) and a --duration
// run: each connection backs off after a refused connect (1 ms, doubling up
// to 100 ms) instead of dialling again in a tight loop (issue 19).
TEST_F(HttpToolsTest, LoadBacksOffFromADeadPortDuringWarmup) {
  IgnoresRangeHandler none("");
  uint16_t dead_port;
  {
    InProcessServer s(&none);
    dead_port = s.port();
  }
  std::string out;
  auto start = std::chrono::steady_clock::now();
  int rc = RunStdout("tools/load/load",
                     "-c 2 -t 1 --warmup 1 --duration 1 --json http://127.0.0.1:" + std::to_string(dead_port) + "/",
                     &out);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << out;
  auto j = nlohmann::json::parse(out);
  // 2 connections for 1 s each: about 2 x 13 tries with the back-off, not
  // the hundreds of thousands of a tight loop.
  uint64_t warmup_errors = j["warmup"]["errors"].get<uint64_t>();
  EXPECT_GE(warmup_errors, 2u) << out;
  EXPECT_LE(warmup_errors, 100u) << out;
  uint64_t connect_errors = j["errors"]["connect"].get<uint64_t>();
  EXPECT_GE(connect_errors, 1u) << out;
  EXPECT_LE(connect_errors, 100u) << out;
}

TEST_F(HttpToolsTest, LoadIntervalsAddUpAndCpuIsReported) {
  SlowHandler slow(std::chrono::milliseconds(5));
  InProcessServer server(&slow);
  std::string out;
  // 40 requests of >= 5 ms each, one at a time: >= 200 ms, i.e. several 50 ms intervals.
  ASSERT_EQ(RunStdout("tools/load/load", "-n 40 -c 1 -k -i 0.05 --json " + server.Url("/"), &out), 0) << out;
  EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["interval_seconds"], 0.05);
  const auto& intervals = j["intervals"];
  ASSERT_GE(intervals.size(), 3u) << out;
  uint64_t requests = 0, bytes = 0;
  double previous_end = 0;
  for (const auto& iv : intervals) {
    EXPECT_DOUBLE_EQ(iv["start"].get<double>(), previous_end);
    EXPECT_GE(iv["end"].get<double>(), iv["start"].get<double>());
    previous_end = iv["end"];
    requests += iv["requests"].get<uint64_t>();
    bytes += iv["bytes"].get<uint64_t>();
    double secs = iv["seconds"];
    if (secs > 0) {
      EXPECT_NEAR(iv["requests_per_s"].get<double>(), iv["requests"].get<double>() / secs, 1e-6 * (1 + secs));
      EXPECT_NEAR(iv["gbit_per_s"].get<double>(), iv["bytes"].get<double>() * 8 / secs / 1e9, 1e-9);
    }
    // Every interval but the last ends near a 50 ms boundary: >= 5 ms requests fit at most ~10.
    EXPECT_LE(iv["requests"].get<uint64_t>(), 40u);
  }
  EXPECT_EQ(requests, 40u);
  EXPECT_EQ(bytes, j["bytes"].get<uint64_t>());
  EXPECT_NEAR(previous_end, j["seconds"].get<double>(), 1e-9);
  EXPECT_GE(j["seconds"].get<double>(), 0.2);
  const auto& cpu = j["cpu_utilization"];
  EXPECT_NEAR(cpu["total_pct"].get<double>(), cpu["user_pct"].get<double>() + cpu["sys_pct"].get<double>(), 1e-9);
  EXPECT_EQ(cpu["wall_seconds"], j["seconds"]);
  // Text: one line per interval, then the summary with CPU and decimal Gbit/s.
  out.clear();
  ASSERT_EQ(RunCommand(BinaryPath("tools/load/load") + " -n 30 -c 1 -k -i 0.05 " + server.Url("/"), &out), 0) << out;
  size_t interval_lines = 0;
  for (size_t pos = out.find("\n["); pos != std::string::npos; pos = out.find("\n[", pos + 1)) ++interval_lines;
  EXPECT_GE(interval_lines, 2u) << out;
  EXPECT_NE(out.find(" req/s "), std::string::npos) << out;
  EXPECT_NE(out.find("Gbit/s (decimal, 10^9 bit/s"), std::string::npos) << out;
  EXPECT_NE(out.find("cpu: "), std::string::npos) << out;
  EXPECT_NE(out.find("% of one core (user "), std::string::npos) << out;
}

TEST_F(HttpToolsTest, LoadPinsItsThreadsWithAffinity) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(::sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  ASSERT_FALSE(cpus.empty());
  int first = cpus.front(), last = cpus.back();
  std::string out;
  std::string list = std::to_string(first) + "," + std::to_string(last);
  ASSERT_EQ(RunStdout("tools/load/load", "-n 100 -c 3 -t 3 -k -a " + list + " --json " + httpd_.Url("/file.bin"),
                      &out),
            0)
      << out;
  EXPECT_EQ(JsonConforms(LoadSchema(), out), "") << out;
  // Round robin over the list, as read back from each thread.
  EXPECT_EQ(nlohmann::json::parse(out)["affinity"], nlohmann::json::array({first, last, first})) << out;
  // A range form.
  ASSERT_EQ(RunStdout("tools/load/load", "-n 10 -c 1 -a " + std::to_string(first) + "-" + std::to_string(first) +
                                             " --json " + httpd_.Url("/file.bin"),
                      &out),
            0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(out)["affinity"], nlohmann::json::array({first})) << out;
}

TEST_F(HttpToolsTest, ToolsReportTheRefusalBeyondMaxConnections) {
  HttpdProcess full;
  std::string error;
  ASSERT_TRUE(full.Start({"--root", root_, "--max-connections", "1"}, &error)) << error;
  // The one allowed connection stays open (keep-alive) after its request.
  UniqueFd held = ConnectLoopback(full.port());
  ASSERT_TRUE(held);
  ASSERT_TRUE(SendString(held.get(), canopy::testing::Get("/file.bin")));
  std::string pending;
  RawResponse first;
  ASSERT_TRUE(ReadResponse(held.get(), &pending, &first));
  ASSERT_EQ(first.status, 200);
  std::string out;
  auto start = std::chrono::steady_clock::now();
  // 503: a server error response, wget's exit status 8.
  EXPECT_EQ(RunStdout("tools/get/get", full.Url("/file.bin") + " -O " + dir_.File("busy") + " --tries 1 --json", &out),
            8);
  EXPECT_EQ(JsonConforms(GetSchema(), out), "") << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["status"], 503);
  EXPECT_EQ(j["error_code"], "http_status");
  EXPECT_EQ(RunStdout("tools/load/load", "-n 5 -c 1 --json " + full.Url("/file.bin"), &out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["status_codes"]["503"], 5) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));  // refused, not stalled
}

TEST(HttpServerLibrary, RunReturnsByItselfAfterMaxDuration) {
  IgnoresRangeHandler handler("x");
  http::ServerOptions options;
  options.max_duration = std::chrono::milliseconds(200);
  auto server = http::Server::Listen(options, &handler);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto start = std::chrono::steady_clock::now();
  std::atomic<bool> returned{false};
  Status run_status;
  std::thread runner([&] {
    run_status = (*server)->Run();
    returned = true;
  });
  // Served while it runs.
  RawResponse r;
  EXPECT_TRUE(RoundTrip((*server)->port(), Get("/a"), &r));
  EXPECT_EQ(r.status, 200);
  runner.join();  // returns without Stop()
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(returned.load());
  EXPECT_TRUE(run_status.ok()) << run_status.ToString();
  EXPECT_GE(elapsed, std::chrono::milliseconds(190));
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  EXPECT_TRUE((*server)->stats().max_duration_reached);
}

}  // namespace
}  // namespace canopy::testing
