// bench: perftest-style transport benchmark over tcp://, dpdk:// or rdma://.
//
//   bench --server [-p PORT] [--bind ADDR] [--transport T] [-a CPU] [--max-duration S] [--max-clients N]
//   bench HOST [-p PORT] [--transport T] [-s SIZE | --sizes MIN:MAX] [-n N] [-t SEC] [--bytes B]
//              [--warmup N] [--omit SEC] [-i SEC] [-R | --bidir] [-P N] [-a CPU] [--json]
//
// Exit status: 0 success, 1 the benchmark failed, 2 bad usage. With --json,
// stdout is exactly one JSON document in every case (tools/bench/bench.schema.json).
#include <signal.h>

#include <csignal>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "base/file.h"
#include "base/logging.h"
#include "base/units.h"
#include "fmt/format.h"
#include "tools/bench/perftest.h"
#include "tools/cli/cli.h"
#include "tools/http/metrics_endpoint.h"
#include "transport/auth.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace po = boost::program_options;

namespace {

using canopy::Status;
using namespace canopy::bench;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

const char kUsage[] =
    "usage: bench [options] HOST            run the sweep against the bench server on HOST\n"
    "       bench --server [options]        answer bench clients\n";

const char kDescription[] =
    "perftest-style benchmark of a canopy transport. For each message size (default: powers\n"
    "of two from 2 B to 8 MiB) it measures bandwidth (rounds of messages streamed to the\n"
    "server, which sinks them and acknowledges each round: peak = best round, average =\n"
    "all bytes / all round time), message rate, and round-trip latency (ping-pong; min, p50,\n"
    "p99). -R makes the server send and the client receive; --bidir runs both directions\n"
    "at once and reports each and the sum. The latency test is the same in every mode.\n"
    "\n"
    "Limits, per size and test: --warmup rounds/pings first (not measured), then --omit\n"
    "seconds of rounds/pings (run, left out of every figure), then the measured part, which\n"
    "ends after -n rounds/pings, -t seconds or (bandwidth test only) --bytes bytes per\n"
    "direction, whichever comes first; a round in progress always completes.\n"
    "CPU: user+system time of the whole client / server process over the measured part,\n"
    "as % of one core (the server reports its figures in each test's DONE message).\n"
    "Units: decimal Gbit/s (10^9 bit/s), Mmsg/s = 10^6 messages/s, latencies in\n"
    "microseconds, sizes in bytes (K/M/G suffixes are powers of 1024).\n";

std::string MakeUri(const std::string& scheme, const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("{}://[{}]:{}", scheme, host, port);
  return fmt::format("{}://{}:{}", scheme, host, port);
}

std::vector<std::string> SplitTransportArgs(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    std::istringstream in(v);
    std::string word;
    while (in >> word) out.push_back(word);
  }
  return out;
}

int UsageError(const std::string& message, bool json) {
  if (json) {
    nlohmann::json j = {{"ok", false},  {"tool", "bench"}, {"error", message}, {"error_code", "InvalidArgument"},
                        {"usage", true}, {"protocol_version", kProtocolVersion}};
    std::cout << j.dump() << std::endl;
  }
  std::cerr << "bench: " << message << "\n" << kUsage << "Try 'bench --help' for every option.\n";
  return kExitUsage;
}

int RunServer(const po::variables_map& vm) {
  if (vm.count("host")) return UsageError("--server takes no HOST argument", vm.count("json") > 0);
  const bool quiet = vm.count("quiet") > 0;
  canopy::SetLogLevel(quiet ? canopy::LogLevel::kWarn : canopy::LogLevel::kInfo);
  BenchServerOptions options;
  if (vm.count("secret-file")) {
    auto secret = canopy::transport::LoadSecretFile(vm["secret-file"].as<std::string>());
    if (!secret.ok()) return UsageError("--secret-file: " + secret.status().message(), false);
    options.secret = std::move(secret).value();
  }
  // An open server (no secret) listens on loopback unless --bind says otherwise.
  const std::string bind =
      vm.count("bind") ? vm["bind"].as<std::string>() : (options.secret.empty() ? "127.0.0.1" : "0.0.0.0");
  if (options.secret.empty()) {
    std::cerr << "bench: WARNING: this server is OPEN (no --secret-file): anyone who can reach " << bind
              << " can use it" << (vm.count("bind") ? "" : "; it listens on loopback only (use --bind to serve other hosts)")
              << "\n";
  }
  options.listen_uri = MakeUri(vm["transport"].as<std::string>(), bind, vm["port"].as<uint16_t>());
  options.transport.backend_args = SplitTransportArgs(vm["transport-arg"].as<std::vector<std::string>>());
  double idle = vm["idle-timeout"].as<double>();
  if (idle <= 0) return UsageError("--idle-timeout must be > 0", false);
  options.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(idle * 1000));
  double max_duration = vm["max-duration"].as<double>();
  if (max_duration < 0) return UsageError("--max-duration must be >= 0 (0: no limit)", false);
  options.max_duration = std::chrono::milliseconds(static_cast<int64_t>(max_duration * 1000));
  int64_t max_clients = vm["max-clients"].as<int64_t>();
  if (max_clients < 1 || max_clients > 4096) return UsageError("--max-clients must be 1..4096", false);
  options.max_connections = static_cast<size_t>(max_clients);
  if (vm.count("affinity")) {
    int cpu = vm["affinity"].as<int>();
    Status pinned = PinToCpu(cpu);
    if (!pinned.ok()) return UsageError("--affinity: " + pinned.message(), false);
    options.affinity = cpu;
  }

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = BenchServer::Start(options);
  if (!server.ok()) {
    std::cerr << "bench: server: " << server.status().ToString() << "\n";
    return kExitFailed;
  }
  canopy::transport::Endpoint bound = (*server)->local_endpoint();
  if (vm.count("port-file")) {
    Status written = canopy::WriteFileAtomic(vm["port-file"].as<std::string>(), std::to_string(bound.port) + "\n");
    if (!written.ok()) {
      std::cerr << "bench: server: " << written.ToString() << "\n";
      return kExitFailed;
    }
  }
  // --metrics: clients served (canopy_bench_*) and the transport's totals.
  std::unique_ptr<canopy::http::MetricsEndpoint> metrics_endpoint;
  if (vm.count("metrics")) {
    auto endpoint = canopy::http::MetricsEndpoint::Start(vm["metrics"].as<std::string>());
    if (!endpoint.ok()) {
      std::cerr << "bench: server: --metrics: " << endpoint.status().ToString() << "\n";
      return kExitFailed;
    }
    metrics_endpoint = std::move(*endpoint);
    if (vm.count("metrics-port-file")) {
      Status written = canopy::WriteFileAtomic(vm["metrics-port-file"].as<std::string>(),
                                               std::to_string(metrics_endpoint->port()) + "\n");
      if (!written.ok()) {
        std::cerr << "bench: server: " << written.ToString() << "\n";
        return kExitFailed;
      }
    }
  }
  if (!quiet) {
    std::cerr << "bench: server listening on " << bound.ToUri() << " (protocol version " << int{kProtocolVersion}
              << ", at most " << options.max_connections << " clients at once"
              << (options.affinity >= 0 ? fmt::format(", pinned to CPU {}", options.affinity) : std::string())
              << ")\n";
  }
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  if (metrics_endpoint) metrics_endpoint->Stop();
  (*server)->Stop();
  if (!quiet) std::cerr << "bench: server stopped (signal " << signal_number << ")\n";
  return kExitOk;
}

nlohmann::json CpuJson(const CpuUsage& cpu) {
  return {{"total_pct", cpu.total_pct}, {"user_pct", cpu.user_pct}, {"sys_pct", cpu.sys_pct},
          {"wall_seconds", cpu.wall_seconds}};
}

nlohmann::json DirectionJson(const DirectionResult& d) {
  return {{"messages", d.messages}, {"bytes", d.bytes}, {"seconds", d.seconds}, {"peak_gbps", d.peak_gbps},
          {"avg_gbps", d.avg_gbps}};
}

nlohmann::json ResultJson(const SizeResult& r, bool bandwidth, bool latency, bool intervals) {
  nlohmann::json j = {{"size", r.size}};
  if (bandwidth) {
    j["direction"] = std::string(DirectionName(r.direction));
    j["bw_rounds"] = r.bw_iterations;
    j["bw_omitted_rounds"] = r.bw_omitted_rounds;
    j["bw_burst"] = r.bw_burst;
    j["bw_messages"] = r.bw_messages;
    j["bw_bytes"] = r.bw_bytes;
    j["bw_seconds"] = r.bw_seconds;
    j["bw_peak_gbps"] = r.bw_peak_gbps;
    j["bw_avg_gbps"] = r.bw_avg_gbps;
    j["msg_rate_mmps"] = r.msg_rate_mmps;
    if (r.direction != Direction::kReverse) j["forward"] = DirectionJson(r.forward);
    if (r.direction != Direction::kForward) j["reverse"] = DirectionJson(r.reverse);
    j["bw_cpu"] = {{"local", CpuJson(r.bw_cpu_local)}, {"remote", CpuJson(r.bw_cpu_remote)}};
    if (intervals) {
      nlohmann::json list = nlohmann::json::array();
      for (const IntervalResult& i : r.intervals) {
        list.push_back({{"start", i.start}, {"end", i.end}, {"seconds", i.end - i.start}, {"bytes", i.bytes},
                        {"forward_bytes", i.forward_bytes}, {"reverse_bytes", i.reverse_bytes}, {"gbps", i.gbps}});
      }
      j["intervals"] = list;
    }
  }
  if (latency) {
    j["lat_iterations"] = r.lat_iterations;
    j["lat_omitted"] = r.lat_omitted;
    j["lat_min_us"] = r.lat_min_us;
    j["lat_p50_us"] = r.lat_p50_us;
    j["lat_p99_us"] = r.lat_p99_us;
    j["lat_max_us"] = r.lat_max_us;
    j["lat_avg_us"] = r.lat_avg_us;
    j["lat_cpu"] = {{"local", CpuJson(r.lat_cpu_local)}, {"remote", CpuJson(r.lat_cpu_remote)}};
  }
  return j;
}

// CPU over several sizes: the sum of CPU time over the sum of wall time.
CpuUsage SumCpu(const std::vector<CpuUsage>& parts) {
  double user = 0, sys = 0, wall = 0;
  for (const CpuUsage& c : parts) {
    user += c.user_pct * c.wall_seconds / 100;
    sys += c.sys_pct * c.wall_seconds / 100;
    wall += c.wall_seconds;
  }
  CpuUsage out;
  out.wall_seconds = wall;
  if (wall > 0) {
    out.user_pct = user / wall * 100;
    out.sys_pct = sys / wall * 100;
    out.total_pct = out.user_pct + out.sys_pct;
  }
  return out;
}

DirectionResult SumDirection(const DirectionResult& a, const DirectionResult& b) {
  DirectionResult out;
  out.messages = a.messages + b.messages;
  out.bytes = a.bytes + b.bytes;
  out.seconds = std::max(a.seconds, b.seconds);
  out.peak_gbps = a.peak_gbps + b.peak_gbps;
  out.avg_gbps = a.avg_gbps + b.avg_gbps;
  return out;
}

// The sizes every stream completed, each the sum over the streams: bytes,
// messages, rounds and Gbit/s add up (the streams ran at the same time);
// seconds are the longest stream's; CPU is the process's (any stream's).
std::vector<SizeResult> AggregateStreams(const std::vector<std::vector<SizeResult>>& streams) {
  size_t sizes = SIZE_MAX;
  for (const auto& s : streams) sizes = std::min(sizes, s.size());
  std::vector<SizeResult> out;
  for (size_t i = 0; i < sizes && !streams.empty(); ++i) {
    SizeResult sum = streams[0][i];
    for (size_t k = 1; k < streams.size(); ++k) {
      const SizeResult& r = streams[k][i];
      sum.bw_iterations += r.bw_iterations;
      sum.bw_omitted_rounds += r.bw_omitted_rounds;
      sum.bw_messages += r.bw_messages;
      sum.bw_bytes += r.bw_bytes;
      sum.bw_seconds = std::max(sum.bw_seconds, r.bw_seconds);
      sum.bw_peak_gbps += r.bw_peak_gbps;
      sum.bw_avg_gbps += r.bw_avg_gbps;
      sum.msg_rate_mmps += r.msg_rate_mmps;
      sum.forward = SumDirection(sum.forward, r.forward);
      sum.reverse = SumDirection(sum.reverse, r.reverse);
    }
    sum.intervals.clear();
    out.push_back(sum);
  }
  return out;
}

int RunClient(const po::variables_map& vm) {
  const bool json = vm.count("json") > 0;
  const bool quiet = vm.count("quiet") > 0;
  if (!vm.count("host")) return UsageError("need HOST (or --server)", json);
  canopy::SetLogLevel(quiet ? canopy::LogLevel::kError : canopy::LogLevel::kWarn);

  SweepOptions options;
  const std::string scheme = vm["transport"].as<std::string>();
  uint16_t port = vm["port"].as<uint16_t>();
  if (port == 0) return UsageError("--port must be 1..65535 for the client", json);
  options.uri = MakeUri(scheme, vm["host"].as<std::string>(), port);
  if (vm.count("size") && !vm["sizes"].defaulted()) return UsageError("give -s/--size or --sizes, not both", json);
  if (vm.count("size")) {
    auto size = canopy::ParseByteSize(vm["size"].as<std::string>());
    if (!size.ok()) return UsageError("-s: " + size.status().message(), json);
    options.sizes = {*size};
  } else {
    auto sizes = ParseSizeRange(vm["sizes"].as<std::string>());
    if (!sizes.ok()) return UsageError("--sizes: " + sizes.status().message(), json);
    options.sizes = *sizes;
  }
  for (uint64_t s : options.sizes) {
    if (s > kMaxMessageSize) return UsageError(fmt::format("sizes must be at most {} bytes", kMaxMessageSize), json);
  }
  int64_t iterations = vm["iterations"].as<int64_t>();
  if (iterations < 1) return UsageError("-n/--iterations must be >= 1", json);
  options.iterations = static_cast<uint64_t>(iterations);
  double seconds = vm["time"].as<double>();
  if (!(seconds > 0)) return UsageError("-t/--time must be > 0", json);
  options.time_per_size = std::chrono::duration<double>(seconds);
  int64_t warmup = vm["warmup"].as<int64_t>();
  if (warmup < 0) return UsageError("--warmup must be >= 0", json);
  options.warmup = static_cast<uint64_t>(warmup);
  const std::string test = vm["test"].as<std::string>();
  if (test == "bw") {
    options.latency = false;
  } else if (test == "lat") {
    options.bandwidth = false;
  } else if (test != "all") {
    return UsageError("--test must be bw, lat or all", json);
  }
  if (vm.count("bytes")) {
    auto bytes = canopy::ParseByteSize(vm["bytes"].as<std::string>());
    if (!bytes.ok()) return UsageError("--bytes: " + bytes.status().message(), json);
    if (*bytes == 0) return UsageError("--bytes must be > 0", json);
    options.bytes_limit = *bytes;
  }
  double omit = vm["omit"].as<double>();
  if (!(omit >= 0) || omit > 3600) return UsageError("--omit must be 0..3600 seconds", json);
  options.omit = std::chrono::duration<double>(omit);
  double interval = vm.count("interval") ? vm["interval"].as<double>() : 0;
  if (vm.count("interval") && !(interval > 0)) return UsageError("-i/--interval must be > 0", json);
  options.interval = std::chrono::duration<double>(interval);
  if (vm.count("reverse") && vm.count("bidir")) return UsageError("give -R/--reverse or --bidir, not both", json);
  if (vm.count("reverse")) options.direction = Direction::kReverse;
  if (vm.count("bidir")) options.direction = Direction::kBidir;
  int affinity = -1;
  if (vm.count("affinity")) {
    affinity = vm["affinity"].as<int>();
    Status pinned = PinToCpu(affinity);
    if (!pinned.ok()) return UsageError("-a/--affinity: " + pinned.message(), json);
  }
  options.bulk = vm.count("bulk") > 0;
  options.one_sided = vm.count("one-sided") > 0;
  if (options.one_sided && (test != "lat" || scheme != "rdma" || options.bulk)) {
    return UsageError("--one-sided is a latency test over rdma://: give --test lat --transport rdma (no --bulk)",
                      json);
  }
  options.transport.backend_args = SplitTransportArgs(vm["transport-arg"].as<std::vector<std::string>>());
  if (vm.count("secret-file")) {
    auto secret = canopy::transport::LoadSecretFile(vm["secret-file"].as<std::string>());
    if (!secret.ok()) return UsageError("--secret-file: " + secret.status().message(), json);
    options.secret = std::move(secret).value();
  }
  double connect_timeout = vm["connect-timeout"].as<double>();
  if (!(connect_timeout > 0)) return UsageError("--connect-timeout must be > 0", json);
  options.transport.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(connect_timeout * 1000));

  const int64_t parallel_arg = vm["parallel"].as<int64_t>();
  if (parallel_arg < 1 || parallel_arg > 64) return UsageError("-P/--parallel must be 1..64", json);
  const size_t parallel = static_cast<size_t>(parallel_arg);
  if (parallel > 1 && options.latency) return UsageError("-P/--parallel above 1 needs --test bw", json);

  const std::string direction(DirectionName(options.direction));
  const bool table = !json && !quiet;
  if (table) {
    std::cout << fmt::format("# bench {} {} -> {}, {} per size, at most {} rounds/pings{}, {} warm-up, {:g} s omitted, "
                             "{} path{}\n",
                             test, direction, options.uri, fmt::format("{:g} s", seconds), options.iterations,
                             options.bytes_limit ? fmt::format(" or {} bytes", options.bytes_limit) : std::string(),
                             options.warmup, omit, options.one_sided ? "one-sided" : options.bulk ? "bulk" : "message",
                             affinity >= 0 ? fmt::format(", client pinned to CPU {}", affinity) : std::string())
              << "# round = burst of messages + ACK (reverse: PULL + burst back); t = ping-pong round trip\n"
              << TableHeader() << std::flush;
    options.on_interval = [](uint64_t size, const IntervalResult& i) { std::cout << IntervalRow(size, i) << std::flush; };
  }
  std::vector<SizeResult> done;
  // -P N: N connections at once, one sweep each on its own thread; `done`
  // gets the sizes every stream completed, summed (AggregateStreams).
  std::vector<std::vector<SizeResult>> stream_results(parallel);
  auto print_row = [&](const SizeResult& r) {
    if (!table) return;
    std::cout << TableRow(r);
    if (options.bandwidth && options.direction == Direction::kBidir) {
      std::cout << fmt::format("#   {} B bidir: forward {:.3f} Gbit/s, reverse {:.3f} Gbit/s, sum {:.3f} Gbit/s\n",
                               r.size, r.forward.avg_gbps, r.reverse.avg_gbps, r.forward.avg_gbps + r.reverse.avg_gbps);
    }
    std::cout << std::flush;
  };
  canopy::Result<std::vector<SizeResult>> results = std::vector<SizeResult>{};
  if (parallel == 1) {
    results = RunSweep(options, [&](const SizeResult& r) {
      done.push_back(r);
      print_row(r);
    });
  } else {
    options.on_interval = nullptr;  // intervals of N streams would interleave
    std::vector<canopy::Result<std::vector<SizeResult>>> outcomes(parallel, std::vector<SizeResult>{});
    std::vector<std::thread> threads;
    for (size_t k = 0; k < parallel; ++k) {
      threads.emplace_back([&, k] {
        outcomes[k] = RunSweep(options, [&, k](const SizeResult& r) { stream_results[k].push_back(r); });
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t k = 0; k < parallel && results.ok(); ++k) {
      if (!outcomes[k].ok()) results = outcomes[k].status().WithContext(fmt::format("stream {} of {}", k + 1, parallel));
    }
    done = AggregateStreams(stream_results);
    for (const SizeResult& r : done) {
      print_row(r);
      if (!table) continue;
      for (size_t k = 0; k < parallel; ++k) {
        const SizeResult& s = stream_results[k][&r - done.data()];
        std::cout << fmt::format("#   {} B stream {}: {:.3f} Gbit/s, {} rounds\n", s.size, k + 1, s.bw_avg_gbps,
                                 s.bw_iterations);
      }
    }
    if (results.ok()) results = done;
  }

  // CPU over the whole run: bandwidth tests when they ran, else latency.
  std::vector<CpuUsage> local_parts, remote_parts;
  int32_t server_affinity = -1;
  bool server_known = false;
  for (const SizeResult& r : done) {
    local_parts.push_back(options.bandwidth ? r.bw_cpu_local : r.lat_cpu_local);
    remote_parts.push_back(options.bandwidth ? r.bw_cpu_remote : r.lat_cpu_remote);
    server_affinity = r.remote_affinity;
    server_known = true;
  }
  const CpuUsage local_cpu = SumCpu(local_parts);
  const CpuUsage remote_cpu = SumCpu(remote_parts);
  std::string local_role = "client", remote_role = "server";
  if (options.bandwidth && options.direction == Direction::kBidir) {
    local_role = remote_role = "sender+receiver";
  } else if (options.bandwidth && options.direction == Direction::kForward) {
    local_role = "sender";
    remote_role = "receiver";
  } else if (options.bandwidth && options.direction == Direction::kReverse) {
    local_role = "receiver";
    remote_role = "sender";
  }
  if (table && !done.empty()) {
    std::cout << fmt::format("# CPU Utilization ({} tests): local/{} {}, remote/{} {}\n",
                             options.bandwidth ? "bandwidth" : "latency", local_role, FormatCpu(local_cpu),
                             remote_role, FormatCpu(remote_cpu));
  }
  if (json) {
    nlohmann::json j;
    j["ok"] = results.ok();
    j["tool"] = "bench";
    j["protocol_version"] = kProtocolVersion;
    j["server"] = options.uri;
    j["transport"] = scheme;
    j["test"] = test;
    j["direction"] = direction;
    j["path"] = options.one_sided ? "one-sided" : options.bulk ? "bulk" : "message";
    j["iterations_limit"] = options.iterations;
    j["seconds_per_size"] = seconds;
    j["bytes_limit"] = options.bytes_limit ? nlohmann::json(options.bytes_limit) : nlohmann::json(nullptr);
    j["warmup"] = options.warmup;
    j["omit_seconds"] = omit;
    j["interval_seconds"] = interval > 0 ? nlohmann::json(interval) : nlohmann::json(nullptr);
    j["limits"] = {
        {"iterations", "measured bandwidth rounds and latency pings per size"},
        {"seconds", "measured seconds per size and test, after warm-up and omit"},
        {"bytes", "measured bytes per size and direction, bandwidth test only"},
        {"warmup", "unmeasured rounds / pings per size and test, before the omit window"},
        {"omit_seconds", "seconds per size and test run after the warm-up and left out of every figure"}};
    j["affinity"] = {{"client", affinity >= 0 ? nlohmann::json(affinity) : nlohmann::json(nullptr)},
                     {"server", server_known && server_affinity >= 0 ? nlohmann::json(server_affinity)
                                                                     : nlohmann::json(nullptr)}};
    j["units"] = {{"gbps", "1e9 bits per second"},
                  {"mmps", "1e6 messages per second"},
                  {"us", "microseconds"},
                  {"bandwidth", "decimal Gbit/s (10^9 bit/s)"},
                  {"bytes", "bytes"},
                  {"seconds", "seconds"},
                  {"cpu", "% of one core (user + system CPU time of the whole process / wall time)"}};
    nlohmann::json rows = nlohmann::json::array();
    for (const SizeResult& r : done) {
      rows.push_back(ResultJson(r, options.bandwidth, options.latency, interval > 0));
    }
    j["results"] = rows;
    j["parallel"] = parallel;
    if (parallel > 1) {
      nlohmann::json streams = nlohmann::json::array();
      for (const std::vector<SizeResult>& one : stream_results) {
        nlohmann::json list = nlohmann::json::array();
        for (const SizeResult& r : one) list.push_back(ResultJson(r, options.bandwidth, options.latency, false));
        streams.push_back(list);
      }
      j["streams"] = streams;
    }
    j["cpu_utilization"] = {{"test", options.bandwidth ? "bandwidth" : "latency"},
                            {"local_role", local_role},
                            {"remote_role", remote_role},
                            {"local", CpuJson(local_cpu)},
                            {"remote", CpuJson(remote_cpu)}};
    if (!results.ok()) {
      j["error"] = results.status().message();
      j["error_code"] = canopy::StatusCodeName(results.status().code());
      j["sizes_completed"] = done.size();
    }
    std::cout << j.dump(1) << std::endl;
  }
  if (!results.ok()) {
    std::cerr << "bench: " << results.status().ToString() << "\n";
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  canopy::transport::RegisterBuiltinTransports();
  const bool json_requested = canopy::cli::CommandLineHas(argc, argv, "--json");

  po::options_description common("Common options");
  common.add_options()
      ("help,h", "show this help and exit")
      ("port,p", po::value<uint16_t>()->default_value(kDefaultPort), "server port (server: 0 picks a free one)")
      ("transport", po::value<std::string>()->default_value("tcp"), "transport backend: tcp, dpdk or rdma")
      ("transport-arg", po::value<std::vector<std::string>>()->default_value({}, "")->composing(),
       "argument for the backend, repeatable, split on spaces (DPDK EAL arguments, RDMA device=...)")
      ("secret-file", po::value<std::string>(),
       "file holding the shared secret (at least 8 bytes): client and server authenticate each other with "
       "HMAC-SHA256 before the test starts; both sides need the same one")
      ("quiet,q", "print nothing but errors (and the JSON with --json)")
      ("affinity,a", po::value<int>(), "pin this process (client or server) to CPU N (sched_setaffinity)");
  po::options_description client("Client options (bench HOST)");
  client.add_options()
      ("size,s", po::value<std::string>(), "test only this message size (e.g. 64K)")
      ("sizes", po::value<std::string>()->default_value("2:8M"), "sweep powers of two from MIN to MAX (e.g. 2:8M)")
      ("iterations,n", po::value<int64_t>()->default_value(1000),
       "at most N measured bandwidth rounds and N pings per size")
      ("time,t", po::value<double>()->default_value(1.0),
       "at most this many measured seconds per size and test (whichever of -n/-t/--bytes comes first)")
      ("bytes", po::value<std::string>(),
       "bandwidth test: stop each size after this many measured bytes per direction (e.g. 1G)")
      ("warmup", po::value<int64_t>()->default_value(8), "unmeasured warm-up rounds / pings per size and test")
      ("omit", po::value<double>()->default_value(0.0),
       "then run this many seconds per size and test left out of the figures (iperf3 -O)")
      ("interval,i", po::value<double>(), "bandwidth test: report every this many seconds (JSON: \"intervals\")")
      ("reverse,R", "reverse: the server sends, the client receives and measures")
      ("bidir", "both directions at once; reports each direction and the sum")
      ("parallel,P", po::value<int64_t>()->default_value(1),
       "run N connections to the server at once, one thread each (bandwidth test only: --test bw); the "
       "results are their sums per size, each connection's own figures are in \"streams\" (JSON) or "
       "'stream K' lines")
      ("test", po::value<std::string>()->default_value("all"), "bw (bandwidth + message rate), lat (latency) or all")
      ("bulk", "send payloads on the bulk path (SendWithBulk) instead of as frame payloads")
      ("one-sided", "latency over the one-sided log ring (rdma:// only, --test lat): the client RDMA-WRITEs a "
       "record into a ring on the server, which RDMA-WRITEs its number back as durable; the round trip "
       "one-sided replication pays per commit")
      ("json", "print one JSON document on stdout instead of the table, also on failure (\"ok\": false, "
       "\"error\") and for bad usage; schema: tools/bench/bench.schema.json")
      ("connect-timeout", po::value<double>()->default_value(5.0), "seconds to wait for the connection");
  po::options_description server("Server options (bench --server)");
  server.add_options()
      ("server", "run the server: sink bandwidth rounds (or send them: -R, --bidir), echo pings; "
       "several clients at once")
      ("bind", po::value<std::string>(),
       "address to listen on (default: 0.0.0.0 with --secret-file, 127.0.0.1 without)")
      ("idle-timeout", po::value<double>()->default_value(60.0), "drop a connection silent for this many seconds")
      ("max-duration", po::value<double>()->default_value(0.0),
       "end a client session longer than this many seconds with an error (0: no limit)")
      ("max-clients", po::value<int64_t>()->default_value(64),
       "serve this many clients at once; more are told the server is busy")
      ("port-file", po::value<std::string>(), "write the bound port number to this file once listening")
      ("metrics", po::value<std::string>(),
       "serve Prometheus metrics at http://ADDR/metrics, ADDR = IPv4:port or [IPv6]:port (port 0: any "
       "free port, see --metrics-port-file): clients served and the transport's connections and bytes")
      ("metrics-port-file", po::value<std::string>(), "write the metrics port to this file once listening");
  po::options_description hidden;
  hidden.add_options()("host", po::value<std::string>(), "");
  po::positional_options_description positional;
  positional.add("host", 1);
  po::options_description all;
  all.add(common).add(client).add(server).add(hidden);
  po::options_description visible;
  visible.add(common).add(client).add(server);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return UsageError(e.what(), json_requested);
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << kDescription << "\n" << visible << "\n"
              << "Exit status: 0 success, 1 the benchmark failed, 2 bad usage.\n";
    return kExitOk;
  }
  try {
    return vm.count("server") ? RunServer(vm) : RunClient(vm);
  } catch (const po::error& e) {
    return UsageError(e.what(), json_requested);
  } catch (const std::exception& e) {
    return UsageError(e.what(), json_requested);
  }
}
