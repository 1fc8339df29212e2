// TCP set-up: transport, listener, connect/accept, socket options, the gate.

#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "base/logging.h"
#include "transport/tcp/tcp_transport_impl.h"

namespace canopy::transport {
namespace tcp_internal {

// ---------------------------------------------------------------- GatedSocket

GatedSocket::GatedSocket(UniqueFd socket, UniqueFd wake)
    : socket_fd_(socket.Release()), wake_fd_(wake.Release()) {}

GatedSocket::~GatedSocket() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_.store(true, std::memory_order_release);
  ReleaseLocked();
}

bool GatedSocket::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_.load(std::memory_order_acquire)) return false;
  ++users_;
  return true;
}

void GatedSocket::Exit() {
  std::lock_guard<std::mutex> lock(mu_);
  --users_;
  if (users_ == 0 && closed_.load(std::memory_order_acquire)) ReleaseLocked();
}

void GatedSocket::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd_, &one, sizeof(one));  // stays readable: every waiter wakes
    (void)n;
  }
  if (users_ == 0) ReleaseLocked();
}

void GatedSocket::ReleaseLocked() {
  if (released_) return;
  released_ = true;
  if (socket_fd_ >= 0) ::close(socket_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status WaitReady(int fd, int wake_fd, short events, int timeout_ms) {
  pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
  for (;;) {
    int n = ::poll(fds, wake_fd >= 0 ? 2 : 1, timeout_ms);
    if (n > 0) {
      if (wake_fd >= 0 && fds[1].revents != 0) return Status::Aborted("closed while waiting");
      return Status::Ok();
    }
    if (n == 0) return Status::Timeout("timed out");
    if (errno != EINTR) return ErrnoStatus(errno, "poll");
    // EINTR: retry with the same timeout; callers pass bounded timeouts and
    // signals are rare, so the overshoot is harmless.
  }
}

std::string SockaddrToUri(const void* address, size_t length) {
  Endpoint e;
  e.scheme = "tcp";
  char text[INET6_ADDRSTRLEN] = {0};
  const auto* sa = static_cast<const sockaddr*>(address);
  if (sa->sa_family == AF_INET && length >= sizeof(sockaddr_in)) {
    const auto* in = static_cast<const sockaddr_in*>(address);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    e.port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6 && length >= sizeof(sockaddr_in6)) {
    const auto* in6 = static_cast<const sockaddr_in6*>(address);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    e.port = ntohs(in6->sin6_port);
  } else {
    return "tcp://unknown:0";
  }
  e.host = text;
  return e.ToUri();
}

namespace {

struct SocketConfig {
  bool nodelay = true;
  bool zero_copy = true;
  size_t buffer_bytes = 0;
  std::optional<TlsConfig> tls;  // tls+tcp://
};

Result<SocketConfig> ParseParams(const Endpoint& endpoint, const TransportOptions& options, bool tls) {
  SocketConfig config;
  config.buffer_bytes = options.buffer_bytes;
  std::map<std::string, std::string> params = endpoint.params;
  if (tls) {
    CANOPY_ASSIGN_OR_RETURN(config.tls, ExtractTlsConfig(&params, options.backend_args));
  } else {
    for (const auto& [key, value] : params) {
      if (IsTlsParameter(key)) {
        return Status::InvalidArgument("tcp URI parameter '" + key +
                                       "' is a TLS setting: use the tls+tcp:// scheme to encrypt");
      }
    }
  }
  for (const auto& [key, value] : params) {
    if (key == "nodelay") {
      if (value == "1" || value == "true") {
        config.nodelay = true;
      } else if (value == "0" || value == "false") {
        config.nodelay = false;
      } else {
        return Status::InvalidArgument("tcp URI parameter nodelay must be 0 or 1, got '" + value + "'");
      }
    } else if (key == "zerocopy") {
      if (value == "1" || value == "true") {
        config.zero_copy = true;
      } else if (value == "0" || value == "false") {
        config.zero_copy = false;
      } else {
        return Status::InvalidArgument("tcp URI parameter zerocopy must be 0 or 1, got '" + value + "'");
      }
    } else {
      return Status::InvalidArgument("unknown " + std::string(tls ? "tls+tcp" : "tcp") + " URI parameter '" + key +
                                     (tls ? "' (known: nodelay, zerocopy, cert, key, ca, verify_host, server_name, ktls)"
                                          : "' (known: nodelay, zerocopy)"));
    }
  }
  return config;
}

void SetBufferSize(int fd, int force_option, int option, size_t bytes) {
  int value = static_cast<int>(std::min<size_t>(bytes, 1u << 30));
  // The *FORCE variants pass net.core.{r,w}mem_max when privileged.
  if (::setsockopt(fd, SOL_SOCKET, force_option, &value, sizeof(value)) != 0) {
    (void)::setsockopt(fd, SOL_SOCKET, option, &value, sizeof(value));
  }
}

// Options that must be set before connect/listen (buffer sizes decide the
// window scale negotiated in the handshake) and on accepted sockets.
void ConfigureSocket(int fd, const SocketConfig& config, bool listening) {
  if (config.buffer_bytes > 0) {
    SetBufferSize(fd, SO_RCVBUFFORCE, SO_RCVBUF, config.buffer_bytes);
    SetBufferSize(fd, SO_SNDBUFFORCE, SO_SNDBUF, config.buffer_bytes);
  }
  if (!listening) {
    int one = config.nodelay ? 1 : 0;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
}

Result<UniqueFd> MakeEventFd() {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, "eventfd");
  return UniqueFd(fd);
}

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { ::freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfoPtr> Resolve(const Endpoint& endpoint, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  std::string port = std::to_string(endpoint.port);
  addrinfo* result = nullptr;
  int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0) {
    std::string why = rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc);
    return Status::Unavailable("resolve host '" + endpoint.host + "': " + why);
  }
  return AddrInfoPtr(result);
}

// "tcp://..." of a socket address, under the transport's own scheme.
std::string PeerUriOf(const void* address, size_t length, bool tls) {
  std::string uri = SockaddrToUri(address, length);
  return tls ? "tls+" + uri : uri;
}

std::string UriOf(const Endpoint& endpoint) {
  Endpoint plain = endpoint;
  plain.params.clear();
  return plain.ToUri();
}

// ----------------------------------------------------------------- TcpListener

class TcpListener final : public Listener {
 public:
  TcpListener(UniqueFd fd, UniqueFd wake, Endpoint local, SocketConfig config,
              const TransportOptions& options, std::shared_ptr<TlsContext> tls)
      : gate_(std::move(fd), std::move(wake)),
        local_(std::move(local)),
        config_(config),
        options_(options),
        tls_(std::move(tls)) {}
  ~TcpListener() override { gate_.Close(); }

  Result<std::unique_ptr<Connection>> Accept(Deadline deadline) override {
    GateUse use(gate_);
    if (!use.entered()) return Status::Aborted("listener on " + UriOf(local_) + " was closed");
    for (;;) {
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof(peer);
      int fd =
          ::accept4(gate_.fd(), reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        UniqueFd socket(fd);
        ConfigureSocket(fd, config_, false);
        CANOPY_ASSIGN_OR_RETURN(UniqueFd wake, MakeEventFd());
        std::string peer_uri = PeerUriOf(&peer, peer_len, tls_ != nullptr);
        CountersForScheme(tls_ ? "tls+tcp" : "tcp").accepted->Increment();
        std::unique_ptr<TlsSession> session;
        if (tls_) {
          CANOPY_ASSIGN_OR_RETURN(session, TlsSession::Create(tls_, fd, ""));
        }
        auto conn = std::make_unique<TcpConnection>(std::move(socket), std::move(wake), std::move(peer_uri),
                                                    options_, config_.zero_copy, std::move(session));
        // The handshake runs beside, not in, Accept: a silent client holds a
        // thread for at most io_timeout, never the accept loop.
        if (tls_) conn->StartHandshakeThread(std::max(options_.io_timeout, options_.connect_timeout));
        return std::unique_ptr<Connection>(std::move(conn));
      }
      int err = errno;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO || err == ENETDOWN || err == ENOPROTOOPT ||
          err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH || err == EOPNOTSUPP ||
          err == ENETUNREACH) {
        continue;  // the pending connection died before we took it; see accept(2)
      }
      if (err != EAGAIN && err != EWOULDBLOCK) {
        if (err == EMFILE || err == ENFILE) {
          return Status::ResourceExhausted("accept on " + UriOf(local_) + ": " + std::strerror(err));
        }
        return ErrnoStatus(err, "accept on " + UriOf(local_));
      }
      Status s = WaitReady(gate_.fd(), gate_.wake_fd(), POLLIN, deadline.poll_timeout_ms());
      if (s.IsTimeout()) return Status::Timeout("accept on " + UriOf(local_) + ": deadline passed");
      if (s.code() == StatusCode::kAborted) {
        return Status::Aborted("listener on " + UriOf(local_) + " was closed");
      }
      CANOPY_RETURN_IF_ERROR(s);
    }
  }

  Endpoint local_endpoint() const override { return local_; }
  void Close() override { gate_.Close(); }

 private:
  GatedSocket gate_;
  const Endpoint local_;
  const SocketConfig config_;
  const TransportOptions options_;
  const std::shared_ptr<TlsContext> tls_;  // null for plain TCP
};

// ---------------------------------------------------------------- TcpTransport

class TcpTransport final : public Transport {
 public:
  TcpTransport(const TransportOptions& options, bool tls) : options_(options), tls_(tls) {}
  std::string_view scheme() const override { return tls_ ? "tls+tcp" : "tcp"; }

  Result<std::unique_ptr<Listener>> Listen(const Endpoint& local) override {
    CANOPY_ASSIGN_OR_RETURN(SocketConfig config, ParseParams(local, options_, tls_));
    std::shared_ptr<TlsContext> context;
    if (config.tls) {
      CANOPY_ASSIGN_OR_RETURN(context, TlsContext::Create(*config.tls, /*server=*/true));
    }
    CANOPY_ASSIGN_OR_RETURN(AddrInfoPtr addresses, Resolve(local, true));
    Status last = Status::Unavailable("no address to listen on for " + UriOf(local));
    for (addrinfo* ai = addresses.get(); ai != nullptr; ai = ai->ai_next) {
      UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd.valid()) {
        last = ErrnoStatus(errno, "socket for " + UriOf(local));
        continue;
      }
      int one = 1;
      (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      ConfigureSocket(fd.get(), config, true);
      if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
        last = ErrnoStatus(errno, "bind " + UriOf(local));
        continue;
      }
      if (::listen(fd.get(), SOMAXCONN) != 0) {
        last = ErrnoStatus(errno, "listen on " + UriOf(local));
        continue;
      }
      sockaddr_storage bound{};
      socklen_t bound_len = sizeof(bound);
      if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
        return ErrnoStatus(errno, "getsockname of listener " + UriOf(local));
      }
      CANOPY_ASSIGN_OR_RETURN(Endpoint actual, ParseEndpoint(SockaddrToUri(&bound, bound_len)));
      actual.scheme = local.scheme;
      actual.params = local.params;
      CANOPY_ASSIGN_OR_RETURN(UniqueFd wake, MakeEventFd());
      CANOPY_LOG(kDebug, "tcp: listening on {}", actual.ToUri());
      return std::unique_ptr<Listener>(
          new TcpListener(std::move(fd), std::move(wake), actual, config, options_, context));
    }
    return last;
  }

  Result<std::unique_ptr<Connection>> Connect(const Endpoint& remote) override {
    CANOPY_ASSIGN_OR_RETURN(SocketConfig config, ParseParams(remote, options_, tls_));
    std::shared_ptr<TlsContext> context;
    if (config.tls) {
      CANOPY_ASSIGN_OR_RETURN(context, TlsContext::Create(*config.tls, /*server=*/false));
    }
    if (remote.port == 0) return Status::InvalidArgument("cannot connect to port 0 (" + UriOf(remote) + ")");
    Deadline deadline = Deadline::After(options_.connect_timeout);
    CANOPY_ASSIGN_OR_RETURN(AddrInfoPtr addresses, Resolve(remote, false));
    Status last = Status::Unavailable("no address for " + UriOf(remote));
    for (addrinfo* ai = addresses.get(); ai != nullptr; ai = ai->ai_next) {
      if (deadline.expired()) break;
      UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd.valid()) {
        last = ErrnoStatus(errno, "socket for " + UriOf(remote));
        continue;
      }
      ConfigureSocket(fd.get(), config, false);
      std::string target = SockaddrToUri(ai->ai_addr, ai->ai_addrlen);
      int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
      int err = rc == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        Status s = WaitReady(fd.get(), -1, POLLOUT, deadline.poll_timeout_ms());
        if (s.IsTimeout()) {
          last = Status::Timeout("connect to " + target + " timed out after " +
                                 std::to_string(options_.connect_timeout.count()) + " ms");
          continue;
        }
        CANOPY_RETURN_IF_ERROR(s);
        socklen_t len = sizeof(err);
        if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
      if (err != 0) {
        if (err == ECONNREFUSED || err == ENETUNREACH || err == EHOSTUNREACH || err == ETIMEDOUT ||
            err == ECONNRESET || err == EADDRNOTAVAIL) {
          last = Status::Unavailable("connect to " + target + ": " + std::strerror(err));
        } else {
          last = ErrnoStatus(err, "connect to " + target);
        }
        continue;
      }
      CANOPY_ASSIGN_OR_RETURN(UniqueFd wake, MakeEventFd());
      sockaddr_storage peer{};
      socklen_t peer_len = sizeof(peer);
      std::string peer_uri = ::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0
                                 ? PeerUriOf(&peer, peer_len, tls_)
                                 : target;
      CountersForScheme(context ? "tls+tcp" : "tcp").dialed->Increment();
      std::unique_ptr<TlsSession> session;
      if (context) {
        CANOPY_ASSIGN_OR_RETURN(session, TlsSession::Create(context, fd.get(), remote.host));
      }
      auto conn = std::make_unique<TcpConnection>(std::move(fd), std::move(wake), peer_uri, options_,
                                                  config.zero_copy, std::move(session));
      if (context) {
        // The TLS handshake shares the connect deadline (at least a second of it).
        CANOPY_RETURN_IF_ERROR(
            conn->HandshakeNow(deadline.expired() ? Deadline::After(std::chrono::seconds(1)) : deadline));
      }
      return std::unique_ptr<Connection>(std::move(conn));
    }
    if (deadline.expired() && !last.IsTimeout() && !last.IsUnavailable()) {
      last = Status::Timeout("connect to " + UriOf(remote) + " timed out after " +
                             std::to_string(options_.connect_timeout.count()) + " ms");
    }
    return last;
  }

 private:
  const TransportOptions options_;
  const bool tls_;
};

void IgnoreSigpipeOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        (current.sa_flags & SA_SIGINFO) == 0) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
}

}  // namespace
}  // namespace tcp_internal

Result<std::shared_ptr<Transport>> CreateTcpTransport(const TransportOptions& options) {
  if (options.max_message_bytes == 0) return Status::InvalidArgument("max_message_bytes must be > 0");
  tcp_internal::IgnoreSigpipeOnce();
  return std::shared_ptr<Transport>(std::make_shared<tcp_internal::TcpTransport>(options, /*tls=*/false));
}

Result<std::shared_ptr<Transport>> CreateTlsTcpTransport(const TransportOptions& options) {
  if (options.max_message_bytes == 0) return Status::InvalidArgument("max_message_bytes must be > 0");
  // Refuse malformed backend arguments now rather than at the first connection.
  std::map<std::string, std::string> none;
  CANOPY_RETURN_IF_ERROR(tcp_internal::ExtractTlsConfig(&none, options.backend_args).status());
  tcp_internal::IgnoreSigpipeOnce();
  return std::shared_ptr<Transport>(std::make_shared<tcp_internal::TcpTransport>(options, /*tls=*/true));
}

Status RegisterTcpTransport(TransportRegistry& registry) {
  return registry.Register("tcp", "kernel TCP (sockets, sendfile/splice bulk path)", CreateTcpTransport);
}

Status RegisterTlsTcpTransport(TransportRegistry& registry) {
  return registry.Register("tls+tcp", "TLS 1.3 over kernel TCP (OpenSSL; kernel TLS keeps sendfile/splice)",
                           CreateTlsTcpTransport);
}

}  // namespace canopy::transport
