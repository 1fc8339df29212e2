#include "tools/bench/perftest.h"

#include "tools/bench/one_sided.h"

#include "base/units.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "base/coding.h"
#include "base/logging.h"
#include "base/metrics.h"
#include "fmt/format.h"
#include "transport/auth.h"
#include "transport/connection_server.h"
#include "transport/registry.h"

namespace canopy::bench {
namespace {

using transport::BulkSink;
using transport::BulkSource;
using transport::Connection;

constexpr uint64_t kRoundBytes = 16ull << 20;
constexpr uint32_t kMaxBurst = 4096;
constexpr uint32_t kBurstLimit = 1u << 20;  // decoder bound

Status CheckVersion(ByteReader& reader, std::string_view what) {
  CANOPY_ASSIGN_OR_RETURN(uint8_t version, reader.ReadFixed8());
  if (version != kProtocolVersion) {
    return Status::Corruption(fmt::format("{}: bench protocol version {} not supported (this is version {})", what,
                                          version, kProtocolVersion));
  }
  return Status::Ok();
}

Status CheckEnd(const ByteReader& reader, std::string_view what) {
  if (!reader.empty()) return Status::Corruption(fmt::format("{}: {} trailing bytes", what, reader.remaining()));
  return Status::Ok();
}

uint32_t BurstFor(uint64_t size) {
  uint64_t burst = (kRoundBytes + size - 1) / size;
  return static_cast<uint32_t>(std::clamp<uint64_t>(burst, 1, kMaxBurst));
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The shared handshake on bench's wire: refusals are ERROR texts. The server
// sends none from the handshake itself (it reports the failure with ERROR
// and drains, like any other), the client does.
class BenchAuthWire final : public transport::BasicAuthWire {
 public:
  explicit BenchAuthWire(bool send_refusals) : BasicAuthWire(kMsgAuthFirst), send_refusals_(send_refusals) {}
  void SendRefusal(Connection& conn, const Status& why) override {
    if (send_refusals_) (void)conn.Send(kMsgError, why.ToString());
  }
  Status Unexpected(const transport::Message& message, Step expected) override {
    if (message.type == kMsgError) return Status::PermissionDenied("refused by the server: " + message.payload);
    return BasicAuthWire::Unexpected(message, expected);
  }

 private:
  const bool send_refusals_;
};

Status OpenServerRefusal() {
  return Status::PermissionDenied(
      "this bench server is open (started without --secret-file) and does not authenticate; give it the same "
      "--secret-file, or drop it on the client");
}

// Receives the next message and checks its type; the server's kMsgError
// becomes Aborted with its text.
Result<transport::Message> Expect(Connection& conn, uint16_t type, Deadline deadline, std::string_view what) {
  auto m = conn.Receive(deadline);
  if (!m.ok()) return m.status().WithContext(fmt::format("waiting for {}", what));
  if (m->type == kMsgError) return Status::Aborted("server: " + m->payload);
  if (m->type != type) {
    return Status::Corruption(fmt::format("expected {} (0x{:04x}), got message type 0x{:04x}", what, type, m->type));
  }
  return m;
}

struct CpuSnapshot {
  double user = 0;  // seconds
  double sys = 0;
  Clock::time_point wall;
};

CpuSnapshot TakeCpu() {
  CpuSnapshot snap;
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) {
    snap.user = static_cast<double>(ru.ru_utime.tv_sec) + static_cast<double>(ru.ru_utime.tv_usec) / 1e6;
    snap.sys = static_cast<double>(ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_stime.tv_usec) / 1e6;
  }
  snap.wall = Clock::now();
  return snap;
}

CpuUsage MakeCpu(double user_s, double sys_s, double wall_s) {
  CpuUsage cpu;
  cpu.wall_seconds = wall_s;
  if (wall_s > 0) {
    cpu.user_pct = std::max(0.0, user_s) / wall_s * 100;
    cpu.sys_pct = std::max(0.0, sys_s) / wall_s * 100;
    cpu.total_pct = cpu.user_pct + cpu.sys_pct;
  }
  return cpu;
}

CpuUsage CpuSince(const CpuSnapshot& from) {
  CpuSnapshot now = TakeCpu();
  return MakeCpu(now.user - from.user, now.sys - from.sys, Seconds(now.wall - from.wall));
}

CpuUsage RemoteCpu(const DoneCounts& done) {
  return MakeCpu(static_cast<double>(done.cpu_user_us) / 1e6, static_cast<double>(done.cpu_sys_us) / 1e6,
                 static_cast<double>(done.wall_us) / 1e6);
}

uint64_t Micros(double seconds) { return seconds > 0 ? static_cast<uint64_t>(std::llround(seconds * 1e6)) : 0; }

// Sends rounds of `burst` DATA messages from its own thread, one round per
// Post(), so that its owner can keep receiving meanwhile (reverse and bidir
// tests). `buffer` must outlive it and stay unchanged.
class RoundSender {
 public:
  RoundSender(Connection& conn, const std::string& buffer, bool bulk, uint32_t burst)
      : conn_(conn), buffer_(buffer), bulk_(bulk), burst_(burst), thread_([this] { Loop(); }) {}
  ~RoundSender() { (void)Stop(); }
  RoundSender(const RoundSender&) = delete;
  RoundSender& operator=(const RoundSender&) = delete;

  void Post() {
    std::lock_guard<std::mutex> lock(mu_);
    ++pending_;
    cv_.notify_all();
  }
  // Ends the thread after the message in progress (rounds not yet sent are
  // dropped) and returns the first send error. Idempotent.
  Status Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  uint64_t messages_sent() const { return sent_.load(); }

 private:
  void Loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || pending_ > 0; });
        if (stop_) return;
        --pending_;
      }
      for (uint32_t i = 0; i < burst_; ++i) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (stop_) return;
        }
        Status s = bulk_ ? conn_.SendWithBulk(kMsgData, "", BulkSource::FromMemory(buffer_))
                         : conn_.Send(kMsgData, buffer_);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu_);
          status_ = s;
          return;
        }
        sent_.fetch_add(1);
      }
    }
  }

  Connection& conn_;
  const std::string& buffer_;
  const bool bulk_;
  const uint32_t burst_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t pending_ = 0;
  bool stop_ = false;
  Status status_;
  std::atomic<uint64_t> sent_{0};
  std::thread thread_;  // last: starts once everything above is built
};

// Checks that `m` is a DATA message of `size` bytes and consumes its bulk
// bytes into `scratch` (at least `size` bytes).
Status ConsumeData(Connection& conn, const transport::Message& m, uint64_t size, bool bulk, char* scratch,
                   Deadline deadline) {
  if (m.type != kMsgData) {
    return Status::Corruption(fmt::format("expected DATA (0x{:04x}), got message type 0x{:04x}", kMsgData, m.type));
  }
  uint64_t got = bulk ? m.bulk_bytes : m.payload.size();
  if (got != size || (bulk ? !m.payload.empty() : m.bulk_bytes != 0)) {
    return Status::Corruption(fmt::format("message of {} bytes in a test of {} byte messages", got, size));
  }
  if (bulk) return conn.ReceiveBulk(BulkSink::ToMemory(scratch), m.bulk_bytes, deadline);
  return Status::Ok();
}

struct RoundTimes {
  double forward = 0;  // to the ACK (forward, bidir)
  double reverse = 0;  // to the last DATA received (reverse, bidir)
  double round = 0;    // until both are done
};

class SizeRunner {
 public:
  SizeRunner(Connection& conn, const SweepOptions& options) : conn_(conn), o_(options) {}

  Status Bandwidth(uint64_t size, SizeResult* r) {
    const Direction dir = o_.direction;
    BeginTest begin{TestKind::kBandwidth, size, BurstFor(size), o_.bulk, dir};
    CANOPY_RETURN_IF_ERROR(Begin(begin));
    buffer_.assign(size, 'b');
    reply_.resize(size);
    r->direction = dir;
    r->bw_burst = begin.burst;
    rounds_ahead_ = 0;
    const bool sends = dir != Direction::kReverse;
    const bool receives = dir != Direction::kForward;
    std::unique_ptr<RoundSender> sender;
    if (dir == Direction::kBidir) sender = std::make_unique<RoundSender>(conn_, buffer_, o_.bulk, begin.burst);
    uint64_t rounds_run = 0;
    for (uint64_t i = 0; i < o_.warmup; ++i, ++rounds_run) CANOPY_RETURN_IF_ERROR(Round(begin, sender.get()).status());
    if (o_.omit.count() > 0) {
      Clock::time_point omit_start = Clock::now();
      while (Clock::now() - omit_start < o_.omit) {
        CANOPY_RETURN_IF_ERROR(Round(begin, sender.get()).status());
        ++rounds_run;
        ++r->bw_omitted_rounds;
      }
    }
    CANOPY_RETURN_IF_ERROR(conn_.Send(kMsgMeasure, ""));
    CpuSnapshot cpu = TakeCpu();
    const uint64_t round_bytes = size * begin.burst;
    const double interval = o_.interval.count();
    IntervalResult current;
    double total = 0;
    Clock::time_point start = Clock::now();
    for (;;) {
      CANOPY_ASSIGN_OR_RETURN(RoundTimes t, Round(begin, sender.get()));
      ++r->bw_iterations;
      ++rounds_run;
      total += t.round;
      auto account = [&](DirectionResult& d, double seconds) {
        d.messages += begin.burst;
        d.bytes += round_bytes;
        d.seconds += seconds;
        if (seconds > 0) d.peak_gbps = std::max(d.peak_gbps, static_cast<double>(round_bytes) * 8 / seconds / 1e9);
      };
      if (sends) account(r->forward, t.forward);
      if (receives) account(r->reverse, t.reverse);
      const uint64_t moved = round_bytes * ((sends ? 1 : 0) + (receives ? 1 : 0));
      double gbps = t.round > 0 ? static_cast<double>(moved) * 8 / t.round / 1e9 : 0;
      r->bw_peak_gbps = std::max(r->bw_peak_gbps, gbps);
      const double elapsed = Seconds(Clock::now() - start);
      const bool done = r->bw_iterations >= std::max<uint64_t>(o_.iterations, 1) ||
                        (o_.bytes_limit > 0 && (sends ? r->forward.bytes : r->reverse.bytes) >= o_.bytes_limit) ||
                        elapsed >= o_.time_per_size.count();
      if (interval > 0) {
        current.bytes += moved;
        if (sends) current.forward_bytes += round_bytes;
        if (receives) current.reverse_bytes += round_bytes;
        if (elapsed >= current.start + interval || done) {
          current.end = elapsed;
          current.gbps = current.end > current.start
                             ? static_cast<double>(current.bytes) * 8 / (current.end - current.start) / 1e9
                             : 0;
          r->intervals.push_back(current);
          if (o_.on_interval) o_.on_interval(size, current);
          current = IntervalResult{};
          current.start = elapsed;
        }
      }
      if (done) break;
    }
    r->bw_cpu_local = CpuSince(cpu);
    if (sender) CANOPY_RETURN_IF_ERROR(sender->Stop());
    CANOPY_ASSIGN_OR_RETURN(uint64_t drained, DrainRoundAhead());
    rounds_run += drained;
    for (DirectionResult* d : {&r->forward, &r->reverse}) {
      d->avg_gbps = d->seconds > 0 ? static_cast<double>(d->bytes) * 8 / d->seconds / 1e9 : 0;
    }
    r->bw_messages = r->forward.messages + r->reverse.messages;
    r->bw_bytes = r->forward.bytes + r->reverse.bytes;
    r->bw_seconds = total;
    r->bw_avg_gbps = total > 0 ? static_cast<double>(r->bw_bytes) * 8 / total / 1e9 : 0;
    r->msg_rate_mmps = total > 0 ? static_cast<double>(r->bw_messages) / total / 1e6 : 0;
    DoneCounts expected;
    if (sends) expected.messages = rounds_run * begin.burst;
    if (receives) expected.messages_sent = rounds_run * begin.burst;
    expected.bytes = expected.messages * size;
    expected.bytes_sent = expected.messages_sent * size;
    CANOPY_ASSIGN_OR_RETURN(DoneCounts done, End(expected));
    r->bw_cpu_remote = RemoteCpu(done);
    r->remote_affinity = done.affinity;
    return Status::Ok();
  }

  Status Latency(uint64_t size, SizeResult* r) {
    if (o_.one_sided) return OneSidedLatency(size, r);
    BeginTest begin{TestKind::kLatency, size, 1, o_.bulk, Direction::kForward};
    CANOPY_RETURN_IF_ERROR(Begin(begin));
    buffer_.assign(size, 'p');
    reply_.resize(size);
    uint64_t pings = 0;
    for (uint64_t i = 0; i < o_.warmup; ++i, ++pings) CANOPY_RETURN_IF_ERROR(Ping(begin).status());
    if (o_.omit.count() > 0) {
      Clock::time_point omit_start = Clock::now();
      while (Clock::now() - omit_start < o_.omit) {
        CANOPY_RETURN_IF_ERROR(Ping(begin).status());
        ++pings;
        ++r->lat_omitted;
      }
    }
    CANOPY_RETURN_IF_ERROR(conn_.Send(kMsgMeasure, ""));
    CpuSnapshot cpu = TakeCpu();
    std::vector<double> samples;
    Clock::time_point start = Clock::now();
    while (samples.size() < std::max<uint64_t>(o_.iterations, 1)) {
      CANOPY_ASSIGN_OR_RETURN(double seconds, Ping(begin));
      samples.push_back(seconds * 1e6);
      if (Clock::now() - start >= o_.time_per_size) break;
    }
    r->lat_cpu_local = CpuSince(cpu);
    r->lat_iterations = samples.size();
    double sum = 0;
    for (double s : samples) sum += s;
    r->lat_avg_us = sum / static_cast<double>(samples.size());
    r->lat_min_us = *std::min_element(samples.begin(), samples.end());
    r->lat_max_us = *std::max_element(samples.begin(), samples.end());
    r->lat_p50_us = Percentile(samples, 50);
    r->lat_p99_us = Percentile(samples, 99);
    pings += r->lat_iterations;
    DoneCounts expected;
    expected.messages = pings;
    expected.bytes = pings * size;
    CANOPY_ASSIGN_OR_RETURN(DoneCounts done, End(expected));
    r->lat_cpu_remote = RemoteCpu(done);
    r->remote_affinity = done.affinity;
    return Status::Ok();
  }

 private:
  Deadline IoDeadline() const { return Deadline::After(o_.transport.io_timeout); }

  // The latency test over the one-sided log ring (one_sided.h).
  Status OneSidedLatency(uint64_t size, SizeResult* r) {
    OneSidedLatencyOptions ring;
    ring.size = size;
    ring.warmup = o_.warmup;
    ring.iterations = o_.iterations;
    ring.time_limit = o_.time_per_size;
    ring.io_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(o_.transport.io_timeout);
    CpuSnapshot cpu = TakeCpu();
    CANOPY_ASSIGN_OR_RETURN(std::vector<double> samples, RunOneSidedLatency(conn_, ring));
    r->lat_cpu_local = CpuSince(cpu);
    r->lat_iterations = samples.size();
    double sum = 0;
    for (double s : samples) sum += s;
    r->lat_avg_us = sum / static_cast<double>(samples.size());
    r->lat_min_us = *std::min_element(samples.begin(), samples.end());
    r->lat_max_us = *std::max_element(samples.begin(), samples.end());
    r->lat_p50_us = Percentile(samples, 50);
    r->lat_p99_us = Percentile(samples, 99);
    return Status::Ok();
  }

  Status Begin(const BeginTest& begin) {
    CANOPY_RETURN_IF_ERROR(conn_.Send(kMsgBegin, EncodeBegin(begin)));
    Status s = Expect(conn_, kMsgReady, IoDeadline(), "READY").status();
    if (!s.ok() && s.message().find("bench protocol version") != std::string::npos) {
      return Status(s.code(), s.message() + " (client and server are different bench builds; use the same on both)");
    }
    return s;
  }

  // Only the counts of `expected` are compared.
  Result<DoneCounts> End(const DoneCounts& expected) {
    CANOPY_RETURN_IF_ERROR(conn_.Send(kMsgEnd, ""));
    CANOPY_ASSIGN_OR_RETURN(transport::Message m, Expect(conn_, kMsgDone, IoDeadline(), "DONE"));
    CANOPY_ASSIGN_OR_RETURN(DoneCounts done, DecodeDone(m.payload));
    if (done.messages != expected.messages || done.bytes != expected.bytes) {
      return Status::Corruption(fmt::format("server counted {} messages / {} bytes, client sent {} / {}",
                                            done.messages, done.bytes, expected.messages, expected.bytes));
    }
    if (done.messages_sent != expected.messages_sent || done.bytes_sent != expected.bytes_sent) {
      return Status::Corruption(fmt::format("server sent {} messages / {} bytes, client received {} / {}",
                                            done.messages_sent, done.bytes_sent, expected.messages_sent,
                                            expected.bytes_sent));
    }
    return done;
  }

  Status SendOne(uint16_t type, const BeginTest& begin) {
    if (begin.bulk) return conn_.SendWithBulk(type, "", BulkSource::FromMemory(buffer_));
    return conn_.Send(type, buffer_);
  }

  Result<transport::Message> Next(std::string_view what) {
    auto m = conn_.Receive(IoDeadline());
    if (!m.ok()) return m.status().WithContext(fmt::format("waiting for {}", what));
    if (m->type == kMsgError) return Status::Aborted("server: " + m->payload);
    return m;
  }

  Result<RoundTimes> Round(const BeginTest& begin, RoundSender* sender) {
    RoundTimes t;
    Clock::time_point t0 = Clock::now();
    switch (begin.direction) {
      case Direction::kForward: {
        // One round stays in flight ahead of the one being acknowledged (as
        // perftest keeps its send queue full), so the pipe does not drain
        // between rounds: a round's time runs from the previous ACK (or, for
        // the first, from its first send) to its own ACK.
        if (rounds_ahead_ == 0) {
          for (uint32_t i = 0; i < begin.burst; ++i) CANOPY_RETURN_IF_ERROR(SendOne(kMsgData, begin));
          last_ack_ = t0;
          rounds_ahead_ = 1;
        }
        for (uint32_t i = 0; i < begin.burst; ++i) CANOPY_RETURN_IF_ERROR(SendOne(kMsgData, begin));
        CANOPY_RETURN_IF_ERROR(Expect(conn_, kMsgAck, IoDeadline(), "ACK").status());
        Clock::time_point now = Clock::now();
        t.forward = t.round = Seconds(now - last_ack_);
        last_ack_ = now;
        return t;
      }
      case Direction::kReverse:
        CANOPY_RETURN_IF_ERROR(conn_.Send(kMsgPull, ""));
        for (uint32_t i = 0; i < begin.burst; ++i) {
          CANOPY_ASSIGN_OR_RETURN(transport::Message m, Next("DATA"));
          CANOPY_RETURN_IF_ERROR(ConsumeData(conn_, m, begin.size, begin.bulk, reply_.data(), IoDeadline()));
        }
        t.reverse = t.round = Seconds(Clock::now() - t0);
        return t;
      case Direction::kBidir: {
        CANOPY_RETURN_IF_ERROR(conn_.Send(kMsgPull, ""));
        sender->Post();
        bool acked = false;
        uint32_t received = 0;
        while (!acked || received < begin.burst) {
          CANOPY_ASSIGN_OR_RETURN(transport::Message m, Next(acked ? "DATA" : "ACK or DATA"));
          if (m.type == kMsgAck && !acked) {
            acked = true;
            t.forward = Seconds(Clock::now() - t0);
            continue;
          }
          if (received == begin.burst && m.type == kMsgData) {
            return Status::Corruption(fmt::format("more than {} DATA in a round", begin.burst));
          }
          CANOPY_RETURN_IF_ERROR(ConsumeData(conn_, m, begin.size, begin.bulk, reply_.data(), IoDeadline()));
          if (++received == begin.burst) t.reverse = Seconds(Clock::now() - t0);
        }
        t.round = std::max(t.forward, t.reverse);
        return t;
      }
    }
    return Status::Internal("unknown direction");
  }

  Result<double> Ping(const BeginTest& begin) {
    Clock::time_point t0 = Clock::now();
    CANOPY_RETURN_IF_ERROR(SendOne(kMsgPing, begin));
    CANOPY_ASSIGN_OR_RETURN(transport::Message m, Expect(conn_, kMsgPong, IoDeadline(), "PONG"));
    if (begin.bulk) {
      if (m.bulk_bytes != begin.size || !m.payload.empty()) {
        return Status::Corruption(fmt::format("PONG carried {} bulk bytes, expected {}", m.bulk_bytes, begin.size));
      }
      CANOPY_RETURN_IF_ERROR(conn_.ReceiveBulk(BulkSink::ToMemory(reply_.data()), m.bulk_bytes, IoDeadline()));
    } else if (m.payload.size() != begin.size || m.bulk_bytes != 0) {
      return Status::Corruption(fmt::format("PONG of {} bytes, expected {}", m.payload.size(), begin.size));
    }
    return Seconds(Clock::now() - t0);
  }

  // Forward bandwidth: waits for the ACK of the round still in flight after
  // the last measured one (its bytes are sent but in no figure). Returns how
  // many rounds that was (0 or 1).
  Result<uint64_t> DrainRoundAhead() {
    const uint64_t drained = rounds_ahead_;
    if (rounds_ahead_ > 0) {
      CANOPY_RETURN_IF_ERROR(Expect(conn_, kMsgAck, IoDeadline(), "ACK").status());
      rounds_ahead_ = 0;
    }
    return drained;
  }

  Connection& conn_;
  const SweepOptions& o_;
  std::string buffer_;
  std::string reply_;
  uint64_t rounds_ahead_ = 0;     // forward rounds sent whose ACK has not been read yet
  Clock::time_point last_ack_{};  // when the last forward ACK arrived
};

}  // namespace

std::string_view DirectionName(Direction d) {
  switch (d) {
    case Direction::kForward: return "forward";
    case Direction::kReverse: return "reverse";
    case Direction::kBidir: return "bidir";
  }
  return "unknown";
}

std::string EncodeBegin(const BeginTest& begin) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutFixed8(&out, static_cast<uint8_t>(begin.kind));
  PutFixed64(&out, begin.size);
  PutFixed32(&out, begin.burst);
  PutFixed8(&out, begin.bulk ? 1 : 0);
  PutFixed8(&out, static_cast<uint8_t>(begin.direction));
  return out;
}

Result<BeginTest> DecodeBegin(std::string_view payload) {
  ByteReader reader(payload);
  CANOPY_RETURN_IF_ERROR(CheckVersion(reader, "BEGIN"));
  BeginTest begin;
  CANOPY_ASSIGN_OR_RETURN(uint8_t kind, reader.ReadFixed8());
  CANOPY_ASSIGN_OR_RETURN(begin.size, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(begin.burst, reader.ReadFixed32());
  CANOPY_ASSIGN_OR_RETURN(uint8_t bulk, reader.ReadFixed8());
  CANOPY_ASSIGN_OR_RETURN(uint8_t direction, reader.ReadFixed8());
  CANOPY_RETURN_IF_ERROR(CheckEnd(reader, "BEGIN"));
  if (kind != static_cast<uint8_t>(TestKind::kBandwidth) && kind != static_cast<uint8_t>(TestKind::kLatency)) {
    return Status::Corruption(fmt::format("BEGIN: unknown test kind {}", kind));
  }
  begin.kind = static_cast<TestKind>(kind);
  if (begin.size == 0 || begin.size > kMaxMessageSize) {
    return Status::Corruption(fmt::format("BEGIN: message size {} outside 1..{}", begin.size, kMaxMessageSize));
  }
  if (begin.burst == 0 || begin.burst > kBurstLimit) {
    return Status::Corruption(fmt::format("BEGIN: burst {} outside 1..{}", begin.burst, kBurstLimit));
  }
  if (bulk > 1) return Status::Corruption(fmt::format("BEGIN: bad bulk flag {}", bulk));
  begin.bulk = bulk == 1;
  if (direction < static_cast<uint8_t>(Direction::kForward) || direction > static_cast<uint8_t>(Direction::kBidir)) {
    return Status::Corruption(fmt::format("BEGIN: unknown direction {}", direction));
  }
  begin.direction = static_cast<Direction>(direction);
  if (begin.kind == TestKind::kLatency && begin.direction != Direction::kForward) {
    return Status::Corruption("BEGIN: a latency test is always forward");
  }
  return begin;
}

std::string EncodeDone(const DoneCounts& done) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutFixed64(&out, done.messages);
  PutFixed64(&out, done.bytes);
  PutFixed64(&out, done.messages_sent);
  PutFixed64(&out, done.bytes_sent);
  PutFixed64(&out, done.cpu_user_us);
  PutFixed64(&out, done.cpu_sys_us);
  PutFixed64(&out, done.wall_us);
  PutFixed32(&out, static_cast<uint32_t>(done.affinity));
  return out;
}

Result<DoneCounts> DecodeDone(std::string_view payload) {
  ByteReader reader(payload);
  CANOPY_RETURN_IF_ERROR(CheckVersion(reader, "DONE"));
  DoneCounts done;
  CANOPY_ASSIGN_OR_RETURN(done.messages, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(done.bytes, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(done.messages_sent, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(done.bytes_sent, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(done.cpu_user_us, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(done.cpu_sys_us, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(done.wall_us, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(uint32_t affinity, reader.ReadFixed32());
  CANOPY_RETURN_IF_ERROR(CheckEnd(reader, "DONE"));
  done.affinity = static_cast<int32_t>(affinity);
  if (done.affinity < -1) return Status::Corruption(fmt::format("DONE: bad affinity {}", done.affinity));
  return done;
}

Status PinToCpu(int cpu) {
  long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
  if (cpu < 0 || cpu >= CPU_SETSIZE || (cpus > 0 && cpu >= cpus)) {
    return Status::InvalidArgument(fmt::format("CPU {} outside 0..{}", cpu, cpus > 0 ? cpus - 1 : CPU_SETSIZE - 1));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
    int err = errno;
    return Status::InvalidArgument(fmt::format("sched_setaffinity(CPU {}): {}", cpu, std::strerror(err)));
  }
  return Status::Ok();
}

Result<std::vector<uint64_t>> PowerOfTwoSizes(uint64_t min, uint64_t max) {
  if (min == 0) return Status::InvalidArgument("smallest size must be at least 1 byte");
  if (min > max) return Status::InvalidArgument(fmt::format("size range {}:{} is empty (min > max)", min, max));
  uint64_t p = 1;
  while (p < min) p <<= 1;
  std::vector<uint64_t> sizes;
  for (; p <= max && p != 0; p <<= 1) sizes.push_back(p);
  if (sizes.empty()) return Status::InvalidArgument(fmt::format("no power of two between {} and {}", min, max));
  return sizes;
}

Result<std::vector<uint64_t>> ParseSizeRange(std::string_view text) {
  size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    return Status::InvalidArgument(fmt::format("bad size range '{}': expected MIN:MAX, e.g. 2:8M", text));
  }
  CANOPY_ASSIGN_OR_RETURN(uint64_t min, ParseByteSize(text.substr(0, colon)));
  CANOPY_ASSIGN_OR_RETURN(uint64_t max, ParseByteSize(text.substr(colon + 1)));
  return PowerOfTwoSizes(min, max);
}

double Percentile(std::vector<double>& values, double percent) {
  if (values.empty()) return 0;
  double rank = std::ceil(percent / 100.0 * static_cast<double>(values.size()));
  size_t index = rank < 1 ? 0 : std::min(values.size() - 1, static_cast<size_t>(rank) - 1);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(index), values.end());
  return values[index];
}

Result<std::vector<SizeResult>> RunSweep(const SweepOptions& options,
                                         const std::function<void(const SizeResult&)>& on_result) {
  if (options.sizes.empty()) return Status::InvalidArgument("no message sizes to test");
  for (uint64_t size : options.sizes) {
    if (size == 0 || size > kMaxMessageSize || size > options.transport.max_message_bytes) {
      return Status::InvalidArgument(fmt::format("message size {} outside 1..{}", size,
                                                 std::min<uint64_t>(kMaxMessageSize, options.transport.max_message_bytes)));
    }
  }
  CANOPY_ASSIGN_OR_RETURN(std::unique_ptr<Connection> conn, transport::Dial(options.uri, options.transport));
  if (!options.secret.empty()) {
    BenchAuthWire wire(/*send_refusals=*/true);
    transport::AuthIdentity self{"bench", "bench-client-" + std::to_string(::getpid()), options.secret};
    auto server = transport::AuthenticateDialer(*conn, wire, self, Deadline::After(options.transport.io_timeout));
    if (!server.ok()) return server.status().WithContext("authentication with --secret-file");
  }
  SizeRunner runner(*conn, options);
  std::vector<SizeResult> results;
  for (uint64_t size : options.sizes) {
    SizeResult r;
    r.size = size;
    if (options.bandwidth) {
      CANOPY_RETURN_IF_ERROR(runner.Bandwidth(size, &r).WithContext(fmt::format("bandwidth test, {} B", size)));
    }
    if (options.latency) {
      CANOPY_RETURN_IF_ERROR(runner.Latency(size, &r).WithContext(fmt::format("latency test, {} B", size)));
    }
    if (on_result) on_result(r);
    results.push_back(r);
  }
  (void)conn->Shutdown();
  return results;
}

std::string TableHeader() {
  return "# units: decimal Gbit/s (10^9 bit/s), Mmsg/s = 10^6 messages/s, us = microseconds, CPU = % of one core\n" +
         fmt::format("{:>10} {:>8} {:>14} {:>13} {:>16} {:>8} {:>10} {:>10} {:>10} {:>11} {:>11}\n", "#bytes",
                     "#rounds", "BW peak[Gb/s]", "BW avg[Gb/s]", "MsgRate[Mmsg/s]", "#pings", "t_min[us]",
                     "t_p50[us]", "t_p99[us]", "CPU loc[%]", "CPU rem[%]");
}

std::string TableRow(const SizeResult& r) {
  return fmt::format("{:>10} {:>8} {:>14.3f} {:>13.3f} {:>16.4f} {:>8} {:>10.2f} {:>10.2f} {:>10.2f} {:>11.1f} {:>11.1f}\n",
                     r.size, r.bw_iterations, r.bw_peak_gbps, r.bw_avg_gbps, r.msg_rate_mmps, r.lat_iterations,
                     r.lat_min_us, r.lat_p50_us, r.lat_p99_us, r.bw_cpu_local.total_pct, r.bw_cpu_remote.total_pct);
}

std::string IntervalRow(uint64_t size, const IntervalResult& i) {
  std::string line = fmt::format("[{:>9} B] {:7.3f}-{:7.3f} s {:>14} bytes {:10.3f} Gbit/s", size, i.start, i.end,
                                 i.bytes, i.gbps);
  if (i.forward_bytes > 0 && i.reverse_bytes > 0) {
    line += fmt::format("  (forward {} B, reverse {} B)", i.forward_bytes, i.reverse_bytes);
  }
  return line + "\n";
}

std::string FormatCpu(const CpuUsage& cpu) {
  return fmt::format("{:.1f}% ({:.1f}%u/{:.1f}%s)", cpu.total_pct, cpu.user_pct, cpu.sys_pct);
}

// ------------------------------------------------------------------ server

class BenchServer::Impl {
 public:
  explicit Impl(const BenchServerOptions& options) : options_(options) {}

  Status Init() {
    CANOPY_ASSIGN_OR_RETURN(auto listener, transport::ListenOn(options_.listen_uri, options_.transport));
    transport::ConnectionServer::Options server_options;
    server_options.name = "bench server";
    server_options.max_serving = options_.max_connections;
    server_options.max_refusing = kMaxRejecting;
    server_ = std::make_unique<transport::ConnectionServer>(
        std::move(listener), server_options, [this](Connection& conn, bool busy) { Handle(conn, busy); });
    return Status::Ok();
  }

  transport::Endpoint endpoint() const { return server_->local_endpoint(); }

  void Stop() {
    stopping_.store(true);
    if (server_) server_->Stop();
  }

 private:
  // Connections being told "busy" beyond max_connections; more than this many
  // at once are closed without a word.
  static constexpr size_t kMaxRejecting = 16;

  // One connection, on its own thread (transport/connection_server.h).
  void Handle(Connection& c, bool busy) {
    const Clock::time_point accepted_at = Clock::now();
    // Totals for `bench --server --metrics` (base/metrics.h); bytes and
    // connections are the transport's canopy_transport_* counters.
    static prometheus::Gauge& serving_now =
        metrics::GetGauge("canopy_bench_clients_active", "Clients this bench server is serving now.");
    auto count = [](const char* outcome) {
      metrics::GetCounter("canopy_bench_clients_total", "Clients this bench server served, by outcome.",
                          {{"outcome", outcome}})
          .Increment();
    };
    if (busy) {
      RejectAndDrain(c, fmt::format("server busy: {} clients are being served, the most this server takes "
                                    "at once; try again later",
                                    options_.max_connections));
      count("busy");
      return;
    }
    serving_now.Increment();
    Status s = Serve(c, accepted_at);
    serving_now.Decrement();
    if (!s.ok() && !s.IsClosed() && s.code() != StatusCode::kAborted) {
      CANOPY_LOG(kWarn, "bench server: {}: {}", c.peer_uri(), s.ToString());
      RejectAndDrain(c, s.ToString());
      count("failed");
    } else {
      count("served");
    }
  }

  // Sends ERROR, shuts our side down and discards what the client still
  // sends (at most 2 s), so that its transport delivers the ERROR instead of
  // a reset caused by unread bytes.
  void RejectAndDrain(Connection& conn, const std::string& text) {
    (void)conn.Send(kMsgError, text);
    (void)conn.Shutdown();
    Deadline deadline = Deadline::After(std::chrono::seconds(2));
    std::string scratch;
    for (int i = 0; i < 1'000'000 && !deadline.expired() && !stopping_.load(); ++i) {
      auto m = conn.Receive(deadline);
      if (!m.ok()) return;
      uint64_t left = m->bulk_bytes;
      while (left > 0) {
        uint64_t piece = std::min<uint64_t>(left, 1u << 20);
        scratch.resize(piece);
        if (!conn.ReceiveBulk(BulkSink::ToMemory(scratch.data()), piece, deadline).ok()) return;
        left -= piece;
      }
    }
  }

  // Returns Closed when the client ends the connection in an orderly way.
  Status Serve(Connection& conn, Clock::time_point accepted_at) {
    const bool limited = options_.max_duration.count() > 0;
    const Clock::time_point session_end = limited ? accepted_at + options_.max_duration : Clock::time_point::max();
    auto session_over = [&] {
      return Status::ResourceExhausted(
          fmt::format("session ended: it ran longer than this server's maximum session duration (--max-duration) "
                      "of {:g} s",
                      std::chrono::duration<double>(options_.max_duration).count()));
    };
    bool running = false;  // a test is in progress
    BeginTest test;
    DoneCounts counts;
    uint32_t in_round = 0;
    std::string buffer;       // received bulk bytes land here
    std::string send_buffer;  // reverse/bidir payload
    std::unique_ptr<RoundSender> sender;
    CpuSnapshot cpu;
    if (!options_.secret.empty()) {
      BenchAuthWire wire(/*send_refusals=*/false);
      transport::AuthIdentity self{"bench", "bench-server", options_.secret};
      auto client = transport::AuthenticateListener(conn, wire, self, Deadline::After(options_.idle_timeout));
      if (!client.ok()) {
        // Closed / Aborted would pass silently: a refusal always gets ERROR.
        return client.status().IsClosed() ? Status::Unavailable(client.status().message()) : client.status();
      }
    }
    for (;;) {
      Clock::time_point now = Clock::now();
      if (now >= session_end) return session_over();
      Clock::duration wait = options_.idle_timeout;
      if (limited) wait = std::min<Clock::duration>(wait, session_end - now);
      auto m = conn.Receive(Deadline::After(wait));
      if (!m.ok()) {
        if (m.status().IsTimeout() && Clock::now() >= session_end) return session_over();
        return m.status();
      }
      switch (m->type) {
        case kMsgBegin: {
          if (m->bulk_bytes != 0) return Status::Corruption("BEGIN with bulk bytes");
          if (running) return Status::Corruption("BEGIN while a test is running");
          CANOPY_ASSIGN_OR_RETURN(BeginTest begin, DecodeBegin(m->payload));
          if (begin.size > options_.transport.max_message_bytes && !begin.bulk) {
            return Status::InvalidArgument(fmt::format("message size {} exceeds this server's limit of {} bytes",
                                                       begin.size, options_.transport.max_message_bytes));
          }
          test = begin;
          running = true;
          counts = DoneCounts{};
          in_round = 0;
          buffer.resize(begin.size);
          if (begin.kind == TestKind::kBandwidth && begin.direction != Direction::kForward) {
            send_buffer.assign(begin.size, 'r');
            sender = std::make_unique<RoundSender>(conn, send_buffer, begin.bulk, begin.burst);
          }
          cpu = TakeCpu();
          CANOPY_RETURN_IF_ERROR(conn.Send(kMsgReady, ""));
          break;
        }
        case kMsgMeasure:
          if (!running) return Status::Corruption("MEASURE without a test");
          cpu = TakeCpu();
          break;
        case kMsgPull:
          if (!running || !sender) return Status::Corruption("PULL outside a reverse or bidir bandwidth test");
          if (!m->payload.empty() || m->bulk_bytes != 0) return Status::Corruption("PULL with a body");
          sender->Post();
          break;
        case kMsgData:
        case kMsgPing: {
          const bool data = m->type == kMsgData;
          if (!running || (test.kind == TestKind::kBandwidth) != data ||
              (data && test.direction == Direction::kReverse)) {
            return Status::Corruption(fmt::format("{} outside a {} test", data ? "DATA" : "PING",
                                                  data ? "bandwidth" : "latency"));
          }
          uint64_t got = test.bulk ? m->bulk_bytes : m->payload.size();
          if (got != test.size || (test.bulk ? !m->payload.empty() : m->bulk_bytes != 0)) {
            return Status::Corruption(fmt::format("message of {} bytes in a test of {} byte messages", got, test.size));
          }
          if (test.bulk) {
            CANOPY_RETURN_IF_ERROR(conn.ReceiveBulk(BulkSink::ToMemory(buffer.data()), m->bulk_bytes,
                                                    Deadline::After(options_.idle_timeout)));
          }
          ++counts.messages;
          counts.bytes += got;
          if (data) {
            if (++in_round == test.burst) {
              in_round = 0;
              CANOPY_RETURN_IF_ERROR(conn.Send(kMsgAck, ""));
            }
          } else if (test.bulk) {
            CANOPY_RETURN_IF_ERROR(conn.SendWithBulk(kMsgPong, "", BulkSource::FromMemory(buffer)));
          } else {
            CANOPY_RETURN_IF_ERROR(conn.Send(kMsgPong, m->payload));
          }
          break;
        }
        case kMsgRingOpen:
          if (running) return Status::Corruption("RING_OPEN while a test is running");
          CANOPY_RETURN_IF_ERROR(ServeOneSidedLatency(conn, m->payload, options_.idle_timeout));
          break;
        case kMsgEnd: {
          if (!running) return Status::Corruption("END without a test");
          running = false;
          if (sender) {
            CANOPY_RETURN_IF_ERROR(sender->Stop());
            counts.messages_sent = sender->messages_sent();
            counts.bytes_sent = counts.messages_sent * test.size;
            sender.reset();
          }
          CpuSnapshot end = TakeCpu();
          counts.cpu_user_us = Micros(end.user - cpu.user);
          counts.cpu_sys_us = Micros(end.sys - cpu.sys);
          counts.wall_us = Micros(Seconds(end.wall - cpu.wall));
          counts.affinity = options_.affinity;
          CANOPY_RETURN_IF_ERROR(conn.Send(kMsgDone, EncodeDone(counts)));
          break;
        }
        default:
          if (m->type == kMsgAuthFirst && options_.secret.empty()) return OpenServerRefusal();
          return Status::Corruption(fmt::format("unexpected message type 0x{:04x}", m->type));
      }
    }
  }

  const BenchServerOptions options_;
  std::atomic<bool> stopping_{false};  // ends a drain early
  std::unique_ptr<transport::ConnectionServer> server_;
};

BenchServer::BenchServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BenchServer::~BenchServer() { Stop(); }

Result<std::unique_ptr<BenchServer>> BenchServer::Start(const BenchServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  CANOPY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<BenchServer>(new BenchServer(std::move(impl)));
}

transport::Endpoint BenchServer::local_endpoint() const { return impl_->endpoint(); }

void BenchServer::Stop() {
  if (impl_) impl_->Stop();
}

}  // namespace canopy::bench
