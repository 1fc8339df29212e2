// tools/httpd end to end: a real httpd child process on 127.0.0.1, port 0,
// spoken to over raw sockets.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "base/file.h"
#include "tests/http_test_util.h"
#include "tests/testing/test_util.h"

namespace canopy::testing {
namespace {

constexpr char kSecret[] = "TOP-SECRET-OUTSIDE-THE-ROOT";

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.File("root");
    ASSERT_TRUE(CreateDirs(root_ + "/sub").ok());
    ASSERT_TRUE(CreateDirs(root_ + "/empty").ok());
    ASSERT_TRUE(WriteFileAtomic(dir_.File("secret.txt"), kSecret).ok());
    ASSERT_TRUE(WriteFileAtomic(root_ + "/hello.txt", "hello, world\n").ok());
    ASSERT_TRUE(WriteFileAtomic(root_ + "/a.txt", "AAAA").ok());
    ASSERT_TRUE(WriteFileAtomic(root_ + "/b.html", "<p>B</p>").ok());
    data_ = RandomBytes(1 << 20, 7);
    ASSERT_TRUE(WriteFileAtomic(root_ + "/data.bin", data_).ok());
    ASSERT_TRUE(WriteFileAtomic(root_ + "/sub/index.html", "<h1>index</h1>").ok());
    ASSERT_TRUE(WriteFileAtomic(root_ + "/noread.txt", "private").ok());
    ::chmod((root_ + "/noread.txt").c_str(), 0600);
    for (const char* f : {"/hello.txt", "/a.txt", "/b.html", "/data.bin", "/sub/index.html"}) {
      ::chmod((root_ + f).c_str(), 0644);
    }
    ASSERT_EQ(::symlink("../secret.txt", (root_ + "/escape").c_str()), 0);
    ASSERT_EQ(::symlink(dir_.path().c_str(), (root_ + "/escape_dir").c_str()), 0);
    ASSERT_EQ(::symlink("hello.txt", (root_ + "/inside_link").c_str()), 0);
  }

  void StartServer(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--root", root_};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string error;
    ASSERT_TRUE(httpd_.Start(args, &error)) << error;
  }

  RawResponse Fetch(const std::string& request, bool head = false) {
    RawResponse r;
    EXPECT_TRUE(RoundTrip(httpd_.port(), request, &r, head)) << request;
    return r;
  }

  std::string Header(const RawResponse& r, const std::string& name) {
    const std::string* v = r.headers.Find(name);
    return v ? *v : "";
  }

  TempDir dir_;
  std::string root_;
  std::string data_;
  HttpdProcess httpd_;
};

TEST_F(HttpServerTest, GetServesFileWithHeaders) {
  StartServer();
  RawResponse r = Fetch(Get("/hello.txt"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello, world\n");
  EXPECT_EQ(Header(r, "Content-Length"), "13");
  EXPECT_EQ(Header(r, "Content-Type"), "text/plain; charset=utf-8");
  EXPECT_EQ(Header(r, "Accept-Ranges"), "bytes");
  EXPECT_FALSE(Header(r, "ETag").empty());
  EXPECT_NE(Header(r, "Last-Modified").find("GMT"), std::string::npos);
  EXPECT_NE(Header(r, "Date").find("GMT"), std::string::npos);
  EXPECT_EQ(Fetch(Get("/b.html")).headers.Find("Content-Type")->substr(0, 9), "text/html");
  EXPECT_EQ(Header(Fetch(Get("/data.bin")), "Content-Type"), "application/octet-stream");
  RawResponse big = Fetch(Get("/data.bin"));
  EXPECT_EQ(big.body, data_);
  // A symlink that stays inside the root is fine.
  EXPECT_EQ(Fetch(Get("/inside_link")).body, "hello, world\n");
}

TEST_F(HttpServerTest, StatusCodesForMissingMethodAndDirectories) {
  StartServer();
  EXPECT_EQ(Fetch(Get("/nope.txt")).status, 404);
  EXPECT_EQ(Fetch(Get("/sub/nope/deeper")).status, 404);
  RawResponse post = Fetch("POST /hello.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(Header(post, "Allow"), "GET, HEAD");
  EXPECT_EQ(Fetch("DELETE /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n").status, 405);
  RawResponse dir = Fetch(Get("/sub"));
  EXPECT_EQ(dir.status, 301);
  EXPECT_EQ(Header(dir, "Location"), "/sub/");
  RawResponse index = Fetch(Get("/sub/"));
  EXPECT_EQ(index.status, 200);
  EXPECT_EQ(index.body, "<h1>index</h1>");
  EXPECT_EQ(Fetch(Get("/empty/")).status, 403);  // no listings
  EXPECT_EQ(Fetch(Get("/noread.txt")).status, 403);  // not world-readable
  RawResponse etag = Fetch(Get("/hello.txt"));
  RawResponse not_modified = Fetch(Get("/hello.txt", "If-None-Match: " + Header(etag, "ETag") + "\r\n"));
  EXPECT_EQ(not_modified.status, 304);
  EXPECT_TRUE(not_modified.body.empty());
}

TEST_F(HttpServerTest, HeadHasNoBody) {
  StartServer();
  UniqueFd fd = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(fd);
  // HEAD then GET on one connection: if HEAD leaked body bytes, the second
  // response would not start where it must.
  ASSERT_TRUE(SendString(fd.get(), "HEAD /data.bin HTTP/1.1\r\nHost: t\r\n\r\n" + Get("/a.txt")));
  std::string pending;
  RawResponse head;
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &head, /*head_request=*/true));
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(Header(head, "Content-Length"), std::to_string(data_.size()));
  EXPECT_TRUE(head.body.empty());
  RawResponse next;
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &next));
  EXPECT_EQ(next.status, 200);
  EXPECT_EQ(next.body, "AAAA");
  EXPECT_TRUE(pending.empty());
}

TEST_F(HttpServerTest, RangeRequests) {
  StartServer();
  std::string size = std::to_string(data_.size());
  RawResponse r = Fetch(Get("/data.bin", "Range: bytes=100-199\r\n"));
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(r.body, data_.substr(100, 100));
  EXPECT_EQ(Header(r, "Content-Range"), "bytes 100-199/" + size);
  EXPECT_EQ(Header(r, "Content-Length"), "100");

  r = Fetch(Get("/data.bin", "Range: bytes=1000000-\r\n"));
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(r.body, data_.substr(1000000));
  EXPECT_EQ(Header(r, "Content-Range"), "bytes 1000000-" + std::to_string(data_.size() - 1) + "/" + size);

  r = Fetch(Get("/data.bin", "Range: bytes=-500\r\n"));
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(r.body, data_.substr(data_.size() - 500));

  r = Fetch(Get("/data.bin", "Range: bytes=1048000-99999999\r\n"));  // end clipped
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(r.body, data_.substr(1048000));

  r = Fetch(Get("/data.bin", "Range: bytes=" + size + "-\r\n"));
  EXPECT_EQ(r.status, 416);
  EXPECT_EQ(Header(r, "Content-Range"), "bytes */" + size);
  r = Fetch(Get("/data.bin", "Range: bytes=-0\r\n"));
  EXPECT_EQ(r.status, 416);

  // Several ranges, junk, or a stale If-Range: the whole file.
  r = Fetch(Get("/data.bin", "Range: bytes=0-1,5-6\r\n"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.size(), data_.size());
  EXPECT_EQ(Fetch(Get("/a.txt", "Range: lines=1-2\r\n")).status, 200);
  EXPECT_EQ(Fetch(Get("/a.txt", "Range: bytes=3-1\r\n")).status, 200);
  r = Fetch(Get("/a.txt", "Range: bytes=1-2\r\nIf-Range: \"stale\"\r\n"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "AAAA");
  // HEAD with a range: head only.
  r = Fetch("HEAD /data.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=0-9\r\n\r\n", /*head=*/true);
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(Header(r, "Content-Length"), "10");
  EXPECT_TRUE(r.body.empty());
}

TEST_F(HttpServerTest, TraversalIsRefused) {
  StartServer();
  const std::vector<std::string> attempts = {
      "/../secret.txt",          "/sub/../../secret.txt",      "/%2e%2e/secret.txt",
      "/%2E%2E/secret.txt",      "/%2e%2e%2fsecret.txt",       "/..%2fsecret.txt",
      "/sub/..%2f..%2fsecret.txt", "/escape",                  "/escape_dir/secret.txt",
      "/./../secret.txt",        "http://t/../secret.txt",     "/%2e%2e%2f%2e%2e%2fetc/passwd",
  };
  for (const auto& path : attempts) {
    RawResponse r = Fetch(Get(path));
    EXPECT_TRUE(r.status == 403 || r.status == 404) << path << " -> " << r.status;
    EXPECT_EQ(r.body.find(kSecret), std::string::npos) << path;
  }
  // A NUL byte or a bad escape is a malformed path.
  EXPECT_EQ(Fetch(Get("/hello.txt%00.html")).status, 400);
  EXPECT_EQ(Fetch(Get("/%zz")).status, 400);
  // ".." that stays inside is resolved normally.
  EXPECT_EQ(Fetch(Get("/sub/../hello.txt")).body, "hello, world\n");
  EXPECT_EQ(Fetch(Get("/hello%2etxt")).body, "hello, world\n");
}

TEST_F(HttpServerTest, MalformedRequestsGet400AndServerKeepsServing) {
  StartServer();
  const std::vector<std::pair<std::string, int>> cases = {
      {"GARBAGE\r\n\r\n", 400},
      {"GET /hello.txt\r\n\r\n", 400},
      {"GET /hello.txt HTTX/1.1\r\nHost: t\r\n\r\n", 400},
      {"GET /hello.txt HTTP/1.1\r\n\r\n", 400},                      // no Host
      {"GET /hello.txt HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},  // two Hosts
      {"GET /hello.txt HTTP/1.1\r\nHost: t\r\nNoColon\r\n\r\n", 400},
      {"GET /hello.txt HTTP/1.1\r\nHost: t\r\nBad Name: x\r\n\r\n", 400},
      {"GET /hello.txt HTTP/1.1\r\nHost: t\r\n folded\r\n\r\n", 400},
      {"GET hello.txt HTTP/1.1\r\nHost: t\r\n\r\n", 400},
      {"GET /hello.txt HTTP/1.1\r\nHost: t\r\nContent-Length: x\r\n\r\n", 400},
      {"GET /hello.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"GET /hello.txt HTTP/2.0\r\nHost: t\r\n\r\n", 505},
      {"GET /hello.txt HTTP/0.9\r\nHost: t\r\n\r\n", 505},
      {"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999\r\n\r\n", 413},
  };
  for (const auto& [request, status] : cases) {
    RawResponse r = Fetch(request);
    EXPECT_EQ(r.status, status) << request;
    EXPECT_EQ(Header(r, "Connection"), "close") << request;
    // Still serving.
    EXPECT_EQ(Fetch(Get("/a.txt")).body, "AAAA") << "after " << request;
  }
  // The error connection is closed after the answer.
  UniqueFd fd = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(SendString(fd.get(), "GARBAGE\r\n\r\n"));
  std::string pending;
  RawResponse r;
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r));
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(WaitForClose(fd.get(), std::chrono::seconds(5)));
}

TEST_F(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  StartServer();
  UniqueFd fd = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(fd);
  std::string pending;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(SendString(fd.get(), Get(i % 2 ? "/a.txt" : "/hello.txt")));
    RawResponse r;
    ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r)) << i;
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, i % 2 ? "AAAA" : "hello, world\n");
    EXPECT_EQ(r.headers.Find("Connection"), nullptr);
  }
  // "Connection: close" ends it.
  ASSERT_TRUE(SendString(fd.get(), Get("/a.txt", "Connection: close\r\n")));
  RawResponse last;
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &last));
  EXPECT_EQ(Header(last, "Connection"), "close");
  EXPECT_TRUE(WaitForClose(fd.get(), std::chrono::seconds(5)));
  // HTTP/1.0 closes unless it asks for keep-alive.
  RawResponse old = Fetch("GET /a.txt HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old.status, 200);
  EXPECT_EQ(Header(old, "Connection"), "close");
  RawResponse old_keep = Fetch("GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  EXPECT_EQ(Header(old_keep, "Connection"), "keep-alive");
}

TEST_F(HttpServerTest, PipelinedRequestsAnsweredInOrder) {
  StartServer();
  UniqueFd fd = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(fd);
  std::string batch = Get("/a.txt") + Get("/data.bin") + Get("/nope") + Get("/hello.txt", "Range: bytes=0-4\r\n") +
                      "HEAD /b.html HTTP/1.1\r\nHost: t\r\n\r\n" + Get("/b.html");
  ASSERT_TRUE(SendString(fd.get(), batch));
  std::string pending;
  RawResponse r;
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r));
  EXPECT_EQ(r.body, "AAAA");
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r));
  EXPECT_EQ(r.body, data_);
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r));
  EXPECT_EQ(r.status, 404);
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r));
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(r.body, "hello");
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r, /*head_request=*/true));
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.body.empty());
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r));
  EXPECT_EQ(r.body, "<p>B</p>");
  EXPECT_TRUE(pending.empty());
}

TEST_F(HttpServerTest, ManyPipelinedRequestsWithSlowReader) {
  StartServer();
  UniqueFd fd = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(fd);
  // 200 requests (every 10th for the 1 MiB file) sent at once while we read
  // slowly: the server must bound its buffering, stop reading while its
  // answers back up, and still answer every one of them in order.
  auto path = [](int i) { return i % 10 == 0 ? "/data.bin" : (i % 2 ? "/a.txt" : "/hello.txt"); };
  std::string batch;
  for (int i = 0; i < 200; ++i) batch += Get(path(i));
  std::thread sender([&] { SendString(fd.get(), batch); });
  std::string pending;
  for (int i = 0; i < 200; ++i) {
    RawResponse r;
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r)) << i;
    std::string want = i % 10 == 0 ? data_ : (i % 2 ? "AAAA" : "hello, world\n");
    ASSERT_EQ(r.body, want) << i;
  }
  sender.join();
}

TEST_F(HttpServerTest, HeaderAndUriLimits) {
  StartServer({"--max-header-bytes", "4096", "--max-uri-bytes", "1024"});
  RawResponse r = Fetch(Get("/hello.txt", "X-Big: " + std::string(5000, 'x') + "\r\n"));
  EXPECT_EQ(r.status, 431);
  std::string many;
  for (int i = 0; i < 150; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(Fetch(Get("/hello.txt", many)).status, 431);
  r = Fetch(Get("/" + std::string(2000, 'a')));
  EXPECT_EQ(r.status, 414);
  // A head that never ends is cut at the limit too.
  UniqueFd fd = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(SendString(fd.get(), "GET / HTTP/1.1\r\nHost: t\r\nX: " + std::string(8000, 'y')));
  std::string pending;
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r));
  EXPECT_EQ(r.status, 431);
  // Just under the limits is fine.
  EXPECT_EQ(Fetch(Get("/hello.txt", "X-Ok: " + std::string(3000, 'x') + "\r\n")).status, 200);
  EXPECT_EQ(Fetch(Get("/hello.txt?" + std::string(900, 'q'))).status, 200);
}

TEST_F(HttpServerTest, IdleConnectionsAreClosed) {
  StartServer({"--idle-timeout", "0.3"});
  UniqueFd fd = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(fd);
  ASSERT_TRUE(SendString(fd.get(), Get("/a.txt")));
  std::string pending;
  RawResponse r;
  ASSERT_TRUE(ReadResponse(fd.get(), &pending, &r));
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitForClose(fd.get(), std::chrono::seconds(5)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  // A slow, unfinished request is dropped the same way.
  UniqueFd slow = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(SendString(slow.get(), "GET /a.txt HTTP/1.1\r\n"));
  EXPECT_TRUE(WaitForClose(slow.get(), std::chrono::seconds(5)));
}

TEST_F(HttpServerTest, ConnectionsBeyondTheLimitGet503) {
  StartServer({"--max-connections", "2"});
  std::vector<UniqueFd> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(ConnectLoopback(httpd_.port()));
    ASSERT_TRUE(SendString(held.back().get(), Get("/a.txt")));
    std::string pending;
    RawResponse r;
    ASSERT_TRUE(ReadResponse(held.back().get(), &pending, &r));
    EXPECT_EQ(r.status, 200);
  }
  UniqueFd extra = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(extra);
  std::string pending;
  RawResponse r;
  // Answered at once, before any request is sent, and closed: a refusal, not a hang.
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(ReadResponse(extra.get(), &pending, &r));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(Header(r, "Retry-After"), "1");
  EXPECT_EQ(Header(r, "Connection"), "close");
  EXPECT_TRUE(WaitForClose(extra.get(), std::chrono::seconds(3)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  // A refused client that sends its request first reads the same answer.
  UniqueFd eager = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(eager);
  ASSERT_TRUE(SendString(eager.get(), Get("/a.txt")));
  pending.clear();
  ASSERT_TRUE(ReadResponse(eager.get(), &pending, &r));
  EXPECT_EQ(r.status, 503);
  EXPECT_TRUE(WaitForClose(eager.get(), std::chrono::seconds(3)));
  // The held connections are still served.
  ASSERT_TRUE(SendString(held.front().get(), Get("/hello.txt")));
  pending.clear();
  ASSERT_TRUE(ReadResponse(held.front().get(), &pending, &r));
  EXPECT_EQ(r.status, 200);
  held.clear();
  // Once the held connections go, new ones are served again.
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    RawResponse ok;
    served = RoundTrip(httpd_.port(), Get("/a.txt"), &ok) && ok.status == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(served);
}

TEST_F(HttpServerTest, ConcurrentClientsAreServedWhileOthersStall) {
  StartServer();
  // Eight clients each send half a request; none may hold up the others.
  constexpr int kClients = 8;
  std::vector<UniqueFd> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(ConnectLoopback(httpd_.port()));
    ASSERT_TRUE(clients.back());
    ASSERT_TRUE(SendString(clients.back().get(), "GET /data.bin HTTP/1.1\r\n"));
  }
  // Finished in reverse order: the last to connect is answered first, while
  // the others still hold unfinished requests.
  for (int i = kClients - 1; i >= 0; --i) {
    ASSERT_TRUE(SendString(clients[static_cast<size_t>(i)].get(), "Host: t\r\n\r\n"));
    std::string pending;
    RawResponse r;
    ASSERT_TRUE(ReadResponse(clients[static_cast<size_t>(i)].get(), &pending, &r)) << "client " << i;
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body.size(), data_.size());
  }
  // Then all at once, interleaved on the open connections (keep-alive).
  for (auto& c : clients) ASSERT_TRUE(SendString(c.get(), Get("/hello.txt")));
  for (auto& c : clients) {
    std::string pending;
    RawResponse r;
    ASSERT_TRUE(ReadResponse(c.get(), &pending, &r));
    EXPECT_EQ(r.body, "hello, world\n");
  }
}

TEST_F(HttpServerTest, MaxDurationExitsCleanly) {
  StartServer({"--max-duration", "0.5"});
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Fetch(Get("/hello.txt")).status, 200);
  // An idle keep-alive connection does not keep it running.
  UniqueFd idle = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(idle);
  ASSERT_TRUE(SendString(idle.get(), Get("/a.txt")));
  std::string pending;
  RawResponse r;
  ASSERT_TRUE(ReadResponse(idle.get(), &pending, &r));
  int status = httpd_.Wait(std::chrono::seconds(5));
  auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_NE(status, -1) << "httpd still running 5 s after --max-duration 0.5";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_GE(elapsed, std::chrono::milliseconds(400));
  EXPECT_TRUE(WaitForClose(idle.get(), std::chrono::seconds(1)));
  // The default, 0, is no limit: the server serves on past that.
  StartServer({"--max-duration", "0", "--idle-timeout", "5"});
  UniqueFd keep = ConnectLoopback(httpd_.port());
  ASSERT_TRUE(keep);
  ASSERT_TRUE(SendString(keep.get(), Get("/a.txt")));
  pending.clear();
  ASSERT_TRUE(ReadResponse(keep.get(), &pending, &r));
  EXPECT_FALSE(WaitForClose(keep.get(), std::chrono::milliseconds(700)));  // still open, still serving
  ASSERT_TRUE(SendString(keep.get(), Get("/a.txt")));
  ASSERT_TRUE(ReadResponse(keep.get(), &pending, &r));
  EXPECT_EQ(r.body, "AAAA");
}

TEST_F(HttpServerTest, AccessLogInCommonLogFormat) {
  std::string log = dir_.File("access.log");
  StartServer({"--access-log", log});
  EXPECT_EQ(Fetch(Get("/hello.txt")).status, 200);
  EXPECT_EQ(Fetch(Get("/nope")).status, 404);
  std::string text;
  for (int i = 0; i < 100; ++i) {
    auto r = ReadFileToString(log);
    if (r.ok()) text = *r;
    if (text.find("/nope") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(text.find("127.0.0.1 - - ["), std::string::npos) << text;
  EXPECT_NE(text.find("+0000] \"GET /hello.txt HTTP/1.1\" 200 13\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\"GET /nope HTTP/1.1\" 404 "), std::string::npos) << text;
}

TEST_F(HttpServerTest, BadOptionsFailClearly) {
  std::string out;
  EXPECT_NE(RunCommand(BinaryPath("tools/httpd/httpd") + " --root " + dir_.File("missing") + " --port 0", &out), 0);
  EXPECT_NE(out.find("missing"), std::string::npos) << out;
  out.clear();
  EXPECT_NE(RunCommand(BinaryPath("tools/httpd/httpd") + " --port 99999", &out), 0);
  EXPECT_NE(out.find("--port"), std::string::npos) << out;
  out.clear();
  EXPECT_NE(RunCommand(BinaryPath("tools/httpd/httpd") + " --bind nonsense --port 0 --root " + root_, &out), 0);
  EXPECT_NE(out.find("nonsense"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunCommand(BinaryPath("tools/httpd/httpd") + " --max-duration -1 --port 0 --root " + root_, &out), 2);
  EXPECT_NE(out.find("--max-duration"), std::string::npos) << out;
}

}  // namespace
}  // namespace canopy::testing
