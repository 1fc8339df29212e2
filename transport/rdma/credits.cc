#include "transport/rdma/credits.h"

#include <fmt/format.h>

#include "transport/rdma/rdma_wire.h"

namespace canopy::transport::rdma {

uint32_t SendCredits::available() const {
  const uint32_t in_use = sent_ - peer_reposted_;
  return in_use >= depth_ ? 0 : depth_ - in_use;
}

void SendCredits::Consume() { ++sent_; }

Status SendCredits::OnPeerReport(uint32_t peer_reposted) {
  if (CounterDelta(peer_reposted, peer_reposted_) <= 0) return Status::Ok();  // stale or same
  if (CounterDelta(peer_reposted, sent_) > 0) {
    return Status::Corruption(fmt::format("rdma: peer reports {} re-posted slots but only {} items were sent",
                                          peer_reposted, sent_));
  }
  peer_reposted_ = peer_reposted;
  return Status::Ok();
}

}  // namespace canopy::transport::rdma
