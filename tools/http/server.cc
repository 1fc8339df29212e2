#include "tools/http/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "base/logging.h"
#include "tools/http/http_date.h"

namespace canopy::http {
namespace {

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kDoneId = 2;  // deferred responses are ready
constexpr size_t kReadChunk = 64 * 1024;
constexpr std::chrono::milliseconds kLingerTimeout{2000};
constexpr int kMaxEvents = 256;

struct Connection {
  uint64_t id = 0;
  UniqueFd fd;
  std::string peer_ip;
  std::string peer;
  RequestParser parser;
  std::string in;
  size_t in_pos = 0;
  std::string out;
  size_t out_pos = 0;
  std::optional<FileBody> file;
  bool close_after = false;    // shut down once the pending response is sent
  bool lingering = false;      // write side shut; input discarded until EOF or timeout
  bool peer_closed = false;    // read returned 0
  bool refused = false;        // over max_connections: only a 503 is sent
  bool sent_continue = false;  // "100 Continue" sent for the current request
  bool read_blocked = false;   // stopped reading (input bounded while a response is pending)
  bool awaiting = false;       // the handler deferred the current request's answer
  uint64_t await_seq = 0;      // numbers this connection's deferred requests
  Request deferred_request;    // the request being answered later
  Clock::time_point deadline;
  std::list<uint64_t>* timer_list = nullptr;
  std::list<uint64_t>::iterator timer_pos;

  explicit Connection(RequestLimits limits) : parser(limits) {}
  bool pending() const { return awaiting || out_pos < out.size() || file.has_value(); }
};

// Answers of deferred requests, handed from any thread to the server thread.
struct CompletionQueue {
  struct Item {
    uint64_t connection = 0;
    uint64_t seq = 0;
    Response response;
  };
  std::mutex mu;
  std::vector<Item> items;
  bool closed = false;  // the server is gone: answers are dropped
  UniqueFd event_fd;    // eventfd in the server's epoll set

  void Push(uint64_t connection, uint64_t seq, Response response) {
    std::lock_guard<std::mutex> lock(mu);
    if (closed) return;
    items.push_back(Item{connection, seq, std::move(response)});
    if (items.size() == 1) {
      uint64_t one = 1;
      ssize_t ignored = ::write(event_fd.get(), &one, sizeof one);
      (void)ignored;
    }
  }
};

std::string FormatPeer(const sockaddr_storage& addr, std::string* ip_only) {
  char buf[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
    *ip_only = buf;
    return fmt::format("{}:{}", buf, port);
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
    *ip_only = buf;
    return fmt::format("[{}]:{}", buf, port);
  }
  *ip_only = "-";
  return "-";
}

}  // namespace

struct Responder::State {
  std::shared_ptr<CompletionQueue> queue;
  uint64_t connection = 0;
  uint64_t seq = 0;
  bool done = false;
};

Responder::~Responder() {
  if (state_ && !state_->done) Respond(Response::Error(500, "the request was dropped before it was answered"));
}

void Responder::Respond(Response response) {
  if (!state_ || state_->done) return;
  state_->done = true;
  state_->queue->Push(state_->connection, state_->seq, std::move(response));
}

class Server::Impl {
 public:
  Impl(const ServerOptions& options, Handler* handler) : options_(options), handler_(handler) {}
  ~Impl() {
    if (!completions_) return;
    std::lock_guard<std::mutex> lock(completions_->mu);
    completions_->closed = true;
  }

  Status Init();
  Status Run();
  void Stop() {
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof one);
    (void)ignored;
  }
  uint16_t port() const { return port_; }
  ServerStats stats() const {
    ServerStats s = stats_;
    s.open_connections = active_connections_;
    return s;
  }

 private:
  void AcceptAll();
  void OnEvent(Connection* c, uint32_t events);
  // Reads what the socket holds and answers it. A short read counts as
  // "drained" (edge-triggered epoll reports later bytes anew) unless
  // until_eagain, which is needed after a hang-up or a paused read.
  void ReadInput(Connection* c, bool until_eagain);
  // Answers buffered requests. Returns false when the connection was closed.
  bool Process(Connection* c);
  // Queues and sends the deferred answers that are ready.
  void DrainCompletions();
  void QueueResponse(Connection* c, const Request& request, Response response, bool parse_error);
  // Sends what is pending. Returns false when the connection was closed.
  bool Flush(Connection* c);
  // Returns false when the connection was closed.
  bool StartLinger(Connection* c);
  void Close(Connection* c);
  void Touch(Connection* c, std::list<uint64_t>* list, std::chrono::milliseconds timeout);
  void ExpireTimers();
  int NextTimeoutMs() const;
  const std::string& DateHeader();
  void LogAccess(const Connection* c, const Request& request, int status, uint64_t bytes);
  void FlushAccessLog();

  ServerOptions options_;
  Handler* handler_;
  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd wake_fd_;
  UniqueFd reserve_fd_;  // released on EMFILE so a connection can still be accepted and closed
  uint16_t port_ = 0;
  uint64_t next_id_ = 3;
  std::shared_ptr<CompletionQueue> completions_;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t active_connections_ = 0;  // excludes refused ones
  std::list<uint64_t> idle_list_;    // ordered by deadline (same timeout for all)
  std::list<uint64_t> linger_list_;
  Clock::time_point now_ = Clock::now();
  std::time_t date_second_ = 0;
  std::string date_value_;
  std::string access_buffer_;
  ServerStats stats_;
  bool stopping_ = false;
  Clock::time_point run_end_ = Clock::time_point::max();  // max_duration
};

Status Server::Impl::Init() {
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  int family = AF_INET;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (::inet_pton(AF_INET, options_.bind_address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(options_.port);
    addr_len = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, options_.bind_address.c_str(), &v6->sin6_addr) == 1) {
    family = AF_INET6;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(options_.port);
    addr_len = sizeof(sockaddr_in6);
  } else {
    return Status::InvalidArgument(
        fmt::format("bind address '{}' is not an IPv4 or IPv6 literal", options_.bind_address));
  }
  listen_fd_.Reset(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listen_fd_) return ErrnoStatus(errno, "socket");
  int one = 1;
  ::setsockopt(listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) {
    return ErrnoStatus(errno, fmt::format("bind {} port {}", options_.bind_address, options_.port));
  }
  if (::listen(listen_fd_.get(), options_.backlog) != 0) return ErrnoStatus(errno, "listen");
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  if (::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    return ErrnoStatus(errno, "getsockname");
  }
  port_ = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                  : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  epoll_fd_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_) return ErrnoStatus(errno, "epoll_create1");
  wake_fd_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_) return ErrnoStatus(errno, "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev) != 0) return ErrnoStatus(errno, "epoll_ctl");
  ev.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) return ErrnoStatus(errno, "epoll_ctl");
  completions_ = std::make_shared<CompletionQueue>();
  completions_->event_fd.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!completions_->event_fd) return ErrnoStatus(errno, "eventfd");
  ev.data.u64 = kDoneId;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, completions_->event_fd.get(), &ev) != 0) {
    return ErrnoStatus(errno, "epoll_ctl");
  }
  reserve_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  return Status::Ok();
}

Status Server::Impl::Run() {
  epoll_event events[kMaxEvents];
  now_ = Clock::now();
  if (options_.max_duration.count() > 0) run_end_ = now_ + options_.max_duration;
  while (!stopping_) {
    FlushAccessLog();
    int n = ::epoll_wait(epoll_fd_.get(), events, kMaxEvents, NextTimeoutMs());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "epoll_wait");
    }
    now_ = Clock::now();
    for (int i = 0; i < n; ++i) {
      uint64_t id = events[i].data.u64;
      if (id == kListenerId) {
        AcceptAll();
      } else if (id == kWakeId) {
        stopping_ = true;
      } else if (id == kDoneId) {
        DrainCompletions();
      } else {
        auto it = connections_.find(id);
        if (it != connections_.end()) OnEvent(it->second.get(), events[i].events);
      }
    }
    handler_->AfterEvents();
    ExpireTimers();
    if (now_ >= run_end_) {
      stats_.max_duration_reached = true;
      stopping_ = true;
    }
  }
  FlushAccessLog();
  while (!connections_.empty()) Close(connections_.begin()->second.get());
  return Status::Ok();
}

int Server::Impl::NextTimeoutMs() const {
  auto soonest = std::min(now_ + std::chrono::seconds(1), run_end_);
  for (const auto* list : {&idle_list_, &linger_list_}) {
    if (list->empty()) continue;
    auto it = connections_.find(list->front());
    if (it != connections_.end() && it->second->deadline < soonest) soonest = it->second->deadline;
  }
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(soonest - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(ms);
}

void Server::Impl::Touch(Connection* c, std::list<uint64_t>* list, std::chrono::milliseconds timeout) {
  c->deadline = now_ + timeout;
  if (c->timer_list == list) {
    list->splice(list->end(), *list, c->timer_pos);
  } else {
    if (c->timer_list != nullptr) c->timer_list->erase(c->timer_pos);
    c->timer_pos = list->insert(list->end(), c->id);
    c->timer_list = list;
  }
}

void Server::Impl::ExpireTimers() {
  now_ = Clock::now();
  for (auto* list : {&idle_list_, &linger_list_}) {
    while (!list->empty()) {
      auto it = connections_.find(list->front());
      if (it == connections_.end()) {
        list->pop_front();
        continue;
      }
      Connection* c = it->second.get();
      if (c->deadline > now_) break;
      if (c->awaiting && list == &idle_list_) {  // not idle: its answer is being made
        Touch(c, list, options_.idle_timeout);
        continue;
      }
      if (list == &idle_list_) ++stats_.idle_closed;
      Close(c);
    }
  }
}

void Server::Impl::AcceptAll() {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if ((errno == EMFILE || errno == ENFILE) && reserve_fd_) {
        CANOPY_LOG(kWarn, "httpd: out of file descriptors with {} connections open (raise ulimit -n)",
                   connections_.size());
        reserve_fd_.Reset();
        int victim = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (victim >= 0) ::close(victim);
        reserve_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        continue;
      }
      CANOPY_LOG(kWarn, "httpd: accept: {}", std::strerror(errno));
      return;
    }
    auto c = std::make_unique<Connection>(options_.limits);
    c->id = next_id_++;
    c->fd.Reset(fd);
    c->peer = FormatPeer(addr, &c->peer_ip);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = c->id;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      CANOPY_LOG(kWarn, "httpd: epoll_ctl: {}", std::strerror(errno));
      continue;  // c closes fd
    }
    Connection* raw = c.get();
    connections_.emplace(c->id, std::move(c));
    if (active_connections_ >= options_.max_connections) {
      raw->refused = true;
      ++stats_.connections_refused;
      Touch(raw, &linger_list_, kLingerTimeout);
      Response busy = Response::Error(503, "too many connections");
      busy.headers.Add("Retry-After", "1");
      Request none;
      none.method = "-";
      QueueResponse(raw, none, std::move(busy), /*parse_error=*/true);
      Flush(raw);
      continue;
    }
    ++active_connections_;
    ++stats_.connections_accepted;
    Touch(raw, &idle_list_, options_.idle_timeout);
  }
}

void Server::Impl::OnEvent(Connection* c, uint32_t events) {
  if (events & EPOLLERR) {
    Close(c);
    return;
  }
  if ((events & EPOLLOUT) && !Flush(c)) return;
  bool readable = (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) != 0;
  if (readable || (c->read_blocked && !c->pending())) {
    ReadInput(c, (events & (EPOLLRDHUP | EPOLLHUP)) != 0 || c->read_blocked);
  } else if (!c->pending() && c->in_pos < c->in.size()) {
    Process(c);
  }
}

void Server::Impl::ReadInput(Connection* c, bool until_eagain) {
  char buf[kReadChunk];
  for (;;) {
    bool got_bytes = false;
    c->read_blocked = false;
    for (;;) {
      // While a response is pending, stop buffering once a full head's worth waits.
      if (!c->lingering && c->pending() &&
          c->in.size() - c->in_pos > options_.limits.max_header_bytes + kReadChunk) {
        c->read_blocked = true;
        break;
      }
      ssize_t n = ::read(c->fd.get(), buf, sizeof buf);
      if (n > 0) {
        got_bytes = true;
        if (!c->lingering) c->in.append(buf, static_cast<size_t>(n));
        if (static_cast<size_t>(n) < sizeof buf && !until_eagain) break;  // drained
        continue;
      }
      if (n == 0) {
        c->peer_closed = true;
        break;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Close(c);
      return;
    }
    if (c->lingering) {
      if (c->peer_closed) Close(c);
      return;
    }
    if (got_bytes && !c->refused) Touch(c, &idle_list_, options_.idle_timeout);
    if (!Process(c)) return;
    // Reading stopped at the bound and the responses have drained: read on,
    // since edge-triggered epoll will not report the unread bytes again.
    if (!c->read_blocked || c->pending() || c->lingering || c->peer_closed) return;
    until_eagain = true;
  }
}

bool Server::Impl::Process(Connection* c) {
  while (!c->pending() && !c->lingering && !c->close_after) {
    if (c->in_pos == c->in.size()) {
      c->in.clear();
      c->in_pos = 0;
      break;
    }
    size_t used = c->parser.Feed(std::string_view(c->in).substr(c->in_pos));
    c->in_pos += used;
    if (c->in_pos > 65536 && c->in_pos * 2 > c->in.size()) {
      c->in.erase(0, c->in_pos);
      c->in_pos = 0;
    }
    RequestParser::State state = c->parser.state();
    if (state == RequestParser::State::kNeedMore) {
      if (c->parser.expects_continue() && !c->sent_continue) {
        c->sent_continue = true;
        c->out.append("HTTP/1.1 100 Continue\r\n\r\n");
        if (!Flush(c)) return false;
      }
      if (c->in_pos == c->in.size()) {
        c->in.clear();
        c->in_pos = 0;
      }
      break;
    }
    if (state == RequestParser::State::kError) {
      ++stats_.bad_requests;
      Request partial = c->parser.partial_request();
      Response error = Response::Error(c->parser.error_status(), c->parser.error_message());
      if (c->parser.error_status() == 505) error.headers.Add("Upgrade", "HTTP/1.1");
      QueueResponse(c, partial, std::move(error), /*parse_error=*/true);
    } else {
      Request request = c->parser.TakeRequest();
      c->parser.Reset();
      c->sent_continue = false;
      request.peer = c->peer;
      auto state = std::make_shared<Responder::State>();
      state->queue = completions_;
      state->connection = c->id;
      state->seq = ++c->await_seq;
      Responder responder = Server::MakeResponder(state);
      std::optional<Response> response = handler_->HandleAsync(request, responder);
      if (!response) {
        // Answered later by whoever took the responder (or 500 when nobody did).
        c->awaiting = true;
        c->deferred_request = std::move(request);
        break;
      }
      state->done = true;  // answered now: the responder says nothing
      QueueResponse(c, request, std::move(*response), /*parse_error=*/false);
    }
    if (!Flush(c)) return false;
  }
  if (c->peer_closed && !c->pending() && !c->lingering) {
    Close(c);
    return false;
  }
  return true;
}

void Server::Impl::DrainCompletions() {
  uint64_t count = 0;
  ssize_t ignored = ::read(completions_->event_fd.get(), &count, sizeof count);
  (void)ignored;
  std::vector<CompletionQueue::Item> items;
  {
    std::lock_guard<std::mutex> lock(completions_->mu);
    items.swap(completions_->items);
  }
  now_ = Clock::now();
  for (auto& item : items) {
    auto it = connections_.find(item.connection);
    if (it == connections_.end()) continue;  // the client went away meanwhile
    Connection* c = it->second.get();
    if (!c->awaiting || c->await_seq != item.seq) continue;
    c->awaiting = false;
    ++stats_.deferred;
    Request request = std::move(c->deferred_request);
    c->deferred_request = Request();
    QueueResponse(c, request, std::move(item.response), /*parse_error=*/false);
    if (!Flush(c) || c->lingering) continue;
    if (c->pending()) continue;  // the rest goes out on EPOLLOUT, then Process runs
    if (c->read_blocked) {
      ReadInput(c, /*until_eagain=*/true);
    } else {
      Process(c);
    }
  }
}

void Server::Impl::QueueResponse(Connection* c, const Request& request, Response response, bool parse_error) {
  ++stats_.requests;
  bool keep_alive = !parse_error && !stopping_ && !response.close_connection && request.KeepAlive();
  bool no_body = StatusHasNoBody(response.status);
  bool head_only = no_body || request.method == "HEAD";
  uint64_t body_length = response.body_length();

  Headers headers;
  headers.Add("Date", DateHeader());
  headers.Add("Server", options_.server_name);
  if (!no_body) headers.Add("Content-Length", std::to_string(body_length));
  if (!keep_alive) {
    headers.Add("Connection", "close");
  } else if (request.version_minor == 0) {
    headers.Add("Connection", "keep-alive");
  }
  for (auto& h : response.headers.list()) headers.Add(h.name, h.value);
  AppendResponseHead(response.status, headers, &c->out);
  uint64_t sent_body = 0;
  if (!head_only) {
    sent_body = body_length;
    if (response.file) {
      if (response.file->length > 0) c->file = std::move(response.file);
    } else {
      c->out.append(response.body);
    }
  }
  stats_.bytes_sent += sent_body;
  c->close_after = !keep_alive;
  if (options_.access_log_fd >= 0) LogAccess(c, request, response.status, sent_body);
}

bool Server::Impl::Flush(Connection* c) {
  bool progressed = false;
  while (c->out_pos < c->out.size()) {
    int flags = MSG_NOSIGNAL | (c->file ? MSG_MORE : 0);
    ssize_t n = ::send(c->fd.get(), c->out.data() + c->out_pos, c->out.size() - c->out_pos, flags);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (progressed && !c->refused) Touch(c, &idle_list_, options_.idle_timeout);
        return true;
      }
      Close(c);
      return false;
    }
    c->out_pos += static_cast<size_t>(n);
    progressed = true;
  }
  c->out.clear();
  c->out_pos = 0;
  while (c->file) {
    off_t offset = static_cast<off_t>(c->file->offset);
    size_t want = static_cast<size_t>(std::min<uint64_t>(c->file->length, 1u << 30));
    ssize_t n = ::sendfile(c->fd.get(), c->file->fd.get(), &offset, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (progressed) Touch(c, &idle_list_, options_.idle_timeout);
        return true;
      }
      CANOPY_LOG(kWarn, "httpd: sendfile to {}: {}", c->peer, std::strerror(errno));
      Close(c);
      return false;
    }
    if (n == 0) {  // the file shrank under us: the promised length cannot be sent
      CANOPY_LOG(kWarn, "httpd: file shrank while sending to {}; closing", c->peer);
      Close(c);
      return false;
    }
    progressed = true;
    c->file->offset = static_cast<uint64_t>(offset);
    c->file->length -= static_cast<uint64_t>(n);
    if (c->file->length == 0) c->file.reset();
  }
  if (progressed && !c->refused && !c->close_after) Touch(c, &idle_list_, options_.idle_timeout);
  if (c->close_after && !c->lingering) return StartLinger(c);
  return true;
}

bool Server::Impl::StartLinger(Connection* c) {
  c->lingering = true;
  if (c->peer_closed) {
    Close(c);
    return false;
  }
  ::shutdown(c->fd.get(), SHUT_WR);
  c->in.clear();
  c->in_pos = 0;
  auto timeout = std::min(kLingerTimeout, options_.idle_timeout);
  Touch(c, &linger_list_, timeout);
  return true;
}

void Server::Impl::Close(Connection* c) {
  if (c->timer_list != nullptr) c->timer_list->erase(c->timer_pos);
  if (!c->refused) --active_connections_;
  // Closing the fd removes it from the epoll set.
  connections_.erase(c->id);
}

const std::string& Server::Impl::DateHeader() {
  std::time_t t = std::time(nullptr);
  if (t != date_second_) {
    date_second_ = t;
    date_value_ = HttpDate(t);
  }
  return date_value_;
}

void Server::Impl::LogAccess(const Connection* c, const Request& request, int status, uint64_t bytes) {
  std::string line = request.method.empty() || request.method == "-" ? "-" : request.RequestLine();
  // Quotes and control bytes in the request line are escaped so a log line stays one line.
  std::string escaped;
  for (unsigned char ch : line) {
    if (ch == '"' || ch == '\\' || ch < 0x20 || ch >= 0x7f) {
      escaped += fmt::format("\\x{:02x}", ch);
    } else {
      escaped.push_back(static_cast<char>(ch));
    }
  }
  fmt::format_to(std::back_inserter(access_buffer_), "{} - - [{}] \"{}\" {} {}\n", c->peer_ip,
                 ClfDate(std::time(nullptr)), escaped, status, bytes == 0 ? std::string("-") : std::to_string(bytes));
  if (access_buffer_.size() > 64 * 1024) FlushAccessLog();
}

void Server::Impl::FlushAccessLog() {
  size_t done = 0;
  while (done < access_buffer_.size()) {
    ssize_t n = ::write(options_.access_log_fd, access_buffer_.data() + done, access_buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      CANOPY_LOG(kWarn, "httpd: access log write failed: {}", std::strerror(errno));
      break;
    }
    done += static_cast<size_t>(n);
  }
  access_buffer_.clear();
}

Result<std::unique_ptr<Server>> Server::Listen(const ServerOptions& options, Handler* handler) {
  auto impl = std::make_unique<Impl>(options, handler);
  CANOPY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;
uint16_t Server::port() const { return impl_->port(); }
Status Server::Run() { return impl_->Run(); }
void Server::Stop() { impl_->Stop(); }
ServerStats Server::stats() const { return impl_->stats(); }

}  // namespace canopy::http
