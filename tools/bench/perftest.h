// perftest-style transport benchmark (the `bench` tool's logic).
//
// A client connects to a bench server over any transport URI and, for each
// message size, runs
//  - a bandwidth test: rounds of `burst` messages streamed to the server,
//    which sinks them and acknowledges each round. A round's time runs from
//    its first send to the ACK, so the average (total bytes / total time) and
//    the peak (best round) include the pipeline drain once per round; rounds
//    carry >= 16 MiB or 4096 messages so that this costs ~1%.
//  - a latency test: ping-pong of one message each way; the round-trip times
//    give min/p50/p99/max/avg.
// Warm-up rounds/pings run first and are not measured. Each test of each size
// stops after `iterations` measured rounds/pings or `time_per_size`, whichever
// comes first (at least one). The client names the test, size and burst in a
// BEGIN control message, so the server knows what to expect and checks it.
//
// Units: Gbit/s are decimal (1 Gbit = 1e9 bits); Mmsg/s = 1e6 messages per
// second; latencies in microseconds.
//
// Thread safety: RunSweep may run concurrently with itself (separate
// connections); BenchServer methods may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "transport/transport.h"

namespace canopy::bench {

inline constexpr uint16_t kDefaultPort = 18515;  // perftest's
inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr uint64_t kMaxMessageSize = 64ull << 20;

// Message types (transport frame type field).
inline constexpr uint16_t kMsgBegin = 0x4201;  // client: BeginTest
inline constexpr uint16_t kMsgReady = 0x4202;  // server: accepted
inline constexpr uint16_t kMsgData = 0x4203;   // client: bandwidth payload
inline constexpr uint16_t kMsgAck = 0x4204;    // server: a round of `burst` DATA arrived
inline constexpr uint16_t kMsgPing = 0x4205;   // client: latency payload
inline constexpr uint16_t kMsgPong = 0x4206;   // server: the same payload back
inline constexpr uint16_t kMsgEnd = 0x4207;    // client: test over
inline constexpr uint16_t kMsgDone = 0x4208;   // server: DoneCounts
inline constexpr uint16_t kMsgError = 0x4209;  // server: text of what went wrong

enum class TestKind : uint8_t { kBandwidth = 1, kLatency = 2 };

struct BeginTest {
  TestKind kind = TestKind::kBandwidth;
  uint64_t size = 0;   // bytes per message, 1..kMaxMessageSize
  uint32_t burst = 1;  // bandwidth: DATA messages per ACK (1..1<<20); latency: 1
  bool bulk = false;   // payload travels as bulk bytes (SendWithBulk) instead of a frame payload
  bool operator==(const BeginTest&) const = default;
};

struct DoneCounts {
  uint64_t messages = 0;
  uint64_t bytes = 0;
  bool operator==(const DoneCounts&) const = default;
};

std::string EncodeBegin(const BeginTest& begin);
// Corruption on wrong version, truncation, trailing bytes, unknown kind,
// size or burst out of range.
Result<BeginTest> DecodeBegin(std::string_view payload);
std::string EncodeDone(const DoneCounts& done);
Result<DoneCounts> DecodeDone(std::string_view payload);

// Powers of two from min to max inclusive (min and max rounded to powers of
// two: up for min, down for max). InvalidArgument when min > max or min == 0.
Result<std::vector<uint64_t>> PowerOfTwoSizes(uint64_t min, uint64_t max);
// "MIN:MAX" with ParseByteSize-style sizes ("2:8M"). InvalidArgument otherwise.
Result<std::vector<uint64_t>> ParseSizeRange(std::string_view text);

struct SweepOptions {
  std::string uri;  // scheme://host:port of a bench server
  std::vector<uint64_t> sizes;
  uint64_t iterations = 1000;  // measured rounds (bandwidth) / pings (latency) per size
  std::chrono::duration<double> time_per_size{1.0};  // per size and test
  uint64_t warmup = 8;  // unmeasured rounds / pings before each measurement
  bool bandwidth = true;
  bool latency = true;
  bool bulk = false;
  transport::TransportOptions transport;
};

struct SizeResult {
  uint64_t size = 0;
  // Bandwidth test (zero when not run).
  uint64_t bw_iterations = 0;  // measured rounds
  uint32_t bw_burst = 0;
  uint64_t bw_messages = 0;
  uint64_t bw_bytes = 0;
  double bw_seconds = 0;
  double bw_peak_gbps = 0;
  double bw_avg_gbps = 0;
  double msg_rate_mmps = 0;
  // Latency test (zero when not run).
  uint64_t lat_iterations = 0;
  double lat_min_us = 0;
  double lat_p50_us = 0;
  double lat_p99_us = 0;
  double lat_max_us = 0;
  double lat_avg_us = 0;
};

// Runs every size in order over one connection; `on_result` (optional) sees
// each size as soon as it is measured. Errors: the transport's (Unavailable
// when nothing listens), Corruption for protocol violations, or the server's
// kMsgError text as Aborted.
Result<std::vector<SizeResult>> RunSweep(const SweepOptions& options,
                                         const std::function<void(const SizeResult&)>& on_result = {});

// Percentile (0..100) of `values` by nearest rank; 0 for an empty vector.
// Reorders `values`.
double Percentile(std::vector<double>& values, double percent);

// perftest-like table: a header line (with the units) and one line per size.
std::string TableHeader();
std::string TableRow(const SizeResult& r);

struct BenchServerOptions {
  std::string listen_uri;  // e.g. "tcp://0.0.0.0:18515"
  transport::TransportOptions transport;
  std::chrono::milliseconds idle_timeout{60000};  // a silent connection is dropped
  size_t max_connections = 64;
};

// Answers bench clients: sinks DATA (ACK per burst), echoes PING. A thread per
// connection.
class BenchServer {
 public:
  static Result<std::unique_ptr<BenchServer>> Start(const BenchServerOptions& options);
  ~BenchServer();  // Stop()
  BenchServer(const BenchServer&) = delete;
  BenchServer& operator=(const BenchServer&) = delete;

  transport::Endpoint local_endpoint() const;
  // Stops accepting, aborts connections, waits for their threads. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit BenchServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace canopy::bench
