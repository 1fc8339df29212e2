#include "tools/http/message.h"

#include <fmt/format.h>

namespace canopy::http {
namespace {

char LowerAscii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string_view TrimSpaces(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (LowerAscii(a[i]) != LowerAscii(b[i])) return false;
  }
  return true;
}

bool ListHasToken(std::string_view list, std::string_view token) {
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view item = TrimSpaces(list.substr(0, comma));
    if (EqualsIgnoreCase(item, token)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

void Headers::Set(std::string_view name, std::string value) {
  std::vector<Header> kept;
  kept.reserve(list_.size() + 1);
  for (auto& h : list_) {
    if (!EqualsIgnoreCase(h.name, name)) kept.push_back(std::move(h));
  }
  kept.push_back({std::string(name), std::move(value)});
  list_ = std::move(kept);
}

const std::string* Headers::Find(std::string_view name) const {
  for (const auto& h : list_) {
    if (EqualsIgnoreCase(h.name, name)) return &h.value;
  }
  return nullptr;
}

size_t Headers::Count(std::string_view name) const {
  size_t n = 0;
  for (const auto& h : list_) n += EqualsIgnoreCase(h.name, name) ? 1 : 0;
  return n;
}

std::string_view Request::path() const {
  std::string_view t = target;
  return t.substr(0, t.find('?'));
}

std::string_view Request::query() const {
  std::string_view t = target;
  size_t q = t.find('?');
  return q == std::string_view::npos ? std::string_view() : t.substr(q + 1);
}

bool Request::KeepAlive() const {
  const std::string* connection = headers.Find("Connection");
  if (connection && ListHasToken(*connection, "close")) return false;
  if (version_minor >= 1) return true;
  return connection && ListHasToken(*connection, "keep-alive");
}

std::string Request::RequestLine() const {
  return fmt::format("{} {} HTTP/1.{}", method, target, version_minor);
}

Response Response::Text(int status, std::string_view text) {
  Response r;
  r.status = status;
  r.headers.Add("Content-Type", "text/plain; charset=utf-8");
  r.body = std::string(text) + "\n";
  return r;
}

Response Response::Json(int status, std::string json) {
  Response r;
  r.status = status;
  r.headers.Add("Content-Type", "application/json");
  r.body = std::move(json);
  return r;
}

Response Response::Error(int status, std::string_view detail) {
  std::string text = fmt::format("{} {}", status, ReasonPhrase(status));
  if (!detail.empty()) text += fmt::format(": {}", detail);
  return Text(status, text);
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

bool StatusHasNoBody(int status) { return (status >= 100 && status < 200) || status == 204 || status == 304; }

void AppendResponseHead(int status, const Headers& headers, std::string* out) {
  fmt::format_to(std::back_inserter(*out), "HTTP/1.1 {} {}\r\n", status, ReasonPhrase(status));
  for (const auto& h : headers.list()) {
    out->append(h.name);
    out->append(": ");
    out->append(h.value);
    out->append("\r\n");
  }
  out->append("\r\n");
}

}  // namespace canopy::http
