// rcopy: copy files to an rcopy server over tcp://, dpdk:// or rdma://.
//
//   rcopy --server --root DIR [-p PORT] [--bind ADDR] [--transport T] [--max-duration S]
//   rcopy [-p PORT] [--transport T] [-P N] [--verify] [--resume] [--rate R] SRC HOST[:DST]
//   rcopy [options] [-r] SRC... HOST[:DIR]
//
// Exit status: 0 success, 1 a copy (or the server) failed, 2 bad usage. With
// --json exactly one JSON object goes to stdout in every case
// (tools/rcopy/rcopy.schema.json).
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
#include "base/metrics.h"
#include "base/units.h"
#include "fmt/format.h"
#include "tools/cli/cli.h"
#include "tools/http/metrics_endpoint.h"
#include "tools/rcopy/batch.h"
#include "tools/rcopy/checksum.h"
#include "tools/rcopy/client.h"
#include "tools/rcopy/file_list.h"
#include "tools/rcopy/protocol.h"
#include "tools/rcopy/server.h"
#include "transport/auth.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace po = boost::program_options;

namespace {

using canopy::Status;
using namespace canopy::rcopy;
using canopy::FormatBitRate;
using canopy::FormatBytes;
using canopy::ParseBitRate;
using canopy::ParseByteSize;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

const char kUsage[] =
    "usage: rcopy [options] SRC HOST[:DST]           send SRC to the server on HOST\n"
    "       rcopy [options] SRC1 SRC2... HOST[:DIR]  send several files into DIR\n"
    "       rcopy -r [options] SRC... HOST[:DIR]     send directory trees into DIR\n"
    "       rcopy --server --root DIR [options]      receive files into DIR\n";

const char kDescription[] =
    "Copies files to an rcopy server, like librdmacm's rcopy example, over any canopy\n"
    "transport: tcp:// (kernel TCP, sendfile/splice), dpdk:// (user-space packet I/O) or\n"
    "rdma:// (InfiniBand/RoCE). DST is relative to the server's --root; it defaults to the\n"
    "file name of SRC, and a DST ending in '/' gets that name appended. IPv6 hosts are\n"
    "written in brackets: [::1]:dst. With several SRCs or -r, DST is a directory (default:\n"
    "the root): files go to DIR/NAME, trees to DIR/TREE/PATH (relative paths kept; a SRC\n"
    "ending in '/' sends the tree's contents, as rsync). Symlinks and special files inside\n"
    "trees are skipped, not followed. With several files, -P N copies N files at once, one\n"
    "connection each (one file is split into N ranges instead); a failure that concerns one\n"
    "file (missing, refused name, checksum) moves on to the next, any other (server\n"
    "unreachable or busy, connection lost, disk full) starts no further file.\n"
    "The server writes into a temporary file next to DST, fsyncs it once and renames it\n"
    "into place only when the whole file (every stream, and every checksum with --verify)\n"
    "arrived; it never writes outside its root. An interrupted copy (client killed,\n"
    "connection lost, server stopped) leaves the bytes that arrived in .DST.rcopy-partial\n"
    "next to DST (with -P: only the contiguous start; not with --no-partial); any other\n"
    "failure leaves nothing. A server that dies (kill -9) leaves its .DST.rcopy-*.tmp file;\n"
    "the next --resume of DST turns it into the partial file (what was written from the start).\n"
    "--resume: when the server has DST's partial file (else DST itself) and it is not longer\n"
    "than SRC, both sides checksum it (--checksum) and, when it matches the start of SRC,\n"
    "only the rest is sent (reported as resumed_from / bytes_skipped); on a mismatch, or\n"
    "when it is longer, the whole file is sent again from offset 0 (\"prefix mismatch\",\n"
    "\"longer than source\"). A DST already equal to SRC is left alone. --verify then also\n"
    "compares a checksum of the whole resumed file.\n"
    "--rate caps the total sending rate (all streams together) in bits per second, decimal\n"
    "as iperf3 -b: 500M = 500*10^6 bit/s.\n"
    "Throughput is reported in decimal units: 1 Gbit/s = 10^9 bits per second, over the\n"
    "bytes sent.\n";

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
  std::string destination;  // the DST part, possibly empty
};

// HOST[:DST] or [IPV6][:DST].
canopy::Result<Target> ParseTarget(const std::string& text) {
  Target t;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) return Status::InvalidArgument("missing ']' in '" + text + "'");
    t.host = text.substr(1, close - 1);
    std::string rest = text.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') {
      return Status::InvalidArgument("expected ':' after ']' in '" + text + "'");
    }
    if (!rest.empty()) t.destination = rest.substr(1);
  } else {
    size_t colon = text.find(':');
    t.host = text.substr(0, colon);
    if (colon != std::string::npos) t.destination = text.substr(colon + 1);
  }
  if (t.host.empty()) return Status::InvalidArgument("no host in '" + text + "'");
  return t;
}

// One JSON document on one line; invalid UTF-8 in names is replaced, never
// an exception.
void PrintJson(const nlohmann::json& j) {
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
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
    PrintJson(j);
  }
  std::cerr << "rcopy: " << message << "\n" << kUsage << "Try 'rcopy --help' for every option.\n";
  return kExitUsage;
}

// Exposes the server's totals (ServerStats) in the metrics registry: the
// counters advance by what the server counted since the last scrape.
std::unique_ptr<canopy::metrics::Refresher> ExportServerStats(Server& server) {
  struct Exported {
    prometheus::Counter& connections = canopy::metrics::GetCounter(
        "canopy_rcopy_connections_total", "Connections this rcopy server accepted.");
    prometheus::Counter& published = canopy::metrics::GetCounter(
        "canopy_rcopy_files_published_total", "Files this rcopy server published (or sank).");
    prometheus::Counter& failed = canopy::metrics::GetCounter(
        "canopy_rcopy_transfers_failed_total", "Transfers that failed on this rcopy server.");
    prometheus::Counter& bytes = canopy::metrics::GetCounter(
        "canopy_rcopy_bytes_received_total", "File bytes this rcopy server received.");
    prometheus::Gauge& active = canopy::metrics::GetGauge(
        "canopy_rcopy_active_connections", "Connections this rcopy server serves now.");
    ServerStats last;
  };
  auto exported = std::make_shared<Exported>();
  return std::make_unique<canopy::metrics::Refresher>([&server, exported] {
    ServerStats now = server.stats();
    ServerStats& last = exported->last;
    exported->connections.Increment(static_cast<double>(now.connections - last.connections));
    exported->published.Increment(static_cast<double>(now.files_published - last.files_published));
    exported->failed.Increment(static_cast<double>(now.transfers_failed - last.transfers_failed));
    exported->bytes.Increment(static_cast<double>(now.bytes_received - last.bytes_received));
    exported->active.Set(static_cast<double>(now.active_connections));
    last = now;
  });
}

int RunServer(const po::variables_map& vm) {
  const bool json = vm.count("json") > 0;
  if (!vm.count("root")) return UsageError("--server needs --root DIR", json);
  if (vm.count("args")) return UsageError("--server takes no SRC or HOST arguments", json);
  const bool quiet = vm.count("quiet") > 0;
  canopy::SetLogLevel(quiet || json ? canopy::LogLevel::kWarn : canopy::LogLevel::kInfo);

  ServerOptions options;
  options.root = vm["root"].as<std::string>();
  if (vm.count("secret-file")) {
    auto secret = canopy::transport::LoadSecretFile(vm["secret-file"].as<std::string>());
    if (!secret.ok()) return UsageError("--secret-file: " + secret.status().message(), json);
    options.secret = std::move(secret).value();
  }
  // An open server (no secret) listens on loopback unless --bind says otherwise.
  const std::string bind =
      vm.count("bind") ? vm["bind"].as<std::string>() : (options.secret.empty() ? "127.0.0.1" : "0.0.0.0");
  if (options.secret.empty()) {
    std::cerr << "rcopy: WARNING: this server is OPEN (no --secret-file): anyone who can reach " << bind
              << " can write files into " << options.root
              << (vm.count("bind") ? "" : "; it listens on loopback only (use --bind to serve other hosts)") << "\n";
  }
  options.listen_uri = ClientUri(vm["transport"].as<std::string>(), bind, vm["port"].as<uint16_t>());
  options.transport.backend_args = SplitTransportArgs(vm["transport-arg"].as<std::vector<std::string>>());
  double idle = vm["idle-timeout"].as<double>();
  if (!(idle > 0)) return UsageError("--idle-timeout must be > 0", json);
  options.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(idle * 1000));
  options.transport.io_timeout = std::max(options.transport.io_timeout, options.idle_timeout);
  options.max_connections = vm["max-connections"].as<size_t>();
  if (options.max_connections == 0) return UsageError("--max-connections must be > 0", json);
  double max_duration = vm["max-duration"].as<double>();
  if (!(max_duration >= 0) || max_duration > 1e9) {
    return UsageError("--max-duration must be >= 0 seconds (0: unlimited)", json);
  }

  auto fail = [&](const Status& why) {
    if (json) {
      PrintJson({{"ok", false}, {"mode", "server"}, {"error", why.message()},
                 {"error_code", canopy::StatusCodeName(why.code())}});
    }
    std::cerr << "rcopy: server: " << why.ToString() << "\n";
    return kExitFailed;
  };

  // Block the stop signals before any thread starts; the main thread waits
  // for them with sigtimedwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  canopy::Clock::time_point started = canopy::Clock::now();
  auto server = Server::Start(options);
  if (!server.ok()) return fail(server.status());
  canopy::transport::Endpoint bound = (*server)->local_endpoint();
  if (vm.count("port-file")) {
    Status written = canopy::WriteFileAtomic(vm["port-file"].as<std::string>(), std::to_string(bound.port) + "\n");
    if (!written.ok()) return fail(written);
  }
  // --metrics: the totals, and the transport's, for Prometheus.
  std::unique_ptr<canopy::metrics::Refresher> exported_stats;
  std::unique_ptr<canopy::http::MetricsEndpoint> metrics_endpoint;
  if (vm.count("metrics")) {
    exported_stats = ExportServerStats(**server);
    auto endpoint = canopy::http::MetricsEndpoint::Start(vm["metrics"].as<std::string>());
    if (!endpoint.ok()) return fail(endpoint.status().WithContext("--metrics"));
    metrics_endpoint = std::move(*endpoint);
    if (vm.count("metrics-port-file")) {
      Status written = canopy::WriteFileAtomic(vm["metrics-port-file"].as<std::string>(),
                                               std::to_string(metrics_endpoint->port()) + "\n");
      if (!written.ok()) return fail(written);
    }
  }
  if (!quiet && !json) {
    std::cerr << "rcopy: server receiving into " << options.root << " on " << bound.ToUri() << " (idle timeout "
              << idle << " s"
              << (max_duration > 0 ? fmt::format(", stopping after {:g} s", max_duration) : std::string()) << ")\n";
  }
  // Wait for SIGINT/SIGTERM, or until --max-duration has passed.
  int signal_number = 0;
  const auto stop_at = started + std::chrono::duration_cast<canopy::Clock::duration>(
                                     std::chrono::duration<double>(max_duration));
  for (;;) {
    if (max_duration <= 0) {
      if (sigwait(&stop_signals, &signal_number) == 0) break;
      continue;
    }
    auto left = stop_at - canopy::Clock::now();
    if (left <= canopy::Clock::duration::zero()) break;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    struct timespec timeout{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    int got = sigtimedwait(&stop_signals, nullptr, &timeout);
    if (got > 0) {
      signal_number = got;
      break;
    }
  }
  if (metrics_endpoint) metrics_endpoint->Stop();
  exported_stats.reset();
  (*server)->Stop();
  const double seconds = std::chrono::duration<double>(canopy::Clock::now() - started).count();
  ServerStats stats = (*server)->stats();
  const std::string reason =
      signal_number != 0 ? fmt::format("signal {}", signal_number) : fmt::format("--max-duration {:g} s", max_duration);
  if (json) {
    nlohmann::json j = {{"ok", true},
                        {"mode", "server"},
                        {"listen", bound.ToUri()},
                        {"root", options.root},
                        {"stop_reason", signal_number != 0 ? "signal" : "max-duration"},
                        {"seconds", seconds},
                        {"connections", stats.connections},
                        {"files_published", stats.files_published},
                        {"transfers_failed", stats.transfers_failed},
                        {"bytes_received", stats.bytes_received}};
    if (signal_number != 0) j["signal"] = signal_number;
    PrintJson(j);
  } else if (!quiet) {
    std::cerr << fmt::format("rcopy: server stopped ({}): {} connections, {} files, {} failed, {} bytes\n", reason,
                             stats.connections, stats.files_published, stats.transfers_failed,
                             stats.bytes_received);
  }
  return kExitOk;
}

nlohmann::json FileJson(const CopyItem& item, const CopyReport& r, bool resume) {
  nlohmann::json f;
  f["ok"] = r.status.ok();
  f["source"] = item.source;
  f["destination"] = r.destination;
  f["bytes"] = r.file_bytes;
  f["bytes_sent"] = r.bytes_sent;
  f["bytes_skipped"] = r.bytes_skipped;
  f["resumed_from"] = r.resumed_from;
  f["seconds"] = r.seconds;
  f["gbit_per_s"] = r.status.ok() ? r.gbit_per_second() : 0.0;
  if (resume) {
    f["resume"] = {{"outcome", ResumeOutcomeName(r.resume)},
                   {"base", ResumeBaseName(r.resume_base)},
                   {"existing_bytes", r.existing_bytes}};
  }
  if (!r.digests.empty()) {
    nlohmann::json digests = nlohmann::json::array();
    for (uint64_t d : r.digests) digests.push_back(DigestHex(d));
    f["digests"] = digests;
  }
  if (r.status.ok() && r.file_digest != 0) f["file_digest"] = DigestHex(r.file_digest);
  if (!r.status.ok()) {
    f["error"] = r.status.message();
    f["error_code"] = canopy::StatusCodeName(r.status.code());
  }
  return f;
}

// " (resumed from 1048576: 1048576 bytes skipped, partial file)" and the like.
std::string ResumeText(const CopyReport& r) {
  switch (r.resume) {
    case ResumeOutcome::kNotRequested: return "";
    case ResumeOutcome::kNothing: return "; --resume: nothing to resume, sent from offset 0";
    case ResumeOutcome::kResumed:
      return fmt::format("; resumed from {} ({} bytes skipped, {} file on the server)", r.resumed_from,
                         r.bytes_skipped, ResumeBaseName(r.resume_base));
    case ResumeOutcome::kComplete: return "; already complete on the server";
    case ResumeOutcome::kPrefixMismatch:
      return fmt::format("; --resume: prefix mismatch with the {} bytes of the {} file, sent from offset 0",
                         r.existing_bytes, ResumeBaseName(r.resume_base));
    case ResumeOutcome::kLonger:
      return fmt::format("; --resume: the {} file is longer ({} bytes), sent from offset 0",
                         ResumeBaseName(r.resume_base), r.existing_bytes);
  }
  return "";
}

int RunClient(const po::variables_map& vm) {
  const bool json = vm.count("json") > 0;
  const bool quiet = vm.count("quiet") > 0;
  std::vector<std::string> args;
  if (vm.count("args")) args = vm["args"].as<std::vector<std::string>>();
  if (args.size() < 2) return UsageError("need SRC and HOST[:DST]", json);
  if (vm.count("root")) return UsageError("--root is a server option (use it with --server)", json);
  for (const char* server_only : {"max-duration", "port-file", "metrics", "metrics-port-file"}) {
    if (vm.count(server_only) && !vm[server_only].defaulted()) {
      return UsageError(fmt::format("--{} is a server option (use it with --server)", server_only), json);
    }
  }
  canopy::SetLogLevel(quiet ? canopy::LogLevel::kError : canopy::LogLevel::kWarn);

  const std::vector<std::string> sources(args.begin(), args.end() - 1);
  auto target = ParseTarget(args.back());
  if (!target.ok()) return UsageError(target.status().message(), json);
  const bool recursive = vm.count("recursive") > 0;

  ClientOptions options;
  options.host = target->host;
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
  options.resume = vm.count("resume") > 0;
  options.keep_partial = vm.count("no-partial") == 0;
  if (options.resume && options.sink) return UsageError("--resume does not go with --sink", json);
  if (vm.count("rate")) {
    auto rate = ParseBitRate(vm["rate"].as<std::string>(), /*allow_zero=*/true);
    if (!rate.ok()) return UsageError("--rate: " + rate.status().message(), json);
    options.rate_bits_per_second = *rate;
  }
  options.transport.backend_args = SplitTransportArgs(vm["transport-arg"].as<std::vector<std::string>>());
  if (vm.count("secret-file")) {
    auto secret = canopy::transport::LoadSecretFile(vm["secret-file"].as<std::string>());
    if (!secret.ok()) return UsageError("--secret-file: " + secret.status().message(), json);
    options.secret = std::move(secret).value();
  }
  double connect_timeout = vm["connect-timeout"].as<double>();
  double timeout = vm["timeout"].as<double>();
  if (!(connect_timeout > 0) || !(timeout > 0)) return UsageError("timeouts must be > 0", json);
  options.transport.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(connect_timeout * 1000));
  options.transport.io_timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));

  CopyPlan plan = PlanCopies(sources, target->destination, recursive);
  const bool single = !plan.destination_is_directory && plan.items.size() == 1;
  if (!quiet) {
    for (const SkippedItem& skipped : plan.skipped) {
      std::cerr << "rcopy: skipping " << skipped.source << ": " << skipped.reason << "\n";
    }
  }

  const bool show_progress = !quiet && !json && ::isatty(STDERR_FILENO);
  const std::string server_uri = MakeUri(options.scheme, options.host, options.port);
  // The transport's once-per-process setup (dpdk://: the EAL, which loads
  // every PMD plugin it finds, and the port: about half a second) is done
  // before the clock starts, as perftest and iperf3 leave theirs out, and
  // reported apart (setup_seconds). Connecting to the server stays inside
  // the clock. A setup that fails here fails the same way in the copy
  // below, which reports it.
  double setup_seconds = 0;
  if (!plan.items.empty()) {
    canopy::Clock::time_point setup_start = canopy::Clock::now();
    (void)canopy::transport::PrepareDial(server_uri, options.transport);
    setup_seconds = std::chrono::duration<double>(canopy::Clock::now() - setup_start).count();
  }
  // Shown to people only where it is worth a glance (not for tcp://).
  const std::string setup_text =
      setup_seconds >= 0.01
          ? fmt::format(" ({:.3f} s of {}:// setup before the clock)", setup_seconds, options.scheme)
          : "";
  canopy::Clock::time_point run_start = canopy::Clock::now();
  CopyBatchOptions batch;
  batch.client = options;
  batch.single_file = single;
  if (show_progress) {
    batch.progress = [run_start](uint64_t done, uint64_t total) {
      PrintProgress(done, total, std::chrono::duration<double>(canopy::Clock::now() - run_start).count());
    };
  }
  // Called for one file at a time (CopyBatch serializes it).
  batch.on_file_done = [&](size_t index, const CopyReport& report) {
    const CopyItem& item = plan.items[index];
    if (show_progress) ClearProgress();
    if (!report.status.ok()) {
      if (!quiet || json) std::cerr << "rcopy: " << item.source << ": " << report.status.ToString() << "\n";
    } else if (!json && !quiet && report.resume == ResumeOutcome::kComplete) {
      std::cout << fmt::format("rcopy: '{}' on {} already holds the {} bytes of {}: nothing sent\n",
                               report.destination, report.server_uri, report.file_bytes, item.source);
    } else if (!json && !quiet) {
      std::cout << fmt::format("rcopy: {} {} bytes to {} '{}' in {:.3f} s: {} Gbit/s "
                               "(1 Gbit = 10^9 bits){}{}{}{}{}\n",
                               report.sink ? "sent (server discarded)" : "copied", report.file_bytes,
                               report.server_uri, report.destination, report.seconds,
                               GbitText(report.gbit_per_second()),
                               report.streams > 1 ? fmt::format(", {} streams", report.streams) : "",
                               options.verify ? fmt::format(", {} verified", ChecksumAlgorithmName(options.checksum))
                                              : "",
                               report.rate_bits_per_second > 0
                                   ? fmt::format(", rate limit {}", FormatBitRate(report.rate_bits_per_second))
                                   : "",
                               ResumeText(report), single ? setup_text : "");
    }
  };
  CopyBatchResult outcome = CopyBatch(plan, batch);
  if (show_progress) ClearProgress();
  // The files attempted are a prefix of the plan (workers take them in order).
  std::vector<CopyReport> reports;
  for (size_t k = 0; k < outcome.reports.size() && outcome.attempted[k]; ++k) {
    reports.push_back(std::move(outcome.reports[k]));
  }
  const size_t failed = outcome.failed;
  const size_t not_attempted = outcome.not_attempted;
  const Status first_failure = outcome.first_failure;
  const std::string first_failed_source = failed > 0 ? plan.items[outcome.first_failed_index].source : "";
  const double run_seconds = std::chrono::duration<double>(canopy::Clock::now() - run_start).count();

  uint64_t total_bytes = 0, total_sent = 0, total_skipped = 0;
  for (const CopyReport& r : reports) {
    total_bytes += r.file_bytes;
    total_sent += r.bytes_sent;
    total_skipped += r.bytes_skipped;
  }
  const double total_gbit = run_seconds > 0 ? static_cast<double>(total_sent) * 8 / run_seconds / 1e9 : 0;
  const bool ok = failed == 0 && not_attempted == 0;
  Status run_status;
  if (!ok) {
    if (single) {
      run_status = first_failure;
    } else {
      std::string text = fmt::format("{} of {} files failed", failed, plan.items.size());
      if (not_attempted > 0) text += fmt::format(" ({} not attempted: the run stopped)", not_attempted);
      run_status = canopy::Status(first_failure.code(),
                                  text + "; first: " + first_failed_source + ": " + first_failure.message());
    }
  }

  if (json) {
    nlohmann::json j;
    j["ok"] = ok;
    j["mode"] = "client";
    j["server"] = server_uri;
    j["transport"] = options.scheme;
    j["streams"] = options.streams;
    j["chunk_bytes"] = EffectiveChunkBytes(options);
    j["sink"] = options.sink;
    j["verify"] = options.verify;
    if (options.verify) j["checksum"] = ChecksumAlgorithmName(options.checksum);
    j["recursive"] = recursive;
    j["keep_partial"] = options.keep_partial;
    j["rate_bits_per_s"] = options.rate_bits_per_second;
    j["bytes"] = total_bytes;
    j["bytes_sent"] = total_sent;
    j["bytes_skipped"] = total_skipped;
    j["seconds"] = run_seconds;
    j["setup_seconds"] = setup_seconds;
    j["gbit_per_s"] = ok ? total_gbit : 0.0;
    j["gbit_definition"] = "1 Gbit = 1e9 bits";
    nlohmann::json files = nlohmann::json::array();
    for (size_t k = 0; k < reports.size(); ++k) files.push_back(FileJson(plan.items[k], reports[k], options.resume));
    if (single && !files.empty()) {
      // One file: its own fields at the top level too, as before.
      for (const char* key : {"source", "destination", "resumed_from", "resume", "digests", "file_digest"}) {
        if (files[0].contains(key)) j[key] = files[0][key];
      }
    }
    j["files"] = files;
    nlohmann::json skipped = nlohmann::json::array();
    for (const SkippedItem& s : plan.skipped) skipped.push_back({{"source", s.source}, {"reason", s.reason}});
    j["skipped"] = skipped;
    j["totals"] = {{"files", plan.items.size()},
                   {"files_ok", reports.size() - failed},
                   {"files_failed", failed},
                   {"files_not_attempted", not_attempted},
                   {"files_skipped", plan.skipped.size()},
                   {"bytes", total_bytes},
                   {"bytes_sent", total_sent},
                   {"bytes_skipped", total_skipped},
                   {"seconds", run_seconds},
                   {"gbit_per_s", total_gbit}};
    if (!ok) {
      j["error"] = run_status.message();
      j["error_code"] = canopy::StatusCodeName(run_status.code());
    }
    PrintJson(j);
  } else if (!quiet && !single) {
    std::cout << fmt::format("rcopy: {} files ({} failed{}{}), {} bytes sent ({} skipped) in {:.3f} s: {} Gbit/s "
                             "(1 Gbit = 10^9 bits){}\n",
                             plan.items.size(), failed,
                             not_attempted > 0 ? fmt::format(", {} not attempted", not_attempted) : "",
                             plan.skipped.empty() ? "" : fmt::format(", {} skipped", plan.skipped.size()), total_sent,
                             total_skipped, run_seconds, GbitText(total_gbit), setup_text);
  }
  if (!ok && !single && (!quiet || json)) std::cerr << "rcopy: " << run_status.ToString() << "\n";
  return ok ? kExitOk : kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  canopy::transport::RegisterBuiltinTransports();
  const bool json_requested = canopy::cli::CommandLineHas(argc, argv, "--json");

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
      ("secret-file", po::value<std::string>(),
       "file holding the shared secret (at least 8 bytes; a trailing newline is dropped): client and server "
       "authenticate each other with HMAC-SHA256 before any data moves; both sides need the same one")
      ("quiet,q", "print nothing but errors (client: no progress bar, no summary)")
      ("json", "print the result as one JSON object on stdout, also on failure and on usage errors "
               "(client: the copy report; server: its statistics when it stops); "
               "schema: tools/rcopy/rcopy.schema.json");
  po::options_description client("Client options (rcopy SRC... HOST[:DST])");
  client.add_options()
      ("recursive,r", "copy directory trees: relative paths are kept under DST; symlinks and special "
                      "files inside the trees are skipped")
      ("chunk", po::value<std::string>()->default_value("4M"),
       "bytes per DATA message (bulk transfer unit), 4K..1G, e.g. 1M, 16M")
      ("parallel,P", po::value<int>()->default_value(1),
       "N connections at once (1..64): one file is split into N byte ranges sent together; "
       "several files are copied N at a time, one connection each")
      ("verify", "end-to-end check: both sides checksum every range (the server from what it "
                 "wrote) and compare; a mismatch fails the copy and nothing is published. With "
                 "--resume the whole file is compared too")
      ("checksum", po::value<std::string>()->default_value("xxh3"),
       "checksum for --verify and --resume: xxh3 (XXH3-64) or crc32c")
      ("resume", "resume an interrupted copy: send only what follows the server's partial file "
                 "(or shorter DST) when its checksum matches the start of SRC; else send it all "
                 "from offset 0 (see above)")
      ("no-partial", "ask the server to remove, not keep, what arrived when this copy is interrupted "
                     "(then it cannot be resumed)")
      ("rate", po::value<std::string>(),
       "cap the sending rate of all streams together, bits per second, decimal as iperf3 -b: "
       "800k, 80M, 2.5G (0: unlimited)")
      ("sink", "ask the server to discard the data instead of writing it: measures the network only")
      ("connect-timeout", po::value<double>()->default_value(5.0), "seconds to wait for the connection")
      ("timeout", po::value<double>()->default_value(60.0),
       "seconds without progress (or waiting for the server's final answer) before giving up");
  po::options_description server("Server options (rcopy --server)");
  server.add_options()
      ("server", "run the server")
      ("root", po::value<std::string>(), "directory to write received files into (must exist)")
      ("bind", po::value<std::string>(),
       "address to listen on (default: 0.0.0.0 with --secret-file, 127.0.0.1 without: an open server "
       "serves only this host unless told otherwise)")
      ("idle-timeout", po::value<double>()->default_value(60.0),
       "seconds a connection may stay silent before it is dropped (its transfer fails; what arrived "
       "is kept for --resume)")
      ("max-duration", po::value<double>()->default_value(0.0),
       "stop after this many seconds, as on SIGTERM, and exit 0 (0: run until a signal); "
       "open transfers are interrupted")
      ("max-connections", po::value<size_t>()->default_value(256),
       "connections served at once; more get a \"server busy\" error and are closed")
      ("port-file", po::value<std::string>(), "write the bound port number to this file once listening")
      ("metrics", po::value<std::string>(),
       "serve Prometheus metrics at http://ADDR/metrics, ADDR = IPv4:port or [IPv6]:port (port 0: any "
       "free port, see --metrics-port-file): connections, files published, transfers failed, bytes "
       "received, and the transport's connections and bytes")
      ("metrics-port-file", po::value<std::string>(), "write the metrics port to this file once listening");
  po::options_description hidden;
  hidden.add_options()("args", po::value<std::vector<std::string>>(), "");
  po::positional_options_description positional;
  positional.add("args", -1);

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
              << "Exit status: 0 success, 1 a copy failed (reason on stderr / in the JSON), 2 bad usage.\n";
    return kExitOk;
  }
  try {
    return vm.count("server") ? RunServer(vm) : RunClient(vm);
  } catch (const po::error& e) {
    return UsageError(e.what(), json_requested);
  } catch (const std::exception& e) {
    if (json_requested) {
      PrintJson({{"ok", false}, {"mode", vm.count("server") ? "server" : "client"}, {"error", e.what()},
                 {"error_code", "Internal"}});
    }
    std::cerr << "rcopy: " << e.what() << "\n";
    return kExitFailed;
  }
}
