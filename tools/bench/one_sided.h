// bench --one-sided: the latency test over the one-sided log ring of
// transport/rdma/log_ring.h instead of SEND ping-pong. It measures the round
// trip one-sided replication pays per commit: the client (the "leader")
// RDMA-WRITEs a record of `size` payload bytes into a ring registered on the
// server (the "replica"); the server polls the ring, releases the record and
// RDMA-WRITEs the record's number back as its durable version; the client
// polls its feedback block until it sees that number. No SEND and no receive
// completion is on this path.
//
// Protocol on the bench connection (message types of perftest.h):
//   client -> RING_OPEN {version u8, size u64}
//   server -> RING_OFFER (log_ring_layout.h RingOffer)
//   client -> RING_TARGET (FeedbackTarget); then records through the ring:
//             one byte 'p' + payload per ping, a record "e" ends the test
//   server -> DONE (DoneCounts: records and payload bytes received)
//
// Errors: NotSupported when the connection is not rdma:// (or the backend is
// not built); the ring's and the connection's errors otherwise.
// Thread safety: one call per connection at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "transport/transport.h"

namespace canopy::bench {

inline constexpr uint16_t kMsgRingOpen = 0x420c;
inline constexpr uint16_t kMsgRingOffer = 0x420d;
inline constexpr uint16_t kMsgRingTarget = 0x420e;

struct OneSidedLatencyOptions {
  uint64_t size = 64;
  uint64_t warmup = 8;
  uint64_t iterations = 1000;
  std::chrono::duration<double> time_limit{1.0};  // measured part stops after this long
  std::chrono::milliseconds io_timeout{10000};
};

// Client side: round-trip times in microseconds, one per measured ping.
Result<std::vector<double>> RunOneSidedLatency(transport::Connection& conn, const OneSidedLatencyOptions& options);

// Server side, after RING_OPEN arrived (its payload given): serves the ring
// until the end record, then sends DONE.
Status ServeOneSidedLatency(transport::Connection& conn, std::string_view open_payload,
                            std::chrono::milliseconds idle_timeout);

}  // namespace canopy::bench
