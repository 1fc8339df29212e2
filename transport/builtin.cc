#include "transport/builtin.h"

#include <mutex>

#include "transport/fault/fault_transport.h"
#include "transport/registry.h"
#include "transport/tcp/tcp_transport.h"
#if CANOPY_HAVE_RDMA
#include "transport/rdma/rdma_transport.h"
#endif
#if CANOPY_HAVE_DPDK
#include "transport/dpdk/dpdk_transport.h"
#endif

namespace canopy::transport {

void RegisterBuiltinTransports() {
  static std::once_flag once;
  std::call_once(once, [] {
    TransportRegistry& registry = TransportRegistry::Global();
    (void)RegisterTcpTransport(registry);
    (void)RegisterTlsTcpTransport(registry);
#if CANOPY_HAVE_DPDK
    (void)RegisterDpdkTransport(registry);
#else
    (void)registry.RegisterUnavailable(
        "dpdk", "the DPDK backend is not built in: install libdpdk-dev and rebuild with -DCANOPY_WITH_DPDK=ON");
#endif
#if CANOPY_HAVE_RDMA
    (void)RegisterRdmaTransport(registry);
#else
    (void)registry.RegisterUnavailable(
        "rdma", "the RDMA backend is not built in: install libibverbs-dev and librdmacm-dev and rebuild with "
                "-DCANOPY_WITH_RDMA=ON");
#endif
    // Last, so that it wraps whatever backends were registered above.
    (void)RegisterFaultTransports(registry);
  });
}

}  // namespace canopy::transport
