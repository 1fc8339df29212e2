// get: a wget-style HTTP/1.1 client. Downloads one URL to a file, with resume
// (--continue), retries, redirects, a progress bar on a terminal, and a
// summary in bytes, seconds and Gbit/s (decimal: 1 Gbit = 1e9 bits).
//
// Exit status, as wget's: 0 success, 1 generic failure, 2 bad usage, 3 file
// I/O error, 4 network failure, 7 protocol error, 8 the server answered an
// error status (ExitCodeFor below; with --json, "error_code" tells the
// failures apart more finely). With --json, stdout is exactly one JSON
// document in every case (tools/get/get.schema.json).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "base/clock.h"
#include "base/file.h"
#include "tools/cli/cli.h"
#include "tools/http/client.h"
#include "tools/http/parser.h"
#include "tools/http/url.h"

namespace po = boost::program_options;
using namespace canopy;

namespace {

constexpr size_t kBufferBytes = 1 << 20;

struct Options {
  std::string url;
  std::string output;
  bool resume = false;
  int tries = 3;
  double timeout_s = 30;
  int max_redirects = 10;
  bool quiet = false;
  bool json = false;
  bool progress = false;
};

// Outcome of a whole download.
struct Outcome {
  std::string final_url;
  int status = 0;
  uint64_t bytes = 0;          // body bytes received in this run (all attempts)
  uint64_t file_size = 0;      // size of the output when done
  uint64_t resumed_from = 0;   // offset the first successful resume started at
  int attempts = 0;
  int redirects = 0;
  bool already_complete = false;
};

// An error worth another try (network trouble, 5xx) or not (4xx, local I/O).
// `code` is the --json "error_code" (one of the k*Code constants below).
struct AttemptError {
  Status status;
  bool retryable = false;
  const char* code = "";
};

// The "error_code" values, as the usage text and get.schema.json list them.
// ("usage", for a bad command line, is cli::UsageError's.)
constexpr char kResolveCode[] = "resolve";      // the host name does not resolve
constexpr char kConnectCode[] = "connect";      // connection refused or unreachable
constexpr char kTimeoutCode[] = "timeout";      // no connection or no data within --timeout
constexpr char kIoCode[] = "io";                // send/receive failed, or the server closed early
constexpr char kProtocolCode[] = "protocol";    // malformed or inconsistent response
constexpr char kRedirectsCode[] = "redirects";  // more than --max-redirect redirects
constexpr char kHttpStatusCode[] = "http_status";  // the server answered an error status
constexpr char kFileCode[] = "file";            // the output file could not be written
constexpr char kConflictCode[] = "conflict";    // --continue: local file larger than the remote one

// wget's exit status for an error_code: 3 file I/O, 4 network failure
// (resolve, connect, timeout, send/receive), 7 protocol error (malformed
// response, too many redirects), 8 server error response; 1 otherwise.
constexpr int kExitFileError = 3;
constexpr int kExitNetworkFailure = 4;
constexpr int kExitProtocolError = 7;
constexpr int kExitServerError = 8;
int ExitCodeFor(std::string_view code) {
  if (code == kFileCode) return kExitFileError;
  if (code == kResolveCode || code == kConnectCode || code == kTimeoutCode || code == kIoCode) {
    return kExitNetworkFailure;
  }
  if (code == kProtocolCode || code == kRedirectsCode) return kExitProtocolError;
  if (code == kHttpStatusCode) return kExitServerError;
  return 1;  // conflict, internal
}

// A network failure after connecting: a timeout, else "io".
AttemptError NetError(const Status& s) { return {s, true, s.IsTimeout() ? kTimeoutCode : kIoCode}; }

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  void Update(uint64_t done, int64_t total, bool force = false) {
    if (!enabled_) return;
    auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    double secs = std::chrono::duration<double>(now - start_).count();
    double gbps = secs > 0 ? static_cast<double>(done - start_bytes_) * 8 / secs / 1e9 : 0;
    if (total > 0) {
      int pct = static_cast<int>(static_cast<double>(done) * 100 / static_cast<double>(total));
      int width = 30;
      int filled = pct * width / 100;
      std::fprintf(stderr, "\r%3d%% [%s%s] %llu/%lld bytes %.2f Gbit/s ", pct, std::string(filled, '=').c_str(),
                   std::string(width - filled, ' ').c_str(), static_cast<unsigned long long>(done),
                   static_cast<long long>(total), gbps);
    } else {
      std::fprintf(stderr, "\r%llu bytes %.2f Gbit/s ", static_cast<unsigned long long>(done), gbps);
    }
  }
  void Begin(uint64_t start_bytes) {
    start_ = Clock::now();
    start_bytes_ = start_bytes;
  }
  void Finish() {
    if (enabled_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
  uint64_t start_bytes_ = 0;
};

std::string DefaultOutputName(const http::Url& url) {
  std::string_view path = std::string_view(url.target).substr(0, url.target.find('?'));
  std::string name(path.substr(path.rfind('/') + 1));
  Result<std::string> decoded = http::PercentDecode(name);
  if (decoded.ok()) name = *decoded;
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return "index.html";
  }
  return name;
}

// One attempt: follow redirects, then stream the body into the output.
// *offset is the number of bytes already in the output file (resume point);
// it grows as bytes are written so the next attempt can resume.
AttemptError Attempt(const Options& opt, http::Url url, bool to_stdout, uint64_t* offset, Outcome* out,
                     ProgressBar* bar) {
  auto io_timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000));
  for (int redirect = 0;; ++redirect) {
    Result<http::SocketAddress> addr = http::ResolveHost(url.host, url.port);
    if (!addr.ok()) return {addr.status(), true, kResolveCode};
    Result<UniqueFd> conn = http::ConnectTcp(*addr, Deadline::After(io_timeout), io_timeout);
    if (!conn.ok()) return {conn.status(), true, conn.status().IsTimeout() ? kTimeoutCode : kConnectCode};
    int fd = conn->get();
    http::Headers extra;
    if (*offset > 0) extra.Add("Range", fmt::format("bytes={}-", *offset));
    Status s = http::SendAll(fd, http::BuildRequest("GET", url, extra, /*keep_alive=*/false, "canopy-get/0.1"));
    if (!s.ok()) return NetError(s.WithContext(url.ToString()));
    std::string buffer;
    Result<http::ResponseHead> head = http::ReadResponseHead(fd, &buffer);
    if (!head.ok()) {
      if (head.status().IsCorruption()) return {head.status().WithContext(url.ToString()), true, kProtocolCode};
      return NetError(head.status().WithContext(url.ToString()));
    }
    out->status = head->status;
    out->final_url = url.ToString();
    int st = head->status;
    if (st == 301 || st == 302 || st == 303 || st == 307 || st == 308) {
      const std::string* location = head->headers.Find("Location");
      if (location == nullptr) {
        return {Status::Corruption(fmt::format("HTTP {} without Location", st)), false, kProtocolCode};
      }
      if (redirect >= opt.max_redirects) {
        return {Status::Aborted(fmt::format("more than {} redirects", opt.max_redirects)), false, kRedirectsCode};
      }
      Result<http::Url> next = http::ResolveLocation(url, *location);
      if (!next.ok()) return {next.status(), false, kProtocolCode};
      if (!opt.quiet) std::fprintf(stderr, "get: %d redirect to %s\n", st, next->ToString().c_str());
      url = *next;
      ++out->redirects;
      continue;
    }
    if (st == 416 && *offset > 0) {
      // Complete already when the server's size equals ours.
      const std::string* cr = head->headers.Find("Content-Range");
      uint64_t remote = 0;
      if (cr == nullptr || cr->rfind("bytes */", 0) != 0 || !http::ParseContentLength(cr->substr(8), &remote)) {
        return {Status::Corruption("416 without a usable Content-Range"), false, kProtocolCode};
      }
      if (remote != *offset) {
        return {Status::Conflict(fmt::format("local file has {} bytes but the remote one {}", *offset, remote)), false,
                kConflictCode};
      }
      out->already_complete = true;
      out->file_size = *offset;
      return {Status::Ok(), false};
    }
    bool partial = st == 206;
    if (st != 200 && !partial) {
      return {Status::Unavailable(fmt::format("{}: HTTP {} {}", url.ToString(), st, head->reason)), st >= 500,
              kHttpStatusCode};
    }
    if (partial) {
      const std::string* cr = head->headers.Find("Content-Range");
      std::string expect = fmt::format("bytes {}-", *offset);
      if (*offset == 0 || cr == nullptr || cr->rfind(expect, 0) != 0) {
        return {Status::Corruption(fmt::format("206 with unexpected Content-Range '{}'", cr ? *cr : "")), false,
                kProtocolCode};
      }
      if (out->resumed_from == 0) out->resumed_from = *offset;
    } else if (*offset > 0) {
      if (!opt.quiet) std::fprintf(stderr, "get: server ignored the Range request; restarting from 0\n");
      *offset = 0;
    }
    Result<http::BodyReader> body = http::BodyReader::ForResponse(*head, /*request_was_head=*/false);
    if (!body.ok()) return {body.status(), false, kProtocolCode};

    UniqueFd file;
    int out_fd = STDOUT_FILENO;
    if (!to_stdout) {
      int flags = O_WRONLY | O_CREAT | (partial ? 0 : O_TRUNC);
      Result<UniqueFd> f = OpenFile(opt.output, flags);
      if (!f.ok()) return {f.status(), false, kFileCode};
      file = std::move(*f);
      if (partial && ::lseek(file.get(), static_cast<off_t>(*offset), SEEK_SET) < 0) {
        return {ErrnoStatus(errno, "seek " + opt.output), false, kFileCode};
      }
      out_fd = file.get();
    }
    int64_t declared = body->declared_length();
    int64_t total = declared >= 0 ? declared + static_cast<int64_t>(*offset) : -1;
    Status write_status;
    auto sink = [&](std::string_view piece) {
      if (!write_status.ok()) return;
      write_status = WriteAll(out_fd, piece.data(), piece.size(), to_stdout ? "stdout" : opt.output);
      *offset += piece.size();
      out->bytes += piece.size();
    };
    size_t used = body->Feed(buffer, sink);
    (void)used;
    std::string chunk(kBufferBytes, '\0');
    while (!body->done() && write_status.ok() && !body->failed()) {
      Result<size_t> n = http::RecvSome(fd, chunk.data(), chunk.size());
      if (!n.ok()) return NetError(n.status().WithContext(url.ToString()));
      if (*n == 0) {
        Status eof = body->OnEof();
        if (!eof.ok()) return {eof.WithContext(url.ToString()), true, kIoCode};
        break;
      }
      body->Feed(std::string_view(chunk.data(), *n), sink);
      bar->Update(*offset, total);
    }
    if (!write_status.ok()) return {write_status, false, kFileCode};
    if (body->failed()) return {Status::Corruption("bad chunked body: " + body->error()), true, kProtocolCode};
    bar->Update(*offset, total, /*force=*/true);
    out->file_size = *offset;
    return {Status::Ok(), false};
  }
}

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // bad usage: cli::kExitUsage (2)

constexpr char kUnits[] = "decimal Gbit/s (10^9 bit/s)";

const char kUsageText[] =
    "get: download a URL over HTTP/1.1 (like wget)\n"
    "usage: get URL [-O FILE] [options]\n"
    "exit status (wget's): 0 success, 1 other failure (conflict), 2 bad usage, 3 file I/O error\n"
    "(file), 4 network failure (resolve, connect, timeout, io), 7 protocol error (protocol,\n"
    "redirects), 8 server error response (http_status). With --json, \"error_code\" says what\n"
    "failed: the word in parentheses, or usage. Gbit/s are decimal (10^9 bit/s).\n"
    "options";

int UsageError(const std::string& message, bool json) { return cli::UsageError("get", message, json); }

}  // namespace

int main(int argc, char** argv) {
  const bool json_requested = cli::CommandLineHas(argc, argv, "--json");
  Options opt;
  po::variables_map vm;
  po::options_description desc(kUsageText);
  try {
    desc.add_options()
        ("help,h", "show this help")
        ("output-document,O", po::value(&opt.output), "write to FILE ('-' = stdout); default: the URL's file name")
        ("continue,c", po::bool_switch(&opt.resume), "resume a partial FILE with a Range request")
        ("tries,t", po::value(&opt.tries)->default_value(opt.tries), "attempts for network errors and 5xx (resuming)")
        ("timeout,T", po::value(&opt.timeout_s)->default_value(opt.timeout_s),
         "seconds to wait for connect or for data before an attempt fails")
        ("max-redirect", po::value(&opt.max_redirects)->default_value(opt.max_redirects), "redirects to follow")
        ("quiet,q", po::bool_switch(&opt.quiet), "no progress bar and no summary line")
        ("json", po::bool_switch(&opt.json),
         "print the summary as one JSON object on stdout, also on failure (tools/get/get.schema.json)")
        ("url", po::value(&opt.url), "the http:// URL (also positional)");
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
  if (opt.url.empty()) return UsageError("missing URL", opt.json);
  if (opt.tries < 1) return UsageError("--tries must be at least 1", opt.json);
  if (opt.timeout_s <= 0) return UsageError("--timeout must be positive", opt.json);
  if (opt.max_redirects < 0) return UsageError("--max-redirect must be at least 0", opt.json);
  Result<http::Url> url = http::ParseUrl(opt.url);
  if (!url.ok()) return UsageError(url.status().ToString(), opt.json);
  if (opt.output.empty()) opt.output = DefaultOutputName(*url);
  bool to_stdout = opt.output == "-";
  if (to_stdout && opt.resume) return UsageError("--continue needs a file, not stdout", opt.json);
  if (to_stdout && opt.json) return UsageError("--json prints on stdout; use -O FILE with it", opt.json);

  try {
    uint64_t offset = 0;
    if (opt.resume) {
      struct stat st {};
      if (::stat(opt.output.c_str(), &st) == 0 && S_ISREG(st.st_mode)) offset = static_cast<uint64_t>(st.st_size);
    }
    bool show_progress = !opt.quiet && !opt.json && ::isatty(STDERR_FILENO) == 1;
    ProgressBar bar(show_progress);
    Outcome out;
    auto start = Clock::now();
    bar.Begin(offset);
    AttemptError last;
    for (int attempt = 1; attempt <= opt.tries; ++attempt) {
      out.attempts = attempt;
      AttemptError r = Attempt(opt, *url, to_stdout, &offset, &out, &bar);
      last = r;
      if (r.status.ok()) break;
      if (!r.retryable || attempt == opt.tries) break;
      if (!opt.quiet) {
        std::fprintf(stderr, "%sget: attempt %d failed: %s; retrying%s\n", show_progress ? "\n" : "", attempt,
                     r.status.ToString().c_str(),
                     offset > 0 && !to_stdout ? fmt::format(" from byte {}", offset).c_str() : "");
      }
      if (to_stdout && offset > 0) break;  // cannot rewind stdout
      std::this_thread::sleep_for(std::chrono::milliseconds(200 * attempt));
    }
    bar.Finish();
    bool ok = last.status.ok();
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    double gbps = secs > 0 ? static_cast<double>(out.bytes) * 8 / secs / 1e9 : 0;
    if (opt.json) {
      nlohmann::json j = {{"ok", ok},
                          {"tool", "get"},
                          {"url", opt.url},
                          {"final_url", out.final_url},
                          {"file", opt.output},
                          {"status", out.status},
                          {"bytes", out.bytes},
                          {"file_size", out.file_size},
                          {"resumed_from", out.resumed_from},
                          {"already_complete", out.already_complete},
                          {"attempts", out.attempts},
                          {"redirects", out.redirects},
                          {"seconds", secs},
                          {"gbit_per_s", gbps},
                          {"units", {{"gbit_per_s", kUnits}, {"seconds", "seconds"}, {"bytes", "bytes"}}}};
      if (!ok) {
        j["error"] = last.status.ToString();
        j["error_code"] = last.code;
      }
      std::printf("%s\n", j.dump().c_str());
    }
    if (!ok) {
      std::fprintf(stderr, "get: %s\n", last.status.ToString().c_str());
      return ExitCodeFor(last.code);
    }
    if (!opt.quiet && !opt.json) {
      if (out.already_complete) {
        std::fprintf(stderr, "get: %s is already complete (%llu bytes)\n", opt.output.c_str(),
                     static_cast<unsigned long long>(out.file_size));
      } else {
        std::fprintf(stderr, "get: %s: %llu bytes in %.3f s = %.3f Gbit/s (decimal, 10^9 bit/s)\n",
                     opt.output.c_str(), static_cast<unsigned long long>(out.bytes), secs, gbps);
      }
    }
    return kExitOk;
  } catch (const std::exception& e) {
    // Not expected (errors are values above); keep stdout one JSON document anyway.
    if (opt.json) {
      nlohmann::json j = {{"ok", false}, {"tool", "get"}, {"error", e.what()}, {"error_code", "internal"}};
      std::printf("%s\n", j.dump().c_str());
    }
    std::fprintf(stderr, "get: %s\n", e.what());
    return kExitFailed;
  }
}
