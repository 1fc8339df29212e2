// Incremental HTTP/1.1 parsers: requests (server side), response heads and
// message bodies (client side).
//
// The parsers never trust their input: every limit is checked before memory
// is spent, and a violation is reported with the HTTP status a server should
// answer (400, 413, 414, 431, 501, 505). Bytes are fed as they arrive, in any
// split; a parser copies what it must keep, so the caller may reuse its buffer
// after each Feed.
//
// Accepted framing: CRLF or bare LF line ends; leading empty lines before a
// request line are skipped (RFC 9112 §2.2). obs-fold, whitespace before ':',
// both Content-Length and Transfer-Encoding, conflicting Content-Length
// values and HTTP/1.1 without exactly one Host are rejected with 400.
//
// Thread safety: none; one parser per connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/result.h"
#include "base/status.h"
#include "tools/http/message.h"

namespace canopy::http {

struct RequestLimits {
  size_t max_uri_bytes = 8192;        // request line longer than this → 414
  size_t max_header_bytes = 16384;    // request line + headers longer → 431
  size_t max_header_count = 100;      // more header fields → 431
  uint64_t max_body_bytes = 1 << 20;  // larger declared or decoded body → 413
};

// Decodes a chunked body (RFC 9112 §7.1) incrementally. Chunk extensions and
// trailer fields are read and dropped.
class ChunkedDecoder {
 public:
  // Consumes bytes from `in`, calling on_data for each piece of decoded body.
  // Returns how many bytes of `in` were used: fewer than in.size() only once
  // done() (the rest belongs to the next message) or failed().
  size_t Feed(std::string_view in, const std::function<void(std::string_view)>& on_data);
  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kError; }
  const std::string& error() const { return error_; }
  void Reset() { *this = ChunkedDecoder(); }

 private:
  enum class State { kSize, kExtension, kSizeLf, kData, kDataCr, kDataLf, kTrailerStart, kTrailerLine,
                     kTrailerLf, kDone, kError };
  size_t Fail(std::string message, size_t used);
  static constexpr size_t kMaxLineBytes = 16384;  // extensions + trailer fields
  State state_ = State::kSize;
  uint64_t chunk_left_ = 0;
  int size_digits_ = 0;
  size_t trailer_bytes_ = 0;
  std::string error_;
};

// Server-side request parser. Usage per connection:
//   size_t used = parser.Feed(bytes);   // repeat while state() == kNeedMore
//   if (parser.state() == kComplete) { Request r = parser.TakeRequest(); parser.Reset(); }
//   if (parser.state() == kError)    { answer parser.error_status(), close }
class RequestParser {
 public:
  enum class State { kNeedMore, kComplete, kError };

  explicit RequestParser(RequestLimits limits = {}) : limits_(limits) {}

  // Consumes bytes; returns how many were used. Stops at the end of one
  // request (the rest is the next, pipelined, request) or at an error.
  size_t Feed(std::string_view in);

  State state() const { return state_; }
  // True once the head is parsed (the body may still be arriving).
  bool head_complete() const { return phase_ != Phase::kHead; }
  // True while a parsed head asked for "Expect: 100-continue" and its body has
  // not fully arrived; the server should send "100 Continue" once.
  bool expects_continue() const { return expects_continue_; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  // What was parsed so far (method/target may be empty), for the access log.
  const Request& partial_request() const { return request_; }
  // REQUIRES: state() == kComplete.
  Request TakeRequest() { return std::move(request_); }
  // Ready for the next request on the same connection.
  void Reset();

 private:
  enum class Phase { kHead, kFixedBody, kChunkedBody, kDone };
  size_t Fail(int status, std::string message, size_t used);
  // Parses head_ (complete, without the final empty line) into request_.
  bool ParseHead();

  RequestLimits limits_;
  State state_ = State::kNeedMore;
  Phase phase_ = Phase::kHead;
  std::string head_;
  uint64_t body_left_ = 0;
  ChunkedDecoder chunked_;
  bool expects_continue_ = false;
  int error_status_ = 0;
  std::string error_message_;
  Request request_;
};

// Position just past the empty line that ends a message head in `buf`
// ("\r\n\r\n" or "\n\n", mixed forms too), or npos. Scanning starts at `from`
// (a previous scan's end minus 3 is safe) so repeated scans stay linear.
size_t FindHeadEnd(std::string_view buf, size_t from = 0);

struct ResponseHead {
  int version_minor = 1;
  int status = 0;
  std::string reason;
  Headers headers;
};

// Parses a complete response head (status line + fields, as delimited by
// FindHeadEnd). Corruption on malformed input.
Result<ResponseHead> ParseResponseHead(std::string_view head);

// How the body of a response is delimited, decided from its head (RFC 9112
// §6.3): none (HEAD, 1xx/204/304), chunked, Content-Length, or until close.
class BodyReader {
 public:
  // Corruption for an invalid Content-Length / unsupported Transfer-Encoding.
  static Result<BodyReader> ForResponse(const ResponseHead& head, bool request_was_head);

  // Consumes body bytes, calling on_data with decoded pieces. Returns bytes
  // of `in` used (the rest belongs to the next response).
  size_t Feed(std::string_view in, const std::function<void(std::string_view)>& on_data);
  // The peer closed the connection: Ok when that legitimately ends the body
  // (close-delimited or already done), Corruption ("truncated") otherwise.
  Status OnEof();
  bool done() const;
  bool failed() const { return chunked_.failed(); }
  std::string error() const { return chunked_.error(); }
  // Content-Length when known, else -1.
  int64_t declared_length() const { return kind_ == Kind::kLength ? static_cast<int64_t>(total_) : -1; }
  bool close_delimited() const { return kind_ == Kind::kUntilClose; }

 private:
  enum class Kind { kNone, kLength, kChunked, kUntilClose };
  Kind kind_ = Kind::kNone;
  uint64_t total_ = 0;
  uint64_t left_ = 0;
  bool eof_ = false;
  ChunkedDecoder chunked_;
};

// Parses a Content-Length value: digits only, at most 18 of them.
bool ParseContentLength(std::string_view value, uint64_t* out);

}  // namespace canopy::http
