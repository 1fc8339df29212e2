// The dpdk:// backend: canopy's reliable, ordered, flow-controlled stream
// over UDP/IPv4 frames on a DPDK port, carrying the usual frames (frame.h).
//
//   dpdk://10.0.0.1:7000            listen on / dial 10.0.0.1, UDP port 7000
//   dpdk://10.0.0.1:7000?port=1     ... using DPDK port 1 (id or device name)
//   dpdk://10.0.0.1:7000?port=0+1   ... using ports 0 and 1: a listener takes
//                                   connections on both, a dialler puts each
//                                   new connection on the port carrying the
//                                   fewest (one port per core; see hw/DPDK.md)
//   URI params: port=, ip= (local address when dialling), peer_mac= (static
//   neighbour instead of ARP).
//
// TransportOptions::backend_args holds EAL arguments ("--no-huge", "-m",
// "512", "--vdev=net_memif0,role=server,socket=/tmp/m.sock", "-a",
// "0000:03:00.0") and canopy keys (port=, ip=, peer_mac=, mtu=, mbufs=,
// fault_drop=, fault_dup=, fault_reorder=, fault_seed=; see dpdk_wire.h).
// The EAL is initialised once per process by the first transport created;
// later ones share it (see dpdk_env.h). Each port has one I/O thread that
// polls it and one poll lock, so connections on different ports run on
// different cores at once; send windows are bounded by max_inflight_bytes and receive
// windows by buffer_bytes. Protocol details: dpdk_conn.h.
//
// Errors: Create fails with InvalidArgument for bad canopy keys or EAL
// arguments (never exits the process), NotFound when the port does not
// exist. Connections follow the error table of transport.h.
#pragma once

#include "base/status.h"
#include "transport/registry.h"

namespace canopy::transport {

// Registers "dpdk" in `registry`.
Status RegisterDpdkTransport(TransportRegistry& registry);

}  // namespace canopy::transport
