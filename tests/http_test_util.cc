#include "tests/http_test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "tests/testing/test_util.h"

namespace canopy::testing {

bool HttpdProcess::Start(const std::vector<std::string>& args, std::string* error) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    *error = "pipe failed";
    return false;
  }
  std::string binary = BinaryPath("tools/httpd/httpd");
  std::vector<std::string> argv_strings = {binary, "--port", "0"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    std::vector<char*> argv;
    for (auto& s : argv_strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  UniqueFd out(pipe_fds[0]);
  std::string text;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (text.find('\n') == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{out.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[256];
    ssize_t n = ::read(out.get(), buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  size_t colon = text.rfind(':');
  if (text.rfind("listening on http://", 0) != 0 || colon == std::string::npos) {
    *error = "httpd did not start (" + binary + "), said: '" + text + "'";
    Stop();
    return false;
  }
  port_ = static_cast<uint16_t>(std::stoi(text.substr(colon + 1)));
  return true;
}

int HttpdProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = WaitChild(pid_, std::chrono::seconds(5));
  pid_ = -1;
  return status;
}

int HttpdProcess::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  int status = WaitChild(pid_, timeout);
  pid_ = -1;
  return status;
}

UniqueFd ConnectLoopback(uint16_t port, bool ipv6) {
  UniqueFd fd(::socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int rc;
  if (ipv6) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(port);
    a.sin6_addr = in6addr_loopback;
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0) fd.Reset();
  return fd;
}

bool SendString(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool ReadResponse(int fd, std::string* pending, RawResponse* out, bool head_request) {
  char buf[65536];
  size_t end;
  while ((end = http::FindHeadEnd(*pending)) == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    pending->append(buf, static_cast<size_t>(n));
  }
  out->head_text = pending->substr(0, end);
  auto head = http::ParseResponseHead(out->head_text);
  if (!head.ok()) return false;
  out->status = head->status;
  out->headers = head->headers;
  out->body.clear();
  pending->erase(0, end);
  auto body = http::BodyReader::ForResponse(*head, head_request);
  if (!body.ok()) return false;
  auto sink = [&](std::string_view piece) { out->body.append(piece); };
  size_t used = body->Feed(*pending, sink);
  pending->erase(0, used);
  while (!body->done()) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0) return false;
    if (n == 0) return body->OnEof().ok();
    std::string_view chunk(buf, static_cast<size_t>(n));
    used = body->Feed(chunk, sink);
    pending->append(chunk.substr(used));
    if (body->failed()) return false;
  }
  return true;
}

bool RoundTrip(uint16_t port, const std::string& request, RawResponse* out, bool head_request) {
  UniqueFd fd = ConnectLoopback(port);
  if (!fd || !SendString(fd.get(), request)) return false;
  std::string pending;
  return ReadResponse(fd.get(), &pending, out, head_request);
}

bool WaitForClose(int fd, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

std::string Get(const std::string& path, const std::string& extra_headers) {
  return "GET " + path + " HTTP/1.1\r\nHost: t\r\n" + extra_headers + "\r\n";
}

}  // namespace canopy::testing
