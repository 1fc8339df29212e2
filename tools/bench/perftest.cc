#include "tools/bench/perftest.h"

#include "base/units.h"

#include <algorithm>
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
#include "fmt/format.h"
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

class SizeRunner {
 public:
  SizeRunner(Connection& conn, const SweepOptions& options) : conn_(conn), o_(options) {}

  Status Bandwidth(uint64_t size, SizeResult* r) {
    BeginTest begin{TestKind::kBandwidth, size, BurstFor(size), o_.bulk};
    CANOPY_RETURN_IF_ERROR(Begin(begin));
    buffer_.assign(size, 'b');
    r->bw_burst = begin.burst;
    for (uint64_t i = 0; i < o_.warmup; ++i) CANOPY_RETURN_IF_ERROR(Round(begin).status());
    double total = 0;
    Clock::time_point start = Clock::now();
    while (r->bw_iterations < std::max<uint64_t>(o_.iterations, 1)) {
      CANOPY_ASSIGN_OR_RETURN(double seconds, Round(begin));
      ++r->bw_iterations;
      total += seconds;
      double gbps = seconds > 0 ? static_cast<double>(size) * begin.burst * 8 / seconds / 1e9 : 0;
      r->bw_peak_gbps = std::max(r->bw_peak_gbps, gbps);
      if (Clock::now() - start >= o_.time_per_size) break;
    }
    r->bw_messages = r->bw_iterations * begin.burst;
    r->bw_bytes = r->bw_messages * size;
    r->bw_seconds = total;
    r->bw_avg_gbps = total > 0 ? static_cast<double>(r->bw_bytes) * 8 / total / 1e9 : 0;
    r->msg_rate_mmps = total > 0 ? static_cast<double>(r->bw_messages) / total / 1e6 : 0;
    return End(DoneCounts{(o_.warmup + r->bw_iterations) * begin.burst,
                          (o_.warmup + r->bw_iterations) * begin.burst * size});
  }

  Status Latency(uint64_t size, SizeResult* r) {
    BeginTest begin{TestKind::kLatency, size, 1, o_.bulk};
    CANOPY_RETURN_IF_ERROR(Begin(begin));
    buffer_.assign(size, 'p');
    reply_.resize(size);
    for (uint64_t i = 0; i < o_.warmup; ++i) CANOPY_RETURN_IF_ERROR(Ping(begin).status());
    std::vector<double> samples;
    Clock::time_point start = Clock::now();
    while (samples.size() < std::max<uint64_t>(o_.iterations, 1)) {
      CANOPY_ASSIGN_OR_RETURN(double seconds, Ping(begin));
      samples.push_back(seconds * 1e6);
      if (Clock::now() - start >= o_.time_per_size) break;
    }
    r->lat_iterations = samples.size();
    double sum = 0;
    for (double s : samples) sum += s;
    r->lat_avg_us = sum / static_cast<double>(samples.size());
    r->lat_min_us = *std::min_element(samples.begin(), samples.end());
    r->lat_max_us = *std::max_element(samples.begin(), samples.end());
    r->lat_p50_us = Percentile(samples, 50);
    r->lat_p99_us = Percentile(samples, 99);
    uint64_t pings = o_.warmup + r->lat_iterations;
    return End(DoneCounts{pings, pings * size});
  }

 private:
  Deadline IoDeadline() const { return Deadline::After(o_.transport.io_timeout); }

  Status Begin(const BeginTest& begin) {
    CANOPY_RETURN_IF_ERROR(conn_.Send(kMsgBegin, EncodeBegin(begin)));
    return Expect(conn_, kMsgReady, IoDeadline(), "READY").status();
  }

  Status End(const DoneCounts& expected) {
    CANOPY_RETURN_IF_ERROR(conn_.Send(kMsgEnd, ""));
    CANOPY_ASSIGN_OR_RETURN(transport::Message m, Expect(conn_, kMsgDone, IoDeadline(), "DONE"));
    CANOPY_ASSIGN_OR_RETURN(DoneCounts done, DecodeDone(m.payload));
    if (!(done == expected)) {
      return Status::Corruption(fmt::format("server counted {} messages / {} bytes, client sent {} / {}",
                                            done.messages, done.bytes, expected.messages, expected.bytes));
    }
    return Status::Ok();
  }

  Status SendOne(uint16_t type, const BeginTest& begin) {
    if (begin.bulk) return conn_.SendWithBulk(type, "", BulkSource::FromMemory(buffer_));
    return conn_.Send(type, buffer_);
  }

  Result<double> Round(const BeginTest& begin) {
    Clock::time_point t0 = Clock::now();
    for (uint32_t i = 0; i < begin.burst; ++i) CANOPY_RETURN_IF_ERROR(SendOne(kMsgData, begin));
    CANOPY_RETURN_IF_ERROR(Expect(conn_, kMsgAck, IoDeadline(), "ACK").status());
    return Seconds(Clock::now() - t0);
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

  Connection& conn_;
  const SweepOptions& o_;
  std::string buffer_;
  std::string reply_;
};

}  // namespace

std::string EncodeBegin(const BeginTest& begin) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutFixed8(&out, static_cast<uint8_t>(begin.kind));
  PutFixed64(&out, begin.size);
  PutFixed32(&out, begin.burst);
  PutFixed8(&out, begin.bulk ? 1 : 0);
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
  return begin;
}

std::string EncodeDone(const DoneCounts& done) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutFixed64(&out, done.messages);
  PutFixed64(&out, done.bytes);
  return out;
}

Result<DoneCounts> DecodeDone(std::string_view payload) {
  ByteReader reader(payload);
  CANOPY_RETURN_IF_ERROR(CheckVersion(reader, "DONE"));
  DoneCounts done;
  CANOPY_ASSIGN_OR_RETURN(done.messages, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(done.bytes, reader.ReadFixed64());
  CANOPY_RETURN_IF_ERROR(CheckEnd(reader, "DONE"));
  return done;
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
  return fmt::format("{:>10} {:>8} {:>14} {:>13} {:>16} {:>8} {:>10} {:>10} {:>10}\n", "#bytes", "#rounds",
                     "BW peak[Gb/s]", "BW avg[Gb/s]", "MsgRate[Mmsg/s]", "#pings", "t_min[us]", "t_p50[us]",
                     "t_p99[us]");
}

std::string TableRow(const SizeResult& r) {
  return fmt::format("{:>10} {:>8} {:>14.3f} {:>13.3f} {:>16.4f} {:>8} {:>10.2f} {:>10.2f} {:>10.2f}\n", r.size,
                     r.bw_iterations, r.bw_peak_gbps, r.bw_avg_gbps, r.msg_rate_mmps, r.lat_iterations, r.lat_min_us,
                     r.lat_p50_us, r.lat_p99_us);
}

// ------------------------------------------------------------------ server

class BenchServer::Impl {
 public:
  explicit Impl(const BenchServerOptions& options) : options_(options) {}

  Status Init() {
    CANOPY_ASSIGN_OR_RETURN(listener_, transport::ListenOn(options_.listen_uri, options_.transport));
    endpoint_ = listener_->local_endpoint();
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return Status::Ok();
  }

  transport::Endpoint endpoint() const { return endpoint_; }

  void Stop() {
    std::call_once(stop_once_, [&] {
      stopping_.store(true);
      if (listener_) listener_->Close();
      if (accept_thread_.joinable()) accept_thread_.join();
      std::unique_lock<std::mutex> lock(mu_);
      for (auto& [id, conn] : live_) conn->Close();
      cv_.wait(lock, [&] { return active_ == 0; });
    });
  }

 private:
  void AcceptLoop() {
    while (!stopping_.load()) {
      auto accepted = listener_->Accept(Deadline::After(std::chrono::milliseconds(500)));
      if (!accepted.ok()) {
        if (accepted.status().IsTimeout()) continue;
        if (stopping_.load() || accepted.status().code() == StatusCode::kAborted) break;
        CANOPY_LOG(kWarn, "bench server: accept failed: {}", accepted.status().ToString());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      std::unique_ptr<Connection> conn = std::move(accepted).value();
      std::unique_lock<std::mutex> lock(mu_);
      if (active_ >= options_.max_connections) {
        lock.unlock();
        (void)conn->Send(kMsgError, fmt::format("server busy: {} connections open", options_.max_connections));
        (void)conn->Shutdown();
        continue;
      }
      uint64_t id = next_id_++;
      ++active_;
      live_[id] = conn.get();
      lock.unlock();
      std::thread([this, id, c = std::move(conn)]() mutable {
        Status s = Serve(*c);
        if (!s.ok() && !s.IsClosed() && s.code() != StatusCode::kAborted) {
          CANOPY_LOG(kWarn, "bench server: {}: {}", c->peer_uri(), s.ToString());
          (void)c->Send(kMsgError, s.ToString());
          (void)c->Shutdown();
        }
        {
          std::lock_guard<std::mutex> guard(mu_);
          live_.erase(id);
        }
        c.reset();
        std::lock_guard<std::mutex> guard(mu_);
        --active_;
        cv_.notify_all();
      }).detach();
    }
  }

  // Returns Closed when the client ends the connection in an orderly way.
  Status Serve(Connection& conn) {
    bool running = false;  // a test is in progress
    BeginTest test;
    DoneCounts counts;
    uint32_t in_round = 0;
    std::string buffer;
    for (;;) {
      auto m = conn.Receive(Deadline::After(options_.idle_timeout));
      if (!m.ok()) return m.status();
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
          CANOPY_RETURN_IF_ERROR(conn.Send(kMsgReady, ""));
          break;
        }
        case kMsgData:
        case kMsgPing: {
          const bool data = m->type == kMsgData;
          if (!running || (test.kind == TestKind::kBandwidth) != data) {
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
        case kMsgEnd:
          if (!running) return Status::Corruption("END without a test");
          running = false;
          CANOPY_RETURN_IF_ERROR(conn.Send(kMsgDone, EncodeDone(counts)));
          break;
        default:
          return Status::Corruption(fmt::format("unexpected message type 0x{:04x}", m->type));
      }
    }
  }

  const BenchServerOptions options_;
  std::unique_ptr<transport::Listener> listener_;
  transport::Endpoint endpoint_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::once_flag stop_once_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Connection*> live_;
  size_t active_ = 0;
  uint64_t next_id_ = 1;
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
