// TransportRegistry: backends registered by URI scheme.
//
// RegisterBuiltinTransports() (transport/builtin.h, target canopy_transport_builtin)
// fills the global registry from one place with #ifdef-guarded calls, so
// registration survives static linking. A scheme whose backend was not built
// is registered as unavailable and Create() returns NotSupported naming the
// build option that turns it on.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "transport/transport.h"

namespace canopy::transport {

using TransportFactory = std::function<Result<std::shared_ptr<Transport>>(const TransportOptions&)>;

class TransportRegistry {
 public:
  static TransportRegistry& Global();

  // AlreadyExists if the scheme is taken.
  Status Register(std::string scheme, std::string description, TransportFactory factory);
  // Records that `scheme` exists but is not usable in this build; `why` says
  // how to get it (e.g. "rebuild with -DCANOPY_WITH_DPDK=ON after installing libdpdk-dev").
  Status RegisterUnavailable(std::string scheme, std::string why);

  // NotFound for unknown schemes, NotSupported for unavailable ones, or
  // whatever the backend's factory returns (e.g. NotSupported: no RDMA device).
  Result<std::shared_ptr<Transport>> Create(std::string_view scheme, const TransportOptions& options) const;

  struct Entry {
    std::string scheme;
    std::string description;  // or the reason it is unavailable
    bool available = false;
  };
  std::vector<Entry> List() const;

 private:
  struct Slot {
    Entry entry;
    TransportFactory factory;
  };
  mutable std::mutex mu_;
  std::vector<Slot> slots_;
};

// Convenience: parse `uri`, create its transport from the global registry,
// connect / listen.
Result<std::unique_ptr<Connection>> Dial(std::string_view uri, const TransportOptions& options);
Result<std::unique_ptr<Listener>> ListenOn(std::string_view uri, const TransportOptions& options);
// Parses `uri`, creates its transport and calls Transport::Prepare on it: the
// process-wide setup that a later Dial(uri, options) would otherwise do
// first. Contacts no peer. Errors as Dial's would be for the same reason.
Status PrepareDial(std::string_view uri, const TransportOptions& options);

}  // namespace canopy::transport
