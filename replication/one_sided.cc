#include "replication/one_sided.h"

#include <fmt/format.h>

#include "base/logging.h"
#include "replication/handshake.h"
#if CANOPY_HAVE_RDMA
#include "transport/rdma/one_sided_stream.h"
#endif

namespace canopy::replication {
namespace {

bool IsRdmaUri(std::string_view uri) { return uri.starts_with("rdma://"); }

// Why this end cannot carry a one-sided stream on `stream` (empty: it can).
std::string OneSidedUnsupportedReason(const transport::Connection& stream) {
#if CANOPY_HAVE_RDMA
  if (transport::rdma::SupportsOneSided(stream)) return "";
  return fmt::format("{} is not a plain rdma:// connection", stream.peer_uri());
#else
  (void)stream;
  return "this node is built without rdma";
#endif
}

Result<std::unique_ptr<transport::Connection>> Upgrade(transport::Connection& stream, uint64_t ring_bytes,
                                                       uint64_t epoch, std::chrono::microseconds poll_max,
                                                       Deadline deadline) {
#if CANOPY_HAVE_RDMA
  transport::rdma::OneSidedOptions o;
  o.ring_bytes = ring_bytes;
  o.epoch = epoch;
  o.max_poll_sleep = poll_max;
  return transport::rdma::UpgradeToOneSided(stream, o, deadline);
#else
  (void)ring_bytes;
  (void)epoch;
  (void)poll_max;
  (void)deadline;
  return Status::NotSupported(OneSidedUnsupportedReason(stream));
#endif
}

}  // namespace

uint64_t OneSidedRingToAsk(const transport::Connection& stream, bool enabled, uint64_t ring_bytes) {
  return enabled && IsRdmaUri(stream.peer_uri()) ? ring_bytes : 0;
}

Result<std::unique_ptr<transport::Connection>> FollowOneSided(transport::Connection& stream, const Subscribe& sub,
                                                              std::chrono::microseconds poll_max, Deadline deadline) {
  if (sub.one_sided_ring_bytes == 0) return std::unique_ptr<transport::Connection>();
  CANOPY_ASSIGN_OR_RETURN(transport::Message m, stream.Receive(deadline));
  if (m.type != static_cast<uint16_t>(MessageType::kOneSidedAnswer) || m.bulk_bytes != 0) {
    return UnexpectedMessage(m, "ONE_SIDED_ANSWER");
  }
  CANOPY_ASSIGN_OR_RETURN(OneSidedAnswer answer, DecodeOneSidedAnswer(m.payload));
  if (!answer.accepted) {
    CANOPY_LOG(kInfo, "replica of {}: leader {} declined one-sided replication ({}): messages it is",
               sub.tree, stream.peer_uri(), answer.reason);
    return std::unique_ptr<transport::Connection>();
  }
  auto upgraded = Upgrade(stream, sub.one_sided_ring_bytes, sub.epoch, poll_max, deadline);
  if (!upgraded.ok()) return upgraded.status().WithContext("one-sided replication of " + sub.tree);
  CANOPY_LOG(kInfo, "replica of {}: following {} over the one-sided ring ({} bytes, epoch {})", sub.tree,
             stream.peer_uri(), sub.one_sided_ring_bytes, sub.epoch);
  return upgraded;
}

Result<std::unique_ptr<transport::Connection>> LeadOneSided(transport::Connection& stream, const Subscribe& sub,
                                                            bool enabled, uint64_t epoch,
                                                            std::chrono::microseconds poll_max, Deadline deadline) {
  if (sub.one_sided_ring_bytes == 0) return std::unique_ptr<transport::Connection>();
  std::string reason = enabled ? OneSidedUnsupportedReason(stream) : "the leader runs without --one-sided-replication";
  if (reason.empty() && sub.epoch != epoch) {
    reason = fmt::format("the replica's epoch {} is not the leader's {}", sub.epoch, epoch);
  }
  if (!reason.empty()) {
    CANOPY_LOG(kInfo, "leader of {}: declined one-sided replication to {}: {}", sub.tree, sub.node_id, reason);
    CANOPY_RETURN_IF_ERROR(SendMessage(stream, OneSidedAnswer{false, reason}));
    return std::unique_ptr<transport::Connection>();
  }
  CANOPY_RETURN_IF_ERROR(SendMessage(stream, OneSidedAnswer{true, ""}));
  auto upgraded = Upgrade(stream, kOneSidedAckRingBytes, epoch, poll_max, deadline);
  if (!upgraded.ok()) return upgraded.status().WithContext("one-sided replication of " + sub.tree);
  CANOPY_LOG(kInfo, "leader of {}: streaming to replica {} over the one-sided ring (epoch {})", sub.tree, sub.node_id,
             epoch);
  return upgraded;
}

}  // namespace canopy::replication
