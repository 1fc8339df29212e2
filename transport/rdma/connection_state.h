// The RDMA connection's state machine (no verbs here): which librdmacm step
// comes next, whether sending and receiving are allowed, and which Status a
// blocked call returns once the connection is no longer open.
//
//   active:   kIdle -ResolveAddress-> kResolvingAddress -AddressResolved->
//             kResolvingRoute -RouteResolved-> kConnecting -Established->
//             kAwaitingHello -HelloReceived-> kOpen
//   passive:  kIdle -ConnectRequest-> kAccepting -Established-> kAwaitingHello ...
//   any state -Fail(status)-> kFailed (first failure kept), -Close-> kClosed
//   kOpen -Disconnected-> kFailed (Unavailable) unless closed first.
// Shutdown flags are orthogonal: local (we sent kShutdown) and peer (we
// received it); a peer shutdown turns an empty Receive into Closed even if a
// disconnect follows.
//
// Thread safety: none; the connection guards it with its mutex.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace canopy::transport::rdma {

enum class ConnState : uint8_t {
  kIdle,
  kResolvingAddress,
  kResolvingRoute,
  kConnecting,
  kAccepting,
  kAwaitingHello,
  kOpen,
  kFailed,
  kClosed,
};

enum class ConnEvent : uint8_t {
  kResolveAddress,
  kAddressResolved,
  kRouteResolved,
  kConnectRequest,
  kEstablished,
  kHelloReceived,
  kDisconnected,
  kClose,
};

const char* ConnStateName(ConnState state);
const char* ConnEventName(ConnEvent event);

class ConnectionStateMachine {
 public:
  ConnState state() const { return state_; }

  // Applies an event. Internal error (state unchanged) when the event is not
  // valid in the current state; kClose is valid everywhere (idempotent), and
  // kDisconnected after kFailed / kClosed is ignored.
  Status Apply(ConnEvent event);

  // Records a failure (the first one wins) and moves to kFailed, unless
  // already closed.
  void Fail(const Status& status);

  void MarkLocalShutdown() { local_shutdown_ = true; }
  void MarkPeerShutdown() { peer_shutdown_ = true; }
  bool local_shutdown() const { return local_shutdown_; }
  bool peer_shutdown() const { return peer_shutdown_; }

  // OK when a data item may be sent now; otherwise Aborted (closed), the
  // failure, Unavailable after our own Shutdown, or Unavailable when not yet open.
  Status CheckSend() const;
  // What an empty Receive returns instead of waiting: Closed after the peer's
  // shutdown, Aborted when closed, the failure when failed; OK means wait.
  Status ReceiveEndStatus() const;
  // OK while open or awaiting hello; otherwise like CheckSend without the
  // local-shutdown rule (control traffic such as bulk-done still flows).
  Status CheckAlive() const;

  const Status& failure() const { return failure_; }

 private:
  ConnState state_ = ConnState::kIdle;
  Status failure_;
  bool local_shutdown_ = false;
  bool peer_shutdown_ = false;
};

}  // namespace canopy::transport::rdma
