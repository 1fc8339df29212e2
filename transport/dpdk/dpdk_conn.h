// ConnState: one end of a canopy reliable stream over UDP segments — the
// protocol engine of the DPDK backend, free of DPDK types so that the port
// (dpdk_port.h) feeds it received segments and lets it emit new ones.
//
// Protocol (see dpdk_wire.h for the header):
//   - Handshake: the dialler sends SYN {src_conn, window, MSS}; the listener
//     answers SYN-ACK {its id, window, MSS}; the dialler is established on the
//     SYN-ACK and acks it, the listener on the first segment that names its id.
//     SYN / SYN-ACK are retransmitted with backoff until connect_timeout.
//   - Data: byte sequence numbers (64-bit, never wrap), cumulative ack plus up
//     to kMaxSackBlocks SACK blocks, receive window in bytes. The sender keeps
//     at most min(peer window, send buffer = max_inflight_bytes) unacked.
//   - Loss recovery: RACK-style (a segment sent well before the newest one the
//     peer has seen, per the echoed timestamp, and not SACKed is resent) and a
//     retransmission timer (RFC 6298 estimator, exponential backoff).
//     Only segments judged lost (or, on a timeout, the oldest unSACKed one,
//     whose ack then lets RACK judge the rest) are resent, never whole
//     windows; a tail loss probe (one segment after
//     max(2 srtt, 200 us) without acks) draws the SACKs that let RACK see
//     losses at the end of a burst without waiting for the timer.
//   - Congestion control: a congestion window (slow start, then +1 MSS per
//     window acked) bounds the bytes in the pipe (sent, not acked, not
//     SACKed). Sparse loss (a single segment, or at most 1 in 32 of a
//     window) is recovered without a cut, so a lossy link degrades smoothly.
//     Beyond that a loss episode (at most one per window) halves it when the
//     losses come in a burst (more than 1 in 8 segments of the window: a
//     queue overflowed) and takes 15% off when they are scattered (a lossy
//     link); a timeout halves it. Never below kMinCwndSegments segments.
//   - Zero-copy transmit: the port may point frames straight into the send
//     ring (ByteRing pins); acked bytes are released once no frame pins them.
//   - Liveness: idle ends send keepalive probes; nothing heard from the peer
//     for io_timeout fails the connection with Unavailable.
//   - Tear-down: FIN after the last byte (Shutdown), RST on abort / unknown id.
//   Out-of-order segments are buffered within the window; duplicates are
//   dropped; delivery is always in order and byte-exact.
//
// Thread safety: every method takes the internal mutex. On* / Poll / Finished
// are called by whoever holds the port's poll lock (its I/O thread, or an
// application thread polling the port itself); Write / Read / Shutdown /
// Abort by application threads. Run to completion: a blocked Read or Write
// first polls the port from its own thread (the poller hook) while traffic
// flows, so a frame is received, processed and copied into the caller's
// buffer by the thread that wants it; only after kSpinNs without progress does
// it sleep on a condition variable and leave the port to the I/O thread.
// A Read that finds no buffered bytes posts the caller's buffer: in-order
// payload arriving while it waits is copied from the frame straight into it
// (one copy on receive). A ReadWith that finds none posts its drainer the same
// way, for the polls it makes from its own thread: the drainer gets the bytes
// where they lie in the frame (the message being received, or the file a bulk
// transfer lands in, is the only copy). Bytes that arrive while the I/O thread
// polls go through the receive ring as before.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "base/clock.h"
#include "base/result.h"
#include "base/status.h"
#include "transport/dpdk/byte_ring.h"
#include "transport/dpdk/dpdk_wire.h"

namespace canopy::transport::dpdk {

class ConnState;

// Copies received payload bytes out of wherever the frame lives (an mbuf chain).
class PayloadSource {
 public:
  virtual ~PayloadSource() = default;
  virtual void CopyOut(uint32_t offset, uint32_t len, char* dst) const = 0;
  // Where payload byte `offset` lies, and how many of the `len` (>= 1) bytes
  // from there follow it contiguously (1..len: a frame in several pieces
  // ends a span at the end of a piece). REQUIRES: offset + len within the
  // payload. Valid while the frame is.
  struct Span {
    const char* data;
    uint32_t len;
  };
  virtual Span SpanAt(uint32_t offset, uint32_t len) const = 0;
};

// What a connection needs from its port to put segments on the wire.
class SegmentOutput {
 public:
  virtual ~SegmentOutput() = default;
  // Builds one frame for `conn` (IP/UDP addresses from its params) to dst_mac
  // with header h and h.payload_len bytes of `data` from stream offset
  // `offset` (data is null when payload_len is 0). SYN / SYN-ACK carry the
  // sender's MSS in h.seq. False when no buffer is free (try again later).
  // Called with the connection's mutex held: must not call back into it.
  virtual bool Emit(const ConnState& conn, const MacAddress& dst_mac, const SegmentHeader& h,
                    const ByteRing* data, uint64_t offset) = 0;
  // Neighbour table lookup; false when the MAC of `ip` is not known yet.
  virtual bool Neighbour(uint32_t ip, MacAddress* mac) = 0;
  virtual void SendArpRequest(uint32_t local_ip, uint32_t target_ip) = 0;
};

struct ConnParams {
  uint32_t local_id = 0;
  uint32_t local_ip = 0;
  uint32_t remote_ip = 0;
  uint16_t local_port = 0;
  uint16_t remote_port = 0;
  uint32_t mss = 1400;             // largest payload per segment on this port
  size_t send_capacity = 1 << 20;  // send buffer = in-flight bound
  size_t recv_capacity = 4 << 20;  // receive buffer = advertised window
  std::chrono::nanoseconds connect_timeout{std::chrono::seconds(5)};
  std::chrono::nanoseconds io_timeout{std::chrono::seconds(30)};
  FaultConfig faults;
  std::optional<MacAddress> static_mac;  // else ARP (dialler) / learned from the SYN (listener)
  // This end accepts frames with an unchecked payload (set by the port when
  // its link cannot damage a frame); said in the SYN / SYN-ACK.
  bool accepts_unchecked_payloads = false;
};

class ConnState {
 public:
  // A dialling end; Poll starts ARP / SYN.
  static std::shared_ptr<ConnState> NewClient(const ConnParams& params, uint64_t now_ns);
  // A listening end created from a received SYN (its MSS and window applied).
  static std::shared_ptr<ConnState> NewServer(const ConnParams& params, const SegmentHeader& syn,
                                              const MacAddress& peer_mac, uint64_t now_ns);

  const ConnParams& params() const { return params_; }
  // Whether the peer's SYN / SYN-ACK said it accepts frames with an
  // unchecked payload (false until then, and for a peer that predates it).
  bool peer_accepts_unchecked_payloads() const;
  uint32_t remote_id() const;
  MacAddress remote_mac() const;

  // ---- I/O thread ----
  void OnSegment(const SegmentHeader& h, const PayloadSource& payload, uint64_t now_ns);
  // Timers, acks, (re)transmission; emits at most `budget` segments.
  void Poll(SegmentOutput& out, uint64_t now_ns, int budget);
  // True once nothing is left to do and the application has let go
  // (after Abort), so the port may forget the connection.
  bool Finished() const;
  // Fails the connection (e.g. its listener closed before Accept).
  void Fail(const Status& status);

  // ---- application threads ----
  // Blocks until established (or failed / deadline). Dialler only.
  Status WaitEstablished(Deadline deadline);
  // Appends all of data to the send stream; blocks while the send buffer is
  // full; Timeout when no space frees up for io_timeout. With flush, what
  // is buffered goes out now (this thread polls the port); without it, less
  // than a segment's worth may wait for the next flushing Write (the caller
  // promises one: e.g. a message header before its payload).
  Status Write(const char* data, size_t n, bool flush = true);
  // Write, but the bytes are produced straight into the send ring:
  // fill(dst, len) writes 1..len bytes at dst and returns how many (or an
  // error, returned as is). It runs without the connection's mutex (the
  // datapath keeps going), so at most one Write / WriteWith at a time
  // (REQUIRES: the caller serialises them). For file bulk: pread into the
  // ring saves the copy through a buffer.
  using Filler = std::function<Result<size_t>(char* dst, size_t len)>;
  Status WriteWith(size_t n, const Filler& fill);
  // Reads 1..max bytes. Closed at the orderly end of stream; the connection's
  // error, Aborted after Abort, Timeout at the deadline.
  Result<size_t> Read(char* dst, size_t max, Deadline deadline);
  // Read, but the received bytes are handed out in place:
  // drain(src, len) consumes 1..len bytes at src (e.g. pwrite to a file) and
  // returns how many, or an error (returned as is). One ReadWith may call it
  // several times, with successive bytes of the stream (a consumed prefix is
  // never handed out again). A drainer that has consumed bytes in this
  // ReadWith may decline more by consuming fewer than offered, or none (it
  // is full: say, the message it reads is complete); it is then offered no
  // more in this ReadWith, and the declined bytes stay buffered for the next
  // Read. Consuming none on its first call is an error. Bytes already buffered
  // are drained from the receive ring without the connection's mutex; when
  // none are, the drainer is posted and takes the bytes of frames this
  // thread's own polls receive straight from the frame, inside the poll
  // (under the connection's mutex and the port's poll lock: it must not call
  // into the connection or the port, nor wait for the network). At most one
  // Read / ReadWith at a time (REQUIRES: the caller serialises them).
  // Returns the bytes consumed (1..max).
  using Drainer = std::function<Result<size_t>(const char* src, size_t len)>;
  Result<size_t> ReadWith(size_t max, const Drainer& drain, Deadline deadline);
  // Orderly end of the send stream (FIN after the buffered data). Idempotent.
  Status Shutdown();
  // After Shutdown: waits until the peer acknowledged everything and the FIN
  // (true), or the connection failed / the deadline passed (false).
  bool WaitFinAcked(Deadline deadline);
  // The application lets go: blocked calls return Aborted; buffered data and
  // a FIN still go out (bounded by io_timeout), then the port forgets it.
  void Abort();
  uint64_t retransmits() const;

  // Uniform in [0, 1) from this connection's fault-injection generator
  // (seeded from FaultConfig::seed). Only for the port, inside Emit.
  double NextFaultRandom() const {
    fault_rng_ ^= fault_rng_ << 13;
    fault_rng_ ^= fault_rng_ >> 7;
    fault_rng_ ^= fault_rng_ << 17;
    return static_cast<double>(fault_rng_ >> 11) * (1.0 / 9007199254740992.0);
  }

  // Set by the port: called after Write/Shutdown/Read so a sleeping I/O
  // thread wakes up.
  void set_wakeup(std::function<void()> wakeup) { wakeup_ = std::move(wakeup); }
  // Set by the port: runs one datapath iteration in the calling thread unless
  // another thread is polling; returns whether any frame moved. Called
  // without the connection's mutex.
  void set_poller(std::function<bool()> poller) { poller_ = std::move(poller); }

  // Fault injection accounting (the port calls it inside Emit).
  void CountInjectedDrop() const { ++injected_drops_; }
  // Frames sent (first transmissions + retransmissions), retransmissions,
  // frames dropped by fault injection.
  struct Counters {
    uint64_t frames_sent = 0;
    uint64_t retransmits = 0;
    uint64_t injected_drops = 0;
    uint64_t loss_probes = 0;  // tail loss probes sent
    uint64_t timeouts = 0;     // retransmission timer expiries
    uint64_t window_cuts = 0;  // congestion-window reductions, of which
    uint64_t congestive_cuts = 0;  // halvings (timeout or a burst of losses)
  };
  Counters counters() const;

 private:
  enum class Phase { kSynSent, kSynReceived, kEstablished, kDead };
  struct Segment {
    uint64_t seq = 0;
    uint32_t len = 0;
    bool fin = false;
    bool sacked = false;
    bool lost = false;  // queued for retransmission
    bool retransmitted = false;
    uint64_t sent_ns = 0;
  };

  ConnState(const ConnParams& params, uint64_t now_ns);
  void FailLocked(const Status& status);
  void HandleAckLocked(const SegmentHeader& h, uint64_t now_ns);
  void HandleDataLocked(const SegmentHeader& h, const PayloadSource& payload, uint64_t now_ns);
  void DeliverOutOfOrderLocked();
  void AddOutOfOrderLocked(uint64_t start, uint64_t end);
  // Delivers the next n in-order bytes, payload bytes [skip, skip + n): to a
  // posted drainer (when this thread posted it) or into a posted Read
  // buffer first, the rest into rcv_.
  void DeliverLocked(size_t n, const PayloadSource& payload, uint32_t skip);
  // Frees acked send-ring bytes no queued frame pins.
  void ReleaseSentLocked();
  // Waits until done() (or the deadline / a 20 ms slice), polling the port
  // from this thread first (run to completion).
  template <typename Done>
  void WaitLocked(std::unique_lock<std::mutex>& lock, Deadline deadline, Done done);
  void CheckFinLocked();
  uint32_t AdvertisedWindowLocked() const;
  SegmentHeader BaseHeaderLocked(uint64_t now_ns) const;
  void FillSacksLocked(SegmentHeader* h, size_t max_blocks) const;
  bool EmitLocked(SegmentOutput& out, SegmentHeader& h, const ByteRing* data, uint64_t offset,
                  uint64_t now_ns);
  bool SendSegmentLocked(SegmentOutput& out, Segment& seg, uint64_t now_ns);
  void DetectLossLocked();
  // newly_lost segments were judged lost (by RACK, or a timeout): shrinks
  // cwnd_ unless the loss is sparse (see the top).
  void OnLossLocked(bool timeout, size_t newly_lost);
  void OnAckedLocked(uint64_t acked_bytes, uint32_t mss);
  bool PeerAddressLocked(SegmentOutput& out, uint64_t now_ns);
  uint64_t RtoNs() const;
  void Wake() const {
    if (wakeup_) wakeup_();
  }
  // Sends what is buffered: polls the port from this thread, else wakes the
  // I/O thread. Without the mutex.
  void FlushFromApp();

  const ConnParams params_;
  mutable uint64_t fault_rng_;
  std::function<void()> wakeup_;
  std::function<bool()> poller_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Phase phase_ = Phase::kSynSent;
  Status error_;  // set once the connection failed
  bool app_closed_ = false;
  bool rst_pending_ = false;
  uint32_t remote_id_ = 0;
  MacAddress remote_mac_;
  bool remote_mac_known_ = false;
  uint32_t peer_mss_ = 0;
  bool peer_accepts_unchecked_ = false;  // from the peer's SYN / SYN-ACK
  uint64_t created_ns_ = 0;
  uint64_t handshake_next_ns_ = 0;
  uint64_t handshake_interval_ns_ = 0;
  uint64_t last_heard_ns_ = 0;
  uint64_t last_sent_ns_ = 0;

  // Send side.
  ByteRing snd_;            // [released, write end): acked bytes stay while frames pin them
  uint64_t snd_una_ = 0;    // oldest unacknowledged offset
  uint64_t snd_nxt_ = 0;    // next new offset to send
  uint64_t peer_edge_ = 0;  // peer's ack + window
  std::deque<Segment> inflight_;
  bool fin_queued_ = false;
  bool fin_sent_ = false;
  bool fin_acked_ = false;
  uint64_t fin_seq_ = 0;
  uint64_t rack_ns_ = 0;  // send time of the newest segment the peer is known to have
  bool loss_scan_ = false;
  uint64_t srtt_ns_ = 0;
  uint64_t rttvar_ns_ = 0;
  int backoff_ = 0;
  uint64_t rto_deadline_ns_ = 0;
  uint64_t probe_next_ns_ = 0;
  uint64_t last_space_ns_ = 0;  // when the send buffer last had room (for the Write timeout)
  uint64_t retransmits_ = 0;
  // Congestion control.
  uint64_t cwnd_ = 0;  // 0 until the MSS is known
  uint64_t ssthresh_ = UINT64_MAX;
  uint64_t recovery_end_ = 0;  // no new reduction until snd_una_ passes this
  uint64_t loss_window_end_ = 0;  // losses are counted per window, up to here
  uint64_t window_losses_ = 0;
  uint64_t sacked_bytes_ = 0;  // bytes of inflight_ segments SACKed
  uint64_t last_ack_ns_ = 0;  // when the peer last acked or SACKed new bytes
  bool probe_sent_ = false;   // a tail loss probe is out since then
  uint64_t frames_sent_ = 0;
  uint64_t loss_probes_ = 0;
  uint64_t timeouts_ = 0;
  uint64_t window_cuts_ = 0;
  uint64_t congestive_cuts_ = 0;
  mutable uint64_t injected_drops_ = 0;

  // Receive side.
  ByteRing rcv_;  // in-order bytes not yet read by the application
  uint64_t rcv_nxt_ = 0;
  // Out-of-order byte ranges [first, second), already written into rcv_ at
  // their place past its end (one copy, no allocation per segment).
  std::map<uint64_t, uint64_t> ooo_;
  uint64_t last_ooo_seq_ = 0;
  bool peer_fin_ = false;
  uint64_t peer_fin_seq_ = 0;
  bool eof_ = false;
  bool ack_pending_ = false;
  bool ack_now_ = false;
  uint64_t advertised_edge_ = 0;
  uint64_t ts_recent_ = 0;
  // A Read waiting for bytes: in-order payload goes straight here.
  char* posted_dst_ = nullptr;
  size_t posted_max_ = 0;
  size_t posted_len_ = 0;
  // A ReadWith waiting for bytes: its drainer, for frames its own thread's
  // polls deliver; what it drained and how it failed.
  const Drainer* posted_drain_ = nullptr;
  std::thread::id posted_drain_thread_;
  size_t posted_drain_max_ = 0;
  size_t posted_drained_ = 0;
  Status posted_drain_status_;
};

}  // namespace canopy::transport::dpdk
