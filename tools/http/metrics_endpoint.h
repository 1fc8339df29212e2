// MetricsEndpoint: serves canopy::metrics::Exposition() (base/metrics.h) at
// GET/HEAD /metrics in the Prometheus text format, on its own http::Server
// thread — what `canopy node --metrics`, `rcopy --server --metrics` and
// `bench --server --metrics` run.
//
//   GET /metrics   200, Content-Type: text/plain; version=0.0.4
//   GET /          200, a line pointing at /metrics
//   anything else  404 (405 for other methods on /metrics)
//
// Ownership: Start returns an endpoint that serves until Stop() or its
// destruction (both join the thread).
// Thread safety: Start/Stop/port from one thread; the exposition runs on the
// endpoint's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "base/result.h"
#include "tools/http/server.h"

namespace canopy::http {

// Parses "HOST:PORT" / "[IPV6]:PORT" (port 0: any free port) into the bind
// address and port of `options`. InvalidArgument otherwise.
Status ParseListenAddress(const std::string& text, ServerOptions* options);

class MetricsEndpoint {
 public:
  // Listens on `address` (ParseListenAddress) and starts serving.
  static Result<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  uint16_t port() const;
  const std::string& bind_address() const { return bind_address_; }
  void Stop();

  class MetricsHandler;

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<MetricsHandler> handler_;
  std::unique_ptr<Server> server_;
  std::string bind_address_;
  std::thread thread_;
};

}  // namespace canopy::http
