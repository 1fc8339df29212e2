#include "tools/chaosproxy/chaos_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <list>
#include <random>
#include <vector>

#include "base/logging.h"

namespace canopy::chaos {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxQueuedBytes = 4 * 1024 * 1024;

using Clock = std::chrono::steady_clock;

bool IsLoopback(const std::string& host) {
  in_addr a4;
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  return host == "::1" || host == "localhost";
}

Result<sockaddr_storage> MakeAddr(const std::string& host, uint16_t port, socklen_t* len) {
  sockaddr_storage ss{};
  std::string h = host == "localhost" ? "127.0.0.1" : host;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, h.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    *len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, h.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    *len = sizeof(sockaddr_in6);
  } else {
    return Status::InvalidArgument("not an IP address: " + host);
  }
  return ss;
}

void ResetAndClose(int fd) {
  if (fd < 0) return;
  linger lg{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  ::close(fd);
}

struct Chunk {
  Clock::time_point release;
  std::string data;
  size_t offset = 0;
};

// One direction of a link: bytes read from `from`, written to `to`.
struct Direction {
  std::deque<Chunk> queue;
  size_t queued = 0;
  bool eof = false;       // `from` reached end of stream
  bool shut = false;      // shutdown(SHUT_WR) sent on `to`
};

struct Link {
  int client = -1;
  int server = -1;
  Direction up;    // client -> server
  Direction down;  // server -> client
  uint64_t bytes = 0;
  bool dead = false;
};

}  // namespace

struct ChaosProxy::Impl {
  static bool ReadInto(ChaosProxy& p, std::mt19937_64& rng, int from, Direction& dir, Link& link) {
    std::string buf(kReadChunk, '\0');
    ssize_t n = ::read(from, buf.data(), buf.size());
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    if (n == 0) {
      dir.eof = true;
      return true;
    }
    buf.resize(static_cast<size_t>(n));
    if (p.partitioned_.load()) {
      p.counters_.discarded_bytes += static_cast<uint64_t>(n);
      return true;
    }
    if (p.options_.corrupt_prob > 0 &&
        std::uniform_real_distribution<double>(0, 1)(rng) < p.options_.corrupt_prob) {
      size_t at = std::uniform_int_distribution<size_t>(0, buf.size() - 1)(rng);
      buf[at] = static_cast<char>(buf[at] ^ (1 + (rng() % 255)));
      p.counters_.corruptions++;
    }
    dir.queued += buf.size();
    link.bytes += buf.size();
    dir.queue.push_back(Chunk{Clock::now() + std::chrono::milliseconds(p.options_.delay_ms), std::move(buf), 0});
    return true;
  }

  static bool WriteFrom(ChaosProxy& p, int to, Direction& dir) {
    auto now = Clock::now();
    while (!dir.queue.empty() && dir.queue.front().release <= now) {
      Chunk& c = dir.queue.front();
      ssize_t n = ::send(to, c.data.data() + c.offset, c.data.size() - c.offset, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EINTR;
      c.offset += static_cast<size_t>(n);
      dir.queued -= static_cast<size_t>(n);
      p.counters_.bytes_forwarded += static_cast<uint64_t>(n);
      if (c.offset < c.data.size()) return true;
      dir.queue.pop_front();
    }
    if (dir.eof && dir.queue.empty() && !dir.shut) {
      ::shutdown(to, SHUT_WR);
      dir.shut = true;
    }
    return true;
  }

  static bool HasReady(const Direction& d, Clock::time_point now) {
    return !d.queue.empty() && d.queue.front().release <= now;
  }
};

Result<std::unique_ptr<ChaosProxy>> ChaosProxy::Create(const ChaosOptions& options) {
  if (!IsLoopback(options.listen_host) || !IsLoopback(options.target_host)) {
    return Status::InvalidArgument("chaosproxy only forwards between loopback addresses (127.0.0.0/8, ::1)");
  }
  if (options.target_port == 0) return Status::InvalidArgument("chaosproxy needs a target port");
  if (options.corrupt_prob < 0 || options.corrupt_prob > 1) {
    return Status::InvalidArgument("corrupt probability must be within [0, 1]");
  }
  std::unique_ptr<ChaosProxy> proxy(new ChaosProxy(options));
  socklen_t len = 0;
  CANOPY_ASSIGN_OR_RETURN(sockaddr_storage addr, MakeAddr(options.listen_host, options.listen_port, &len));
  int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket");
  proxy->listen_fd_.Reset(fd);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return ErrnoStatus(errno, "bind " + options.listen_host + ":" + std::to_string(options.listen_port));
  }
  if (::listen(fd, 128) != 0) return ErrnoStatus(errno, "listen");
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
  proxy->port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                                  : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return ErrnoStatus(errno, "eventfd");
  proxy->wake_fd_.Reset(efd);
  return proxy;
}

ChaosProxy::~ChaosProxy() = default;

namespace {
void Wake(int fd) {
  uint64_t one = 1;
  ssize_t ignored = ::write(fd, &one, sizeof one);
  (void)ignored;
}
}  // namespace

void ChaosProxy::Stop() {
  stop_ = true;
  Wake(wake_fd_.get());
  std::lock_guard<std::mutex> lock(cut_mu_);
  cut_cv_.notify_all();  // a CutAll() waiting for Run() stops waiting
}
void ChaosProxy::CutAll() {
  std::unique_lock<std::mutex> lock(cut_mu_);
  const uint64_t want = ++cuts_requested_;
  cut_all_ = true;
  Wake(wake_fd_.get());
  // Bounded: Run() may not be running (not started, or stopped).
  cut_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return cuts_done_ >= want || stop_.load(); });
}
void ChaosProxy::SetPartitioned(bool on) {
  partitioned_ = on;
  Wake(wake_fd_.get());
}

Status ChaosProxy::Run() {
  std::mt19937_64 rng(options_.seed);
  std::list<Link> links;
  socklen_t target_len = 0;
  CANOPY_ASSIGN_OR_RETURN(sockaddr_storage target,
                          MakeAddr(options_.target_host, options_.target_port, &target_len));
  std::vector<pollfd> fds;
  std::vector<Link*> owners;
  while (!stop_.load()) {
    auto now = Clock::now();
    fds.clear();
    owners.clear();
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    int timeout_ms = 200;
    for (Link& l : links) {
      short cev = 0, sev = 0;
      if (!l.up.eof && l.up.queued < kMaxQueuedBytes) cev |= POLLIN;
      if (!l.down.eof && l.down.queued < kMaxQueuedBytes) sev |= POLLIN;
      if (Impl::HasReady(l.up, now) || (l.up.eof && l.up.queue.empty() && !l.up.shut)) sev |= POLLOUT;
      if (Impl::HasReady(l.down, now) || (l.down.eof && l.down.queue.empty() && !l.down.shut)) cev |= POLLOUT;
      for (const Direction* d : {&l.up, &l.down}) {
        if (!d->queue.empty() && d->queue.front().release > now) {
          auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(d->queue.front().release - now);
          timeout_ms = std::min<int>(timeout_ms, static_cast<int>(wait.count()) + 1);
        }
      }
      fds.push_back({l.client, cev, 0});
      owners.push_back(&l);
      fds.push_back({l.server, sev, 0});
      owners.push_back(&l);
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "poll");
    }
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      ssize_t ignored = ::read(wake_fd_.get(), &v, sizeof v);
      (void)ignored;
    }
    uint64_t cut_generation = 0;
    if (cut_all_.exchange(false)) {
      std::lock_guard<std::mutex> lock(cut_mu_);
      cut_generation = cuts_requested_;
      for (Link& l : links) l.dead = true;
      counters_.cuts += links.size();
    }
    if (fds[0].revents & POLLIN) {
      for (;;) {
        int c = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) break;
        counters_.connections++;
        if (partitioned_.load()) {
          ResetAndClose(c);
          continue;
        }
        int s = ::socket(target.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0 || ::connect(s, reinterpret_cast<sockaddr*>(&target), target_len) != 0) {
          if (s >= 0) ::close(s);
          ResetAndClose(c);
          continue;
        }
        int one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::fcntl(s, F_SETFL, ::fcntl(s, F_GETFL) | O_NONBLOCK);
        links.push_back(Link{c, s, {}, {}, 0, false});
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      Link& l = *owners[i - 2];
      if (l.dead) continue;
      bool is_client = fds[i].fd == l.client;
      short re = fds[i].revents;
      Direction& in = is_client ? l.up : l.down;
      Direction& out = is_client ? l.down : l.up;
      if (re & (POLLIN | POLLHUP | POLLERR)) {
        if (!in.eof && !Impl::ReadInto(*this, rng, fds[i].fd, in, l)) l.dead = true;
      }
      if (!l.dead && (re & POLLHUP) && in.eof) l.dead = true;  // peer gone both ways
      if (!l.dead && (re & POLLOUT)) {
        if (!Impl::WriteFrom(*this, fds[i].fd, out)) l.dead = true;
      }
      if (options_.cut_after_bytes > 0 && l.bytes >= options_.cut_after_bytes && !l.dead) {
        l.dead = true;
        counters_.cuts++;
      }
    }
    for (auto it = links.begin(); it != links.end();) {
      bool finished = it->up.shut && it->down.shut;
      if (it->dead || finished) {
        ResetAndClose(it->client);
        ResetAndClose(it->server);
        it = links.erase(it);
      } else {
        ++it;
      }
    }
    if (cut_generation != 0) {  // the links CutAll() asked for are reset now
      std::lock_guard<std::mutex> lock(cut_mu_);
      cuts_done_ = std::max(cuts_done_, cut_generation);
      cut_cv_.notify_all();
    }
  }
  for (Link& l : links) {
    ResetAndClose(l.client);
    ResetAndClose(l.server);
  }
  return Status::Ok();
}

}  // namespace canopy::chaos
