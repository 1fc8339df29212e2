#include "tools/http/parser.h"

#include <fmt/format.h>

#include <algorithm>

namespace canopy::http {
namespace {

bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-':
    case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar);
}

// Field values may hold visible characters, spaces, tabs and obs-text (>= 0x80).
bool IsValidFieldValue(std::string_view s) {
  for (unsigned char c : s) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  return true;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Splits `head` into lines (LF or CRLF ends); stops at the first empty line.
std::vector<std::string_view> SplitHeadLines(std::string_view head) {
  std::vector<std::string_view> lines;
  while (!head.empty()) {
    size_t lf = head.find('\n');
    std::string_view line = head.substr(0, lf);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) break;
    lines.push_back(line);
    if (lf == std::string_view::npos) break;
    head.remove_prefix(lf + 1);
  }
  return lines;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Parses "name: value" lines into *headers. Returns an error text or "".
std::string ParseFieldLines(const std::vector<std::string_view>& lines, size_t first, Headers* headers) {
  for (size_t i = first; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return fmt::format("header line without ':'");
    std::string_view name = line.substr(0, colon);
    if (!IsToken(name)) return "invalid header name (whitespace before ':' or obs-fold?)";
    std::string_view value = TrimOws(line.substr(colon + 1));
    if (!IsValidFieldValue(value)) return fmt::format("control character in header {}", name);
    headers->Add(std::string(name), std::string(value));
  }
  return "";
}

}  // namespace

bool ParseContentLength(std::string_view value, uint64_t* out) {
  if (value.empty() || value.size() > 18) return false;
  uint64_t v = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

size_t FindHeadEnd(std::string_view buf, size_t from) {
  for (size_t i = buf.find('\n', from); i != std::string_view::npos; i = buf.find('\n', i + 1)) {
    size_t j = i + 1;
    if (j < buf.size() && buf[j] == '\n') return j + 1;
    if (j + 1 < buf.size() && buf[j] == '\r' && buf[j + 1] == '\n') return j + 2;
  }
  return std::string_view::npos;
}

// ---------------------------------------------------------------- chunked

size_t ChunkedDecoder::Fail(std::string message, size_t used) {
  state_ = State::kError;
  error_ = std::move(message);
  return used;
}

size_t ChunkedDecoder::Feed(std::string_view in, const std::function<void(std::string_view)>& on_data) {
  size_t i = 0;
  auto end_of_size_line = [&] { state_ = chunk_left_ == 0 ? State::kTrailerStart : State::kData; };
  while (i < in.size()) {
    char c = in[i];
    switch (state_) {
      case State::kSize: {
        int h = HexValue(c);
        if (h >= 0) {
          if (++size_digits_ > 15) return Fail("chunk size too large", i);
          chunk_left_ = chunk_left_ * 16 + static_cast<uint64_t>(h);
          ++i;
          break;
        }
        if (size_digits_ == 0) return Fail("chunk size missing", i);
        if (c == ';' || c == ' ' || c == '\t') {
          state_ = State::kExtension;
        } else if (c == '\r') {
          state_ = State::kSizeLf;
        } else if (c == '\n') {
          end_of_size_line();
        } else {
          return Fail(fmt::format("invalid character 0x{:02x} in chunk size", static_cast<unsigned char>(c)), i);
        }
        ++i;
        break;
      }
      case State::kExtension:
        if (c == '\n') {
          end_of_size_line();
        } else if (c == '\r') {
          state_ = State::kSizeLf;
        } else if (++trailer_bytes_ > kMaxLineBytes) {
          return Fail("chunk extension too long", i);
        }
        ++i;
        break;
      case State::kSizeLf:
        if (c != '\n') return Fail("chunk size line not ended by LF", i);
        end_of_size_line();
        ++i;
        break;
      case State::kData: {
        size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_left_, in.size() - i));
        on_data(in.substr(i, n));
        chunk_left_ -= n;
        i += n;
        if (chunk_left_ == 0) state_ = State::kDataCr;
        break;
      }
      case State::kDataCr:
        if (c == '\r') {
          state_ = State::kDataLf;
        } else if (c == '\n') {
          state_ = State::kSize;
          size_digits_ = 0;
        } else {
          return Fail("chunk data not followed by CRLF", i);
        }
        ++i;
        break;
      case State::kDataLf:
        if (c != '\n') return Fail("chunk data not followed by CRLF", i);
        state_ = State::kSize;
        size_digits_ = 0;
        ++i;
        break;
      case State::kTrailerStart:
        if (c == '\r') {
          state_ = State::kTrailerLf;
        } else if (c == '\n') {
          state_ = State::kDone;
          return i + 1;
        } else {
          state_ = State::kTrailerLine;
        }
        ++i;
        break;
      case State::kTrailerLine:
        if (c == '\n') state_ = State::kTrailerStart;
        if (++trailer_bytes_ > kMaxLineBytes) return Fail("chunked trailer too long", i);
        ++i;
        break;
      case State::kTrailerLf:
        if (c != '\n') return Fail("chunked trailer not ended by CRLF", i);
        state_ = State::kDone;
        return i + 1;
      case State::kDone:
      case State::kError:
        return i;
    }
  }
  return i;
}

// ---------------------------------------------------------------- requests

void RequestParser::Reset() {
  state_ = State::kNeedMore;
  phase_ = Phase::kHead;
  head_.clear();
  body_left_ = 0;
  chunked_.Reset();
  expects_continue_ = false;
  error_status_ = 0;
  error_message_.clear();
  request_ = Request();
}

size_t RequestParser::Fail(int status, std::string message, size_t used) {
  state_ = State::kError;
  error_status_ = status;
  error_message_ = std::move(message);
  return used;
}

size_t RequestParser::Feed(std::string_view in) {
  if (state_ != State::kNeedMore) return 0;
  size_t used = 0;
  if (phase_ == Phase::kHead) {
    while (head_.empty() && used < in.size() && (in[used] == '\r' || in[used] == '\n')) ++used;
    if (used == in.size()) return used;
    size_t old = head_.size();
    size_t cap = limits_.max_header_bytes + 4;  // + the empty line that ends the head
    size_t take = std::min(in.size() - used, cap > old ? cap - old : 0);
    head_.append(in.substr(used, take));
    size_t end = FindHeadEnd(head_, old >= 3 ? old - 3 : 0);
    if (end != std::string::npos) {
      size_t extra = head_.size() - end;
      head_.resize(end);
      take -= extra;
    }
    used += take;
    size_t first_line = std::min(head_.find('\n'), head_.size());
    if (first_line > limits_.max_uri_bytes) {
      return Fail(414, fmt::format("request line longer than {} bytes", limits_.max_uri_bytes), used);
    }
    if (end == std::string::npos) {
      if (head_.size() > limits_.max_header_bytes) {
        return Fail(431, fmt::format("request head longer than {} bytes", limits_.max_header_bytes), used);
      }
      return used;
    }
    if (!ParseHead()) return used;
    if (phase_ == Phase::kDone) {
      state_ = State::kComplete;
      return used;
    }
  }
  while (used < in.size() && state_ == State::kNeedMore) {
    std::string_view rest = in.substr(used);
    if (phase_ == Phase::kFixedBody) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(body_left_, rest.size()));
      request_.body.append(rest.substr(0, n));
      body_left_ -= n;
      used += n;
      if (body_left_ == 0) phase_ = Phase::kDone;
    } else if (phase_ == Phase::kChunkedBody) {
      bool too_large = false;
      used += chunked_.Feed(rest, [&](std::string_view piece) {
        if (request_.body.size() + piece.size() > limits_.max_body_bytes) {
          too_large = true;
        } else {
          request_.body.append(piece);
        }
      });
      if (too_large) return Fail(413, fmt::format("body larger than {} bytes", limits_.max_body_bytes), used);
      if (chunked_.failed()) return Fail(400, "bad chunked body: " + chunked_.error(), used);
      if (chunked_.done()) phase_ = Phase::kDone;
    }
    if (phase_ == Phase::kDone) {
      state_ = State::kComplete;
      expects_continue_ = false;
    }
  }
  return used;
}

bool RequestParser::ParseHead() {
  std::vector<std::string_view> lines = SplitHeadLines(head_);
  if (lines.empty()) return Fail(400, "empty request", 0), false;
  std::string_view line = lines[0];
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return Fail(400, "malformed request line", 0), false;
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method)) return Fail(400, "invalid method", 0), false;
  if (target.empty()) return Fail(400, "empty request target", 0), false;
  for (unsigned char c : target) {
    if (c <= 0x20 || c >= 0x7f) return Fail(400, "invalid character in request target", 0), false;
  }
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || version[5] < '0' ||
      version[5] > '9' || version[7] < '0' || version[7] > '9') {
    return Fail(400, "malformed HTTP version", 0), false;
  }
  request_.method = std::string(method);
  if (version[5] != '1') {
    request_.target = std::string(target);
    return Fail(505, fmt::format("{} is not supported", version), 0), false;
  }
  request_.version_minor = version[7] == '0' ? 0 : 1;
  if (target[0] == '/') {
    request_.target = std::string(target);
  } else if (target == "*" && method == "OPTIONS") {
    request_.target.assign(1, '*');
  } else if (target.size() > 7 && EqualsIgnoreCase(target.substr(0, 7), "http://")) {
    size_t slash = target.find('/', 7);
    request_.target = slash == std::string_view::npos ? "/" : std::string(target.substr(slash));
  } else {
    return Fail(400, "request target is not an absolute path", 0), false;
  }
  if (lines.size() - 1 > limits_.max_header_count) {
    return Fail(431, fmt::format("more than {} header fields", limits_.max_header_count), 0), false;
  }
  std::string field_error = ParseFieldLines(lines, 1, &request_.headers);
  if (!field_error.empty()) return Fail(400, field_error, 0), false;

  const Headers& h = request_.headers;
  if (request_.version_minor == 1 && h.Count("Host") != 1) {
    return Fail(400, "HTTP/1.1 request needs exactly one Host header", 0), false;
  }
  const std::string* te = h.Find("Transfer-Encoding");
  bool has_length = h.Has("Content-Length");
  if (te != nullptr) {
    if (has_length) return Fail(400, "both Transfer-Encoding and Content-Length", 0), false;
    if (h.Count("Transfer-Encoding") != 1 || !EqualsIgnoreCase(TrimOws(*te), "chunked")) {
      return Fail(501, fmt::format("Transfer-Encoding '{}' is not implemented", *te), 0), false;
    }
    phase_ = Phase::kChunkedBody;
  } else if (has_length) {
    uint64_t length = 0;
    bool first = true;
    for (const auto& field : h.list()) {
      if (!EqualsIgnoreCase(field.name, "Content-Length")) continue;
      uint64_t v = 0;
      if (!ParseContentLength(field.value, &v)) return Fail(400, "invalid Content-Length", 0), false;
      if (!first && v != length) return Fail(400, "conflicting Content-Length values", 0), false;
      length = v;
      first = false;
    }
    if (length > limits_.max_body_bytes) {
      return Fail(413, fmt::format("body of {} bytes exceeds the limit of {}", length, limits_.max_body_bytes), 0),
             false;
    }
    body_left_ = length;
    phase_ = length == 0 ? Phase::kDone : Phase::kFixedBody;
  } else {
    phase_ = Phase::kDone;
  }
  if (phase_ != Phase::kDone) {
    const std::string* expect = h.Find("Expect");
    expects_continue_ = expect != nullptr && EqualsIgnoreCase(TrimOws(*expect), "100-continue");
  }
  return true;
}

// ---------------------------------------------------------------- responses

Result<ResponseHead> ParseResponseHead(std::string_view head) {
  std::vector<std::string_view> lines = SplitHeadLines(head);
  if (lines.empty()) return Status::Corruption("empty HTTP response head");
  std::string_view line = lines[0];
  // "HTTP/1.1 200 OK" — the reason may be empty, and the space before it too.
  if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || line[7] < '0' || line[7] > '9' || line[8] != ' ') {
    return Status::Corruption(fmt::format("malformed HTTP status line '{}'", line.substr(0, 80)));
  }
  ResponseHead out;
  out.version_minor = line[7] - '0';
  int status = 0;
  for (size_t i = 9; i < 12; ++i) {
    if (line[i] < '0' || line[i] > '9') return Status::Corruption("malformed HTTP status code");
    status = status * 10 + (line[i] - '0');
  }
  if (status < 100) return Status::Corruption("HTTP status code below 100");
  if (line.size() > 12 && line[12] != ' ') return Status::Corruption("malformed HTTP status line");
  out.status = status;
  if (line.size() > 13) out.reason = std::string(line.substr(13));
  std::string field_error = ParseFieldLines(lines, 1, &out.headers);
  if (!field_error.empty()) return Status::Corruption("HTTP response: " + field_error);
  return out;
}

Result<BodyReader> BodyReader::ForResponse(const ResponseHead& head, bool request_was_head) {
  BodyReader r;
  if (request_was_head || StatusHasNoBody(head.status)) {
    r.kind_ = Kind::kNone;
    return r;
  }
  if (const std::string* te = head.headers.Find("Transfer-Encoding")) {
    // Chunked must be the final coding; anything else is read until close.
    std::string_view v = TrimOws(*te);
    size_t comma = v.rfind(',');
    std::string_view last = TrimOws(comma == std::string_view::npos ? v : v.substr(comma + 1));
    if (EqualsIgnoreCase(last, "chunked")) {
      if (comma != std::string_view::npos) {
        return Status::NotSupported(fmt::format("Transfer-Encoding '{}' is not supported", *te));
      }
      r.kind_ = Kind::kChunked;
    } else {
      r.kind_ = Kind::kUntilClose;
    }
    return r;
  }
  if (const std::string* cl = head.headers.Find("Content-Length")) {
    uint64_t length = 0;
    if (!ParseContentLength(TrimOws(*cl), &length)) {
      return Status::Corruption(fmt::format("invalid Content-Length '{}'", *cl));
    }
    for (const auto& field : head.headers.list()) {
      uint64_t other = 0;
      if (EqualsIgnoreCase(field.name, "Content-Length") &&
          (!ParseContentLength(TrimOws(field.value), &other) || other != length)) {
        return Status::Corruption("conflicting Content-Length values");
      }
    }
    r.kind_ = Kind::kLength;
    r.total_ = r.left_ = length;
    return r;
  }
  r.kind_ = Kind::kUntilClose;
  return r;
}

size_t BodyReader::Feed(std::string_view in, const std::function<void(std::string_view)>& on_data) {
  switch (kind_) {
    case Kind::kNone:
      return 0;
    case Kind::kLength: {
      size_t n = static_cast<size_t>(std::min<uint64_t>(left_, in.size()));
      if (n > 0) on_data(in.substr(0, n));
      left_ -= n;
      return n;
    }
    case Kind::kChunked:
      return chunked_.Feed(in, on_data);
    case Kind::kUntilClose:
      if (!in.empty()) on_data(in);
      return in.size();
  }
  return 0;
}

bool BodyReader::done() const {
  switch (kind_) {
    case Kind::kNone: return true;
    case Kind::kLength: return left_ == 0;
    case Kind::kChunked: return chunked_.done();
    case Kind::kUntilClose: return eof_;
  }
  return false;
}

Status BodyReader::OnEof() {
  if (kind_ == Kind::kUntilClose) {
    eof_ = true;
    return Status::Ok();
  }
  if (done()) return Status::Ok();
  if (kind_ == Kind::kLength) {
    return Status::Corruption(
        fmt::format("connection closed after {} of {} body bytes", total_ - left_, total_));
  }
  return Status::Corruption("connection closed inside a chunked body");
}

}  // namespace canopy::http
