// A Connection that carries its messages over one-sided log rings
// (log_ring.h), one per direction, on top of an rdma:// connection: a Send
// is one RDMA WRITE of a record into the peer's ring, a Receive polls this
// side's ring. No SEND, no posted receive and no receive completion is on
// the path of a message; the peer's CPU only polls memory.
//
// Both ends call UpgradeToOneSided on the same rdma:// connection, once they
// agreed to (the agreement is the caller's: replication negotiates it in
// SUBSCRIBE, replication/one_sided.h). The set-up runs over the connection's
// message stream, the same on both sides: send this side's ring offer, read
// the peer's, send this side's feedback target, read the peer's
// (one_sided_record.h names the message types).
//
// What travels where (record format: one_sided_record.h):
//   Send(type, payload)   one ring record, when it fits in a quarter of the
//                         peer's ring; otherwise a kOnStream marker in the
//                         ring, then the message on the underlying stream
//   SendWithBulk          always a kOnStream marker, then the message and its
//                         bulk bytes on the underlying stream (RDMA's own bulk
//                         path), so the order of all messages is kept
//   Shutdown              a kEnd marker (the peer's Receive: Closed after every
//                         earlier message), then the underlying Shutdown
//   Receive / ReceiveBulk polls the ring; after a kOnStream marker, takes
//                         exactly one message from the underlying stream;
//                         ReceiveBulk reads the underlying stream
// Flow control: a Send waits while the peer's ring is full, up to the
// connection's io_timeout, then fails with Timeout ("log ring full").
//
// Errors: as transport.h. While Receive polls, it checks the underlying
// connection's health, so a peer that died or disconnected surfaces as
// Unavailable (and a Close of the underlying connection as Aborted), as on
// the message stream. A record that fails its CRC or its epoch check is
// Corruption / PermissionDenied. UpgradeToOneSided: NotSupported when the
// connection is not a plain rdma:// one (tcp://, fault+rdma://);
// InvalidArgument for a bad ring size; Corruption when the peer sends
// something other than the set-up messages; the stream's own errors.
//
// Epoch fencing: each side's ring is registered for `epoch`, and the peer's
// writer must carry it. Destroying the returned connection deregisters its
// ring, so from then on the peer's NIC is refused (PermissionDenied on the
// peer's next Send): the stale peer of a connection that was given up can
// write nothing more into this side's memory.
//
// Ownership: REQUIRES `stream` outlives the returned connection (its ring
// registrations belong to the stream's protection domain); the returned
// connection does not own it. Close() closes `stream` too.
//
// Thread safety: as transport.h. Send / SendWithBulk / Shutdown from several
// threads (serialised: a marker and its message are never split); Receive /
// ReceiveBulk from one thread at a time; Close from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "base/clock.h"
#include "base/result.h"
#include "transport/transport.h"

namespace canopy::transport::rdma {

struct OneSidedOptions {
  // Bytes of this side's receive ring (log_ring_layout.h: a multiple of 8,
  // 64 B .. 1 GiB). Messages up to a quarter of the peer's ring go inline.
  uint64_t ring_bytes = 1u << 20;
  // The epoch this side's ring is registered for.
  uint64_t epoch = 0;
  // Receive polls by spinning briefly, then sleeping in steps that double
  // up to this (a polling thread of its own would spin; an emulated or
  // shared machine cannot afford that).
  std::chrono::microseconds max_poll_sleep{200};
};

// True when `connection` can carry a one-sided stream (a plain rdma:// one).
bool SupportsOneSided(const Connection& connection);

Result<std::unique_ptr<Connection>> UpgradeToOneSided(Connection& stream, const OneSidedOptions& options,
                                                      Deadline deadline);

}  // namespace canopy::transport::rdma
