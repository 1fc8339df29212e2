#include "replication/meta/forward.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cerrno>

#include "base/coding.h"
#include "base/crc32c.h"
#include "base/logging.h"

namespace canopy::replication::meta {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kRequestMagic = 0x51574643;   // "CFWQ"
constexpr uint32_t kResponseMagic = 0x52574643;  // "CFWR"
constexpr uint32_t kOutcomeMagic = 0x4F574643;   // "CFWO"
constexpr uint8_t kFormat = 1;
constexpr auto kIdleTimeout = 60s;

void Seal(std::string* out) { PutFixed32(out, crc32c::Value(*out)); }

Result<ByteReader> Open(std::string_view bytes, uint32_t magic, std::string_view what) {
  if (bytes.size() < 9) return Status::Corruption(fmt::format("{}: too short", what));
  std::string_view covered = bytes.substr(0, bytes.size() - 4);
  if (DecodeFixed32(bytes.data()) != magic) return Status::Corruption(fmt::format("{}: bad magic", what));
  if (crc32c::Value(covered) != DecodeFixed32(bytes.data() + bytes.size() - 4)) {
    return Status::Corruption(fmt::format("{}: checksum mismatch", what));
  }
  if (static_cast<uint8_t>(bytes[4]) != kFormat) {
    return Status::Corruption(fmt::format("{}: unknown format", what));
  }
  return ByteReader(covered.substr(5));
}

Status CheckEnd(const ByteReader& r, std::string_view what) {
  if (!r.empty()) return Status::Corruption(fmt::format("{}: {} trailing bytes", what, r.remaining()));
  return Status::Ok();
}

Result<StatusCode> ReadCode(ByteReader* r) {
  CANOPY_ASSIGN_OR_RETURN(uint8_t raw, r->ReadFixed8());
  if (raw > static_cast<uint8_t>(StatusCode::kClosed)) {
    return Status::Corruption(fmt::format("unknown status code {}", raw));
  }
  return static_cast<StatusCode>(raw);
}

Status MakeStatus(StatusCode code, std::string_view message) {
  if (code == StatusCode::kOk) return Status::Ok();
  return Status(code, message);
}

// Waits for `events` on fd, or for `wake` (when valid) to become readable.
Status WaitFd(int fd, short events, int wake, Deadline deadline) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {wake, POLLIN, 0}};
    int n = ::poll(p, wake >= 0 ? 2 : 1, deadline.poll_timeout_ms());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "poll");
    }
    if (n == 0) return Status::Timeout("metadata forward: deadline passed");
    if (wake >= 0 && (p[1].revents & POLLIN)) return Status::Aborted("metadata forward: stopping");
    return Status::Ok();
  }
}

Status SendAll(int fd, std::string_view data, int wake, Deadline deadline) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      CANOPY_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, wake, deadline));
      continue;
    }
    return ErrnoStatus(errno, "metadata forward: send");
  }
  return Status::Ok();
}

// Closed when the peer closes before the first byte.
Status RecvExact(int fd, char* out, size_t n, int wake, Deadline deadline) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      if (got == 0) return Status::Closed("metadata forward: peer closed the connection");
      return Status::Unavailable("metadata forward: connection closed mid-message");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      CANOPY_RETURN_IF_ERROR(WaitFd(fd, POLLIN, wake, deadline));
      continue;
    }
    return ErrnoStatus(errno, "metadata forward: recv");
  }
  return Status::Ok();
}

Status SendMessage(int fd, const std::string& body, int wake, Deadline deadline) {
  std::string frame;
  PutFixed32(&frame, static_cast<uint32_t>(body.size()));
  frame += body;
  return SendAll(fd, frame, wake, deadline);
}

Result<std::string> RecvMessage(int fd, int wake, Deadline deadline) {
  char len_bytes[4];
  CANOPY_RETURN_IF_ERROR(RecvExact(fd, len_bytes, 4, wake, deadline));
  uint32_t len = DecodeFixed32(len_bytes);
  if (len > kMaxForwardMessage) {
    return Status::Corruption(fmt::format("metadata forward: message of {} bytes exceeds the limit", len));
  }
  std::string body(len, '\0');
  Status s = RecvExact(fd, body.data(), len, wake, deadline);
  if (s.IsClosed()) return Status::Unavailable("metadata forward: connection closed mid-message");
  CANOPY_RETURN_IF_ERROR(s);
  return body;
}

Result<sockaddr_in> ParseAddress(const std::string& address) {
  auto colon = address.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (colon == std::string::npos) {
    return Status::InvalidArgument(fmt::format("forward address '{}': expected IPv4:port", address));
  }
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1 || port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535) {
    return Status::InvalidArgument(fmt::format("forward address '{}': expected IPv4:port", address));
  }
  a.sin_port = htons(static_cast<uint16_t>(std::stoul(port)));
  return a;
}

Result<UniqueFd> NonBlockingSocket() {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "metadata forward: socket");
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

std::string EncodeForwardRequest(const ForwardRequest& request) {
  std::string out;
  PutFixed32(&out, kRequestMagic);
  PutFixed8(&out, kFormat);
  PutFixed8(&out, static_cast<uint8_t>(request.kind));
  PutFixed32(&out, request.timeout_ms);
  PutLengthPrefixed(&out, request.payload);
  Seal(&out);
  return out;
}

Result<ForwardRequest> DecodeForwardRequest(std::string_view bytes) {
  CANOPY_ASSIGN_OR_RETURN(ByteReader r, Open(bytes, kRequestMagic, "forward request"));
  ForwardRequest req;
  CANOPY_ASSIGN_OR_RETURN(uint8_t kind, r.ReadFixed8());
  if (kind != static_cast<uint8_t>(ForwardKind::kPropose) &&
      kind != static_cast<uint8_t>(ForwardKind::kRead)) {
    return Status::Corruption(fmt::format("forward request: unknown kind {}", kind));
  }
  req.kind = static_cast<ForwardKind>(kind);
  CANOPY_ASSIGN_OR_RETURN(req.timeout_ms, r.ReadFixed32());
  CANOPY_ASSIGN_OR_RETURN(std::string_view payload, r.ReadLengthPrefixed());
  req.payload = std::string(payload);
  CANOPY_RETURN_IF_ERROR(CheckEnd(r, "forward request"));
  return req;
}

std::string EncodeForwardResponse(const ForwardResponse& response) {
  std::string out;
  PutFixed32(&out, kResponseMagic);
  PutFixed8(&out, kFormat);
  PutFixed8(&out, static_cast<uint8_t>(response.status.code()));
  PutLengthPrefixed(&out, response.status.message());
  PutLengthPrefixed(&out, response.payload);
  Seal(&out);
  return out;
}

Result<ForwardResponse> DecodeForwardResponse(std::string_view bytes) {
  CANOPY_ASSIGN_OR_RETURN(ByteReader r, Open(bytes, kResponseMagic, "forward response"));
  ForwardResponse resp;
  CANOPY_ASSIGN_OR_RETURN(StatusCode code, ReadCode(&r));
  CANOPY_ASSIGN_OR_RETURN(std::string_view message, r.ReadLengthPrefixed());
  CANOPY_ASSIGN_OR_RETURN(std::string_view payload, r.ReadLengthPrefixed());
  resp.status = MakeStatus(code, message);
  resp.payload = std::string(payload);
  CANOPY_RETURN_IF_ERROR(CheckEnd(r, "forward response"));
  return resp;
}

std::string EncodeOutcome(const ApplyOutcome& outcome) {
  std::string out;
  PutFixed32(&out, kOutcomeMagic);
  PutFixed8(&out, kFormat);
  PutFixed8(&out, static_cast<uint8_t>(outcome.status.code()));
  PutLengthPrefixed(&out, outcome.status.message());
  PutVarint64(&out, outcome.epoch);
  PutFixed8(&out, outcome.current ? 1 : 0);
  if (outcome.current) PutLengthPrefixed(&out, *outcome.current);
  Seal(&out);
  return out;
}

Result<ApplyOutcome> DecodeOutcome(std::string_view bytes) {
  CANOPY_ASSIGN_OR_RETURN(ByteReader r, Open(bytes, kOutcomeMagic, "forward outcome"));
  ApplyOutcome o;
  CANOPY_ASSIGN_OR_RETURN(StatusCode code, ReadCode(&r));
  CANOPY_ASSIGN_OR_RETURN(std::string_view message, r.ReadLengthPrefixed());
  o.status = MakeStatus(code, message);
  CANOPY_ASSIGN_OR_RETURN(o.epoch, r.ReadVarint64());
  CANOPY_ASSIGN_OR_RETURN(uint8_t has_current, r.ReadFixed8());
  if (has_current > 1) return Status::Corruption("forward outcome: bad flag");
  if (has_current) {
    CANOPY_ASSIGN_OR_RETURN(std::string_view current, r.ReadLengthPrefixed(kMaxValueBytes));
    o.current = std::string(current);
  }
  CANOPY_RETURN_IF_ERROR(CheckEnd(r, "forward outcome"));
  return o;
}

Result<ForwardResponse> ForwardCall(const std::string& address, const ForwardRequest& request,
                                    Deadline deadline) {
  CANOPY_ASSIGN_OR_RETURN(sockaddr_in a, ParseAddress(address));
  CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, NonBlockingSocket());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) {
      return ErrnoStatus(errno, fmt::format("metadata forward: connect {}", address));
    }
    CANOPY_RETURN_IF_ERROR(WaitFd(fd.get(), POLLOUT, -1, deadline));
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return ErrnoStatus(err, fmt::format("metadata forward: connect {}", address));
  }
  CANOPY_RETURN_IF_ERROR(SendMessage(fd.get(), EncodeForwardRequest(request), -1, deadline));
  auto body = RecvMessage(fd.get(), -1, deadline);
  if (!body.ok()) {
    if (body.status().IsClosed()) {
      return Status::Unavailable(fmt::format("metadata forward: {} closed the connection", address));
    }
    return body.status();
  }
  return DecodeForwardResponse(*body);
}

// ---------------------------------------------------------------------------

ForwardServer::ForwardServer(UniqueFd listener, UniqueFd wake, std::string address, Handler handler)
    : listener_(std::move(listener)),
      wake_(std::move(wake)),
      address_(std::move(address)),
      handler_(std::move(handler)) {}

Result<std::unique_ptr<ForwardServer>> ForwardServer::Start(const std::string& address, Handler handler) {
  CANOPY_ASSIGN_OR_RETURN(sockaddr_in a, ParseAddress(address));
  CANOPY_ASSIGN_OR_RETURN(UniqueFd fd, NonBlockingSocket());
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    return ErrnoStatus(errno, fmt::format("metadata forward: bind {}", address));
  }
  if (::listen(fd.get(), 64) != 0) return ErrnoStatus(errno, "metadata forward: listen");
  socklen_t len = sizeof a;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return ErrnoStatus(errno, "metadata forward: getsockname");
  }
  char host[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return ErrnoStatus(errno, "metadata forward: eventfd");
  std::unique_ptr<ForwardServer> server(new ForwardServer(
      std::move(fd), std::move(wake), fmt::format("{}:{}", host, ntohs(a.sin_port)), std::move(handler)));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

ForwardServer::~ForwardServer() { Stop(); }

void ForwardServer::Stop() {
  std::call_once(stop_once_, [this] {
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_.get(), &one, sizeof one);
    (void)ignored;
    if (accept_thread_.joinable()) accept_thread_.join();
    ReapFinished(/*all=*/true);
  });
}

void ForwardServer::AcceptLoop() {
  for (;;) {
    Status s = WaitFd(listener_.get(), POLLIN, wake_.get(), Deadline::After(1s));
    if (s.code() == StatusCode::kAborted) return;
    ReapFinished(false);
    if (s.IsTimeout()) continue;
    UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!conn) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        CANOPY_LOG(kWarn, "meta forward: accept on {}: {}", address_, std::strerror(errno));
        std::this_thread::sleep_for(10ms);  // e.g. EMFILE: do not spin
      }
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (connections_.size() >= static_cast<size_t>(kMaxConnections)) continue;  // closes conn
    connections_.emplace_back();
    Connection* c = &connections_.back();
    c->fd = std::move(conn);
    c->thread = std::thread([this, c] { Serve(c); });
  }
}

void ForwardServer::Serve(Connection* c) {
  for (;;) {
    auto body = RecvMessage(c->fd.get(), wake_.get(), Deadline::After(kIdleTimeout));
    if (!body.ok()) break;  // closed, idle, stopping or broken: drop the connection
    ForwardResponse resp;
    auto req = DecodeForwardRequest(*body);
    if (!req.ok()) {
      resp.status = req.status();
    } else {
      resp = handler_(*req);
    }
    if (!SendMessage(c->fd.get(), EncodeForwardResponse(resp), wake_.get(), Deadline::After(10s)).ok()) break;
    if (!req.ok()) break;
  }
  c->done = true;
}

void ForwardServer::ReapFinished(bool all) {
  std::list<Connection> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (all || it->done) finished.splice(finished.end(), connections_, it);
      it = next;
    }
  }
  for (Connection& c : finished) {
    if (c.thread.joinable()) c.thread.join();
  }
}

}  // namespace canopy::replication::meta
