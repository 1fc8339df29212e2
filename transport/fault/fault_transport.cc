#include "transport/fault/fault_transport.h"

#include <atomic>
#include <charconv>
#include <optional>
#include <mutex>
#include <random>
#include <thread>

namespace canopy::transport {
namespace {

std::atomic<uint64_t> g_dropped{0}, g_duplicated{0}, g_corrupted{0}, g_cuts{0};

Result<double> ParseProbability(const std::string& key, const std::string& text) {
  try {
    size_t used = 0;
    double v = std::stod(text, &used);
    if (used == text.size() && v >= 0 && v <= 1) return v;
  } catch (...) {
  }
  return Status::InvalidArgument("fault parameter " + key + "=" + text + ": expected a probability in [0, 1]");
}

Result<uint64_t> ParseCount(const std::string& key, const std::string& text) {
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return Status::InvalidArgument("fault parameter " + key + "=" + text + ": expected a whole number");
  }
  return v;
}

class FaultConnection final : public Connection {
 public:
  FaultConnection(std::unique_ptr<Connection> inner, FaultSpec spec)
      : inner_(std::move(inner)), spec_(spec), rng_(spec.seed) {}

  Status Send(uint16_t type, std::string_view payload) override {
    std::unique_lock<std::mutex> lock(mu_);
    CANOPY_RETURN_IF_ERROR(BeforeSend(payload.size()));
    if (Chance(spec_.drop)) {
      g_dropped++;
      return Status::Ok();
    }
    std::string corrupted;
    if (!payload.empty() && Chance(spec_.corrupt)) {
      corrupted.assign(payload);
      size_t at = std::uniform_int_distribution<size_t>(0, corrupted.size() - 1)(rng_);
      corrupted[at] = static_cast<char>(corrupted[at] ^ (1 + rng_() % 255));
      payload = corrupted;
      g_corrupted++;
    }
    bool twice = Chance(spec_.duplicate);
    lock.unlock();  // the inner connection serialises sends itself
    CANOPY_RETURN_IF_ERROR(inner_->Send(type, payload));
    if (twice) {
      g_duplicated++;
      return inner_->Send(type, payload);
    }
    return Status::Ok();
  }

  Status SendWithBulk(uint16_t type, std::string_view payload, const BulkSource& bulk) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      CANOPY_RETURN_IF_ERROR(BeforeSend(payload.size() + bulk.size()));
    }
    return inner_->SendWithBulk(type, payload, bulk);
  }

  Result<Message> Receive(Deadline deadline) override { return inner_->Receive(deadline); }
  Status ReceiveBulk(const BulkSink& sink, uint64_t length, Deadline deadline) override {
    return inner_->ReceiveBulk(sink, length, deadline);
  }
  Status Shutdown() override { return inner_->Shutdown(); }
  void Close() override { inner_->Close(); }
  std::string peer_uri() const override { return "fault+" + inner_->peer_uri(); }
  ConnectionStats stats() const override { return inner_->stats(); }

 private:
  bool Chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  // REQUIRES: mu_ held. Applies the delay and the byte budget of cut_after.
  Status BeforeSend(uint64_t bytes) {
    if (cut_) return Status::Unavailable("connection cut by fault injection");
    if (spec_.cut_after_bytes > 0 && sent_ + bytes > spec_.cut_after_bytes) {
      cut_ = true;
      g_cuts++;
      inner_->Close();
      return Status::Unavailable("connection cut by fault injection after " + std::to_string(sent_) + " bytes");
    }
    sent_ += bytes;
    if (spec_.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(spec_.delay_ms));
    return Status::Ok();
  }

  std::unique_ptr<Connection> inner_;
  const FaultSpec spec_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  uint64_t sent_ = 0;
  bool cut_ = false;
};

class FaultListener final : public Listener {
 public:
  FaultListener(std::unique_ptr<Listener> inner, FaultSpec spec, std::string scheme)
      : inner_(std::move(inner)), spec_(spec), scheme_(std::move(scheme)) {}
  Result<std::unique_ptr<Connection>> Accept(Deadline deadline) override {
    CANOPY_ASSIGN_OR_RETURN(std::unique_ptr<Connection> c, inner_->Accept(deadline));
    FaultSpec spec = spec_;
    spec.seed += ++accepted_;  // distinct but reproducible per connection
    return std::unique_ptr<Connection>(new FaultConnection(std::move(c), spec));
  }
  // The inner endpoint under the fault scheme. connect_delay_ms stays in it:
  // it acts only where a connection is dialled, so a listener's address
  // carries it to whoever dials that address.
  Endpoint local_endpoint() const override {
    Endpoint e = inner_->local_endpoint();
    e.scheme = scheme_;
    if (spec_.connect_delay_ms > 0) e.params["connect_delay_ms"] = std::to_string(spec_.connect_delay_ms);
    return e;
  }
  void Close() override { inner_->Close(); }

 private:
  std::unique_ptr<Listener> inner_;
  FaultSpec spec_;
  std::string scheme_;
  uint64_t accepted_ = 0;
};

class FaultTransport final : public Transport {
 public:
  explicit FaultTransport(std::shared_ptr<Transport> inner)
      : inner_(std::move(inner)), scheme_("fault+" + std::string(inner_->scheme())) {}
  std::string_view scheme() const override { return scheme_; }

  Result<std::unique_ptr<Listener>> Listen(const Endpoint& local) override {
    Endpoint e = local;
    CANOPY_ASSIGN_OR_RETURN(FaultSpec spec, ToInner(&e));
    CANOPY_ASSIGN_OR_RETURN(std::unique_ptr<Listener> l, inner_->Listen(e));
    return std::unique_ptr<Listener>(new FaultListener(std::move(l), spec, scheme_));
  }

  Result<std::unique_ptr<Connection>> Connect(const Endpoint& remote) override {
    Endpoint e = remote;
    CANOPY_ASSIGN_OR_RETURN(FaultSpec spec, ToInner(&e));
    // Before the dial: what takes long is resolving and setting up (as
    // rdma_cm's address and route resolution under emulation), and the peer
    // sees nothing of it.
    if (spec.connect_delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(spec.connect_delay_ms));
    CANOPY_ASSIGN_OR_RETURN(std::unique_ptr<Connection> c, inner_->Connect(e));
    return std::unique_ptr<Connection>(new FaultConnection(std::move(c), spec));
  }

  Status Prepare(const Endpoint& remote) override {
    Endpoint e = remote;
    CANOPY_RETURN_IF_ERROR(ToInner(&e).status());
    return inner_->Prepare(e);
  }

 private:
  // Takes the fault parameters out of *e (returned) and names the inner scheme.
  Result<FaultSpec> ToInner(Endpoint* e) const {
    CANOPY_ASSIGN_OR_RETURN(FaultSpec spec, ExtractFaultSpec(e));
    e->scheme = std::string(inner_->scheme());
    return spec;
  }

  std::shared_ptr<Transport> inner_;
  std::string scheme_;
};

}  // namespace

Result<FaultSpec> ExtractFaultSpec(Endpoint* endpoint) {
  FaultSpec spec;
  auto take = [&](const char* key) -> std::optional<std::string> {
    auto it = endpoint->params.find(key);
    if (it == endpoint->params.end()) return std::nullopt;
    std::string v = it->second;
    endpoint->params.erase(it);
    return v;
  };
  if (auto v = take("drop")) { CANOPY_ASSIGN_OR_RETURN(spec.drop, ParseProbability("drop", *v)); }
  if (auto v = take("dup")) { CANOPY_ASSIGN_OR_RETURN(spec.duplicate, ParseProbability("dup", *v)); }
  if (auto v = take("corrupt")) { CANOPY_ASSIGN_OR_RETURN(spec.corrupt, ParseProbability("corrupt", *v)); }
  // A delay in ms, at most a minute.
  auto take_ms = [&](const char* key, uint32_t* out) -> Status {
    auto v = take(key);
    if (!v) return Status::Ok();
    CANOPY_ASSIGN_OR_RETURN(uint64_t d, ParseCount(key, *v));
    if (d > 60000) return Status::InvalidArgument(std::string("fault parameter ") + key + " above 60000");
    *out = static_cast<uint32_t>(d);
    return Status::Ok();
  };
  CANOPY_RETURN_IF_ERROR(take_ms("delay_ms", &spec.delay_ms));
  CANOPY_RETURN_IF_ERROR(take_ms("connect_delay_ms", &spec.connect_delay_ms));
  if (auto v = take("cut_after")) { CANOPY_ASSIGN_OR_RETURN(spec.cut_after_bytes, ParseCount("cut_after", *v)); }
  if (auto v = take("seed")) { CANOPY_ASSIGN_OR_RETURN(spec.seed, ParseCount("seed", *v)); }
  return spec;
}

FaultCounters GlobalFaultCounters() {
  return FaultCounters{g_dropped.load(), g_duplicated.load(), g_corrupted.load(), g_cuts.load()};
}

std::shared_ptr<Transport> MakeFaultTransport(std::shared_ptr<Transport> inner) {
  return std::make_shared<FaultTransport>(std::move(inner));
}

Status RegisterFaultTransports(TransportRegistry& registry) {
  for (const char* inner : {"tcp", "dpdk", "rdma"}) {
    std::string scheme = std::string("fault+") + inner;
    std::string inner_scheme = inner;
    Status s = registry.Register(
        scheme,
        "user-space fault injection (drop, dup, delay_ms, connect_delay_ms, corrupt, cut_after) over " +
            inner_scheme + "://",
        [&registry, inner_scheme](const TransportOptions& options) -> Result<std::shared_ptr<Transport>> {
          CANOPY_ASSIGN_OR_RETURN(std::shared_ptr<Transport> t, registry.Create(inner_scheme, options));
          return MakeFaultTransport(std::move(t));
        });
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace canopy::transport
