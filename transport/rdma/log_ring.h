// One-sided log ring over an rdma:// connection: the writer puts records
// straight into registered memory on the receiver with RDMA WRITE, and the
// receiver answers with RDMA WRITEs of how much it consumed and of the
// version it made durable. No receive is posted and no CPU on the receiver
// takes part in moving a record; the receiver finds records by polling the
// ring (layout and arithmetic: log_ring_layout.h).
//
// Set-up (both ends hold the same rdma:// Connection, each its own end):
//   receiver: auto ring = LogRingReceiver::Create(conn, bytes, epoch);
//             conn.Send(T, EncodeRingOffer(ring->offer()));
//   writer:   auto writer = LogRingWriter::Create(conn, DecodeRingOffer(msg));
//             conn.Send(T', EncodeFeedbackTarget(writer->feedback_target()));
//   receiver: ring->AttachWriter(DecodeFeedbackTarget(msg));
// The offer and the target go over the connection's own message stream, so
// they arrive only to the peer that holds this connection.
//
// Flow control: the writer never writes over bytes the receiver has not
// released. When the ring is full, Append waits (bounded by its deadline) for
// the receiver's consumed report, then returns Timeout.
//
// Epoch fencing (as Mu does with RDMA permissions): Revoke(new_epoch) on the
// receiver registers the ring memory again under a new rkey and deregisters
// the old registration before it returns, so from then on a WRITE with the
// old rkey is refused by the receiver's NIC. The writer that used it gets
// PermissionDenied ("... revoked ...") from the Append / Flush that sees the
// failed completion, and the connection fails (an RC queue pair does not
// survive a remote access error). Nothing it wrote after the revocation is
// in the ring. The new offer is handed only to the writer of the new epoch.
//
// Errors: InvalidArgument for a bad size or a record that cannot fit;
// NotSupported when the connection is not an rdma:// one (e.g. tcp://, or
// the fault+ wrapper); Timeout (ring full / nothing arrived / report not
// yet there); PermissionDenied (this writer was fenced); Corruption (a record
// whose CRC does not match, or a report that does not add up); the
// connection's own failure (Unavailable, Closed) once it has failed.
//
// Ownership and lifetime: REQUIRES the Connection outlives every ring and
// writer made on it (their registrations belong to its protection domain).
// Destroying a receiver deregisters the ring, which fences its writer too.
//
// Thread safety: a LogRingReceiver is used by one thread at a time. A
// LogRingWriter's Append / Flush / WaitDurable are used by one thread at a
// time; durable_version() and consumed() may be read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "base/result.h"
#include "base/clock.h"
#include "transport/rdma/log_ring_layout.h"
#include "transport/transport.h"

namespace canopy::transport::rdma {

class LogRingReceiver {
 public:
  // Registers `ring_bytes` of zeroed memory for remote write on `connection`.
  static Result<std::unique_ptr<LogRingReceiver>> Create(Connection& connection, uint64_t ring_bytes,
                                                         uint64_t epoch);
  ~LogRingReceiver();
  LogRingReceiver(const LogRingReceiver&) = delete;
  LogRingReceiver& operator=(const LogRingReceiver&) = delete;

  // What the writer needs (send it over the connection).
  RingOffer offer() const;
  uint64_t epoch() const;

  // Where consumed / durable reports go. InvalidArgument when the target's
  // epoch is not this ring's current epoch.
  Status AttachWriter(const FeedbackTarget& target);

  // The payload of the next complete record, or nullopt when it has not
  // (entirely) arrived. The view stays valid until Release(). REQUIRES: the
  // previous record was released.
  Result<std::optional<std::string_view>> Poll();
  // Polls (spinning briefly, then sleeping in short steps) until a record
  // arrives; Timeout at the deadline.
  Result<std::string_view> Wait(Deadline deadline);
  // Frees the record Poll returned (zeroes its bytes) and reports the new
  // consumed count to the writer (posting the report waits at most the
  // connection's io_timeout for send-queue room). REQUIRES: AttachWriter was
  // called.
  Status Release();
  // Reports `version` (monotonic; lower values are ignored) as durable.
  Status ReportDurable(uint64_t version);

  // Fences the current writer: the ring gets a new rkey bound to
  // `new_epoch` (> epoch(), else InvalidArgument), the old one stops working
  // before this returns, records not yet released are dropped, the ring is
  // empty and the writer detached. Returns the new offer.
  Result<RingOffer> Revoke(uint64_t new_epoch);

  // Records received so far (pads not counted).
  uint64_t records_received() const;

  class Impl;

 private:
  explicit LogRingReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class LogRingWriter {
 public:
  // Registers a feedback block on `connection` and aims at `offer`'s ring.
  static Result<std::unique_ptr<LogRingWriter>> Create(Connection& connection, const RingOffer& offer);
  ~LogRingWriter();
  LogRingWriter(const LogRingWriter&) = delete;
  LogRingWriter& operator=(const LogRingWriter&) = delete;

  // What the receiver needs (send it over the connection).
  FeedbackTarget feedback_target() const;
  uint64_t epoch() const;

  // Writes one record (RDMA WRITE; the call returns once it is posted, in
  // order after every earlier record). Waits for room until the deadline,
  // then Timeout ("log ring full"). Errors of earlier writes surface here.
  Status Append(std::string_view payload, Deadline deadline);
  // Waits until every posted write has completed (has reached the receiver's
  // memory); PermissionDenied when one was refused (fenced).
  Status Flush(Deadline deadline);
  // Waits until the receiver reported `version` durable; Timeout at the deadline.
  Status WaitDurable(uint64_t version, Deadline deadline);

  // The latest reports the receiver wrote (0 before any).
  uint64_t durable_version() const;
  uint64_t consumed() const;

  class Impl;

 private:
  explicit LogRingWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace canopy::transport::rdma
