#include "transport/rdma/connection_state.h"

#include <fmt/format.h>

namespace canopy::transport::rdma {

const char* ConnStateName(ConnState state) {
  switch (state) {
    case ConnState::kIdle:
      return "idle";
    case ConnState::kResolvingAddress:
      return "resolving-address";
    case ConnState::kResolvingRoute:
      return "resolving-route";
    case ConnState::kConnecting:
      return "connecting";
    case ConnState::kAccepting:
      return "accepting";
    case ConnState::kAwaitingHello:
      return "awaiting-hello";
    case ConnState::kOpen:
      return "open";
    case ConnState::kFailed:
      return "failed";
    case ConnState::kClosed:
      return "closed";
  }
  return "unknown";
}

const char* ConnEventName(ConnEvent event) {
  switch (event) {
    case ConnEvent::kResolveAddress:
      return "resolve-address";
    case ConnEvent::kAddressResolved:
      return "address-resolved";
    case ConnEvent::kRouteResolved:
      return "route-resolved";
    case ConnEvent::kConnectRequest:
      return "connect-request";
    case ConnEvent::kEstablished:
      return "established";
    case ConnEvent::kHelloReceived:
      return "hello-received";
    case ConnEvent::kDisconnected:
      return "disconnected";
    case ConnEvent::kClose:
      return "close";
  }
  return "unknown";
}

Status ConnectionStateMachine::Apply(ConnEvent event) {
  ConnState next = state_;
  bool valid = false;
  switch (event) {
    case ConnEvent::kResolveAddress:
      valid = state_ == ConnState::kIdle;
      next = ConnState::kResolvingAddress;
      break;
    case ConnEvent::kAddressResolved:
      valid = state_ == ConnState::kResolvingAddress;
      next = ConnState::kResolvingRoute;
      break;
    case ConnEvent::kRouteResolved:
      valid = state_ == ConnState::kResolvingRoute;
      next = ConnState::kConnecting;
      break;
    case ConnEvent::kConnectRequest:
      valid = state_ == ConnState::kIdle;
      next = ConnState::kAccepting;
      break;
    case ConnEvent::kEstablished:
      valid = state_ == ConnState::kConnecting || state_ == ConnState::kAccepting;
      next = ConnState::kAwaitingHello;
      break;
    case ConnEvent::kHelloReceived:
      valid = state_ == ConnState::kAwaitingHello;
      next = ConnState::kOpen;
      break;
    case ConnEvent::kDisconnected:
      if (state_ == ConnState::kFailed || state_ == ConnState::kClosed) return Status::Ok();
      Fail(Status::Unavailable(state_ == ConnState::kOpen
                                   ? "rdma: peer disconnected"
                                   : "rdma: disconnected before the connection was set up"));
      return Status::Ok();
    case ConnEvent::kClose:
      state_ = ConnState::kClosed;
      return Status::Ok();
  }
  if (!valid) {
    return Status::Internal(
        fmt::format("rdma: event {} is not valid in state {}", ConnEventName(event), ConnStateName(state_)));
  }
  state_ = next;
  return Status::Ok();
}

void ConnectionStateMachine::Fail(const Status& status) {
  if (state_ == ConnState::kClosed) return;
  if (failure_.ok()) failure_ = status.ok() ? Status::Internal("rdma: failed with an OK status") : status;
  state_ = ConnState::kFailed;
}

Status ConnectionStateMachine::CheckAlive() const {
  switch (state_) {
    case ConnState::kOpen:
    case ConnState::kAwaitingHello:
      return Status::Ok();
    case ConnState::kClosed:
      return Status::Aborted("rdma: connection closed");
    case ConnState::kFailed:
      return failure_;
    default:
      return Status::Unavailable(
          fmt::format("rdma: connection is not open (state {})", ConnStateName(state_)));
  }
}

Status ConnectionStateMachine::CheckSend() const {
  if (state_ == ConnState::kAwaitingHello) {
    return Status::Unavailable("rdma: connection is not open (state awaiting-hello)");
  }
  CANOPY_RETURN_IF_ERROR(CheckAlive());
  if (local_shutdown_) return Status::Unavailable("rdma: send after Shutdown");
  return Status::Ok();
}

Status ConnectionStateMachine::ReceiveEndStatus() const {
  if (state_ == ConnState::kClosed) return Status::Aborted("rdma: connection closed");
  if (peer_shutdown_) return Status::Closed("peer shut down the connection");
  if (state_ == ConnState::kFailed) return failure_;
  return Status::Ok();
}

}  // namespace canopy::transport::rdma
