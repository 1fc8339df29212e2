// An event-driven HTTP/1.1 server: one thread, one epoll set, non-blocking
// sockets, bodies from files sent with sendfile(2). It owns the connection
// handling (keep-alive, pipelining, idle timeout, limits, error answers,
// access log) and hands every complete request to a Handler, which builds
// the Response. tools/httpd plugs in StaticFileHandler; `canopy node` can
// plug in a JSON API handler the same way (see Handler).
//
// Behaviour:
//  - Malformed or over-limit requests get their status (400, 413, 414, 431,
//    501, 505) with "Connection: close"; the server then stops reading
//    requests from that connection, half-closes it and drops it after the
//    peer closes (or 2 s), so the answer is not lost to a TCP reset.
//  - Pipelined requests are answered in order, one at a time.
//  - A Handler may defer an answer (HandleAsync + Responder): the connection
//    then waits for it (reading at most a bounded amount ahead) while every
//    other connection is served; the Responder may be completed from any
//    thread. At most one deferred request per connection is outstanding, so
//    deferred work is bounded by max_connections.
//  - A connection idle (no bytes in or out) for idle_timeout is closed.
//  - Beyond max_connections, a new connection is accepted, answered
//    "503 Service Unavailable" with "Retry-After: 1" and "Connection: close"
//    at once (without waiting for its request), half-closed and dropped when
//    the peer closes (or after 2 s); such connections do not count toward the
//    limit.
//  - With max_duration > 0, Run() returns by itself once it has run that
//    long, as if Stop() had been called.
//  - When the process runs out of file descriptors (EMFILE) a reserve
//    descriptor is released so the pending connection can be accepted and
//    closed, instead of spinning on the listening socket.
//
// Thread safety: Run() runs on one thread; Stop() may be called from any
// thread and from a signal handler. The Handler is only called on Run's
// thread, one request at a time; Responder::Respond from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/result.h"
#include "base/status.h"
#include "tools/http/message.h"
#include "tools/http/parser.h"

namespace canopy::http {

// Builds the response for one complete request (body already read, within
// RequestLimits). Called on the server thread: it must not block for long —
// every other connection waits meanwhile. A JSON API answers from in-memory
// state, e.g.
//   class ApiHandler : public Handler {
//     Response Handle(const Request& r) override {
//       if (r.method == "GET" && r.path() == "/v1/status") return Response::Json(200, StatusJson());
//       return Response::Error(404);
//     }
//   };
class Handler;

// Completes one deferred request (see Handler::HandleAsync). Move-only.
// Respond sends the answer: once (later calls are ignored), from any thread,
// also after the server stopped or the client went away (it is then
// dropped). A Responder destroyed without answering answers
// "500 Internal Server Error", so a lost one never hangs a connection.
class Responder {
 public:
  Responder() = default;
  Responder(Responder&&) noexcept = default;
  Responder& operator=(Responder&&) noexcept = default;
  ~Responder();
  void Respond(Response response);
  bool empty() const { return state_ == nullptr; }

  struct State;

 private:
  friend class Server;
  explicit Responder(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

class Handler {
 public:
  virtual ~Handler() = default;
  virtual Response Handle(const Request& request) = 0;
  // What the server calls: an answer now (leave `responder` alone), or
  // std::nullopt after moving `responder` to whoever answers later (a worker
  // thread, a callback); std::nullopt with `responder` left here answers 500.
  // The default answers Handle(request) at once. Runs on the server thread:
  // it must not block for long either.
  virtual std::optional<Response> HandleAsync(const Request& request, Responder& responder) {
    (void)responder;
    return Handle(request);
  }
  // Called on the server thread after each round of socket events, once
  // every request read in it went to HandleAsync: a handler that collects
  // deferred work (e.g. requests to forward) sends it here, in one go.
  virtual void AfterEvents() {}
};

struct ServerOptions {
  std::string bind_address = "127.0.0.1";  // IPv4 or IPv6 literal ("0.0.0.0", "::" for all)
  uint16_t port = 0;                       // 0: an ephemeral port, see Server::port()
  int backlog = 1024;                      // listen(2) backlog (capped by net.core.somaxconn)
  size_t max_connections = 10000;          // open connections beyond this are answered 503
  RequestLimits limits;
  std::chrono::milliseconds idle_timeout{30000};
  std::chrono::milliseconds max_duration{0};  // Run() returns after this long; 0: no limit
  int access_log_fd = -1;                  // Common Log Format lines go here; -1: off. Not owned.
  std::string server_name = "canopy-httpd";
};

struct ServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  // answered 503 (max_connections reached)
  uint64_t requests = 0;
  uint64_t bad_requests = 0;         // answered with a parser error status
  uint64_t idle_closed = 0;
  uint64_t deferred = 0;             // requests answered through a Responder
  uint64_t bytes_sent = 0;
  uint64_t open_connections = 0;
  bool max_duration_reached = false;  // Run() returned because of max_duration
};

class Server {
 public:
  // Binds and listens. `handler` must outlive the Server.
  // Errors: InvalidArgument (bad bind address), IOError/PermissionDenied from bind/listen.
  static Result<std::unique_ptr<Server>> Listen(const ServerOptions& options, Handler* handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound port (the ephemeral one when options.port was 0).
  uint16_t port() const;

  // Serves until Stop() or max_duration. Returns an error only if epoll itself fails.
  Status Run();

  // Makes Run() return soon (open connections are closed). Async-signal-safe.
  void Stop();

  // Counters; read on Run's thread or after Run returned.
  ServerStats stats() const;

  class Impl;

 private:
  static Responder MakeResponder(std::shared_ptr<Responder::State> state) { return Responder(std::move(state)); }
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace canopy::http
