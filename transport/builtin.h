// RegisterBuiltinTransports: fills TransportRegistry::Global() with every
// backend compiled into this build (tcp always; dpdk and rdma when their
// libraries were found), and records the others as unavailable with the
// reason. Idempotent and thread-safe; every binary calls it once at start.
#pragma once

namespace canopy::transport {

void RegisterBuiltinTransports();

}  // namespace canopy::transport
