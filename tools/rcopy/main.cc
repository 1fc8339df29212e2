// rcopy: copy a file to an rcopy server over tcp://, dpdk:// or rdma://.
//
//   rcopy --server --root DIR [-p PORT] [--bind ADDR] [--transport T]
//   rcopy [-p PORT] [--transport T] [-P N] [--verify] SRC HOST[:DST]
//
// Exit status: 0 success, 1 the copy (or the server) failed, 2 bad usage.
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "base/file.h"
#include "base/logging.h"
#include "fmt/format.h"
#include "tools/rcopy/checksum.h"
#include "tools/rcopy/client.h"
#include "tools/rcopy/protocol.h"
#include "tools/rcopy/server.h"
#include "base/units.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace po = boost::program_options;

namespace {

using canopy::Status;
using namespace canopy::rcopy;
using canopy::FormatBytes;
using canopy::ParseByteSize;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

const char kUsage[] =
    "usage: rcopy [options] SRC HOST[:DST]        send SRC to the server on HOST\n"
    "       rcopy --server --root DIR [options]   receive files into DIR\n";

const char kDescription[] =
    "Copies one file to an rcopy server, like librdmacm's rcopy example, over any canopy\n"
    "transport: tcp:// (kernel TCP, sendfile/splice), dpdk:// (user-space packet I/O) or\n"
    "rdma:// (InfiniBand/RoCE). DST is relative to the server's --root; it defaults to the\n"
    "file name of SRC, and a DST ending in '/' gets that name appended. IPv6 hosts are\n"
    "written in brackets: [::1]:dst. The server writes into a temporary file next to DST,\n"
    "fsyncs it once and renames it into place only when the whole file (every stream, and\n"
    "every checksum with --verify) arrived; it never writes outside its root.\n"
    "Throughput is reported in decimal units: 1 Gbit/s = 10^9 bits per second.\n";

std::string ClientUri(const std::string& scheme, const std::string& host, uint16_t port) {
  return MakeUri(scheme, host, port);
}

// Splits --transport-arg values on whitespace, so both
// --transport-arg=--no-huge --transport-arg=-m --transport-arg=512 and
// --transport-arg="--no-huge -m 512" work.
std::vector<std::string> SplitTransportArgs(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    std::istringstream in(v);
    std::string word;
    while (in >> word) out.push_back(word);
  }
  return out;
}

struct Target {
  std::string host;
  std::string destination;
};

// HOST[:DST] or [IPV6][:DST].
canopy::Result<Target> ParseTarget(const std::string& text, const std::string& source) {
  Target t;
  std::string rest;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) return Status::InvalidArgument("missing ']' in '" + text + "'");
    t.host = text.substr(1, close - 1);
    rest = text.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') {
      return Status::InvalidArgument("expected ':' after ']' in '" + text + "'");
    }
    if (!rest.empty()) rest = rest.substr(1);
  } else {
    size_t colon = text.find(':');
    t.host = text.substr(0, colon);
    if (colon != std::string::npos) rest = text.substr(colon + 1);
  }
  if (t.host.empty()) return Status::InvalidArgument("no host in '" + text + "'");
  std::string base = canopy::BaseName(source);
  if (rest.empty()) {
    t.destination = base;
  } else if (rest.back() == '/') {
    t.destination = rest + base;
  } else {
    t.destination = rest;
  }
  return t;
}

std::string GbitText(double gbit) { return fmt::format("{:.3f}", gbit); }

void PrintProgress(uint64_t done, uint64_t total, double seconds) {
  constexpr int kWidth = 30;
  double fraction = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  if (fraction > 1) fraction = 1;
  int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>';
  bar.resize(kWidth, ' ');
  double gbit = seconds > 0 ? static_cast<double>(done) * 8 / seconds / 1e9 : 0;
  std::string line = fmt::format("\r{:3.0f}% [{}] {} / {}  {:.2f} Gbit/s ", fraction * 100, bar, FormatBytes(done),
                                 FormatBytes(total), gbit);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void ClearProgress() {
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
}

int UsageError(const std::string& message, bool json) {
  if (json) {
    nlohmann::json j = {{"ok", false}, {"error", message}, {"error_code", "InvalidArgument"}, {"usage", true}};
    std::cout << j.dump() << std::endl;
  }
  std::cerr << "rcopy: " << message << "\n" << kUsage << "Try 'rcopy --help' for every option.\n";
  return kExitUsage;
}

int RunServer(const po::variables_map& vm) {
  if (!vm.count("root")) return UsageError("--server needs --root DIR", vm.count("json") > 0);
  if (vm.count("source") || vm.count("target")) {
    return UsageError("--server takes no SRC or HOST arguments", vm.count("json") > 0);
  }
  const bool quiet = vm.count("quiet") > 0;
  canopy::SetLogLevel(quiet ? canopy::LogLevel::kWarn : canopy::LogLevel::kInfo);

  ServerOptions options;
  options.root = vm["root"].as<std::string>();
  options.listen_uri = ClientUri(vm["transport"].as<std::string>(), vm["bind"].as<std::string>(),
                                 vm["port"].as<uint16_t>());
  options.transport.backend_args = SplitTransportArgs(vm["transport-arg"].as<std::vector<std::string>>());
  double idle = vm["idle-timeout"].as<double>();
  if (idle <= 0) return UsageError("--idle-timeout must be > 0", false);
  options.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(idle * 1000));
  options.transport.io_timeout = std::max(options.transport.io_timeout, options.idle_timeout);
  options.max_connections = vm["max-connections"].as<size_t>();
  if (options.max_connections == 0) return UsageError("--max-connections must be > 0", false);

  // Block the stop signals before any thread starts; the main thread waits
  // for them with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = Server::Start(options);
  if (!server.ok()) {
    std::cerr << "rcopy: server: " << server.status().ToString() << "\n";
    return kExitFailed;
  }
  canopy::transport::Endpoint bound = (*server)->local_endpoint();
  if (vm.count("port-file")) {
    Status written = canopy::WriteFileAtomic(vm["port-file"].as<std::string>(), std::to_string(bound.port) + "\n");
    if (!written.ok()) {
      std::cerr << "rcopy: server: " << written.ToString() << "\n";
      return kExitFailed;
    }
  }
  if (!quiet) {
    std::cerr << "rcopy: server receiving into " << options.root << " on " << bound.ToUri()
              << " (idle timeout " << idle << " s)\n";
  }
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  (*server)->Stop();
  if (!quiet) {
    ServerStats stats = (*server)->stats();
    std::cerr << fmt::format("rcopy: server stopped (signal {}): {} connections, {} files, {} failed, {} bytes\n",
                             signal_number, stats.connections, stats.files_published, stats.transfers_failed,
                             stats.bytes_received);
  }
  return kExitOk;
}

int RunClient(const po::variables_map& vm) {
  const bool json = vm.count("json") > 0;
  const bool quiet = vm.count("quiet") > 0;
  if (!vm.count("source") || !vm.count("target")) return UsageError("need SRC and HOST[:DST]", json);
  if (vm.count("root")) return UsageError("--root is a server option (use it with --server)", json);
  canopy::SetLogLevel(quiet ? canopy::LogLevel::kError : canopy::LogLevel::kWarn);

  ClientOptions options;
  options.source = vm["source"].as<std::string>();
  auto target = ParseTarget(vm["target"].as<std::string>(), options.source);
  if (!target.ok()) return UsageError(target.status().message(), json);
  options.host = target->host;
  options.destination = target->destination;
  options.scheme = vm["transport"].as<std::string>();
  options.port = vm["port"].as<uint16_t>();
  if (options.port == 0) return UsageError("--port must be 1..65535 for the client", json);
  auto chunk = ParseByteSize(vm["chunk"].as<std::string>());
  if (!chunk.ok()) return UsageError("--chunk: " + chunk.status().message(), json);
  if (*chunk < kMinChunkBytes || *chunk > kMaxChunkBytes) {
    return UsageError(fmt::format("--chunk must be between {} and {}", FormatBytes(kMinChunkBytes),
                                  FormatBytes(kMaxChunkBytes)),
                      json);
  }
  options.chunk_bytes = *chunk;
  int streams = vm["parallel"].as<int>();
  if (streams < 1 || streams > kMaxStreams) {
    return UsageError(fmt::format("-P/--parallel must be 1..{}", kMaxStreams), json);
  }
  options.streams = static_cast<uint16_t>(streams);
  options.verify = vm.count("verify") > 0;
  auto algorithm = ParseChecksumAlgorithm(vm["checksum"].as<std::string>());
  if (!algorithm.ok()) return UsageError("--checksum: " + algorithm.status().message(), json);
  options.checksum = *algorithm;
  options.sink = vm.count("sink") > 0;
  options.transport.backend_args = SplitTransportArgs(vm["transport-arg"].as<std::vector<std::string>>());
  double connect_timeout = vm["connect-timeout"].as<double>();
  double timeout = vm["timeout"].as<double>();
  if (connect_timeout <= 0 || timeout <= 0) return UsageError("timeouts must be > 0", json);
  options.transport.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(connect_timeout * 1000));
  options.transport.io_timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));

  const bool show_progress = !quiet && !json && ::isatty(STDERR_FILENO);
  canopy::Clock::time_point start = canopy::Clock::now();
  if (show_progress) {
    options.progress = [start](uint64_t done, uint64_t total) {
      PrintProgress(done, total, std::chrono::duration<double>(canopy::Clock::now() - start).count());
    };
  }

  CopyReport report = CopyFile(options);
  if (show_progress) ClearProgress();

  if (json) {
    nlohmann::json j;
    j["ok"] = report.status.ok();
    j["source"] = options.source;
    j["server"] = report.server_uri;
    j["transport"] = options.scheme;
    j["destination"] = report.destination;
    j["bytes"] = report.file_bytes;
    j["bytes_sent"] = report.bytes_sent;
    j["seconds"] = report.seconds;
    j["gbit_per_s"] = report.status.ok() ? report.gbit_per_second() : 0.0;
    j["gbit_definition"] = "1 Gbit = 1e9 bits";
    j["streams"] = report.streams;
    j["chunk_bytes"] = report.chunk_bytes;
    j["sink"] = report.sink;
    j["verify"] = options.verify;
    if (options.verify) j["checksum"] = ChecksumAlgorithmName(options.checksum);
    if (!report.digests.empty()) {
      nlohmann::json digests = nlohmann::json::array();
      for (uint64_t d : report.digests) digests.push_back(DigestHex(d));
      j["digests"] = digests;
    }
    if (!report.status.ok()) {
      j["error"] = report.status.message();
      j["error_code"] = canopy::StatusCodeName(report.status.code());
    }
    std::cout << j.dump() << std::endl;
  }
  if (!report.status.ok()) {
    if (!quiet || json) std::cerr << "rcopy: " << options.source << ": " << report.status.ToString() << "\n";
    return kExitFailed;
  }
  if (!json && !quiet) {
    std::cout << fmt::format("rcopy: {} {} bytes to {} '{}' in {:.3f} s: {} Gbit/s (1 Gbit = 10^9 bits){}{}\n",
                             report.sink ? "sent (server discarded)" : "copied", report.file_bytes,
                             report.server_uri, report.destination, report.seconds,
                             GbitText(report.gbit_per_second()),
                             report.streams > 1 ? fmt::format(", {} streams", report.streams) : "",
                             options.verify ? fmt::format(", {} verified", ChecksumAlgorithmName(options.checksum))
                                            : "");
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
      ("port,p", po::value<uint16_t>()->default_value(kDefaultPort),
       "TCP/UDP port of the server (server: 0 picks a free one)")
      ("transport", po::value<std::string>()->default_value("tcp"),
       "transport backend: tcp, dpdk or rdma (the URI scheme used)")
      ("transport-arg", po::value<std::vector<std::string>>()->default_value({}, "")->composing(),
       "argument for the backend, repeatable, split on spaces: DPDK EAL arguments such as "
       "--transport-arg='--no-huge -m 512 --vdev=net_memif0', or RDMA device=mlx5_0")
      ("quiet,q", "print nothing but errors (client: no progress bar, no summary)")
      ("json", "client: print the result as one JSON object on stdout (also on failure)");
  po::options_description client("Client options (rcopy SRC HOST[:DST])");
  client.add_options()
      ("chunk", po::value<std::string>()->default_value("4M"),
       "bytes per DATA message (bulk transfer unit), 4K..1G, e.g. 1M, 16M")
      ("parallel,P", po::value<int>()->default_value(1),
       "split the file into N byte ranges sent over N connections at once (1..64)")
      ("verify", "end-to-end check: both sides checksum every range (the server from what it "
                 "wrote) and compare; a mismatch fails the copy and nothing is published")
      ("checksum", po::value<std::string>()->default_value("xxh3"), "checksum for --verify: xxh3 (XXH3-64) or crc32c")
      ("sink", "ask the server to discard the data instead of writing it: measures the network only")
      ("connect-timeout", po::value<double>()->default_value(5.0), "seconds to wait for the connection")
      ("timeout", po::value<double>()->default_value(60.0),
       "seconds without progress (or waiting for the server's final answer) before giving up");
  po::options_description server("Server options (rcopy --server)");
  server.add_options()
      ("server", "run the server")
      ("root", po::value<std::string>(), "directory to write received files into (must exist)")
      ("bind", po::value<std::string>()->default_value("0.0.0.0"), "address to listen on")
      ("idle-timeout", po::value<double>()->default_value(60.0),
       "seconds a connection may stay silent before it is dropped (its transfer fails)")
      ("max-connections", po::value<size_t>()->default_value(256), "connections served at once; more are refused")
      ("port-file", po::value<std::string>(), "write the bound port number to this file once listening");
  po::options_description hidden;
  hidden.add_options()
      ("source", po::value<std::string>(), "")
      ("target", po::value<std::string>(), "");
  po::positional_options_description positional;
  positional.add("source", 1).add("target", 1);

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
              << "Exit status: 0 success, 1 the copy failed (reason on stderr / in the JSON), 2 bad usage.\n";
    return kExitOk;
  }
  try {
    return vm.count("server") ? RunServer(vm) : RunClient(vm);
  } catch (const std::exception& e) {
    return UsageError(e.what(), json_requested);
  }
}
