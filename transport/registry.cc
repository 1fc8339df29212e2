#include "transport/registry.h"

#include <string>
#include <utility>

namespace canopy::transport {

TransportRegistry& TransportRegistry::Global() {
  static TransportRegistry* registry = new TransportRegistry();  // never destroyed: used at exit too
  return *registry;
}

Status TransportRegistry::Register(std::string scheme, std::string description, TransportFactory factory) {
  if (scheme.empty()) return Status::InvalidArgument("transport scheme must not be empty");
  if (!factory) return Status::InvalidArgument("transport '" + scheme + "' registered without a factory");
  std::lock_guard<std::mutex> lock(mu_);
  for (const Slot& slot : slots_) {
    if (slot.entry.scheme == scheme) {
      return Status::AlreadyExists("transport scheme '" + scheme + "' is already registered");
    }
  }
  slots_.push_back(Slot{Entry{std::move(scheme), std::move(description), true}, std::move(factory)});
  return Status::Ok();
}

Status TransportRegistry::RegisterUnavailable(std::string scheme, std::string why) {
  if (scheme.empty()) return Status::InvalidArgument("transport scheme must not be empty");
  std::lock_guard<std::mutex> lock(mu_);
  for (const Slot& slot : slots_) {
    if (slot.entry.scheme == scheme) {
      return Status::AlreadyExists("transport scheme '" + scheme + "' is already registered");
    }
  }
  slots_.push_back(Slot{Entry{std::move(scheme), std::move(why), false}, nullptr});
  return Status::Ok();
}

Result<std::shared_ptr<Transport>> TransportRegistry::Create(std::string_view scheme,
                                                             const TransportOptions& options) const {
  TransportFactory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Slot& slot : slots_) {
      if (slot.entry.scheme == scheme) {
        if (!slot.entry.available) {
          return Status::NotSupported("transport '" + slot.entry.scheme + "': " + slot.entry.description);
        }
        factory = slot.factory;
        break;
      }
    }
    if (!factory) {
      if (slots_.empty()) {
        return Status::NotFound("unknown transport scheme '" + std::string(scheme) +
                                "': no transports are registered (RegisterBuiltinTransports() not called?)");
      }
      std::string all;
      for (const Slot& slot : slots_) all += (all.empty() ? "" : ", ") + slot.entry.scheme;
      return Status::NotFound("unknown transport scheme '" + std::string(scheme) + "' (known: " + all + ")");
    }
  }
  // The factory runs unlocked: it may be slow (device probing) or use the registry.
  auto result = factory(options);
  if (result.ok() && *result == nullptr) {
    return Status::Internal("transport factory for '" + std::string(scheme) + "' returned null");
  }
  return result;
}

std::vector<TransportRegistry::Entry> TransportRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  out.reserve(slots_.size());
  for (const Slot& slot : slots_) out.push_back(slot.entry);
  return out;
}

Result<std::unique_ptr<Connection>> Dial(std::string_view uri, const TransportOptions& options) {
  CANOPY_ASSIGN_OR_RETURN(Endpoint endpoint, ParseEndpoint(uri));
  CANOPY_ASSIGN_OR_RETURN(std::shared_ptr<Transport> transport,
                          TransportRegistry::Global().Create(endpoint.scheme, options));
  return transport->Connect(endpoint);
}

Status PrepareDial(std::string_view uri, const TransportOptions& options) {
  CANOPY_ASSIGN_OR_RETURN(Endpoint endpoint, ParseEndpoint(uri));
  CANOPY_ASSIGN_OR_RETURN(std::shared_ptr<Transport> transport,
                          TransportRegistry::Global().Create(endpoint.scheme, options));
  return transport->Prepare(endpoint);
}

Result<std::unique_ptr<Listener>> ListenOn(std::string_view uri, const TransportOptions& options) {
  CANOPY_ASSIGN_OR_RETURN(Endpoint endpoint, ParseEndpoint(uri));
  CANOPY_ASSIGN_OR_RETURN(std::shared_ptr<Transport> transport,
                          TransportRegistry::Global().Create(endpoint.scheme, options));
  return transport->Listen(endpoint);
}

}  // namespace canopy::transport
