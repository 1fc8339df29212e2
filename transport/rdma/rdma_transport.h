// The rdma:// backend: canopy connections over InfiniBand / RoCE / iWARP
// with librdmacm (connection management) and libibverbs (reliable-connected
// queue pairs).
//
//   rdma://10.0.0.1:7000        listen / connect (address of an RDMA netdev)
//   rdma://0.0.0.0:0            listen on every RDMA device, ephemeral port
//
// Options (TransportOptions::backend_args, or URI query parameters):
//   device=NAME      fail unless the route uses this device (e.g. mlx5_0)
//   cq_mode=event    progress thread sleeps on a completion channel (default)
//   cq_mode=poll     progress thread busy-polls the completion queue
//   slot_bytes=N     size of one registered send / receive slot (64 KiB)
//   eager_bulk=N     bulk transfers up to N bytes are copied through slots;
//                    larger ones are RDMA READ by the receiver straight from
//                    the sender's registered memory or mmap of the file
//                    (default: 64 KiB on a hardware HCA, 1 MiB on Soft-RoCE
//                    and siw, transport/rdma/bulk_policy.h)
//
// Design (see rdma_connection.h): messages are cut into slot-sized SENDs
// (inline when small), one credit per receive slot, credits returned in every
// item header and by an 8-byte RDMA WRITE into the peer's credit block.
//
// Without an RDMA device, the factory fails with NotSupported and says how to
// create a Soft-RoCE device (hw/RDMA.md).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "transport/registry.h"

namespace canopy::transport {

// Registers "rdma" in `registry`.
Status RegisterRdmaTransport(TransportRegistry& registry);

// Names of the RDMA devices ibv_get_device_list() reports (empty when none).
std::vector<std::string> RdmaDeviceNames();

// The NotSupported message used when there is no device.
std::string NoRdmaDeviceMessage();

}  // namespace canopy::transport
