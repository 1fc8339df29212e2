#include "tools/http/metrics_endpoint.h"

#include "base/logging.h"
#include "base/metrics.h"

namespace canopy::http {

class MetricsEndpoint::MetricsHandler : public Handler {
 public:
  Response Handle(const Request& request) override {
    if (request.path() == "/metrics") {
      if (request.method != "GET" && request.method != "HEAD") {
        Response r = Response::Error(405);
        r.headers.Add("Allow", "GET, HEAD");
        return r;
      }
      Response r;
      r.status = 200;
      r.headers.Add("Content-Type", metrics::kContentType);
      r.body = metrics::Exposition();
      return r;
    }
    if (request.path() == "/") return Response::Text(200, "canopy metrics: GET /metrics (Prometheus text format)");
    return Response::Error(404);
  }
};

Status ParseListenAddress(const std::string& text, ServerOptions* options) {
  size_t colon = text.rfind(':');
  std::string host = colon == std::string::npos ? "" : text.substr(0, colon);
  std::string port = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535) {
    return Status::InvalidArgument("expected IPv4:port or [IPv6]:port, got '" + text + "'");
  }
  options->bind_address = host;
  options->port = static_cast<uint16_t>(std::stoul(port));
  return Status::Ok();
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address) {
  ServerOptions options;
  CANOPY_RETURN_IF_ERROR(ParseListenAddress(address, &options));
  options.server_name = "canopy-metrics";
  options.max_connections = 64;
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->handler_ = std::make_unique<MetricsHandler>();
  endpoint->bind_address_ = options.bind_address;
  CANOPY_ASSIGN_OR_RETURN(endpoint->server_, Server::Listen(options, endpoint->handler_.get()));
  Server* server = endpoint->server_.get();
  endpoint->thread_ = std::thread([server] {
    Status s = server->Run();
    if (!s.ok()) CANOPY_LOG(kError, "metrics endpoint stopped: {}", s.ToString());
  });
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

uint16_t MetricsEndpoint::port() const { return server_->port(); }

void MetricsEndpoint::Stop() {
  if (!thread_.joinable()) return;
  server_->Stop();
  thread_.join();
}

}  // namespace canopy::http
