#include "transport/transport_metrics.h"

#include <map>
#include <mutex>

namespace canopy::transport {

const SchemeCounters& CountersForScheme(const std::string& scheme) {
  static std::mutex mu;
  static auto* by_scheme = new std::map<std::string, SchemeCounters>();  // lives until exit, like the counters
  std::lock_guard<std::mutex> lock(mu);
  auto it = by_scheme->find(scheme);
  if (it != by_scheme->end()) return it->second;
  const char* kConnections = "canopy_transport_connections_total";
  const char* kConnectionsHelp = "Connections opened, by transport scheme and direction.";
  const char* kBytes = "canopy_transport_bytes_total";
  const char* kBytesHelp = "Payload and bulk bytes moved over connections, by transport scheme and direction.";
  SchemeCounters c{
      &metrics::GetCounter(kConnections, kConnectionsHelp, {{"scheme", scheme}, {"direction", "dialed"}}),
      &metrics::GetCounter(kConnections, kConnectionsHelp, {{"scheme", scheme}, {"direction", "accepted"}}),
      &metrics::GetCounter(kBytes, kBytesHelp, {{"scheme", scheme}, {"direction", "sent"}}),
      &metrics::GetCounter(kBytes, kBytesHelp, {{"scheme", scheme}, {"direction", "received"}}),
      &metrics::GetCounter("canopy_transport_retransmissions_total",
                           "Segments sent again by a transport with its own reliability (dpdk).",
                           {{"scheme", scheme}}),
      &metrics::GetCounter("canopy_transport_credit_stalls_total",
                           "Sends that found no receive credit and waited (rdma).", {{"scheme", scheme}}),
      &metrics::GetCounter("canopy_transport_bulk_direct_bytes_total",
                           "Bulk bytes received straight into a file sink's pages, with no write "
                           "(rdma: RDMA READ into a tmpfs file's mapping).",
                           {{"scheme", scheme}})};
  return by_scheme->emplace(scheme, c).first->second;
}

}  // namespace canopy::transport
