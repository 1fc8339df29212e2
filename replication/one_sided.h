// Negotiating a replication stream over one-sided RDMA (issue 16 item 5).
//
// A replica whose node runs with NodeOptions::one_sided_replication and
// whose connection to the leader is rdma:// asks for it in SUBSCRIBE
// (Subscribe::one_sided_ring_bytes). The leader answers ONE_SIDED_ANSWER
// before anything else:
//   accepted  both ends then call transport::rdma::UpgradeToOneSided on the
//             connection and run the stream (deltas, heartbeats, ACKs) over
//             the returned Connection: a delta is one RDMA WRITE into the
//             replica's ring, an ACK one RDMA WRITE into the leader's;
//             snapshots and oversize messages keep the message stream, in
//             order (one_sided_stream.h)
//   declined  (the leader has the option off, the connection is not a plain
//             rdma:// one, or rdma is not built in) the reason is logged
//             and the stream runs on the connection as messages, as before
// A SUBSCRIBE that does not ask gets no answer: the stream starts at once.
//
// Fencing: each ring is registered for the leader's epoch of the stream
// (the replica's view of it in its SUBSCRIBE), and the epoch checks of the
// stream's messages are unchanged. The replica follows one leader of a tree
// at a time; when it moves on (a newer epoch, a new leader), the old
// stream's connection is destroyed before the next one is set up, which
// deregisters its ring: the deposed leader's next WRITE is refused by the
// replica's NIC (PermissionDenied on the leader), as Mu does with RDMA
// permissions.
//
// Errors: the stream's own (Unavailable, Timeout, ...); an ERROR the leader
// sent instead of its answer (not the leader, no such tree) as its Status;
// Corruption on a malformed answer.
//
// Ownership: the returned Connection (when not null) borrows `stream`, which
// must outlive it. Thread safety: one stream, one thread during set-up.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "base/clock.h"
#include "base/result.h"
#include "replication/protocol.h"
#include "transport/transport.h"

namespace canopy::replication {

// Bytes of the ring on the leader that the replica's ACKs go into.
inline constexpr uint64_t kOneSidedAckRingBytes = 64u << 10;

// The ring size a replica asks for on `stream` (0: do not ask): `ring_bytes`
// when `enabled` and the connection is rdma://.
uint64_t OneSidedRingToAsk(const transport::Connection& stream, bool enabled, uint64_t ring_bytes);

// Replica side, right after it sent `sub`. nullptr when `sub` did not ask or
// the leader declined: use `stream` as before.
// `poll_max`: see NodeOptions::one_sided_poll_max.
Result<std::unique_ptr<transport::Connection>> FollowOneSided(transport::Connection& stream, const Subscribe& sub,
                                                              std::chrono::microseconds poll_max, Deadline deadline);

// Leader side, after it accepted `sub` and before it streams anything.
// `enabled`: this node's option. nullptr when `sub` did not ask or this
// leader declined (it told the replica why).
Result<std::unique_ptr<transport::Connection>> LeadOneSided(transport::Connection& stream, const Subscribe& sub,
                                                            bool enabled, uint64_t epoch,
                                                            std::chrono::microseconds poll_max, Deadline deadline);

}  // namespace canopy::replication
