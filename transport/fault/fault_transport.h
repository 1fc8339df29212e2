// Fault injection for any transport: "fault+<scheme>://host:port?faults".
//
// RegisterFaultTransports() registers fault+tcp, fault+dpdk and fault+rdma in
// a registry; each wraps the transport of the inner scheme (created from the
// same registry and options) in a decorator that injects faults on the
// SENDING side of every connection it makes or accepts. This kernel has no
// netem, so faults are injected in user space, above the backend:
//
//   drop=P        a message is silently not sent (Send returns OK)
//   dup=P         a message is sent twice
//   delay_ms=N    every message is held N ms before it is sent
//   connect_delay_ms=N
//                 Connect() waits N ms before it dials (a slow set-up, as
//                 rdma_cm's address and route resolution under emulation);
//                 the messages themselves go at full speed. Only on the
//                 dialling side; a listener keeps it in its local_endpoint(),
//                 so peers that dial the address it advertises get it too.
//   corrupt=P     one payload byte is flipped before sending (the frame CRC is
//                 then computed over the corrupted bytes, so it is the layer
//                 above -- delta CRCs, protocol decoders -- that must notice)
//   cut_after=N   the connection is closed abruptly once N payload+bulk bytes
//                 have been sent (the send that would cross N fails with
//                 Unavailable and the peer sees the connection die)
//   seed=S        random seed (default 1), so a failing run can be replayed
//
// The fault parameters are removed from the endpoint before it reaches the
// inner transport; every other parameter passes through. With no fault
// parameters the wrapper is transparent (it passes the conformance suite).
// Bulk bytes are never dropped, duplicated or corrupted (that would break
// the bulk framing itself), but count towards cut_after.
//
// Thread safety: as the inner transport's (transport.h); the random source
// of each connection is guarded by its send mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport/registry.h"
#include "transport/transport.h"

namespace canopy::transport {

struct FaultSpec {
  double drop = 0;
  double duplicate = 0;
  double corrupt = 0;
  uint32_t delay_ms = 0;
  uint32_t connect_delay_ms = 0;
  uint64_t cut_after_bytes = 0;  // 0: never
  uint64_t seed = 1;

  bool any() const {
    return drop > 0 || duplicate > 0 || corrupt > 0 || delay_ms > 0 || connect_delay_ms > 0 ||
           cut_after_bytes > 0;
  }
};

// Takes the fault parameters out of endpoint->params (InvalidArgument for a
// malformed value or a probability outside [0, 1]).
Result<FaultSpec> ExtractFaultSpec(Endpoint* endpoint);

struct FaultCounters {
  uint64_t dropped = 0;
  uint64_t duplicated = 0;
  uint64_t corrupted = 0;
  uint64_t cuts = 0;
};
// Faults injected so far by every fault transport in this process.
FaultCounters GlobalFaultCounters();

// A decorator transport; `inner` must not itself be null.
std::shared_ptr<Transport> MakeFaultTransport(std::shared_ptr<Transport> inner);

// Registers fault+tcp, fault+dpdk, fault+rdma in `registry`.
Status RegisterFaultTransports(TransportRegistry& registry);

}  // namespace canopy::transport
