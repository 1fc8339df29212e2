#include "tools/http/client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace canopy::http {

std::string SocketAddress::ToString() const {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return fmt::format("{}:{}", buf, ntohs(a->sin_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
  ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
  return fmt::format("[{}]:{}", buf, ntohs(a->sin6_port));
}

Result<SocketAddress> ResolveHost(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) return Status::NotFound(fmt::format("resolve {}: {}", host, ::gai_strerror(rc)));
  SocketAddress out;
  std::memcpy(&out.storage, list->ai_addr, list->ai_addrlen);
  out.length = list->ai_addrlen;
  ::freeaddrinfo(list);
  return out;
}

Result<UniqueFd> ConnectTcp(const SocketAddress& address, Deadline deadline, std::chrono::milliseconds io_timeout) {
  UniqueFd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return ErrnoStatus(errno, "socket");
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::string where = address.ToString();
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
    if (errno != EINPROGRESS) return ErrnoStatus(errno, "connect " + where);
    pollfd p{fd.get(), POLLOUT, 0};
    for (;;) {
      int rc = ::poll(&p, 1, deadline.poll_timeout_ms());
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) return ErrnoStatus(errno, "poll");
      if (rc == 0) return Status::Timeout(fmt::format("connect {}: timed out", where));
      break;
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return ErrnoStatus(err, "connect " + where);
  }
  int flags = ::fcntl(fd.get(), F_GETFL);
  ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(io_timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((io_timeout.count() % 1000) * 1000);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

std::string BuildRequest(std::string_view method, const Url& url, const Headers& extra, bool keep_alive,
                         std::string_view user_agent) {
  std::string out = fmt::format("{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}\r\nAccept: */*\r\n", method,
                                url.target, url.HostHeader(), user_agent);
  if (!keep_alive) out += "Connection: close\r\n";
  for (const auto& h : extra.list()) out += fmt::format("{}: {}\r\n", h.name, h.value);
  out += "\r\n";
  return out;
}

Status SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Timeout("send: timed out");
      return ErrnoStatus(errno, "send");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

Result<size_t> RecvSome(int fd, char* buffer, size_t size) {
  for (;;) {
    ssize_t n = ::recv(fd, buffer, size, 0);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Timeout("receive: timed out (no data)");
    return ErrnoStatus(errno, "recv");
  }
}

Result<ResponseHead> ReadResponseHead(int fd, std::string* buffer, size_t max_head_bytes) {
  size_t scanned = 0;
  char chunk[16384];
  for (;;) {
    size_t end = FindHeadEnd(*buffer, scanned >= 3 ? scanned - 3 : 0);
    if (end != std::string::npos) {
      Result<ResponseHead> head = ParseResponseHead(std::string_view(*buffer).substr(0, end));
      buffer->erase(0, end);
      return head;
    }
    scanned = buffer->size();
    if (buffer->size() > max_head_bytes) {
      return Status::Corruption(fmt::format("response head longer than {} bytes", max_head_bytes));
    }
    CANOPY_ASSIGN_OR_RETURN(size_t n, RecvSome(fd, chunk, sizeof chunk));
    if (n == 0) {
      return Status::Unavailable(buffer->empty() ? "server closed the connection without a response"
                                                 : "server closed the connection inside the response head");
    }
    buffer->append(chunk, n);
  }
}

}  // namespace canopy::http
