#include <gtest/gtest.h>

#include <string>

#include "transport/transport.h"

namespace canopy::transport {
namespace {

Endpoint MustParse(std::string_view uri) {
  auto e = ParseEndpoint(uri);
  EXPECT_TRUE(e.ok()) << uri << ": " << e.status().ToString();
  return e.ok() ? *e : Endpoint{};
}

TEST(EndpointTest, ParsesIpv4) {
  Endpoint e = MustParse("tcp://127.0.0.1:7000");
  EXPECT_EQ(e.scheme, "tcp");
  EXPECT_EQ(e.host, "127.0.0.1");
  EXPECT_EQ(e.port, 7000);
  EXPECT_TRUE(e.params.empty());
  EXPECT_EQ(e.HostPort(), "127.0.0.1:7000");
  EXPECT_EQ(e.ToUri(), "tcp://127.0.0.1:7000");
}

TEST(EndpointTest, ParsesHostnamesAndPortBounds) {
  Endpoint e = MustParse("rdma://node-1.rack_2.example.org:65535");
  EXPECT_EQ(e.scheme, "rdma");
  EXPECT_EQ(e.host, "node-1.rack_2.example.org");
  EXPECT_EQ(e.port, 65535);
  EXPECT_EQ(MustParse("tcp://localhost:0").port, 0);
  EXPECT_EQ(MustParse("TCP://h:1").scheme, "tcp") << "schemes are case-insensitive";
  EXPECT_EQ(MustParse("tcp://h:1/").ToUri(), "tcp://h:1") << "a trailing slash is allowed";
  EXPECT_EQ(MustParse("tcp://h:00080").port, 80);
}

TEST(EndpointTest, ParsesBracketedIpv6) {
  Endpoint e = MustParse("tcp://[::1]:7000");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 7000);
  EXPECT_EQ(e.HostPort(), "[::1]:7000");
  EXPECT_EQ(e.ToUri(), "tcp://[::1]:7000");
  EXPECT_EQ(MustParse("tcp://[fe80::1%eth0]:1").host, "fe80::1%eth0");
  EXPECT_EQ(MustParse("tcp://[2001:db8::ffff:1.2.3.4]:9").host, "2001:db8::ffff:1.2.3.4");
}

TEST(EndpointTest, ParsesQueryParameters) {
  Endpoint e = MustParse("dpdk://10.0.0.2:7000?port=1&queues=4&flag");
  EXPECT_EQ(e.params.size(), 3u);
  EXPECT_EQ(e.params["port"], "1");
  EXPECT_EQ(e.params["queues"], "4");
  EXPECT_EQ(e.params["flag"], "");
  EXPECT_EQ(e.ToUri(), "dpdk://10.0.0.2:7000?flag=&port=1&queues=4");
  EXPECT_EQ(MustParse("tcp://h:1?").params.size(), 0u);
  EXPECT_EQ(MustParse("tcp://h:1?a=1&&b=2&").params.size(), 2u);
  Endpoint escaped = MustParse("tcp://h:1?k%3Dx=a%26b%25c&v=x=y");
  EXPECT_EQ(escaped.params["k=x"], "a&b%c");
  EXPECT_EQ(escaped.params["v"], "x=y") << "the first '=' separates key and value";
}

TEST(EndpointTest, RoundTripsThroughToUri) {
  Endpoint e;
  e.scheme = "tcp";
  e.host = "::ffff:10.1.2.3";
  e.port = 1;
  e.params = {{"a b", "c&d=e"}, {"nodelay", "0"}, {"path", "/x/y"}, {"pct", "100%"}, {"empty", ""}};
  auto parsed = ParseEndpoint(e.ToUri());
  ASSERT_TRUE(parsed.ok()) << e.ToUri() << ": " << parsed.status().ToString();
  EXPECT_EQ(*parsed, e) << e.ToUri();
  for (const char* uri : {"tcp://127.0.0.1:7000", "rdma://[::1]:1?device=mlx5_0", "dpdk://h:2?a=1&b=2"}) {
    EXPECT_EQ(MustParse(uri).ToUri(), uri);
  }
}

TEST(EndpointTest, RejectsMalformedUris) {
  const char* bad[] = {
      "",                     // empty
      "127.0.0.1:7000",       // missing scheme
      "://127.0.0.1:7000",    // empty scheme
      "tcp:/127.0.0.1:7000",  // one slash
      "1tcp://h:1",           // scheme starts with a digit
      "t_p://h:1",            // bad scheme character
      "tcp://127.0.0.1",      // missing port
      "tcp://127.0.0.1:",     // empty port
      "tcp://:7000",          // empty host
      "tcp://h:65536",        // port out of range
      "tcp://h:123456",       // port out of range
      "tcp://h:-1",           // not a number
      "tcp://h:7a",           // not a number
      "tcp://h:1/path",       // paths are not allowed
      "tcp://::1:7000",       // IPv6 without brackets
      "tcp://[::1:7000",      // unterminated bracket
      "tcp://[::1]",          // missing port after bracket
      "tcp://[::1]7000",      // missing colon
      "tcp://[]:1",           // empty bracketed host
      "tcp://[not-v6]:1",     // invalid IPv6
      "tcp://[fe80::1%]:1",   // empty zone
      "tcp://user@h:1",       // userinfo
      "tcp://h h:1",          // space in host
      "tcp://h:1?=v",         // empty parameter name
      "tcp://h:1?a=1&a=2",    // duplicate parameter
      "tcp://h:1?a=%zz",      // bad escape
      "tcp://h:1?a=%4",       // truncated escape
      "tcp://h:1?a=b c",      // raw space in query
      "tcp://h:1#frag",       // fragment (lands in the port)
  };
  for (const char* uri : bad) {
    auto e = ParseEndpoint(uri);
    EXPECT_FALSE(e.ok()) << "accepted '" << uri << "' as " << (e.ok() ? e->ToUri() : "");
    if (!e.ok()) {
      EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << uri;
      EXPECT_NE(e.status().message().find(uri), std::string::npos) << "the message names the URI: " << uri;
    }
  }
}

}  // namespace
}  // namespace canopy::transport
