// How the rdma backend notices a peer that vanished (no verbs here).
//
// An RC queue pair only learns that its peer is gone when a request it posted
// goes unacknowledged: after retry_count + 1 attempts of the local ACK timeout
// each, the request completes with IBV_WC_RETRY_EXC_ERR and the connection
// fails with Unavailable. A connection that posts nothing (a sender blocked on
// credits, a receiver waiting for data) would never notice, so the progress
// thread keeps something posted: after ProbeIntervalFor(io_timeout) without a
// completion it re-writes its credit counters into the peer's credit block
// (idempotent: the counters are cumulative). With the ACK timeout from
// AckTimeoutExponentFor the retries of that write take at most io_timeout / 2,
// so a vanished peer is seen as Unavailable within about 3/4 of io_timeout
// (for io_timeout >= ~1.1 s; below, the 67 ms floor of the ACK timeout wins),
// whether the connection is busy or idle.
//
// Thread safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>

namespace canopy::transport::rdma {

// The RC retry count the backend asks for (rdma_conn_param::retry_count). Not 7, the most verbs
// allow: Soft-RoCE (rxe_comp.c) takes retry_cnt 7 to mean "retry forever", like rnr_retry 7, so
// a request to a vanished peer would never fail there.
inline constexpr int kRetryCount = 6;

// io_timeout / 4, clamped to [100 ms, 10 s].
std::chrono::milliseconds ProbeIntervalFor(std::chrono::milliseconds io_timeout);

// The local ACK timeout exponent e (the QP waits 4.096 us * 2^e for an ACK)
// such that kRetryCount + 1 attempts take at most io_timeout / 2; clamped to
// [14, 20] (67 ms: an emulated or loaded peer is not retried for nothing;
// 4.3 s: a dead peer is not waited on for half a minute).
uint8_t AckTimeoutExponentFor(std::chrono::milliseconds io_timeout);

// 4.096 us * 2^exponent.
std::chrono::microseconds AckTimeoutFor(uint8_t exponent);

}  // namespace canopy::transport::rdma
