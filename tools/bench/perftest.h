// perftest-style transport benchmark (the `bench` tool's logic).
//
// A client connects to a bench server over any transport URI and, for each
// message size, runs
//  - a bandwidth test: rounds of `burst` messages. Forward (the default): the
//    client streams them to the server, which sinks them and acknowledges each
//    round; one round is always in flight ahead of the one being timed (the
//    pipe never drains), a round's time runs from the previous round's ACK to
//    its own (the first: from its first send), and the round still in flight
//    at the end is drained unmeasured (the server's DONE counts it). Reverse: the
//    client asks for a round with PULL and the server streams `burst` DATA
//    back; a round's time runs from the PULL to the last DATA received. Bidir:
//    both at once (the client sends PULL, then its burst, while the server
//    sends its own burst); each direction has its own time (to the ACK / to
//    the last DATA) and the round lasts until both are done. In reverse and
//    bidir the average (bytes / summed round time) and the peak (best round)
//    include the pipeline drain once per round; rounds carry >= 16 MiB or 4096
//    messages to keep that small.
//  - a latency test: ping-pong of one message each way (the same in every
//    direction mode); the round-trip times give min/p50/p99/max/avg.
//
// Limits, per size and test:
//  - `warmup` rounds/pings run first, unmeasured;
//  - then, for `omit` seconds (iperf3 -O), rounds/pings are run and left out
//    of every figure (counted in bw_omitted_rounds / lat_omitted);
//  - then the measured part, which stops after `iterations` rounds/pings,
//    `time_per_size` seconds, or (bandwidth only) `bytes_limit` measured bytes
//    per direction, whichever comes first; always at least one round/ping.
//    Limits are checked between rounds, so a round in progress completes.
// The client sends MEASURE when the measured part starts; both sides meter
// their CPU time (getrusage of the whole process: user and system) from there
// to the end of the test and report it as % of one core over that wall time.
// The server's figures come back in DONE. With `interval` > 0 the bandwidth
// test also records per-interval byte counts (a round counts in the interval
// in which it completes).
//
// The client names the test, size, burst and direction in a BEGIN control
// message, so the server knows what to expect and checks it. Every control
// message that has a body starts with the protocol version; a peer of another
// version is answered with ERROR naming both versions.
//
// Units: Gbit/s are decimal (1 Gbit = 1e9 bits); Mmsg/s = 1e6 messages per
// second; latencies in microseconds; CPU in % of one core.
//
// Thread safety: RunSweep may run concurrently with itself (separate
// connections); BenchServer methods may be called from any thread. The server
// serves up to max_connections clients at once (a thread each, plus a sender
// thread during reverse/bidir tests) and answers ERROR "server busy" beyond.
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
// 1: forward only. 2: direction in BEGIN, PULL, MEASURE, CPU and sent counts
// in DONE.
inline constexpr uint8_t kProtocolVersion = 2;
inline constexpr uint64_t kMaxMessageSize = 64ull << 20;

// Message types (transport frame type field).
inline constexpr uint16_t kMsgBegin = 0x4201;  // client: BeginTest
inline constexpr uint16_t kMsgReady = 0x4202;  // server: accepted
inline constexpr uint16_t kMsgData = 0x4203;   // bandwidth payload (client, or server when reverse/bidir)
inline constexpr uint16_t kMsgAck = 0x4204;    // server: a round of `burst` DATA arrived
inline constexpr uint16_t kMsgPing = 0x4205;   // client: latency payload
inline constexpr uint16_t kMsgPong = 0x4206;   // server: the same payload back
inline constexpr uint16_t kMsgEnd = 0x4207;    // client: test over
inline constexpr uint16_t kMsgDone = 0x4208;   // server: DoneCounts
inline constexpr uint16_t kMsgError = 0x4209;  // server: text of what went wrong
inline constexpr uint16_t kMsgPull = 0x420a;   // client: send me a round of `burst` DATA (reverse/bidir)
inline constexpr uint16_t kMsgMeasure = 0x420b;  // client: the measured part starts (CPU meter)
// With a shared secret (--secret-file) a connection starts with the mutual
// HMAC-SHA256 handshake of transport/auth.h (BasicAuthWire, realm "bench"):
// types kMsgAuthFirst .. +4; a refusal travels as kMsgError.
inline constexpr uint16_t kMsgAuthFirst = 0x42f0;

enum class TestKind : uint8_t { kBandwidth = 1, kLatency = 2 };
// Who sends the bandwidth payload: the client (forward), the server (reverse)
// or both at once (bidir).
enum class Direction : uint8_t { kForward = 1, kReverse = 2, kBidir = 3 };
std::string_view DirectionName(Direction d);  // "forward", "reverse", "bidir"

struct BeginTest {
  TestKind kind = TestKind::kBandwidth;
  uint64_t size = 0;   // bytes per message, 1..kMaxMessageSize
  uint32_t burst = 1;  // bandwidth: DATA messages per ACK (1..1<<20); latency: 1
  bool bulk = false;   // payload travels as bulk bytes (SendWithBulk) instead of a frame payload
  Direction direction = Direction::kForward;  // latency tests: always forward
  bool operator==(const BeginTest&) const = default;
};

// The server's account of one test, sent in DONE.
struct DoneCounts {
  uint64_t messages = 0;  // DATA/PING received
  uint64_t bytes = 0;     // ... and their payload bytes
  uint64_t messages_sent = 0;  // DATA sent (reverse/bidir)
  uint64_t bytes_sent = 0;
  // Server process CPU time and wall time from MEASURE (or BEGIN when none
  // came) to END, microseconds.
  uint64_t cpu_user_us = 0;
  uint64_t cpu_sys_us = 0;
  uint64_t wall_us = 0;
  int32_t affinity = -1;  // CPU the server is pinned to, -1 when not pinned
  bool operator==(const DoneCounts&) const = default;
};

std::string EncodeBegin(const BeginTest& begin);
// Corruption on wrong version (the message names both), truncation, trailing
// bytes, unknown kind or direction, size or burst out of range, a latency
// test that is not forward.
Result<BeginTest> DecodeBegin(std::string_view payload);
std::string EncodeDone(const DoneCounts& done);
Result<DoneCounts> DecodeDone(std::string_view payload);

// Powers of two from min to max inclusive (min and max rounded to powers of
// two: up for min, down for max). InvalidArgument when min > max or min == 0.
Result<std::vector<uint64_t>> PowerOfTwoSizes(uint64_t min, uint64_t max);
// "MIN:MAX" with ParseByteSize-style sizes ("2:8M"). InvalidArgument otherwise.
Result<std::vector<uint64_t>> ParseSizeRange(std::string_view text);

struct IntervalResult;

struct SweepOptions {
  std::string uri;  // scheme://host:port of a bench server
  std::vector<uint64_t> sizes;
  uint64_t iterations = 1000;  // measured rounds (bandwidth) / pings (latency) per size
  std::chrono::duration<double> time_per_size{1.0};  // measured seconds per size and test
  uint64_t bytes_limit = 0;  // bandwidth: measured bytes per size and direction; 0 = no limit
  uint64_t warmup = 8;  // unmeasured rounds / pings before each measurement
  std::chrono::duration<double> omit{0.0};  // then run this long unmeasured (iperf3 -O)
  std::chrono::duration<double> interval{0.0};  // bandwidth interval reports; 0 = none
  Direction direction = Direction::kForward;
  // Called (on the sweep's thread) as each interval of a bandwidth test ends.
  std::function<void(uint64_t size, const IntervalResult&)> on_interval;
  bool bandwidth = true;
  bool latency = true;
  bool bulk = false;
  // Latency over the one-sided log ring (one_sided.h; rdma:// only) instead of SEND ping-pong.
  bool one_sided = false;
  transport::TransportOptions transport;
  std::string secret;  // the server's shared secret; empty: do not authenticate
};

// CPU time of one process over a measured test, as % of one core.
struct CpuUsage {
  double user_pct = 0;
  double sys_pct = 0;
  double total_pct = 0;  // user + sys
  double wall_seconds = 0;  // the wall time it is relative to
};

// One direction of a bandwidth test.
struct DirectionResult {
  uint64_t messages = 0;
  uint64_t bytes = 0;
  double seconds = 0;  // summed round times of this direction
  double peak_gbps = 0;
  double avg_gbps = 0;
};

// Bytes measured in one interval of a bandwidth test; times in seconds from
// the start of the measured part.
struct IntervalResult {
  double start = 0;
  double end = 0;
  uint64_t bytes = 0;          // all directions
  uint64_t forward_bytes = 0;  // client -> server
  uint64_t reverse_bytes = 0;  // server -> client
  double gbps = 0;             // bytes * 8 / (end - start) / 1e9
};

struct SizeResult {
  uint64_t size = 0;
  // Bandwidth test (zero when not run). In bidir mode bytes/messages are the
  // sum of both directions, bw_seconds the summed round times (a round lasts
  // until both directions are done) and the Gbit/s figures are the aggregate.
  Direction direction = Direction::kForward;
  uint64_t bw_iterations = 0;  // measured rounds
  uint64_t bw_omitted_rounds = 0;  // rounds run in the omit window
  uint32_t bw_burst = 0;
  uint64_t bw_messages = 0;
  uint64_t bw_bytes = 0;
  double bw_seconds = 0;
  double bw_peak_gbps = 0;
  double bw_avg_gbps = 0;
  double msg_rate_mmps = 0;
  DirectionResult forward;  // client -> server (forward and bidir)
  DirectionResult reverse;  // server -> client (reverse and bidir)
  std::vector<IntervalResult> intervals;  // with SweepOptions::interval > 0
  CpuUsage bw_cpu_local;   // this process
  CpuUsage bw_cpu_remote;  // the server process
  int32_t remote_affinity = -1;  // from the server's DONE
  // Latency test (zero when not run).
  uint64_t lat_iterations = 0;
  double lat_min_us = 0;
  double lat_p50_us = 0;
  double lat_p99_us = 0;
  double lat_max_us = 0;
  double lat_avg_us = 0;
  uint64_t lat_omitted = 0;  // pings in the omit window
  CpuUsage lat_cpu_local;
  CpuUsage lat_cpu_remote;
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

// perftest-like table: a units line, a header line and one line per size
// (the last columns: CPU % of one core, client and server, bandwidth test).
std::string TableHeader();
std::string TableRow(const SizeResult& r);
// One interval report line ("size, start-end, bytes, Gbit/s").
std::string IntervalRow(uint64_t size, const IntervalResult& i);
// iperf3-style "X% (Y%u/Z%s)".
std::string FormatCpu(const CpuUsage& cpu);

// Pins the calling thread (and the threads it creates later) to `cpu` with
// sched_setaffinity. InvalidArgument when cpu is out of range, the error of
// the call otherwise.
Status PinToCpu(int cpu);

struct BenchServerOptions {
  std::string listen_uri;  // e.g. "tcp://0.0.0.0:18515"
  transport::TransportOptions transport;
  std::chrono::milliseconds idle_timeout{60000};  // a silent connection is dropped
  // A connection older than this is ended with ERROR "...maximum session
  // duration..."; 0 = no limit.
  std::chrono::milliseconds max_duration{0};
  size_t max_connections = 64;  // more at once are answered ERROR "server busy"
  int32_t affinity = -1;  // reported in DONE (the caller pins the process)
  // When set, a client must pass the handshake (see kMsgAuthFirst) before
  // anything else is read; empty: an open server, which answers an
  // authenticating client with ERROR.
  std::string secret;
};

// Answers bench clients: sinks DATA (ACK per burst), sends DATA rounds on
// PULL, echoes PING. A thread per connection. After an ERROR the server shuts
// its side down and discards what the client still sends (up to 2 s), so the
// client reads the ERROR rather than a reset.
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
