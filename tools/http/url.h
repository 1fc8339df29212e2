// http:// URLs (client side) and percent-decoding (server side).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"

namespace canopy::http {

struct Url {
  std::string host;     // name or address literal, IPv6 without brackets
  uint16_t port = 80;
  std::string target;   // path + optional "?query", never empty ("/" at least)
  bool ipv6_literal = false;

  // "host[:port]" for the Host header (brackets around IPv6, port only when not 80).
  std::string HostHeader() const;
  // "http://" + HostHeader() + target.
  std::string ToString() const;
};

// Parses "http://host[:port][/path][?query]" (fragments dropped). Hosts may
// be names, IPv4 literals or bracketed IPv6 literals ("http://[::1]:8080/").
// NotSupported for https:// (no TLS here), InvalidArgument otherwise.
Result<Url> ParseUrl(std::string_view text);

// Resolves a redirect's Location (absolute URL, "//host/path", "/path" or a
// relative path) against the URL that was requested.
Result<Url> ResolveLocation(const Url& base, std::string_view location);

// Decodes %XX escapes ('+' is left alone: it is a literal in paths).
// InvalidArgument for a truncated or non-hex escape.
Result<std::string> PercentDecode(std::string_view text);

}  // namespace canopy::http
