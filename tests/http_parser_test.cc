// canopy_http's parsers and small helpers, without sockets.
#include <gtest/gtest.h>

#include "tools/http/message.h"
#include "tools/http/mime.h"
#include "tools/http/parser.h"
#include "tools/http/range.h"
#include "tools/http/url.h"

namespace canopy::http {
namespace {

struct Parsed {
  RequestParser::State state;
  int error = 0;
  Request request;
  size_t used = 0;
};

Parsed ParseAll(std::string_view text, RequestLimits limits = {}, size_t piece = SIZE_MAX) {
  RequestParser p(limits);
  Parsed out;
  while (out.used < text.size() && p.state() == RequestParser::State::kNeedMore) {
    std::string_view part = text.substr(out.used, std::min(piece, text.size() - out.used));
    size_t n = p.Feed(part);
    out.used += n;
    if (n < part.size()) break;
  }
  out.state = p.state();
  out.error = p.error_status();
  if (out.state == RequestParser::State::kComplete) out.request = p.TakeRequest();
  return out;
}

TEST(HttpRequestParserTest, ParsesSimpleRequestInAnySplit) {
  std::string text = "GET /a%20b?x=1 HTTP/1.1\r\nHost: h\r\nX-Thing:  v  \r\n\r\n";
  for (size_t piece : {size_t{1}, size_t{2}, size_t{7}, SIZE_MAX}) {
    Parsed p = ParseAll(text, {}, piece);
    ASSERT_EQ(p.state, RequestParser::State::kComplete) << piece;
    EXPECT_EQ(p.used, text.size());
    EXPECT_EQ(p.request.method, "GET");
    EXPECT_EQ(p.request.target, "/a%20b?x=1");
    EXPECT_EQ(p.request.path(), "/a%20b");
    EXPECT_EQ(p.request.query(), "x=1");
    EXPECT_EQ(p.request.version_minor, 1);
    ASSERT_NE(p.request.headers.Find("x-thing"), nullptr);
    EXPECT_EQ(*p.request.headers.Find("X-THING"), "v");
    EXPECT_TRUE(p.request.KeepAlive());
  }
}

TEST(HttpRequestParserTest, StopsAtEndOfRequestForPipelining) {
  std::string one = "GET /1 HTTP/1.1\r\nHost: h\r\n\r\n";
  std::string two = "GET /2 HTTP/1.1\r\nHost: h\r\n\r\n";
  RequestParser p;
  std::string both = one + two;
  size_t used = p.Feed(both);
  EXPECT_EQ(used, one.size());
  ASSERT_EQ(p.state(), RequestParser::State::kComplete);
  EXPECT_EQ(p.TakeRequest().target, "/1");
  p.Reset();
  EXPECT_EQ(p.Feed(std::string_view(both).substr(used)), two.size());
  ASSERT_EQ(p.state(), RequestParser::State::kComplete);
  EXPECT_EQ(p.TakeRequest().target, "/2");
}

TEST(HttpRequestParserTest, BodiesByLengthAndChunked) {
  Parsed p = ParseAll("POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloEXTRA", {}, 3);
  ASSERT_EQ(p.state, RequestParser::State::kComplete);
  EXPECT_EQ(p.request.body, "hello");
  std::string chunked =
      "POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n";
  for (size_t piece : {size_t{1}, size_t{4}, SIZE_MAX}) {
    p = ParseAll(chunked, {}, piece);
    ASSERT_EQ(p.state, RequestParser::State::kComplete) << piece;
    EXPECT_EQ(p.request.body, "hello world");
    EXPECT_EQ(p.used, chunked.size());
  }
  RequestLimits small;
  small.max_body_bytes = 8;
  EXPECT_EQ(ParseAll(chunked, small).error, 413);
  EXPECT_EQ(ParseAll("POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 9\r\n\r\n", small).error, 413);
  EXPECT_EQ(ParseAll("POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").error, 400);
}

TEST(HttpRequestParserTest, ExpectContinue) {
  RequestParser p;
  p.Feed("POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_EQ(p.state(), RequestParser::State::kNeedMore);
  EXPECT_TRUE(p.head_complete());
  EXPECT_TRUE(p.expects_continue());
  p.Feed("ok");
  EXPECT_EQ(p.state(), RequestParser::State::kComplete);
  EXPECT_FALSE(p.expects_continue());
}

TEST(HttpRequestParserTest, ErrorStatuses) {
  RequestLimits limits;
  limits.max_uri_bytes = 64;
  limits.max_header_bytes = 256;
  limits.max_header_count = 4;
  EXPECT_EQ(ParseAll("GET /" + std::string(100, 'a') + " HTTP/1.1\r\nHost: h\r\n\r\n", limits).error, 414);
  // 414 is detected before the line even ends.
  EXPECT_EQ(ParseAll("GET /" + std::string(100, 'a'), limits).error, 414);
  EXPECT_EQ(ParseAll("GET / HTTP/1.1\r\nHost: h\r\nX: " + std::string(300, 'b'), limits).error, 431);
  EXPECT_EQ(ParseAll("GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\n\r\n", limits).error, 431);
  EXPECT_EQ(ParseAll("GET / HTTP/1.1\r\nhost: h\r\n\r\n").state, RequestParser::State::kComplete);
  EXPECT_EQ(ParseAll("GET / HTTP/1.1\r\n\r\n").error, 400);
  EXPECT_EQ(ParseAll("GET / HTTP/1.0\r\n\r\n").state, RequestParser::State::kComplete);
  EXPECT_EQ(ParseAll("GET / HTTP/3.0\r\nHost: h\r\n\r\n").error, 505);
  EXPECT_EQ(ParseAll("GET / HTTP/1.1 \r\nHost: h\r\n\r\n").error, 400);
  EXPECT_EQ(ParseAll("GET  / HTTP/1.1\r\nHost: h\r\n\r\n").error, 400);
  EXPECT_EQ(ParseAll("G(T / HTTP/1.1\r\nHost: h\r\n\r\n").error, 400);
  EXPECT_EQ(ParseAll("GET / HTTP/1.1\r\nHost: h\r\nX: a\x01b\r\n\r\n").error, 400);
  EXPECT_EQ(ParseAll("GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").error, 501);
  // Leading empty lines are skipped; bare LF line ends are accepted.
  Parsed p = ParseAll("\r\n\r\nGET /lf HTTP/1.1\nHost: h\n\n");
  ASSERT_EQ(p.state, RequestParser::State::kComplete);
  EXPECT_EQ(p.request.target, "/lf");
  // Absolute-form targets are reduced to their path.
  p = ParseAll("GET http://example/x/y?q HTTP/1.1\r\nHost: example\r\n\r\n");
  ASSERT_EQ(p.state, RequestParser::State::kComplete);
  EXPECT_EQ(p.request.target, "/x/y?q");
}

TEST(HttpRequestParserTest, KeepAliveRules) {
  EXPECT_FALSE(ParseAll("GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n").request.KeepAlive());
  EXPECT_FALSE(ParseAll("GET / HTTP/1.0\r\n\r\n").request.KeepAlive());
  EXPECT_TRUE(ParseAll("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").request.KeepAlive());
  EXPECT_FALSE(ParseAll("GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, close\r\n\r\n").request.KeepAlive());
}

TEST(HttpChunkedDecoderTest, RejectsBadInput) {
  for (std::string bad : {"x\r\n", "5\r\nhelloXX", "1234567890abcdef0\r\n", "\r\n"}) {
    ChunkedDecoder d;
    d.Feed(bad, [](std::string_view) {});
    EXPECT_TRUE(d.failed()) << bad;
  }
  ChunkedDecoder d;
  std::string out;
  size_t used = d.Feed("3\r\nabc\r\n0\r\n\r\nNEXT", [&](std::string_view s) { out.append(s); });
  EXPECT_TRUE(d.done());
  EXPECT_EQ(out, "abc");
  EXPECT_EQ(used, 13u);  // "NEXT" belongs to the next message
}

TEST(HttpResponseParserTest, HeadAndBodyFraming) {
  auto head = ParseResponseHead("HTTP/1.1 206 Partial Content\r\nContent-Length: 3\r\nX: y\r\n\r\n");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->status, 206);
  EXPECT_EQ(head->reason, "Partial Content");
  auto body = BodyReader::ForResponse(*head, false);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(body->declared_length(), 3);
  std::string out;
  EXPECT_EQ(body->Feed("abcdef", [&](std::string_view s) { out.append(s); }), 3u);
  EXPECT_TRUE(body->done());
  EXPECT_EQ(out, "abc");
  EXPECT_TRUE(BodyReader::ForResponse(*head, /*request_was_head=*/true)->done());

  auto truncated = BodyReader::ForResponse(*head, false);
  truncated->Feed("a", [](std::string_view) {});
  EXPECT_TRUE(truncated->OnEof().IsCorruption());

  auto until_close = ParseResponseHead("HTTP/1.0 200 OK\r\n\r\n");
  ASSERT_TRUE(until_close.ok());
  auto r = BodyReader::ForResponse(*until_close, false);
  EXPECT_TRUE(r->close_delimited());
  EXPECT_TRUE(r->OnEof().ok());
  EXPECT_TRUE(r->done());

  EXPECT_TRUE(ParseResponseHead("HTTP/1.1 204\r\n\r\n").ok());
  EXPECT_FALSE(ParseResponseHead("HTTP/1.1 2x4 No\r\n\r\n").ok());
  EXPECT_FALSE(ParseResponseHead("SPDY/1 200 OK\r\n\r\n").ok());
  auto conflicting = ParseResponseHead("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n");
  ASSERT_TRUE(conflicting.ok());
  EXPECT_FALSE(BodyReader::ForResponse(*conflicting, false).ok());
}

TEST(HttpRangeTest, SingleRanges) {
  ByteRange r;
  EXPECT_EQ(ParseRange("bytes=0-9", 100, &r), RangeResult::kSatisfiable);
  EXPECT_EQ(r.first, 0u);
  EXPECT_EQ(r.length, 10u);
  EXPECT_EQ(ParseRange("bytes=90-", 100, &r), RangeResult::kSatisfiable);
  EXPECT_EQ(r.length, 10u);
  EXPECT_EQ(ParseRange("bytes=-30", 100, &r), RangeResult::kSatisfiable);
  EXPECT_EQ(r.first, 70u);
  EXPECT_EQ(ParseRange("bytes=-300", 100, &r), RangeResult::kSatisfiable);
  EXPECT_EQ(r.first, 0u);
  EXPECT_EQ(r.length, 100u);
  EXPECT_EQ(ParseRange("bytes=50-5000", 100, &r), RangeResult::kSatisfiable);
  EXPECT_EQ(r.length, 50u);
  EXPECT_EQ(ParseRange("bytes=100-", 100, &r), RangeResult::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=-0", 100, &r), RangeResult::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=0-", 0, &r), RangeResult::kUnsatisfiable);
  EXPECT_EQ(ParseRange("bytes=5-1", 100, &r), RangeResult::kIgnore);
  EXPECT_EQ(ParseRange("bytes=0-1,3-4", 100, &r), RangeResult::kIgnore);
  EXPECT_EQ(ParseRange("items=0-1", 100, &r), RangeResult::kIgnore);
  EXPECT_EQ(ParseRange("bytes=a-b", 100, &r), RangeResult::kIgnore);
}

TEST(HttpUrlTest, ParseAndResolve) {
  auto u = ParseUrl("http://example.com:8080/a/b?c=d#frag");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "example.com");
  EXPECT_EQ(u->port, 8080);
  EXPECT_EQ(u->target, "/a/b?c=d");
  EXPECT_EQ(u->HostHeader(), "example.com:8080");
  auto v6 = ParseUrl("http://[::1]:81/x");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_TRUE(v6->ipv6_literal);
  EXPECT_EQ(v6->HostHeader(), "[::1]:81");
  auto bare = ParseUrl("127.0.0.1");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->port, 80);
  EXPECT_EQ(bare->target, "/");
  EXPECT_EQ(ParseUrl("https://x/").status().code(), StatusCode::kNotSupported);
  EXPECT_FALSE(ParseUrl("ftp://x/").ok());
  EXPECT_FALSE(ParseUrl("http://x:0/").ok());
  EXPECT_FALSE(ParseUrl("http://x:70000/").ok());
  EXPECT_FALSE(ParseUrl("http://[::1/").ok());
  EXPECT_FALSE(ParseUrl("http://x/a b").ok());

  auto next = ResolveLocation(*u, "/other");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->ToString(), "http://example.com:8080/other");
  next = ResolveLocation(*u, "sibling");
  EXPECT_EQ(next->target, "/a/sibling");
  next = ResolveLocation(*u, "http://elsewhere/z");
  EXPECT_EQ(next->host, "elsewhere");
  EXPECT_EQ(next->port, 80);
}

TEST(HttpUrlTest, PercentDecode) {
  EXPECT_EQ(*PercentDecode("/a%20b%2F%2e%2E"), "/a b/..");
  EXPECT_EQ(*PercentDecode("a+b"), "a+b");
  EXPECT_EQ(PercentDecode("%00")->size(), 1u);
  EXPECT_FALSE(PercentDecode("%").ok());
  EXPECT_FALSE(PercentDecode("%4").ok());
  EXPECT_FALSE(PercentDecode("%zz").ok());
}

TEST(HttpMessageTest, MimeAndHeadSerialisation) {
  EXPECT_EQ(MimeTypeForPath("/x/INDEX.HTML"), "text/html; charset=utf-8");
  EXPECT_EQ(MimeTypeForPath("/x/a.json"), "application/json");
  EXPECT_EQ(MimeTypeForPath("/x.d/noext"), "application/octet-stream");
  EXPECT_EQ(MimeTypeForPath("/x/a."), "application/octet-stream");
  Headers h;
  h.Add("A", "1");
  h.Add("B", "2");
  h.Set("a", "3");
  std::string out;
  AppendResponseHead(404, h, &out);
  EXPECT_EQ(out, "HTTP/1.1 404 Not Found\r\nB: 2\r\na: 3\r\n\r\n");
  EXPECT_TRUE(ListHasToken("keep-alive, Upgrade", "upgrade"));
  EXPECT_FALSE(ListHasToken("keep-alive-ish", "keep-alive"));
}

}  // namespace
}  // namespace canopy::http
