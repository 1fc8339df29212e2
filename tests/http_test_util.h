// Helpers for the HTTP tests: run tools/httpd as a child process on an
// ephemeral loopback port, and talk raw HTTP to it over blocking sockets with
// timeouts (every read is bounded, so a broken server fails a test instead of
// hanging it).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "base/fd.h"
#include "tools/http/parser.h"

namespace canopy::testing {

class HttpdProcess {
 public:
  HttpdProcess() = default;
  ~HttpdProcess() { Stop(); }
  HttpdProcess(const HttpdProcess&) = delete;
  HttpdProcess& operator=(const HttpdProcess&) = delete;

  // Starts `httpd --port 0 <args>` and waits (≤ 10 s) for its
  // "listening on http://HOST:PORT" line. Returns false (with *error) on failure.
  bool Start(const std::vector<std::string>& args, std::string* error);
  // SIGTERM, then SIGKILL after 5 s. Returns the wait status (or -1).
  int Stop();
  // Waits up to `timeout` for httpd to exit by itself (e.g. --max-duration).
  // Returns the wait status, or -1 on timeout (httpd is then SIGKILLed).
  int Wait(std::chrono::milliseconds timeout);
  uint16_t port() const { return port_; }
  std::string Url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

// Connects to 127.0.0.1:port (or ::1 when ipv6) with 5 s send/receive timeouts; invalid fd on failure.
UniqueFd ConnectLoopback(uint16_t port, bool ipv6 = false);
bool SendString(int fd, const std::string& data);

struct RawResponse {
  int status = 0;
  http::Headers headers;
  std::string body;
  std::string head_text;  // the head exactly as received
};

// Reads one response (head + body framed by its headers) from fd, using and
// refilling *pending (bytes read past the previous response). `head_request`
// says the response answers a HEAD. Returns false on timeout/EOF/garbage.
bool ReadResponse(int fd, std::string* pending, RawResponse* out, bool head_request = false);

// Sends `request` on a fresh connection and reads one response.
bool RoundTrip(uint16_t port, const std::string& request, RawResponse* out, bool head_request = false);

// True when the peer closes fd within `timeout` (reads and drops data meanwhile).
bool WaitForClose(int fd, std::chrono::milliseconds timeout);

// "GET <path> HTTP/1.1\r\nHost: t\r\n<extra>\r\n".
std::string Get(const std::string& path, const std::string& extra_headers = "");

}  // namespace canopy::testing
