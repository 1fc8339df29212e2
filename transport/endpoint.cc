// Endpoint parsing and formatting: scheme://host:port[/][?key=value&key=value].
//
// Keys and values may carry percent-escapes (%3D for '='); ToUri() escapes
// every byte outside a conservative safe set, so that any Endpoint round-trips.

#include <arpa/inet.h>

#include <cctype>
#include <string>

#include "transport/transport.h"

namespace canopy::transport {
namespace {

bool IsSafeQueryChar(unsigned char c) {
  if (std::isalnum(c)) return true;
  switch (c) {
    case '-':
    case '.':
    case '_':
    case '~':
    case ':':
    case '/':
    case ',':
    case '@':
    case '!':
    case '$':
    case '*':
    case '+':
    case ';':
    case '(':
    case ')':
    case '\'':
      return true;
    default:
      return false;
  }
}

void AppendEscaped(std::string* out, std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (unsigned char c : text) {
    if (IsSafeQueryChar(c)) {
      out->push_back(static_cast<char>(c));
    } else {
      out->push_back('%');
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 15]);
    }
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> Unescape(std::string_view text, std::string_view uri) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '%') {
      int hi = i + 2 < text.size() ? HexValue(text[i + 1]) : -1;
      int lo = i + 2 < text.size() ? HexValue(text[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        return Status::InvalidArgument("bad percent-escape in URI '" + std::string(uri) + "'");
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (static_cast<unsigned char>(c) <= 0x20 || c == '#') {
      return Status::InvalidArgument("unexpected character in query of URI '" + std::string(uri) + "'");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool IsHostNameChar(unsigned char c) { return std::isalnum(c) || c == '-' || c == '.' || c == '_'; }

}  // namespace

std::string Endpoint::HostPort() const {
  std::string out;
  if (host.find(':') != std::string::npos) {
    out = "[" + host + "]";
  } else {
    out = host;
  }
  out += ":" + std::to_string(port);
  return out;
}

std::string Endpoint::ToUri() const {
  std::string out = scheme + "://" + HostPort();
  char separator = '?';
  for (const auto& [key, value] : params) {
    out.push_back(separator);
    separator = '&';
    AppendEscaped(&out, key);
    out.push_back('=');
    AppendEscaped(&out, value);
  }
  return out;
}

Result<Endpoint> ParseEndpoint(std::string_view uri) {
  auto bad = [uri](std::string_view why) {
    return Status::InvalidArgument("bad transport URI '" + std::string(uri) + "': " + std::string(why) +
                                   " (expected scheme://host:port[?key=value&...])");
  };
  Endpoint e;
  size_t sep = uri.find("://");
  if (sep == std::string_view::npos) return bad("missing scheme");
  std::string_view scheme = uri.substr(0, sep);
  if (scheme.empty()) return bad("missing scheme");
  for (size_t i = 0; i < scheme.size(); ++i) {
    auto c = static_cast<unsigned char>(scheme[i]);
    bool ok = std::isalpha(c) || (i > 0 && (std::isdigit(c) || c == '+' || c == '-' || c == '.'));
    if (!ok) return bad("invalid character in scheme");
    e.scheme.push_back(static_cast<char>(std::tolower(c)));
  }

  std::string_view rest = uri.substr(sep + 3);
  std::string_view query;
  bool has_query = false;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
    has_query = true;
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);  // "tcp://h:1/" is allowed

  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated '[' in IPv6 address");
    std::string host(rest.substr(1, close - 1));
    if (host.empty()) return bad("empty host");
    std::string address = host.substr(0, host.find('%'));  // zone id (fe80::1%eth0) allowed
    in6_addr unused{};
    if (::inet_pton(AF_INET6, address.c_str(), &unused) != 1) return bad("invalid IPv6 address in brackets");
    if (host.find('%') != std::string::npos && host.size() == address.size() + 1)
      return bad("empty IPv6 zone");
    e.host = std::move(host);
    std::string_view after = rest.substr(close + 1);
    if (after.empty() || after.front() != ':') return bad("missing port");
    port_text = after.substr(1);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("missing port");
    std::string_view host = rest.substr(0, colon);
    if (host.empty()) return bad("empty host");
    for (char c : host) {
      if (c == ':') return bad("IPv6 addresses must be written in brackets, e.g. tcp://[::1]:7000");
      if (!IsHostNameChar(static_cast<unsigned char>(c))) return bad("invalid character in host");
    }
    e.host = std::string(host);
    port_text = rest.substr(colon + 1);
  }
  if (port_text.empty()) return bad("missing port");
  if (port_text.size() > 5) return bad("port out of range (0-65535)");
  uint32_t port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') return bad("port is not a number");
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port > 65535) return bad("port out of range (0-65535)");
  e.port = static_cast<uint16_t>(port);

  if (has_query) {
    size_t start = 0;
    while (start <= query.size()) {
      size_t amp = query.find('&', start);
      if (amp == std::string_view::npos) amp = query.size();
      std::string_view pair = query.substr(start, amp - start);
      start = amp + 1;
      if (pair.empty()) continue;  // "?a=1&&b=2", trailing '&'
      size_t eq = pair.find('=');
      std::string_view raw_key = pair.substr(0, eq);
      std::string_view raw_value = eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
      if (raw_key.empty()) return bad("empty parameter name");
      CANOPY_ASSIGN_OR_RETURN(std::string key, Unescape(raw_key, uri));
      CANOPY_ASSIGN_OR_RETURN(std::string value, Unescape(raw_value, uri));
      if (e.params.count(key) != 0) return bad("parameter '" + key + "' given twice");
      e.params.emplace(std::move(key), std::move(value));
    }
  }
  return e;
}

}  // namespace canopy::transport
