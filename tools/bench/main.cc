// bench: perftest-style transport benchmark over tcp://, dpdk:// or rdma://.
//
//   bench --server [-p PORT] [--bind ADDR] [--transport T]
//   bench HOST [-p PORT] [--transport T] [-s SIZE | --sizes MIN:MAX] [-n N] [-t SEC] [--json]
//
// Exit status: 0 success, 1 the benchmark failed, 2 bad usage.
#include <signal.h>

#include <csignal>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "base/file.h"
#include "base/logging.h"
#include "fmt/format.h"
#include "base/units.h"
#include "tools/bench/perftest.h"
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
    "p99). Warm-up rounds are not measured. Units: 1 Gbit/s = 10^9 bit/s, Mmsg/s = 10^6\n"
    "messages/s, latencies in microseconds.\n";

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
    nlohmann::json j = {{"ok", false}, {"error", message}, {"error_code", "InvalidArgument"}, {"usage", true}};
    std::cout << j.dump() << std::endl;
  }
  std::cerr << "bench: " << message << "\n" << kUsage << "Try 'bench --help' for every option.\n";
  return kExitUsage;
}

int RunServer(const po::variables_map& vm) {
  if (vm.count("host")) return UsageError("--server takes no HOST argument", false);
  const bool quiet = vm.count("quiet") > 0;
  canopy::SetLogLevel(quiet ? canopy::LogLevel::kWarn : canopy::LogLevel::kInfo);
  BenchServerOptions options;
  options.listen_uri = MakeUri(vm["transport"].as<std::string>(), vm["bind"].as<std::string>(),
                               vm["port"].as<uint16_t>());
  options.transport.backend_args = SplitTransportArgs(vm["transport-arg"].as<std::vector<std::string>>());
  double idle = vm["idle-timeout"].as<double>();
  if (idle <= 0) return UsageError("--idle-timeout must be > 0", false);
  options.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(idle * 1000));

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
  if (!quiet) std::cerr << "bench: server listening on " << bound.ToUri() << "\n";
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  (*server)->Stop();
  if (!quiet) std::cerr << "bench: server stopped (signal " << signal_number << ")\n";
  return kExitOk;
}

nlohmann::json ResultJson(const SizeResult& r, bool bandwidth, bool latency) {
  nlohmann::json j = {{"size", r.size}};
  if (bandwidth) {
    j["bw_rounds"] = r.bw_iterations;
    j["bw_burst"] = r.bw_burst;
    j["bw_messages"] = r.bw_messages;
    j["bw_bytes"] = r.bw_bytes;
    j["bw_seconds"] = r.bw_seconds;
    j["bw_peak_gbps"] = r.bw_peak_gbps;
    j["bw_avg_gbps"] = r.bw_avg_gbps;
    j["msg_rate_mmps"] = r.msg_rate_mmps;
  }
  if (latency) {
    j["lat_iterations"] = r.lat_iterations;
    j["lat_min_us"] = r.lat_min_us;
    j["lat_p50_us"] = r.lat_p50_us;
    j["lat_p99_us"] = r.lat_p99_us;
    j["lat_max_us"] = r.lat_max_us;
    j["lat_avg_us"] = r.lat_avg_us;
  }
  return j;
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
  options.bulk = vm.count("bulk") > 0;
  options.transport.backend_args = SplitTransportArgs(vm["transport-arg"].as<std::vector<std::string>>());
  double connect_timeout = vm["connect-timeout"].as<double>();
  if (!(connect_timeout > 0)) return UsageError("--connect-timeout must be > 0", json);
  options.transport.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(connect_timeout * 1000));

  const bool table = !json && !quiet;
  if (table) {
    std::cout << fmt::format("# bench {} -> {}, {} per size, at most {} rounds/pings, {} warm-up, {} path\n", test,
                             options.uri, fmt::format("{:g} s", seconds), options.iterations, options.warmup,
                             options.bulk ? "bulk" : "message")
              << "# 1 Gb = 10^9 bits; round = burst of messages + ACK; t = ping-pong round trip\n"
              << TableHeader() << std::flush;
  }
  auto results = RunSweep(options, [&](const SizeResult& r) {
    if (table) std::cout << TableRow(r) << std::flush;
  });
  if (json) {
    nlohmann::json j;
    j["ok"] = results.ok();
    j["tool"] = "bench";
    j["server"] = options.uri;
    j["transport"] = scheme;
    j["test"] = test;
    j["path"] = options.bulk ? "bulk" : "message";
    j["iterations_limit"] = options.iterations;
    j["seconds_per_size"] = seconds;
    j["warmup"] = options.warmup;
    j["units"] = {{"gbps", "1e9 bits per second"}, {"mmps", "1e6 messages per second"}, {"us", "microseconds"}};
    nlohmann::json rows = nlohmann::json::array();
    if (results.ok()) {
      for (const SizeResult& r : *results) rows.push_back(ResultJson(r, options.bandwidth, options.latency));
    } else {
      j["error"] = results.status().message();
      j["error_code"] = canopy::StatusCodeName(results.status().code());
    }
    j["results"] = rows;
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
  bool json_requested = false;
  for (int i = 1; i < argc; ++i) json_requested |= std::string_view(argv[i]) == "--json";

  po::options_description common("Common options");
  common.add_options()
      ("help,h", "show this help and exit")
      ("port,p", po::value<uint16_t>()->default_value(kDefaultPort), "server port (server: 0 picks a free one)")
      ("transport", po::value<std::string>()->default_value("tcp"), "transport backend: tcp, dpdk or rdma")
      ("transport-arg", po::value<std::vector<std::string>>()->default_value({}, "")->composing(),
       "argument for the backend, repeatable, split on spaces (DPDK EAL arguments, RDMA device=...)")
      ("quiet,q", "print nothing but errors (and the JSON with --json)");
  po::options_description client("Client options (bench HOST)");
  client.add_options()
      ("size,s", po::value<std::string>(), "test only this message size (e.g. 64K)")
      ("sizes", po::value<std::string>()->default_value("2:8M"), "sweep powers of two from MIN to MAX (e.g. 2:8M)")
      ("iterations,n", po::value<int64_t>()->default_value(1000),
       "at most N measured bandwidth rounds and N pings per size")
      ("time,t", po::value<double>()->default_value(1.0),
       "at most this many seconds per size and test (whichever of -n/-t comes first)")
      ("warmup", po::value<int64_t>()->default_value(8), "unmeasured warm-up rounds / pings per size and test")
      ("test", po::value<std::string>()->default_value("all"), "bw (bandwidth + message rate), lat (latency) or all")
      ("bulk", "send payloads on the bulk path (SendWithBulk) instead of as frame payloads")
      ("json", "print the results as JSON on stdout instead of the table (also on failure)")
      ("connect-timeout", po::value<double>()->default_value(5.0), "seconds to wait for the connection");
  po::options_description server("Server options (bench --server)");
  server.add_options()
      ("server", "run the server: sink bandwidth rounds, echo pings")
      ("bind", po::value<std::string>()->default_value("0.0.0.0"), "address to listen on")
      ("idle-timeout", po::value<double>()->default_value(60.0), "drop a connection silent for this many seconds")
      ("port-file", po::value<std::string>(), "write the bound port number to this file once listening");
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
  } catch (const std::exception& e) {
    return UsageError(e.what(), json_requested);
  }
}
