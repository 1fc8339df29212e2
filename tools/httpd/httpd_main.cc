// httpd: an event-driven HTTP/1.1 static file server (one process, one
// thread, epoll, sendfile). See README.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "base/logging.h"
#include "tools/http/server.h"
#include "tools/http/static_files.h"

namespace po = boost::program_options;
using namespace canopy;

namespace {

http::Server* g_server = nullptr;

void OnSignal(int) {
  if (g_server != nullptr) g_server->Stop();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string root = ".";
    std::string bind = "127.0.0.1";
    int port = 8080;
    int backlog = 1024;
    size_t max_connections = 10000;
    size_t max_header_bytes = 16384;
    size_t max_uri_bytes = 8192;
    uint64_t max_body_bytes = 1 << 20;
    double idle_timeout_s = 30;
    double max_duration_s = 0;
    std::string access_log;

    po::options_description desc(
        "httpd: serve the files below --root over HTTP/1.1 (GET, HEAD, Range, keep-alive)\n"
        "usage: httpd --root DIR [--port N] [options]\noptions");
    desc.add_options()
        ("help,h", "show this help")
        ("root,r", po::value(&root)->default_value(root), "directory to serve (nothing outside it is served)")
        ("port,p", po::value(&port)->default_value(port),
         "TCP port; 0 picks a free one. Prints \"listening on http://HOST:PORT\" once ready")
        ("bind,b", po::value(&bind)->default_value(bind), "address to listen on (IPv4/IPv6 literal; 0.0.0.0 or :: for all)")
        ("backlog", po::value(&backlog)->default_value(backlog), "listen backlog (also capped by net.core.somaxconn)")
        ("max-connections", po::value(&max_connections)->default_value(max_connections),
         "open connections beyond this are answered 503 and closed")
        ("max-header-bytes", po::value(&max_header_bytes)->default_value(max_header_bytes),
         "request line + headers larger than this get 431")
        ("max-uri-bytes", po::value(&max_uri_bytes)->default_value(max_uri_bytes),
         "request lines longer than this get 414")
        ("max-body-bytes", po::value(&max_body_bytes)->default_value(max_body_bytes),
         "request bodies larger than this get 413")
        ("idle-timeout", po::value(&idle_timeout_s)->default_value(idle_timeout_s),
         "seconds a connection may sit idle (keep-alive or a slow request) before it is closed")
        ("max-duration", po::value(&max_duration_s)->default_value(max_duration_s),
         "exit (status 0) after serving this many seconds, closing open connections as SIGTERM does; 0 = no limit")
        ("access-log", po::value(&access_log),
         "write a Common Log Format line per request to this file ('-' = stderr)");
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    if (port < 0 || port > 65535) throw std::runtime_error("--port must be 0..65535");
    if (idle_timeout_s <= 0) throw std::runtime_error("--idle-timeout must be positive");
    if (max_duration_s < 0) throw std::runtime_error("--max-duration must be at least 0 (0: no limit)");
    if (max_connections == 0) throw std::runtime_error("--max-connections must be at least 1");
    if (max_header_bytes < 64 || max_uri_bytes < 16) throw std::runtime_error("header/URI limits are too small");

    UniqueFd log_fd;
    int access_log_fd = -1;
    if (vm.count("access-log")) {
      if (access_log == "-") {
        access_log_fd = STDERR_FILENO;
      } else {
        log_fd.Reset(::open(access_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
        if (!log_fd) throw std::runtime_error(ErrnoStatus(errno, "open access log " + access_log).ToString());
        access_log_fd = log_fd.get();
      }
    }

    auto handler = http::StaticFileHandler::Create(root);
    if (!handler.ok()) {
      std::fprintf(stderr, "httpd: %s\n", handler.status().ToString().c_str());
      return 1;
    }
    http::ServerOptions options;
    options.bind_address = bind;
    options.port = static_cast<uint16_t>(port);
    options.backlog = backlog;
    options.max_connections = max_connections;
    options.limits.max_header_bytes = max_header_bytes;
    options.limits.max_uri_bytes = max_uri_bytes;
    options.limits.max_body_bytes = max_body_bytes;
    options.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(idle_timeout_s * 1000));
    options.max_duration = std::chrono::milliseconds(static_cast<int64_t>(max_duration_s * 1000));
    if (max_duration_s > 0 && options.max_duration.count() == 0) options.max_duration = std::chrono::milliseconds(1);
    options.access_log_fd = access_log_fd;

    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
        files.rlim_cur < max_connections + 16) {
      CANOPY_LOG(kWarn, "httpd: open-file limit {} is below --max-connections {}; raise it with ulimit -n",
                 files.rlim_cur, max_connections);
    }

    auto server = http::Server::Listen(options, handler->get());
    if (!server.ok()) {
      std::fprintf(stderr, "httpd: %s\n", server.status().ToString().c_str());
      return 1;
    }
    g_server = server->get();
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    std::string shown = bind.find(':') != std::string::npos ? "[" + bind + "]" : bind;
    std::printf("listening on http://%s:%u\n", shown.c_str(), (*server)->port());
    std::fflush(stdout);
    CANOPY_LOG(kInfo, "httpd: serving {} on {}:{}", (*handler)->root(), shown, (*server)->port());

    Status s = (*server)->Run();
    g_server = nullptr;
    http::ServerStats st = (*server)->stats();
    CANOPY_LOG(kInfo, "httpd: stopped{}; {} connections, {} refused, {} requests, {} bad, {} bytes sent",
               st.max_duration_reached ? " (--max-duration reached)" : "", st.connections_accepted,
               st.connections_refused, st.requests, st.bad_requests, st.bytes_sent);
    if (!s.ok()) {
      std::fprintf(stderr, "httpd: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "httpd: %s (try --help)\n", e.what());
    return 2;
  }
}
