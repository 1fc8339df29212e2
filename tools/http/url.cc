#include "tools/http/url.h"

#include <fmt/format.h>

#include "tools/http/message.h"

namespace canopy::http {
namespace {

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string Url::HostHeader() const {
  std::string h = ipv6_literal ? "[" + host + "]" : host;
  if (port != 80) h += fmt::format(":{}", port);
  return h;
}

std::string Url::ToString() const { return "http://" + HostHeader() + target; }

Result<Url> ParseUrl(std::string_view text) {
  std::string_view rest = text;
  if (rest.size() >= 8 && EqualsIgnoreCase(rest.substr(0, 8), "https://")) {
    return Status::NotSupported(fmt::format("{}: https is not supported (no TLS); use http://", text));
  }
  if (rest.size() >= 7 && EqualsIgnoreCase(rest.substr(0, 7), "http://")) {
    rest.remove_prefix(7);
  } else if (rest.find("://") != std::string_view::npos) {
    return Status::InvalidArgument(fmt::format("{}: only http:// URLs are supported", text));
  }
  size_t end_authority = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, end_authority);
  std::string_view tail = end_authority == std::string_view::npos ? std::string_view() : rest.substr(end_authority);
  if (size_t at = authority.rfind('@'); at != std::string_view::npos) {
    return Status::InvalidArgument(fmt::format("{}: user:password@ in URLs is not supported", text));
  }
  Url url;
  std::string_view port_text;
  if (!authority.empty() && authority[0] == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return Status::InvalidArgument(fmt::format("{}: unclosed '['", text));
    url.host = std::string(authority.substr(1, close - 1));
    url.ipv6_literal = true;
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Status::InvalidArgument(fmt::format("{}: junk after ']'", text));
      port_text = after.substr(1);
    }
    if (url.host.find_first_not_of("0123456789abcdefABCDEF:.%") != std::string::npos || url.host.empty()) {
      return Status::InvalidArgument(fmt::format("{}: invalid IPv6 literal", text));
    }
  } else {
    size_t colon = authority.find(':');
    url.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
    if (url.host.empty()) return Status::InvalidArgument(fmt::format("{}: missing host", text));
    for (char c : url.host) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                c == '.' || c == '_';
      if (!ok) return Status::InvalidArgument(fmt::format("{}: invalid character in host", text));
    }
  }
  if (!port_text.empty()) {
    unsigned port = 0;
    for (char c : port_text) {
      if (c < '0' || c > '9' || port > 65535) return Status::InvalidArgument(fmt::format("{}: invalid port", text));
      port = port * 10 + static_cast<unsigned>(c - '0');
    }
    if (port == 0 || port > 65535) return Status::InvalidArgument(fmt::format("{}: invalid port", text));
    url.port = static_cast<uint16_t>(port);
  }
  tail = tail.substr(0, tail.find('#'));
  if (tail.empty() || tail[0] != '/') {
    url.target = "/" + std::string(tail);
  } else {
    url.target = std::string(tail);
  }
  for (unsigned char c : url.target) {
    if (c <= 0x20 || c >= 0x7f) {
      return Status::InvalidArgument(fmt::format("{}: characters in the path must be percent-encoded", text));
    }
  }
  return url;
}

Result<Url> ResolveLocation(const Url& base, std::string_view location) {
  if (location.empty()) return Status::InvalidArgument("empty Location header");
  if (location.find("://") != std::string_view::npos) return ParseUrl(location);
  if (location.size() >= 2 && location.substr(0, 2) == "//") return ParseUrl(fmt::format("http:{}", location));
  Url url = base;
  if (location[0] == '/') {
    url.target = std::string(location);
  } else {
    std::string_view path = std::string_view(base.target).substr(0, base.target.find('?'));
    url.target = std::string(path.substr(0, path.rfind('/') + 1)) + std::string(location);
  }
  url.target = url.target.substr(0, url.target.find('#'));
  for (unsigned char c : url.target) {
    if (c <= 0x20 || c >= 0x7f) return Status::InvalidArgument("invalid character in Location");
  }
  return url;
}

Result<std::string> PercentDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    if (i + 2 >= text.size()) {
      return Status::InvalidArgument("truncated percent escape");
    }
    int hi = Hex(text[i + 1]);
    int lo = Hex(text[i + 2]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("invalid percent escape");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

}  // namespace canopy::http
