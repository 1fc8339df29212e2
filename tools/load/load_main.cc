// load: a weighttp-style HTTP/1.1 load generator. -n requests over -c
// connections driven by -t threads (each thread one epoll loop over its share
// of the connections), optionally keep-alive. Bounded in count (-n) and time
// (--duration), after an optional --warmup whose requests are left out of
// every figure. Reports requests/s, throughput (decimal Gbit/s), latency
// percentiles, status codes, errors, its own CPU use and, with -i, periodic
// interval figures, as text or --json.
//
// Exit status: 0 when every measured request got an answer (any status code)
// and -n was reached, 1 otherwise (errors, or stopped by --duration), 2 bad
// usage. With --json, stdout is exactly one JSON document in every case
// (tools/load/load.schema.json).
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <atomic>
#include <boost/program_options.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/fd.h"
#include "tools/cli/cli.h"
#include "tools/http/client.h"
#include "tools/http/parser.h"
#include "tools/http/url.h"

namespace po = boost::program_options;
using namespace canopy;

namespace {

// Back-off of a connection whose connect failed (Worker::Fail).
constexpr uint64_t kFirstConnectBackoffNs = 1'000'000;     // 1 ms
constexpr uint64_t kMaxConnectBackoffNs = 100'000'000;     // 100 ms

struct Config {
  http::SocketAddress address;
  std::string request;  // the bytes of one request
  bool keep_alive = false;
  bool head_method = false;  // HEAD responses have no body
  uint64_t timeout_ns = 0;
  Clock::time_point measure_start;  // end of --warmup: requests started before it are not measured
  Clock::time_point end;            // measure_start + --duration
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
  // Requests started during --warmup (answered or failed); in no other figure.
  uint64_t warmup_completed = 0;
  uint64_t warmup_errors = 0;
};

// What a worker has measured so far, for the -i reports: written by the
// worker only, read by the main thread (relaxed; a report may lag a request).
struct LiveCounts {
  std::atomic<uint64_t> completed{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> errors{0};
};

class Worker {
 public:
  // `cpus`: pin the thread that calls Run() to these, ascending (empty: not pinned).
  Worker(const Config& config, std::atomic<int64_t>* budget, int connections, std::vector<int> cpus)
      : config_(config), budget_(budget), conns_(static_cast<size_t>(connections)), cpus_(std::move(cpus)) {}

  void Run();
  Tally& tally() { return tally_; }
  const LiveCounts& live() const { return live_; }
  // After Run(): the CPUs the thread was allowed to run on (read back after
  // pinning; empty when not pinned) and the pinning error, if any.
  const std::vector<int>& pinned_cpus() const { return pinned_cpus_; }
  const std::string& pin_error() const { return pin_error_; }

 private:
  // kBackoff: the last connect failed; the connection waits until
  // retry_at_ns before it tries again (see Fail).
  enum class State { kIdle, kConnecting, kSending, kReceiving, kBackoff, kDone };
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
    bool warm = false;  // started during --warmup: counted in warmup_* only
    int connect_failures = 0;  // in a row; reset by a connect that succeeds
    uint64_t retry_at_ns = 0;  // kBackoff: when to try again
  };

  // Pins this thread to cpus_ and reads the mask back. False on failure.
  bool Pin();

  void StartNext(Conn* c);
  void Connect(Conn* c);
  void Send(Conn* c);
  void Receive(Conn* c);
  // Handles bytes; returns false when the connection failed.
  bool Consume(Conn* c, std::string_view data);
  void Complete(Conn* c);
  // Counts the failure, closes and queues the connection for StartNext
  // (run by DrainRestarts, so a connect that fails at once cannot recurse).
  void Fail(Conn* c, uint64_t* counter);
  void DrainRestarts();
  // Restarts the connections in kBackoff whose retry time has come.
  void RetryBackedOff();
  void CloseFd(Conn* c);

  const Config& config_;
  std::atomic<int64_t>* budget_;
  std::vector<Conn> conns_;
  UniqueFd epoll_;
  Tally tally_;
  LiveCounts live_;
  size_t active_ = 0;
  size_t backing_off_ = 0;  // connections in kBackoff
  std::vector<Conn*> restart_;
  std::vector<int> cpus_;
  std::vector<int> pinned_cpus_;
  std::string pin_error_;
};

bool Worker::Pin() {
  if (cpus_.empty()) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus_) CPU_SET(cpu, &set);
  int rc = ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
  if (rc == 0) rc = ::pthread_getaffinity_np(::pthread_self(), sizeof set, &set);
  if (rc != 0) {
    pin_error_ = fmt::format("pthread_setaffinity_np: {}", std::strerror(rc));
    return false;
  }
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) pinned_cpus_.push_back(cpu);
  }
  if (pinned_cpus_ != cpus_) {
    pin_error_ = fmt::format("asked for CPUs {} but the thread runs on {}", fmt::join(cpus_, ","),
                             fmt::join(pinned_cpus_, ","));
    return false;
  }
  return true;
}

void Worker::Run() {
  if (!Pin()) return;
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
  DrainRestarts();
  epoll_event events[256];
  uint64_t last_scan_ns = NowNanos();
  while (active_ > 0) {
    auto now = Clock::now();
    if (now >= config_.end) break;
    int wait_ms = static_cast<int>(
        std::min<int64_t>(backing_off_ > 0 ? 1 : 100,
                          std::chrono::ceil<std::chrono::milliseconds>(config_.end - now).count()));
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
        c->connect_failures = 0;
        c->state = State::kSending;
        Send(c);
      } else if (c->state == State::kSending) {
        Send(c);
      } else if (c->state == State::kReceiving) {
        Receive(c);
        continue;
      }
      // A server may answer before the request is all sent (e.g. httpd's 503
      // at accept): the EPOLLIN edge came with this event and will not come again.
      if (c->state == State::kReceiving && (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP))) Receive(c);
    }
    DrainRestarts();
    if (backing_off_ > 0) RetryBackedOff();
    uint64_t now_ns = NowNanos();
    if (now_ns - last_scan_ns < 10'000'000) continue;  // timeouts are checked every 10 ms
    last_scan_ns = now_ns;
    for (auto& c : conns_) {
      if ((c.state == State::kConnecting || c.state == State::kSending || c.state == State::kReceiving) &&
          now_ns - c.start_ns > config_.timeout_ns) {
        Fail(&c, &tally_.timeouts);
      }
    }
    DrainRestarts();
  }
  for (auto& c : conns_) {
    if (c.state == State::kConnecting || c.state == State::kSending || c.state == State::kReceiving) {
      ++(c.warm ? tally_.warmup_errors : tally_.unfinished);
    }
    CloseFd(&c);
  }
}

void Worker::StartNext(Conn* c) {
  auto now = Clock::now();
  // Warm-up requests do not take from the -n budget.
  c->warm = now < config_.measure_start;
  if (now >= config_.end || (!c->warm && budget_->fetch_sub(1, std::memory_order_relaxed) <= 0)) {
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
  if (!c->warm) ++tally_.connections_opened;
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
    c->connect_failures = 0;
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
  // Wait for the EPOLLIN edge (Run reads at once if it came with this event).
  c->state = State::kReceiving;
}

void Worker::Receive(Conn* c) {
  char buf[65536];
  while (c->state == State::kReceiving) {
    ssize_t n = ::recv(c->fd.get(), buf, sizeof buf, 0);
    if (n > 0) {
      if (!c->warm) {
        tally_.bytes += static_cast<uint64_t>(n);
        live_.bytes.store(tally_.bytes, std::memory_order_relaxed);
      }
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
  if (c->warm) {
    ++tally_.warmup_completed;
  } else {
    tally_.latencies_ns.push_back(NowNanos() - c->start_ns);
    ++tally_.status_counts[c->status];
    ++tally_.completed;
    live_.completed.store(tally_.completed, std::memory_order_relaxed);
  }
  if (!config_.keep_alive || c->server_closes || c->body->close_delimited()) CloseFd(c);
  c->state = State::kIdle;
  StartNext(c);
}

void Worker::Fail(Conn* c, uint64_t* counter) {
  if (c->warm) {
    ++tally_.warmup_errors;
  } else {
    ++*counter;
    live_.errors.fetch_add(1, std::memory_order_relaxed);
  }
  CloseFd(c);
  if (counter == &tally_.connect_errors) {
    // A server that refuses (or is not there) would otherwise be dialled again
    // at once, in a tight loop for as long as the run lasts (a --warmup or
    // --duration run has no request budget to end it): wait 1 ms, doubling
    // with every failure in a row up to 100 ms, before the next try.
    c->connect_failures = std::min(c->connect_failures + 1, 20);
    uint64_t delay_ns = std::min<uint64_t>(kMaxConnectBackoffNs, kFirstConnectBackoffNs << (c->connect_failures - 1));
    c->retry_at_ns = NowNanos() + delay_ns;
    c->state = State::kBackoff;
    ++backing_off_;
    return;
  }
  c->state = State::kIdle;
  restart_.push_back(c);
}

void Worker::RetryBackedOff() {
  uint64_t now_ns = NowNanos();
  for (auto& c : conns_) {
    if (c.state != State::kBackoff || c.retry_at_ns > now_ns) continue;
    --backing_off_;
    c.state = State::kIdle;
    StartNext(&c);
  }
  DrainRestarts();
}

void Worker::DrainRestarts() {
  while (!restart_.empty()) {
    Conn* c = restart_.back();
    restart_.pop_back();
    StartNext(c);
  }
}

void Worker::CloseFd(Conn* c) { c->fd.Reset(); }

uint64_t Percentile(const std::vector<uint64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t idx = static_cast<size_t>(p / 100.0 * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(idx, sorted.size() - 1)];
}

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
// bad usage: cli::kExitUsage (2)

constexpr char kGbpsUnit[] = "decimal Gbit/s (10^9 bit/s)";

const char kUsageText[] =
    "load: HTTP/1.1 load generator (like weighttp)\n"
    "usage: load -n REQUESTS -c CONNECTIONS -t THREADS [-k] [-d SECONDS] [--warmup SECONDS] [-i SECONDS]\n"
    "            [-a CPU[,CPU...]] [--json] URL\n"
    "The run makes requests for --warmup seconds first (left out of every figure: counts,\n"
    "bytes, latency, status codes, errors, CPU, intervals), then measures until -n requests\n"
    "were started and answered or -d seconds passed, whichever comes first.\n"
    "Gbit/s are decimal (10^9 bit/s) and count response bytes (heads + bodies); CPU is the\n"
    "user + system time of load itself (getrusage) over the measured part, in % of one core.\n"
    "Exit status: 0 when every measured request was answered (any status code) and the run\n"
    "ended as asked: -n reached, or -d elapsed when no -n was given (a run by time, as wrk's);\n"
    "1 otherwise (with --json, \"error_code\" says why: connect, timeout, io, protocol, duration\n"
    "(-d stopped it before the -n given), resolve, affinity), 2 bad usage (error_code \"usage\").\n"
    "options";

int UsageError(const std::string& message, bool json) { return cli::UsageError("load", message, json); }

// A failure before any request was made (e.g. the host does not resolve).
int StartFailure(const std::string& url, const std::string& message, const char* code, bool json) {
  if (json) {
    nlohmann::json j = {{"ok", false}, {"tool", "load"}, {"url", url}, {"error", message}, {"error_code", code}};
    std::printf("%s\n", j.dump().c_str());
  }
  std::fprintf(stderr, "load: %s\n", message.c_str());
  return kExitFailed;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size(); ++i) out += (i ? "," : "") + std::to_string(cpus[i]);
  return out;
}

// "0,2,4-6" -> {0, 2, 4, 5, 6}, each CPU one the process may run on.
// InvalidArgument otherwise.
Result<std::vector<int>> ParseCpuList(const std::string& text) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    return Status::InvalidArgument(fmt::format("sched_getaffinity: {}", std::strerror(errno)));
  }
  std::vector<int> allowed_list;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) allowed_list.push_back(cpu);
  }
  auto number = [](std::string_view t, int* out) {
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string_view::npos) return false;
    *out = std::stoi(std::string(t));
    return true;
  };
  std::vector<int> cpus;
  std::string_view rest = text;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    size_t dash = item.find('-');
    int lo = 0, hi = 0;
    bool good = dash == std::string_view::npos ? number(item, &lo) && number(item, &hi)
                                               : number(item.substr(0, dash), &lo) && number(item.substr(dash + 1), &hi);
    if (!good || lo > hi) {
      return Status::InvalidArgument(fmt::format("bad CPU list '{}' (want e.g. 0,2,4-6)", text));
    }
    for (int cpu = lo; cpu <= hi; ++cpu) {
      if (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) {
        return Status::InvalidArgument(
            fmt::format("CPU {} is not available to this process (allowed: {})", cpu, FormatCpuList(allowed_list)));
      }
      cpus.push_back(cpu);
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return cpus;
}

struct CpuTimes {
  double user_s = 0;
  double sys_s = 0;
};

CpuTimes ProcessCpu() {
  CpuTimes t;
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) {
    t.user_s = static_cast<double>(ru.ru_utime.tv_sec) + static_cast<double>(ru.ru_utime.tv_usec) / 1e6;
    t.sys_s = static_cast<double>(ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_stime.tv_usec) / 1e6;
  }
  return t;
}

struct Interval {
  double start = 0;  // seconds since the measured part began
  double end = 0;
  uint64_t requests = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  double seconds() const { return end - start; }
  double rps() const { return seconds() > 0 ? static_cast<double>(requests) / seconds() : 0; }
  double gbps() const { return seconds() > 0 ? static_cast<double>(bytes) * 8 / seconds() / 1e9 : 0; }
};

void PrintInterval(const Interval& iv) {
  std::printf("[%7.2f-%7.2f s] %10llu requests %10.0f req/s %12llu bytes %8.3f Gbit/s %llu errors\n", iv.start,
              iv.end, static_cast<unsigned long long>(iv.requests), iv.rps(),
              static_cast<unsigned long long>(iv.bytes), iv.gbps(), static_cast<unsigned long long>(iv.errors));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool json_requested = cli::CommandLineHas(argc, argv, "--json");
  int64_t requests = 10000;
  int connections = 10;
  int threads = 1;
  bool keep_alive = false;
  double duration_s = 60;
  double timeout_s = 10;
  double warmup_s = 0;
  double interval_s = 0;
  std::string affinity_text;
  bool json = false;
  std::string method = "GET";
  std::string body;
  std::vector<std::string> header_args;
  std::string url_text;
  po::variables_map vm;
  try {
    po::options_description desc(kUsageText);
    desc.add_options()
        ("help,h", "show this help")
        ("requests,n", po::value(&requests)->default_value(requests), "measured requests in total")
        ("connections,c", po::value(&connections)->default_value(connections), "concurrent connections")
        ("threads,t", po::value(&threads)->default_value(threads), "threads (each drives c/t connections)")
        ("keep-alive,k", po::bool_switch(&keep_alive), "reuse connections (HTTP keep-alive)")
        ("duration,d", po::value(&duration_s)->default_value(duration_s),
         "stop measuring after this many seconds at most (after --warmup)")
        ("warmup", po::value(&warmup_s)->default_value(warmup_s),
         "seconds of requests first, left out of every figure (requests in flight when it ends are too)")
        ("interval,i", po::value(&interval_s)->default_value(interval_s),
         "report every this many seconds of the measured part (0: no interval reports)")
        ("affinity,a", po::value(&affinity_text),
         "pin thread k to the k-th CPU of the list, round robin (e.g. 0,2 or 4-7)")
        ("timeout", po::value(&timeout_s)->default_value(timeout_s), "seconds one request may take before it counts as an error")
        ("method", po::value(&method)->default_value(method), "request method (GET, HEAD, POST or PUT)")
        ("body", po::value(&body), "request body sent with every request (POST/PUT; Content-Length is added; set "
         "Content-Type with -H)")
        ("header,H", po::value(&header_args), "extra request header 'Name: value' (repeatable)")
        ("json", po::bool_switch(&json), "print the result as one JSON object, also on failure "
         "(tools/load/load.schema.json)")
        ("url", po::value(&url_text), "the http:// URL (also positional)");
    po::positional_options_description pos;
    pos.add("url", 1);
    po::store(po::command_line_parser(argc, argv).options(desc).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return kExitOk;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    return UsageError(e.what(), json_requested);
  }
  if (url_text.empty()) return UsageError("missing URL", json);
  if (requests < 1 || connections < 1 || threads < 1) return UsageError("-n, -c and -t must be at least 1", json);
  if (threads > connections) return UsageError("-t must not exceed -c", json);
  if (duration_s <= 0 || timeout_s <= 0) return UsageError("--duration and --timeout must be positive", json);
  if (warmup_s < 0) return UsageError("--warmup must be at least 0", json);
  if (interval_s < 0 || (interval_s > 0 && interval_s < 0.01)) {
    return UsageError("--interval must be 0 (off) or at least 0.01 seconds", json);
  }
  if (method != "GET" && method != "HEAD" && method != "POST" && method != "PUT") {
    return UsageError("--method must be GET, HEAD, POST or PUT", json);
  }
  // A run by time, as wrk's: -d given and no -n. It makes requests until -d
  // ends it (which is then success); otherwise -d stopping the run before -n
  // requests is a short run.
  const bool by_time = vm["requests"].defaulted() && !vm["duration"].defaulted();
  if (by_time) requests = std::numeric_limits<int64_t>::max() / 4;  // -d ends it
  if (vm.count("body") && method != "POST" && method != "PUT") return UsageError("--body needs --method POST or PUT", json);
  std::vector<int> affinity;
  if (vm.count("affinity")) {
    Result<std::vector<int>> cpus = ParseCpuList(affinity_text);
    if (!cpus.ok()) return UsageError("-a/--affinity: " + cpus.status().message(), json);
    affinity = *cpus;
  }
  if (connections > requests) connections = static_cast<int>(requests);
  if (threads > connections) threads = connections;

  Result<http::Url> url = http::ParseUrl(url_text);
  if (!url.ok()) return UsageError(url.status().ToString(), json);
  http::Headers extra;
  for (const auto& h : header_args) {
    size_t colon = h.find(':');
    if (colon == std::string::npos || colon == 0) return UsageError("bad -H '" + h + "' (want 'Name: value')", json);
    std::string value = h.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    extra.Add(h.substr(0, colon), value);
  }
  Result<http::SocketAddress> address = http::ResolveHost(url->host, url->port);
  if (!address.ok()) return StartFailure(url_text, address.status().ToString(), "resolve", json);

  try {
    Config config;
    config.address = *address;
    config.keep_alive = keep_alive;
    config.head_method = method == "HEAD";
    if (method == "POST" || method == "PUT") extra.Add("Content-Length", std::to_string(body.size()));
    config.request = http::BuildRequest(method, *url, extra, keep_alive, "canopy-load/0.1") + body;
    config.timeout_ns = static_cast<uint64_t>(timeout_s * 1e9);
    if (!json) {
      std::printf("load: %s  %s c=%d t=%d keep-alive=%s\n", url_text.c_str(),
                  by_time ? fmt::format("d={:g}s", duration_s).c_str()
                          : fmt::format("n={}", static_cast<long long>(requests)).c_str(),
                  connections, threads, keep_alive ? "yes" : "no");
      if (!affinity.empty()) std::printf("threads pinned to CPUs %s (round robin)\n", FormatCpuList(affinity).c_str());
      std::fflush(stdout);
    }
    auto start = Clock::now();
    config.measure_start = start + std::chrono::nanoseconds(static_cast<int64_t>(warmup_s * 1e9));
    config.end = config.measure_start + std::chrono::nanoseconds(static_cast<int64_t>(duration_s * 1e9));
    CpuTimes cpu_start = ProcessCpu();

    std::atomic<int64_t> budget{requests};
    std::vector<std::unique_ptr<Worker>> workers;
    for (int t = 0; t < threads; ++t) {
      int share = connections / threads + (t < connections % threads ? 1 : 0);
      std::vector<int> cpus;
      if (!affinity.empty()) cpus.push_back(affinity[static_cast<size_t>(t) % affinity.size()]);
      workers.push_back(std::make_unique<Worker>(config, &budget, share, std::move(cpus)));
    }
    std::mutex mu;
    std::condition_variable finished_cv;
    int finished = 0;
    std::vector<std::thread> pool;
    for (auto& w : workers) {
      pool.emplace_back([&w, &mu, &finished, &finished_cv] {
        w->Run();
        std::lock_guard<std::mutex> lock(mu);
        ++finished;
        finished_cv.notify_all();
      });
    }
    auto all_done = [&] { return finished == threads; };

    // The measured part starts at measure_start: CPU is counted from there.
    {
      std::unique_lock<std::mutex> lock(mu);
      if (warmup_s > 0 && !finished_cv.wait_until(lock, config.measure_start, all_done)) {
        lock.unlock();
        cpu_start = ProcessCpu();
      }
    }
    auto since_start = [&](Clock::time_point t) {
      return std::max(0.0, std::chrono::duration<double>(t - config.measure_start).count());
    };
    // Interval reports: sample the workers' live counts at each boundary.
    std::vector<Interval> intervals;
    Interval sampled;  // cumulative counts at the last boundary (start/end unused)
    double last_end = 0;
    if (interval_s > 0) {
      auto step = std::chrono::nanoseconds(static_cast<int64_t>(interval_s * 1e9));
      auto next = config.measure_start + step;
      for (;;) {
        {
          std::unique_lock<std::mutex> lock(mu);
          if (finished_cv.wait_until(lock, next, all_done)) break;
        }
        Interval now_counts;
        for (auto& w : workers) {
          now_counts.requests += w->live().completed.load(std::memory_order_relaxed);
          now_counts.bytes += w->live().bytes.load(std::memory_order_relaxed);
          now_counts.errors += w->live().errors.load(std::memory_order_relaxed);
        }
        Interval iv;
        iv.start = last_end;
        iv.end = since_start(Clock::now());
        iv.requests = now_counts.requests - sampled.requests;
        iv.bytes = now_counts.bytes - sampled.bytes;
        iv.errors = now_counts.errors - sampled.errors;
        sampled = now_counts;
        last_end = iv.end;
        intervals.push_back(iv);
        if (!json) PrintInterval(iv);
        next += step;
      }
    }
    for (auto& t : pool) t.join();
    auto stop = Clock::now();
    CpuTimes cpu_end = ProcessCpu();
    double secs = since_start(stop);

    Tally total;
    std::string pin_error;
    std::vector<int> pinned;  // per thread, read back after pinning
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
      total.warmup_completed += t.warmup_completed;
      total.warmup_errors += t.warmup_errors;
      if (!w->pin_error().empty()) pin_error = w->pin_error();
      if (!w->pinned_cpus().empty()) pinned.push_back(w->pinned_cpus().front());
    }
    if (interval_s > 0) {
      // The last, partial interval: the rest up to the end, so the intervals add up to the totals.
      Interval iv;
      iv.start = last_end;
      iv.end = std::max(last_end, secs);
      iv.requests = total.completed - sampled.requests;
      iv.bytes = total.bytes - sampled.bytes;
      iv.errors = total.connect_errors + total.io_errors + total.timeouts + total.protocol_errors - sampled.errors;
      if (iv.requests > 0 || iv.bytes > 0 || iv.errors > 0 || iv.seconds() >= 0.001) {
        intervals.push_back(iv);
        if (!json) PrintInterval(iv);
      }
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
    double cpu_user_pct = secs > 0 ? std::max(0.0, cpu_end.user_s - cpu_start.user_s) / secs * 100 : 0;
    double cpu_sys_pct = secs > 0 ? std::max(0.0, cpu_end.sys_s - cpu_start.sys_s) / secs * 100 : 0;

    // The outcome: the largest error class names the failure, then the -d cap.
    std::string error, error_code;
    if (!pin_error.empty()) {
      error = "-a/--affinity: " + pin_error;
      error_code = "affinity";
    } else if (errors > 0) {
      std::pair<uint64_t, const char*> classes[] = {{total.connect_errors, "connect"},
                                                    {total.timeouts, "timeout"},
                                                    {total.io_errors, "io"},
                                                    {total.protocol_errors, "protocol"}};
      auto worst = std::max_element(std::begin(classes), std::end(classes),
                                    [](const auto& a, const auto& b) { return a.first < b.first; });
      error_code = worst->second;
      error = fmt::format("{} of {} measured requests failed (connect {}, timeout {}, io {}, protocol {})", errors,
                          total.completed + errors, total.connect_errors, total.timeouts, total.io_errors,
                          total.protocol_errors);
    } else if (time_capped && !by_time) {
      error_code = "duration";
      error = fmt::format("stopped by --duration {} s after {} of {} requests", duration_s, total.completed,
                          requests);
    }
    bool ok = error_code.empty();

    if (json) {
      nlohmann::json codes = nlohmann::json::object();
      for (auto [code, n] : total.status_counts) codes[std::to_string(code)] = n;
      nlohmann::json iv_json = nlohmann::json::array();
      for (const Interval& iv : intervals) {
        iv_json.push_back({{"start", iv.start}, {"end", iv.end}, {"seconds", iv.seconds()},
                           {"requests", iv.requests}, {"bytes", iv.bytes}, {"errors", iv.errors},
                           {"requests_per_s", iv.rps()}, {"gbit_per_s", iv.gbps()}});
      }
      nlohmann::json j = {
          {"ok", ok}, {"tool", "load"},
          {"url", url_text}, {"requests", by_time ? nlohmann::json(nullptr) : nlohmann::json(requests)}, {"connections", connections}, {"threads", threads},
          {"keep_alive", keep_alive}, {"completed", total.completed}, {"ok_2xx", ok_2xx},
          {"status_codes", codes},
          {"errors", {{"total", errors}, {"connect", total.connect_errors}, {"io", total.io_errors},
                      {"timeout", total.timeouts}, {"protocol", total.protocol_errors}}},
          {"unfinished", total.unfinished}, {"time_capped", time_capped},
          {"connections_opened", total.connections_opened}, {"seconds", secs}, {"requests_per_s", rps},
          {"bytes", total.bytes}, {"gbit_per_s", gbps},
          {"latency_ms", {{"p50", p50}, {"p99", p99}, {"max", pmax}, {"mean", ms(mean_ns)}}},
          {"duration_limit_s", duration_s},
          {"warmup", {{"seconds", warmup_s}, {"requests", total.warmup_completed}, {"errors", total.warmup_errors}}},
          {"interval_seconds", interval_s > 0 ? nlohmann::json(interval_s) : nlohmann::json(nullptr)},
          {"intervals", iv_json},
          {"affinity", affinity.empty() ? nlohmann::json(nullptr) : nlohmann::json(pinned)},
          {"cpu_utilization", {{"total_pct", cpu_user_pct + cpu_sys_pct}, {"user_pct", cpu_user_pct},
                               {"sys_pct", cpu_sys_pct}, {"wall_seconds", secs}}},
          {"units", {{"gbit_per_s", kGbpsUnit}, {"latency_ms", "milliseconds"}, {"seconds", "seconds"},
                     {"bytes", "bytes (response heads + bodies)"},
                     {"cpu", "% of one core (user + system time of load over the measured part)"}}}};
      if (!ok) {
        j["error"] = error;
        j["error_code"] = error_code;
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      if (warmup_s > 0) {
        std::printf("warm-up: %.3f s, %llu requests and %llu errors (left out below)\n", warmup_s,
                    static_cast<unsigned long long>(total.warmup_completed),
                    static_cast<unsigned long long>(total.warmup_errors));
      }
      std::printf("finished in %.3f s, %.0f req/s, %.3f Gbit/s (decimal, 10^9 bit/s; %llu bytes received)\n", secs,
                  rps, gbps, static_cast<unsigned long long>(total.bytes));
      std::printf("requests: %llu completed, %llu 2xx, %llu errors (connect %llu, io %llu, timeout %llu, protocol %llu)%s\n",
                  static_cast<unsigned long long>(total.completed), static_cast<unsigned long long>(ok_2xx),
                  static_cast<unsigned long long>(errors), static_cast<unsigned long long>(total.connect_errors),
                  static_cast<unsigned long long>(total.io_errors), static_cast<unsigned long long>(total.timeouts),
                  static_cast<unsigned long long>(total.protocol_errors), time_capped ? " [stopped by --duration]" : "");
      std::string code_text;
      for (auto [code, n] : total.status_counts) code_text += fmt::format(" {}:{}", code, n);
      std::printf("status codes:%s\n", code_text.empty() ? " none" : code_text.c_str());
      std::printf("latency: p50 %.3f ms, p99 %.3f ms, max %.3f ms, mean %.3f ms\n", p50, p99, pmax, ms(mean_ns));
      std::printf("cpu: %.1f%% of one core (user %.1f%%, sys %.1f%%)\n", cpu_user_pct + cpu_sys_pct, cpu_user_pct,
                  cpu_sys_pct);
    }
    if (!ok) std::fprintf(stderr, "load: %s\n", error.c_str());
    return ok ? kExitOk : kExitFailed;
  } catch (const std::exception& e) {
    // Not expected (errors are counted above); keep stdout one JSON document anyway.
    return StartFailure(url_text, e.what(), "internal", json);
  }
}
