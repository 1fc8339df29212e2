// load: a weighttp-style HTTP/1.1 load generator. -n requests over -c
// connections driven by -t threads (each thread one epoll loop over its share
// of the connections), optionally keep-alive. Bounded in count (-n) and time
// (--duration). Reports requests/s, throughput, latency percentiles, status
// codes and errors, as text or --json.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/fd.h"
#include "tools/http/client.h"
#include "tools/http/parser.h"
#include "tools/http/url.h"

namespace po = boost::program_options;
using namespace canopy;

namespace {

struct Config {
  http::SocketAddress address;
  std::string request;  // the bytes of one request
  bool keep_alive = false;
  bool head_method = false;  // HEAD responses have no body
  uint64_t timeout_ns = 0;
  Clock::time_point end;  // --duration cap
};

struct Tally {
  std::vector<uint64_t> latencies_ns;
  std::map<int, uint64_t> status_counts;
  uint64_t completed = 0;
  uint64_t bytes = 0;  // response bytes received (heads + bodies)
  uint64_t connect_errors = 0;
  uint64_t io_errors = 0;
  uint64_t timeouts = 0;
  uint64_t protocol_errors = 0;
  uint64_t connections_opened = 0;
  uint64_t unfinished = 0;  // in flight when --duration ran out
};

class Worker {
 public:
  Worker(const Config& config, std::atomic<int64_t>* budget, int connections)
      : config_(config), budget_(budget), conns_(static_cast<size_t>(connections)) {}

  void Run();
  Tally& tally() { return tally_; }

 private:
  enum class State { kIdle, kConnecting, kSending, kReceiving, kDone };
  struct Conn {
    size_t index = 0;
    UniqueFd fd;
    State state = State::kIdle;
    size_t sent = 0;
    std::string head_buffer;
    bool head_done = false;
    int status = 0;
    bool server_closes = false;
    std::optional<http::BodyReader> body;
    uint64_t start_ns = 0;
  };

  void StartNext(Conn* c);
  void Connect(Conn* c);
  void Send(Conn* c);
  void Receive(Conn* c);
  // Handles bytes; returns false when the connection failed.
  bool Consume(Conn* c, std::string_view data);
  void Complete(Conn* c);
  void Fail(Conn* c, uint64_t* counter);
  void CloseFd(Conn* c);

  const Config& config_;
  std::atomic<int64_t>* budget_;
  std::vector<Conn> conns_;
  UniqueFd epoll_;
  Tally tally_;
  size_t active_ = 0;
};

void Worker::Run() {
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) {
    tally_.connect_errors += conns_.size();
    return;
  }
  active_ = conns_.size();
  for (size_t i = 0; i < conns_.size(); ++i) {
    conns_[i].index = i;
    StartNext(&conns_[i]);
  }
  epoll_event events[256];
  uint64_t last_scan_ns = NowNanos();
  while (active_ > 0) {
    auto now = Clock::now();
    if (now >= config_.end) break;
    int wait_ms = static_cast<int>(
        std::min<int64_t>(100, std::chrono::ceil<std::chrono::milliseconds>(config_.end - now).count()));
    int n = ::epoll_wait(epoll_.get(), events, 256, wait_ms);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < n; ++i) {
      Conn* c = &conns_[events[i].data.u64];
      if (c->state == State::kConnecting) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(c->fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          Fail(c, &tally_.connect_errors);
          continue;
        }
        if (!(events[i].events & EPOLLOUT)) continue;
        c->state = State::kSending;
        Send(c);
      } else if (c->state == State::kSending) {
        Send(c);
      } else if (c->state == State::kReceiving) {
        Receive(c);
      }
    }
    uint64_t now_ns = NowNanos();
    if (now_ns - last_scan_ns < 10'000'000) continue;  // timeouts are checked every 10 ms
    last_scan_ns = now_ns;
    for (auto& c : conns_) {
      if ((c.state == State::kConnecting || c.state == State::kSending || c.state == State::kReceiving) &&
          now_ns - c.start_ns > config_.timeout_ns) {
        Fail(&c, &tally_.timeouts);
      }
    }
  }
  for (auto& c : conns_) {
    if (c.state == State::kConnecting || c.state == State::kSending || c.state == State::kReceiving) {
      ++tally_.unfinished;
    }
    CloseFd(&c);
  }
}

void Worker::StartNext(Conn* c) {
  if (Clock::now() >= config_.end || budget_->fetch_sub(1, std::memory_order_relaxed) <= 0) {
    CloseFd(c);
    c->state = State::kDone;
    --active_;
    return;
  }
  c->start_ns = NowNanos();
  c->sent = 0;
  c->head_buffer.clear();
  c->head_done = false;
  c->status = 0;
  c->server_closes = false;
  c->body.reset();
  if (c->fd) {
    c->state = State::kSending;
    Send(c);
  } else {
    Connect(c);
  }
}

void Worker::Connect(Conn* c) {
  const auto& addr = config_.address;
  c->fd.Reset(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!c->fd) {
    Fail(c, &tally_.connect_errors);
    return;
  }
  ++tally_.connections_opened;
  int one = 1;
  ::setsockopt(c->fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
  ev.data.u64 = c->index;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, c->fd.get(), &ev) != 0) {
    Fail(c, &tally_.connect_errors);
    return;
  }
  int rc = ::connect(c->fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.length);
  if (rc == 0) {
    c->state = State::kSending;
    Send(c);
  } else if (errno == EINPROGRESS) {
    c->state = State::kConnecting;
  } else {
    Fail(c, &tally_.connect_errors);
  }
}

void Worker::Send(Conn* c) {
  const std::string& req = config_.request;
  while (c->sent < req.size()) {
    ssize_t n = ::send(c->fd.get(), req.data() + c->sent, req.size() - c->sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;  // wait for EPOLLOUT
      Fail(c, &tally_.io_errors);
      return;
    }
    c->sent += static_cast<size_t>(n);
  }
  // The answer cannot be there yet: wait for the EPOLLIN edge.
  c->state = State::kReceiving;
}

void Worker::Receive(Conn* c) {
  char buf[65536];
  while (c->state == State::kReceiving) {
    ssize_t n = ::recv(c->fd.get(), buf, sizeof buf, 0);
    if (n > 0) {
      tally_.bytes += static_cast<uint64_t>(n);
      if (!Consume(c, std::string_view(buf, static_cast<size_t>(n)))) return;
      // A short read drained the socket; edge-triggered epoll reports new bytes.
      if (static_cast<size_t>(n) < sizeof buf) return;
      continue;
    }
    if (n == 0) {
      if (c->head_done && c->body && c->body->OnEof().ok()) {
        c->server_closes = true;
        Complete(c);
      } else {
        Fail(c, &tally_.io_errors);
      }
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    Fail(c, &tally_.io_errors);
    return;
  }
}

bool Worker::Consume(Conn* c, std::string_view data) {
  auto discard = [](std::string_view) {};
  if (!c->head_done) {
    size_t old = c->head_buffer.size();
    c->head_buffer.append(data);
    size_t end = http::FindHeadEnd(c->head_buffer, old >= 3 ? old - 3 : 0);
    if (end == std::string::npos) {
      if (c->head_buffer.size() > 65536) {
        Fail(c, &tally_.protocol_errors);
        return false;
      }
      return true;
    }
    Result<http::ResponseHead> head = http::ParseResponseHead(std::string_view(c->head_buffer).substr(0, end));
    if (!head.ok()) {
      Fail(c, &tally_.protocol_errors);
      return false;
    }
    Result<http::BodyReader> body = http::BodyReader::ForResponse(*head, config_.head_method);
    if (!body.ok()) {
      Fail(c, &tally_.protocol_errors);
      return false;
    }
    c->head_done = true;
    c->status = head->status;
    const std::string* connection = head->headers.Find("Connection");
    c->server_closes = (connection && http::ListHasToken(*connection, "close")) ||
                       (head->version_minor == 0 && !(connection && http::ListHasToken(*connection, "keep-alive")));
    c->body.emplace(std::move(*body));
    data = std::string_view(c->head_buffer).substr(end);
    c->body->Feed(data, discard);
  } else {
    c->body->Feed(data, discard);
  }
  if (c->body->failed()) {
    Fail(c, &tally_.protocol_errors);
    return false;
  }
  if (c->body->done()) Complete(c);
  return true;
}

void Worker::Complete(Conn* c) {
  tally_.latencies_ns.push_back(NowNanos() - c->start_ns);
  ++tally_.status_counts[c->status];
  ++tally_.completed;
  if (!config_.keep_alive || c->server_closes || c->body->close_delimited()) CloseFd(c);
  c->state = State::kIdle;
  StartNext(c);
}

void Worker::Fail(Conn* c, uint64_t* counter) {
  ++*counter;
  CloseFd(c);
  c->state = State::kIdle;
  StartNext(c);
}

void Worker::CloseFd(Conn* c) { c->fd.Reset(); }

uint64_t Percentile(const std::vector<uint64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t idx = static_cast<size_t>(p / 100.0 * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(idx, sorted.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int64_t requests = 10000;
    int connections = 10;
    int threads = 1;
    bool keep_alive = false;
    double duration_s = 60;
    double timeout_s = 10;
    bool json = false;
    std::string method = "GET";
    std::string body;
    std::vector<std::string> header_args;
    std::string url_text;
    po::options_description desc(
        "load: HTTP/1.1 load generator (like weighttp)\n"
        "usage: load -n REQUESTS -c CONNECTIONS -t THREADS [-k] URL\noptions");
    desc.add_options()
        ("help,h", "show this help")
        ("requests,n", po::value(&requests)->default_value(requests), "requests in total")
        ("connections,c", po::value(&connections)->default_value(connections), "concurrent connections")
        ("threads,t", po::value(&threads)->default_value(threads), "threads (each drives c/t connections)")
        ("keep-alive,k", po::bool_switch(&keep_alive), "reuse connections (HTTP keep-alive)")
        ("duration,d", po::value(&duration_s)->default_value(duration_s), "stop after this many seconds at most")
        ("timeout", po::value(&timeout_s)->default_value(timeout_s), "seconds one request may take before it counts as an error")
        ("method", po::value(&method)->default_value(method), "request method (GET, HEAD, POST or PUT)")
        ("body", po::value(&body), "request body sent with every request (POST/PUT; Content-Length is added; set "
         "Content-Type with -H)")
        ("header,H", po::value(&header_args), "extra request header 'Name: value' (repeatable)")
        ("json", po::bool_switch(&json), "print the result as one JSON object")
        ("url", po::value(&url_text), "the http:// URL (also positional)");
    po::positional_options_description pos;
    pos.add("url", 1);
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(desc).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    if (url_text.empty()) throw std::runtime_error("missing URL");
    if (requests < 1 || connections < 1 || threads < 1) throw std::runtime_error("-n, -c and -t must be at least 1");
    if (threads > connections) throw std::runtime_error("-t must not exceed -c");
    if (duration_s <= 0 || timeout_s <= 0) throw std::runtime_error("--duration and --timeout must be positive");
    if (method != "GET" && method != "HEAD" && method != "POST" && method != "PUT") {
      throw std::runtime_error("--method must be GET, HEAD, POST or PUT");
    }
    if (vm.count("body") && method != "POST" && method != "PUT") throw std::runtime_error("--body needs --method POST or PUT");
    if (connections > requests) connections = static_cast<int>(requests);
    if (threads > connections) threads = connections;

    Result<http::Url> url = http::ParseUrl(url_text);
    if (!url.ok()) {
      std::fprintf(stderr, "load: %s\n", url.status().ToString().c_str());
      return 2;
    }
    Result<http::SocketAddress> address = http::ResolveHost(url->host, url->port);
    if (!address.ok()) {
      std::fprintf(stderr, "load: %s\n", address.status().ToString().c_str());
      return 2;
    }
    http::Headers extra;
    for (const auto& h : header_args) {
      size_t colon = h.find(':');
      if (colon == std::string::npos || colon == 0) throw std::runtime_error("bad -H '" + h + "' (want 'Name: value')");
      std::string value = h.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      extra.Add(h.substr(0, colon), value);
    }
    Config config;
    config.address = *address;
    config.keep_alive = keep_alive;
    config.head_method = method == "HEAD";
    if (method == "POST" || method == "PUT") extra.Add("Content-Length", std::to_string(body.size()));
    config.request = http::BuildRequest(method, *url, extra, keep_alive, "canopy-load/0.1") + body;
    config.timeout_ns = static_cast<uint64_t>(timeout_s * 1e9);
    auto start = Clock::now();
    config.end = start + std::chrono::nanoseconds(static_cast<int64_t>(duration_s * 1e9));

    std::atomic<int64_t> budget{requests};
    std::vector<std::unique_ptr<Worker>> workers;
    for (int t = 0; t < threads; ++t) {
      int share = connections / threads + (t < connections % threads ? 1 : 0);
      workers.push_back(std::make_unique<Worker>(config, &budget, share));
    }
    std::vector<std::thread> pool;
    for (auto& w : workers) pool.emplace_back([&w] { w->Run(); });
    for (auto& t : pool) t.join();
    double secs = std::chrono::duration<double>(Clock::now() - start).count();

    Tally total;
    for (auto& w : workers) {
      Tally& t = w->tally();
      total.latencies_ns.insert(total.latencies_ns.end(), t.latencies_ns.begin(), t.latencies_ns.end());
      for (auto [code, n] : t.status_counts) total.status_counts[code] += n;
      total.completed += t.completed;
      total.bytes += t.bytes;
      total.connect_errors += t.connect_errors;
      total.io_errors += t.io_errors;
      total.timeouts += t.timeouts;
      total.protocol_errors += t.protocol_errors;
      total.connections_opened += t.connections_opened;
      total.unfinished += t.unfinished;
    }
    std::sort(total.latencies_ns.begin(), total.latencies_ns.end());
    uint64_t errors = total.connect_errors + total.io_errors + total.timeouts + total.protocol_errors;
    uint64_t ok_2xx = 0;
    for (auto [code, n] : total.status_counts) ok_2xx += (code >= 200 && code < 300) ? n : 0;
    double rps = secs > 0 ? static_cast<double>(total.completed) / secs : 0;
    double gbps = secs > 0 ? static_cast<double>(total.bytes) * 8 / secs / 1e9 : 0;
    double mean_ns = 0;
    for (uint64_t v : total.latencies_ns) mean_ns += static_cast<double>(v);
    if (!total.latencies_ns.empty()) mean_ns /= static_cast<double>(total.latencies_ns.size());
    auto ms = [](double ns) { return ns / 1e6; };
    double p50 = ms(static_cast<double>(Percentile(total.latencies_ns, 50)));
    double p99 = ms(static_cast<double>(Percentile(total.latencies_ns, 99)));
    double pmax = ms(total.latencies_ns.empty() ? 0 : static_cast<double>(total.latencies_ns.back()));
    bool time_capped = total.completed + errors < static_cast<uint64_t>(requests);

    if (json) {
      nlohmann::json codes = nlohmann::json::object();
      for (auto [code, n] : total.status_counts) codes[std::to_string(code)] = n;
      nlohmann::json j = {
          {"url", url_text}, {"requests", requests}, {"connections", connections}, {"threads", threads},
          {"keep_alive", keep_alive}, {"completed", total.completed}, {"ok_2xx", ok_2xx},
          {"status_codes", codes},
          {"errors", {{"total", errors}, {"connect", total.connect_errors}, {"io", total.io_errors},
                      {"timeout", total.timeouts}, {"protocol", total.protocol_errors}}},
          {"unfinished", total.unfinished}, {"time_capped", time_capped},
          {"connections_opened", total.connections_opened}, {"seconds", secs}, {"requests_per_s", rps},
          {"bytes", total.bytes}, {"gbit_per_s", gbps},
          {"latency_ms", {{"p50", p50}, {"p99", p99}, {"max", pmax}, {"mean", ms(mean_ns)}}}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("load: %s  n=%lld c=%d t=%d keep-alive=%s\n", url_text.c_str(), static_cast<long long>(requests),
                  connections, threads, keep_alive ? "yes" : "no");
      std::printf("finished in %.3f s, %.0f req/s, %.3f Gbit/s (%llu bytes received)\n", secs, rps, gbps,
                  static_cast<unsigned long long>(total.bytes));
      std::printf("requests: %llu completed, %llu 2xx, %llu errors (connect %llu, io %llu, timeout %llu, protocol %llu)%s\n",
                  static_cast<unsigned long long>(total.completed), static_cast<unsigned long long>(ok_2xx),
                  static_cast<unsigned long long>(errors), static_cast<unsigned long long>(total.connect_errors),
                  static_cast<unsigned long long>(total.io_errors), static_cast<unsigned long long>(total.timeouts),
                  static_cast<unsigned long long>(total.protocol_errors), time_capped ? " [stopped by --duration]" : "");
      std::string codes;
      for (auto [code, n] : total.status_counts) codes += fmt::format(" {}:{}", code, n);
      std::printf("status codes:%s\n", codes.empty() ? " none" : codes.c_str());
      std::printf("latency: p50 %.3f ms, p99 %.3f ms, max %.3f ms, mean %.3f ms\n", p50, p99, pmax, ms(mean_ns));
    }
    return errors == 0 && !time_capped ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "load: %s (try --help)\n", e.what());
    return 2;
  }
}
