// HTTP/1.1 message values shared by the server and the clients: header lists,
// requests, responses (with an in-memory or a file body), reason phrases and
// the serialisation of a response head.
//
// These are plain values: no I/O happens here. A Response may own an open file
// (FileBody) whose bytes the server sends with sendfile(2); moving the Response
// moves the ownership.
//
// Thread safety: values; distinct objects may be used from distinct threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/fd.h"

namespace canopy::http {

// ASCII case-insensitive equality (header names, tokens).
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

// True when the comma-separated list `list` (e.g. a Connection header value)
// contains `token`, compared case-insensitively with surrounding spaces ignored.
bool ListHasToken(std::string_view list, std::string_view token);

struct Header {
  std::string name;
  std::string value;
};

// An ordered header list. Lookups are case-insensitive; duplicates are kept in
// order (Find returns the first).
class Headers {
 public:
  void Add(std::string name, std::string value) { list_.push_back({std::move(name), std::move(value)}); }
  // Replaces every header called `name` by one with `value`.
  void Set(std::string_view name, std::string value);
  // First value of `name`, or null. The pointer is valid until the list changes.
  const std::string* Find(std::string_view name) const;
  size_t Count(std::string_view name) const;
  bool Has(std::string_view name) const { return Find(name) != nullptr; }
  const std::vector<Header>& list() const { return list_; }
  size_t size() const { return list_.size(); }
  void Clear() { list_.clear(); }

 private:
  std::vector<Header> list_;
};

// A parsed request. `target` is the raw request-target as received (origin
// form, e.g. "/a%20b?x=1"; an absolute-form target is reduced to its path).
struct Request {
  std::string method;      // case-sensitive token, e.g. "GET"
  std::string target;      // raw, not percent-decoded
  int version_minor = 1;   // HTTP/1.<minor>; only 0 and 1 are accepted
  Headers headers;
  std::string body;        // decoded body (Content-Length or chunked)
  std::string peer;        // "addr:port" of the client, filled by the server

  // Target up to '?' / after '?' (both raw, still percent-encoded).
  std::string_view path() const;
  std::string_view query() const;
  // Whether the connection may stay open after this request (HTTP/1.1
  // default, or HTTP/1.0 with "Connection: keep-alive"; "close" wins).
  bool KeepAlive() const;
  // "GET /x HTTP/1.1" (for logs).
  std::string RequestLine() const;
};

// A body to be sent straight from a file: `length` bytes from `offset`.
struct FileBody {
  UniqueFd fd;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A response built by a handler. The server adds Date, Server,
// Content-Length and Connection itself; a handler must not set them.
// For HEAD requests the server sends the head only, with the Content-Length
// the body would have had.
struct Response {
  int status = 200;
  Headers headers;
  std::string body;                // used when `file` is empty
  std::optional<FileBody> file;    // when set, the body is these file bytes
  bool close_connection = false;   // force "Connection: close" after this response

  uint64_t body_length() const { return file ? file->length : body.size(); }

  // text/plain body "<text>\n".
  static Response Text(int status, std::string_view text);
  // application/json body.
  static Response Json(int status, std::string json);
  // A short error page for `status` ("404 Not Found\n"), optionally with detail.
  static Response Error(int status, std::string_view detail = {});
};

// "OK", "Not Found", ...; "Unknown" for codes without a phrase.
const char* ReasonPhrase(int status);

// Whether a response with this status carries no body by definition
// (1xx, 204, 304).
bool StatusHasNoBody(int status);

// Serialises "HTTP/1.1 <status> <reason>\r\n" + headers + "\r\n" into *out
// (appending). `headers` are written in order as given.
void AppendResponseHead(int status, const Headers& headers, std::string* out);

}  // namespace canopy::http
