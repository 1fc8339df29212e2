// Process-wide traffic counters of one transport scheme (base/metrics.h), for
// the backends to count into:
//   canopy_transport_connections_total{scheme, direction="dialed"|"accepted"}
//   canopy_transport_bytes_total{scheme, direction="sent"|"received"}
//     frame payloads and bulk bytes the connections' callers moved (not
//     framing, not retransmissions)
//   canopy_transport_retransmissions_total{scheme}   segments sent again (dpdk)
//   canopy_transport_credit_stalls_total{scheme}     sends that found no credit
//                                                    and had to wait (rdma)
//   canopy_transport_bulk_direct_bytes_total{scheme} bulk bytes received straight
//                                                    into a file sink's pages, with
//                                                    no write (rdma: READ into a
//                                                    tmpfs file's mapping)
//
// Ownership: the counters live until exit. Thread safety: any thread; the
// increments are lock-free (CountersForScheme takes a lock: call it once per
// connection, not per message).
#pragma once

#include <string>

#include "base/metrics.h"

namespace canopy::transport {

struct SchemeCounters {
  prometheus::Counter* dialed;
  prometheus::Counter* accepted;
  prometheus::Counter* bytes_sent;
  prometheus::Counter* bytes_received;
  prometheus::Counter* retransmissions;
  prometheus::Counter* credit_stalls;
  prometheus::Counter* bulk_direct_bytes;
};

const SchemeCounters& CountersForScheme(const std::string& scheme);

}  // namespace canopy::transport
