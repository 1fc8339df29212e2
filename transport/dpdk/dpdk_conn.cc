#include "transport/dpdk/dpdk_conn.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/logging.h"
#include "transport/dpdk/dpdk_wire.h"
#include "transport/transport_metrics.h"

namespace canopy::transport::dpdk {
namespace {

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kInitialRtoNs = 100 * kMs;
constexpr uint64_t kMinRtoNs = 10 * kMs;
constexpr uint64_t kMaxRtoNs = 1000 * kMs;
// RACK's reorder window: a segment is lost once one sent this long after it
// (or a quarter of srtt, if longer) has been acknowledged. A port's frames
// leave and arrive in order (one queue per connection; memif, af_packet and a
// NIC queue are FIFO), so only the fault injector reorders; the window covers
// a few frames sent back to back, not a scheduling delay. At 100 us a 1% drop
// on memif stalled every hole that long (plus ~550 tail loss probes a second)
// and cost 30% of the goodput; at 20 us, 19% (retransmissions still = drops).
constexpr uint64_t kMinReorderWindowNs = 20'000;
// Tail loss probe: nothing acked for max(2 srtt, this) with data in flight
// resends the newest unSACKed segment, so the SACKs it draws let RACK find
// earlier losses instead of waiting for the retransmission timer. (A
// srtt + 4 rttvar term, tried against late acks on a busy host, brought the
// probe so close to the timer that timeouts went up instead.)
constexpr uint64_t kMinProbeTimeoutNs = 200'000;
constexpr uint64_t kHandshakeFirstNs = 50 * kMs;
constexpr uint64_t kHandshakeMaxNs = 1000 * kMs;
constexpr uint64_t kInitialCwndSegments = 32;
constexpr uint64_t kMinCwndSegments = 16;
// Losses beyond 1 in this many segments of a window are congestion.
constexpr uint64_t kSparseLossDivisor = 32;
// Losses beyond 1 in this many segments of a window are a queue that
// overflowed (a burst of drops): halve.
constexpr uint64_t kOverflowLossDivisor = 8;
// A blocked Read / Write polls the port itself until nothing moved for this
// long; for the first kSpinNoYieldNs (a few round trips) without yielding the
// CPU, since a sched_yield on a busy core can give the time slice away for
// milliseconds.
constexpr uint64_t kSpinNs = 1 * kMs;
constexpr uint64_t kSpinNoYieldNs = 200'000;

// now - then, 0 when `then` was stamped after `now` was read (by another thread).
uint64_t Since(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

uint64_t Ns(std::chrono::nanoseconds d) { return static_cast<uint64_t>(d.count()); }

std::string Ms(uint64_t ns) { return std::to_string(ns / kMs) + " ms"; }

}  // namespace

ConnState::ConnState(const ConnParams& params, uint64_t now_ns)
    : params_(params),
      fault_rng_((params.faults.seed * 0x9E3779B97F4A7C15ull) ^ (uint64_t{params.local_id} << 1) ^ 1),
      snd_(std::max<size_t>(params.send_capacity, 64 << 10)),
      rcv_(std::max<size_t>(params.recv_capacity, 64 << 10)) {
  created_ns_ = now_ns;
  last_heard_ns_ = now_ns;
  last_sent_ns_ = now_ns;
  last_space_ns_ = now_ns;
  handshake_interval_ns_ = kHandshakeFirstNs;
  if (params.static_mac) {
    remote_mac_ = *params.static_mac;
    remote_mac_known_ = true;
  }
}

std::shared_ptr<ConnState> ConnState::NewClient(const ConnParams& params, uint64_t now_ns) {
  std::shared_ptr<ConnState> c(new ConnState(params, now_ns));
  c->phase_ = Phase::kSynSent;
  return c;
}

std::shared_ptr<ConnState> ConnState::NewServer(const ConnParams& params, const SegmentHeader& syn,
                                                const MacAddress& peer_mac, uint64_t now_ns) {
  std::shared_ptr<ConnState> c(new ConnState(params, now_ns));
  c->phase_ = Phase::kSynReceived;
  c->remote_id_ = syn.src_conn;
  if (!c->remote_mac_known_) {
    c->remote_mac_ = peer_mac;
    c->remote_mac_known_ = true;
  }
  c->peer_mss_ = syn.seq > 0 ? static_cast<uint32_t>(std::min<uint64_t>(syn.seq, params.mss)) : params.mss;
  c->peer_accepts_unchecked_ = (syn.ack & kHandshakeAcceptsUncheckedPayloads) != 0;
  c->peer_edge_ = syn.window;
  c->ts_recent_ = syn.tsval;
  return c;
}

bool ConnState::peer_accepts_unchecked_payloads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peer_accepts_unchecked_;
}

uint32_t ConnState::remote_id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return remote_id_;
}

MacAddress ConnState::remote_mac() const {
  std::lock_guard<std::mutex> lock(mu_);
  return remote_mac_;
}

uint64_t ConnState::retransmits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retransmits_;
}

ConnState::Counters ConnState::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Counters{frames_sent_, retransmits_, injected_drops_, loss_probes_, timeouts_, window_cuts_, congestive_cuts_};
}

template <typename Done>
void ConnState::WaitLocked(std::unique_lock<std::mutex>& lock, Deadline deadline, Done done) {
  if (poller_) {
    uint64_t last_progress = NowNanos();
    while (!done() && !deadline.expired()) {
      lock.unlock();
      bool moved = poller_();
      uint64_t now = NowNanos();
      if (moved) {
        last_progress = now;
      } else if (now - last_progress > kSpinNs) {
        Wake();  // quiet: sleep below, and the I/O thread takes over now
        lock.lock();
        break;
      } else if (now - last_progress > kSpinNoYieldNs) {
        // Waiting longer than a round trip (window, acks, a slow peer): let
        // the other threads on this core run between polls.
        std::this_thread::yield();
      }
      lock.lock();
    }
    if (done() || deadline.expired()) return;
  }
  cv_.wait_for(lock, std::min<std::chrono::milliseconds>(deadline.remaining(), std::chrono::milliseconds(20)));
}

void ConnState::DeliverLocked(size_t n, const PayloadSource& payload, uint32_t skip) {
  size_t direct = 0;
  if (posted_drain_ != nullptr && rcv_.size() == 0 && posted_drain_status_.ok() &&
      posted_drain_thread_ == std::this_thread::get_id()) {
    // The reader polls from its own thread: hand it the bytes where they lie.
    while (direct < n && posted_drained_ < posted_drain_max_) {
      const size_t want = std::min(n - direct, posted_drain_max_ - posted_drained_);
      const PayloadSource::Span span =
          payload.SpanAt(skip + static_cast<uint32_t>(direct), static_cast<uint32_t>(want));
      Result<size_t> drained = (*posted_drain_)(span.data, span.len);
      if (drained.ok() && *drained == 0 && posted_drained_ == 0)
        drained = Status::Internal("ReadWith: the drainer consumed no bytes");
      if (!drained.ok()) {
        posted_drain_status_ = drained.status();
        break;
      }
      const size_t used = std::min<size_t>(*drained, span.len);
      direct += used;
      posted_drained_ += used;
      if (used < span.len) {
        posted_drain_max_ = posted_drained_;  // it declined the rest: full for this ReadWith
        break;
      }
    }
    rcv_.Skip(direct);
  } else if (posted_dst_ != nullptr && rcv_.size() == 0) {
    direct = std::min(n, posted_max_ - posted_len_);
    if (direct > 0) {
      payload.CopyOut(skip, static_cast<uint32_t>(direct), posted_dst_ + posted_len_);
      posted_len_ += direct;
      rcv_.Skip(direct);
    }
  }
  if (n > direct) {
    rcv_.AppendWith(n - direct, [&](char* dst, size_t len, size_t done) {
      payload.CopyOut(skip + static_cast<uint32_t>(direct + done), static_cast<uint32_t>(len), dst);
    });
  }
  rcv_nxt_ += n;
}

void ConnState::ReleaseSentLocked() {
  uint64_t upto = snd_.PinFloor(std::min(snd_una_, snd_.end()));
  if (upto > snd_.begin()) {
    snd_.ConsumeTo(upto);
    cv_.notify_all();
  }
}

void ConnState::FailLocked(const Status& status) {
  if (phase_ == Phase::kDead) return;
  CANOPY_LOG(kDebug, "dpdk: connection {:08x} to {}:{} failed: {}", params_.local_id,
             FormatIpv4(params_.remote_ip), params_.remote_port, status.ToString());
  phase_ = Phase::kDead;
  if (error_.ok()) error_ = status;
  cv_.notify_all();
}

void ConnState::Fail(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  FailLocked(status);
}

uint64_t ConnState::RtoNs() const {
  uint64_t rto = srtt_ns_ == 0 ? kInitialRtoNs : srtt_ns_ + std::max<uint64_t>(4 * rttvar_ns_, kMs);
  rto = std::clamp(rto, kMinRtoNs, kMaxRtoNs);
  for (int i = 0; i < backoff_ && rto < kMaxRtoNs; ++i) rto *= 2;
  return std::min(rto, 2 * kMaxRtoNs);
}

uint32_t ConnState::AdvertisedWindowLocked() const {
  return static_cast<uint32_t>(std::min<size_t>(rcv_.space(), UINT32_MAX));
}

SegmentHeader ConnState::BaseHeaderLocked(uint64_t now_ns) const {
  SegmentHeader h;
  h.kind = SegmentKind::kData;
  h.src_conn = params_.local_id;
  h.dst_conn = remote_id_;
  h.seq = snd_nxt_;
  h.ack = rcv_nxt_ + (eof_ ? 1 : 0);
  h.window = AdvertisedWindowLocked();
  h.tsval = now_ns;
  h.tsecr = ts_recent_;
  return h;
}

void ConnState::FillSacksLocked(SegmentHeader* h, size_t max_blocks) const {
  if (ooo_.empty() || max_blocks == 0) return;
  std::vector<SackBlock> blocks;
  for (const auto& [seq, range_end] : ooo_) {
    uint64_t end = range_end;
    if (end <= rcv_nxt_) continue;
    uint64_t start = std::max(seq, rcv_nxt_);
    if (!blocks.empty() && start <= blocks.back().end) {
      blocks.back().end = std::max(blocks.back().end, end);
    } else {
      blocks.push_back({start, end});
    }
  }
  // The block holding the newest out-of-order arrival first (RFC 2018), then the lowest.
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (last_ooo_seq_ >= blocks[i].start && last_ooo_seq_ < blocks[i].end) {
      std::rotate(blocks.begin(), blocks.begin() + static_cast<long>(i),
                  blocks.begin() + static_cast<long>(i) + 1);
      break;
    }
  }
  if (blocks.size() > max_blocks) blocks.resize(max_blocks);
  h->sacks = std::move(blocks);
}

bool ConnState::EmitLocked(SegmentOutput& out, SegmentHeader& h, const ByteRing* data, uint64_t offset,
                           uint64_t now_ns) {
  if (!out.Emit(*this, remote_mac_, h, data, offset)) return false;
  last_sent_ns_ = now_ns;
  if (h.kind == SegmentKind::kData || h.kind == SegmentKind::kSynAck) {
    ack_pending_ = false;
    ack_now_ = false;
    // A SYN-ACK's ack field holds features; its window starts at offset 0.
    advertised_edge_ = (h.kind == SegmentKind::kSynAck ? 0 : h.ack) + h.window;
  }
  return true;
}

bool ConnState::PeerAddressLocked(SegmentOutput& out, uint64_t now_ns) {
  (void)now_ns;
  if (remote_mac_known_) return true;
  if (out.Neighbour(params_.remote_ip, &remote_mac_)) {
    remote_mac_known_ = true;
    return true;
  }
  out.SendArpRequest(params_.local_ip, params_.remote_ip);
  return false;
}

bool ConnState::SendSegmentLocked(SegmentOutput& out, Segment& seg, uint64_t now_ns) {
  SegmentHeader h = BaseHeaderLocked(now_ns);
  h.seq = seg.seq;
  h.payload_len = seg.len;
  if (seg.fin) h.flags |= kSegFlagFin;
  FillSacksLocked(&h, kDataSackBlocks);
  if (!EmitLocked(out, h, &snd_, seg.seq, now_ns)) return false;
  ++frames_sent_;
  if (seg.sent_ns != 0) {
    static const SchemeCounters& counters = CountersForScheme("dpdk");
    seg.retransmitted = true;
    ++retransmits_;
    counters.retransmissions->Increment();
  }
  seg.sent_ns = now_ns;
  seg.lost = false;
  if (rto_deadline_ns_ == 0) rto_deadline_ns_ = now_ns + RtoNs();
  return true;
}

void ConnState::OnSegment(const SegmentHeader& h, const PayloadSource& payload, uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ == Phase::kDead) return;
  if (h.kind == SegmentKind::kRst) {
    const std::string peer = FormatIpv4(params_.remote_ip) + ":" + std::to_string(params_.remote_port);
    FailLocked(Status::Unavailable(phase_ == Phase::kSynSent
                                       ? "connection refused by " + peer + " (nothing listens there)"
                                       : "connection reset by peer " + peer));
    return;
  }
  last_heard_ns_ = now_ns;
  if (h.kind == SegmentKind::kSyn) {
    // Our SYN-ACK was lost: answer again.
    if (phase_ == Phase::kSynReceived) handshake_next_ns_ = 0;
    return;
  }
  if (h.kind == SegmentKind::kSynAck) {
    if (phase_ == Phase::kSynSent) {
      remote_id_ = h.src_conn;
      peer_mss_ = h.seq > 0 ? static_cast<uint32_t>(std::min<uint64_t>(h.seq, params_.mss)) : params_.mss;
      peer_accepts_unchecked_ = (h.ack & kHandshakeAcceptsUncheckedPayloads) != 0;
      peer_edge_ = h.window;
      phase_ = Phase::kEstablished;
      cv_.notify_all();
    }
    ts_recent_ = std::max(ts_recent_, h.tsval);
    ack_now_ = true;  // acknowledge (again) so the listener knows we are there
    return;
  }
  if (h.src_conn != remote_id_) return;  // stale incarnation
  if (phase_ == Phase::kSynReceived) {
    phase_ = Phase::kEstablished;
    cv_.notify_all();
  }
  if (phase_ != Phase::kEstablished) return;
  if (h.tsval > ts_recent_) ts_recent_ = h.tsval;
  HandleAckLocked(h, now_ns);
  if (app_closed_ && h.payload_len > 0 && h.seq + h.payload_len > rcv_nxt_) {
    rst_pending_ = true;  // new data for an application that is gone: reset, like TCP
    return;
  }
  if (h.payload_len > 0 || (h.flags & kSegFlagFin)) HandleDataLocked(h, payload, now_ns);
  if (h.flags & kSegFlagAckNow) ack_now_ = true;
}

void ConnState::HandleAckLocked(const SegmentHeader& h, uint64_t now_ns) {
  uint64_t una = snd_una_;
  uint64_t max_ack = snd_nxt_ + (fin_sent_ ? 1 : 0);
  if (h.ack > max_ack) return;  // acknowledges bytes never sent: ignore the ack part
  peer_edge_ = std::max(peer_edge_, h.ack + h.window);
  if (h.tsecr != 0 && h.tsecr <= now_ns && h.tsecr > rack_ns_) {
    rack_ns_ = h.tsecr;
    loss_scan_ = true;
  }
  if (h.ack > una || (fin_sent_ && !fin_acked_ && h.ack > fin_seq_)) {
    snd_una_ = std::max(snd_una_, std::min(h.ack, snd_.end()));
    ReleaseSentLocked();
    if (fin_sent_ && h.ack > fin_seq_) fin_acked_ = true;
    uint64_t acked = 0;
    while (!inflight_.empty()) {
      const Segment& s = inflight_.front();
      uint64_t end = s.seq + s.len + (s.fin ? 1 : 0);
      if (end > h.ack) break;
      if (s.sacked) {
        sacked_bytes_ -= s.len;
      } else {
        acked += s.len;
      }
      inflight_.pop_front();
    }
    const uint32_t mss = std::min(params_.mss, peer_mss_ == 0 ? params_.mss : peer_mss_);
    OnAckedLocked(acked, mss);
    if (h.tsecr != 0 && h.tsecr <= now_ns) {
      uint64_t rtt = now_ns - h.tsecr;
      if (srtt_ns_ == 0) {
        srtt_ns_ = rtt;
        rttvar_ns_ = rtt / 2;
      } else {
        uint64_t diff = srtt_ns_ > rtt ? srtt_ns_ - rtt : rtt - srtt_ns_;
        rttvar_ns_ = (3 * rttvar_ns_ + diff) / 4;
        srtt_ns_ = (7 * srtt_ns_ + rtt) / 8;
      }
    }
    backoff_ = 0;
    last_ack_ns_ = now_ns;
    probe_sent_ = false;
    rto_deadline_ns_ = inflight_.empty() ? 0 : now_ns + RtoNs();
    last_space_ns_ = now_ns;
    cv_.notify_all();
  }
  for (const SackBlock& b : h.sacks) {
    auto it = std::lower_bound(inflight_.begin(), inflight_.end(), b.start,
                               [](const Segment& s, uint64_t v) { return s.seq < v; });
    for (; it != inflight_.end() && it->seq + it->len <= b.end; ++it) {
      if (!it->sacked && it->len > 0) {
        it->sacked = true;
        sacked_bytes_ += it->len;
        last_ack_ns_ = now_ns;
        probe_sent_ = false;
        it->lost = false;
        rack_ns_ = std::max(rack_ns_, it->sent_ns);
        loss_scan_ = true;
      }
    }
  }
}

void ConnState::HandleDataLocked(const SegmentHeader& h, const PayloadSource& payload, uint64_t now_ns) {
  (void)now_ns;
  ack_pending_ = true;
  uint64_t seq = h.seq;
  uint64_t end = seq + h.payload_len;
  uint64_t window_end = rcv_.begin() + rcv_.capacity();
  bool clipped = false;
  if (h.payload_len > 0) {
    if (end <= rcv_nxt_) {
      ack_now_ = true;  // duplicate
    } else if (seq >= window_end) {
      ack_now_ = true;  // beyond the window
      clipped = true;
    } else {
      if (end > window_end) {
        end = window_end;
        clipped = true;
      }
      if (seq <= rcv_nxt_) {
        uint64_t skip = rcv_nxt_ - seq;
        size_t n = static_cast<size_t>(end - rcv_nxt_);
        DeliverLocked(n, payload, static_cast<uint32_t>(skip));
        DeliverOutOfOrderLocked();
        cv_.notify_all();
      } else {
        // Straight into the receive ring at its place (inside the window).
        rcv_.WriteAt(seq, static_cast<size_t>(end - seq), [&](char* dst, size_t len, size_t done) {
          payload.CopyOut(static_cast<uint32_t>(done), static_cast<uint32_t>(len), dst);
        });
        AddOutOfOrderLocked(seq, end);
        last_ooo_seq_ = seq;
        ack_now_ = true;
      }
    }
  }
  if ((h.flags & kSegFlagFin) && !clipped) {
    peer_fin_ = true;
    peer_fin_seq_ = seq + h.payload_len;
  }
  CheckFinLocked();
}

void ConnState::AddOutOfOrderLocked(uint64_t start, uint64_t end) {
  auto it = ooo_.lower_bound(start);
  if (it != ooo_.begin() && std::prev(it)->second >= start) {
    --it;
    start = it->first;
    end = std::max(end, it->second);
    it = ooo_.erase(it);
  }
  while (it != ooo_.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = ooo_.erase(it);
  }
  ooo_.emplace(start, end);
}

void ConnState::DeliverOutOfOrderLocked() {
  while (!ooo_.empty() && ooo_.begin()->first <= rcv_nxt_) {
    uint64_t end = ooo_.begin()->second;
    ooo_.erase(ooo_.begin());
    if (end > rcv_nxt_) {
      // Those bytes already sit in rcv_ past its end (rcv_.end() == rcv_nxt_).
      rcv_.ExtendTo(end);
      rcv_nxt_ = end;
    }
  }
}

void ConnState::CheckFinLocked() {
  if (peer_fin_ && !eof_ && rcv_nxt_ == peer_fin_seq_) {
    eof_ = true;
    ack_now_ = true;
    cv_.notify_all();
  }
}

void ConnState::DetectLossLocked() {
  loss_scan_ = false;
  uint64_t reo = std::max<uint64_t>(srtt_ns_ / 4, kMinReorderWindowNs);
  size_t found = 0;
  for (Segment& s : inflight_) {
    if (s.sent_ns + reo >= rack_ns_) {
      if (!s.retransmitted) break;  // everything after was sent later still
      continue;
    }
    if (!s.sacked && !s.lost && s.sent_ns != 0) {
      s.lost = true;
      ++found;
    }
  }
  if (found > 0) OnLossLocked(false, found);
}

void ConnState::OnAckedLocked(uint64_t acked_bytes, uint32_t mss) {
  if (acked_bytes == 0 || cwnd_ == 0) return;
  if (snd_una_ < recovery_end_) return;  // no growth while recovering
  if (cwnd_ < ssthresh_) {
    cwnd_ += acked_bytes;  // slow start
  } else {
    cwnd_ += std::max<uint64_t>(1, uint64_t{mss} * acked_bytes / cwnd_);
  }
  cwnd_ = std::min<uint64_t>(cwnd_, snd_.capacity());
}

void ConnState::OnLossLocked(bool timeout, size_t newly_lost) {
  if (cwnd_ == 0) return;
  const uint64_t window_segments = std::max<uint64_t>(1, inflight_.size());
  if (!timeout) {
    // Sparse loss (at most 1 in kSparseLossDivisor segments of a window, or
    // a single one) is recovered without a cut: it is what a lossy link
    // does at any rate, and cutting for it pins the window at the floor
    // (sqrt(1 / loss) segments), so goodput would follow the RTT. A queue
    // that overflows drops more than that in a window; so does a timeout.
    if (snd_una_ >= loss_window_end_) {
      loss_window_end_ = snd_nxt_;
      window_losses_ = 0;
    }
    window_losses_ += newly_lost;
    if (window_losses_ < 2 || window_losses_ * kSparseLossDivisor <= window_segments) return;
  }
  if (!timeout && snd_una_ < recovery_end_) return;  // this window was already reduced
  const uint32_t mss = std::min(params_.mss, peer_mss_ == 0 ? params_.mss : peer_mss_);
  // A timeout, or a burst of losses (a queue that overflowed drops what
  // arrives while it is full), is congestion: halve. Otherwise the losses
  // are scattered (a lossy link): take 15% off, so that goodput degrades
  // smoothly; still multiplicative, so connections sharing a bottleneck
  // converge to equal shares. (The RTT is no guide here: a receiver that is
  // the bottleneck holds a queue of frames in its port's ring at full speed,
  // lossless or not, so "srtt above 4x the minimum RTT" held during every
  // loaded transfer and made every cut a halving: 1% random loss then cost
  // a third of the goodput, 5% barely more.)
  bool congestive = timeout || window_losses_ * kOverflowLossDivisor > window_segments;
  uint64_t reduced = congestive ? cwnd_ / 2 : cwnd_ * 85 / 100;
  ++window_cuts_;
  if (congestive) ++congestive_cuts_;
  cwnd_ = std::max<uint64_t>(reduced, kMinCwndSegments * mss);
  ssthresh_ = cwnd_;
  recovery_end_ = snd_nxt_;
}

void ConnState::Poll(SegmentOutput& out, uint64_t now, int budget) {
  std::lock_guard<std::mutex> lock(mu_);
  if (phase_ == Phase::kDead) return;
  // Only for error messages: Poll runs once per loop of the port's thread,
  // and formatting this every time cost 1-2% of a 1 MiB transfer.
  auto peer_name = [&] { return FormatIpv4(params_.remote_ip) + ":" + std::to_string(params_.remote_port); };

  if (phase_ == Phase::kSynSent || phase_ == Phase::kSynReceived) {
    if (Since(now, created_ns_) > Ns(params_.connect_timeout)) {
      FailLocked(Status::Timeout((phase_ == Phase::kSynSent ? "connect to " : "handshake with ") + peer_name() +
                                 " timed out after " + Ms(Ns(params_.connect_timeout)) +
                                 (remote_mac_known_ ? "" : " (no ARP reply)")));
      return;
    }
    // The ARP reply is in (the port learned the peer's MAC): send the SYN
    // now rather than at the next handshake retry, 50 ms or more away.
    if (!remote_mac_known_ && out.Neighbour(params_.remote_ip, &remote_mac_)) {
      remote_mac_known_ = true;
      handshake_next_ns_ = now;
    }
    if (now < handshake_next_ns_) return;
    handshake_next_ns_ = now + handshake_interval_ns_;
    handshake_interval_ns_ = std::min(2 * handshake_interval_ns_, kHandshakeMaxNs);
    if (!PeerAddressLocked(out, now)) return;
    SegmentHeader h = BaseHeaderLocked(now);
    h.kind = phase_ == Phase::kSynSent ? SegmentKind::kSyn : SegmentKind::kSynAck;
    h.seq = params_.mss;  // SYN / SYN-ACK carry the MSS in seq
    h.payload_len = 0;
    // ... and the handshake features in ack (dpdk_wire.h).
    h.ack = params_.accepts_unchecked_payloads ? kHandshakeAcceptsUncheckedPayloads : 0;
    EmitLocked(out, h, nullptr, 0, now);
    return;
  }

  // Established.
  const uint64_t io_timeout = Ns(params_.io_timeout);
  if (Since(now, last_heard_ns_) > io_timeout) {
    FailLocked(Status::Unavailable("peer " + peer_name() + " silent for " + Ms(Since(now, last_heard_ns_)) +
                                   " (died or unreachable)"));
    SegmentHeader rst = BaseHeaderLocked(now);
    rst.kind = SegmentKind::kRst;
    out.Emit(*this, remote_mac_, rst, nullptr, 0);
    return;
  }
  if (rst_pending_) {
    SegmentHeader rst = BaseHeaderLocked(now);
    rst.kind = SegmentKind::kRst;
    out.Emit(*this, remote_mac_, rst, nullptr, 0);
    FailLocked(Status::Aborted("connection closed"));
    return;
  }
  if (app_closed_ && fin_acked_) {
    phase_ = Phase::kDead;  // everything delivered; the port forgets us
    return;
  }
  if (app_closed_ && Since(now, last_space_ns_) > io_timeout) {
    SegmentHeader rst = BaseHeaderLocked(now);
    rst.kind = SegmentKind::kRst;
    out.Emit(*this, remote_mac_, rst, nullptr, 0);
    FailLocked(Status::Aborted("closed"));
    return;
  }

  const uint32_t mss = std::min(params_.mss, peer_mss_ == 0 ? params_.mss : peer_mss_);
  if (snd_.begin() < snd_una_) ReleaseSentLocked();  // frames that pinned acked bytes are gone now
  if (loss_scan_) DetectLossLocked();
  if (!inflight_.empty() && !probe_sent_ && srtt_ns_ != 0 &&
      now > std::max(last_ack_ns_, last_sent_ns_) + std::max(2 * srtt_ns_, kMinProbeTimeoutNs)) {
    for (auto it = inflight_.rbegin(); it != inflight_.rend(); ++it) {
      if (it->sacked || it->lost || it->sent_ns == 0) continue;
      it->lost = true;  // resent below; not a loss episode for congestion control
      probe_sent_ = true;
      ++loss_probes_;
      break;
    }
  }
  if (!inflight_.empty() && rto_deadline_ns_ != 0 && now >= rto_deadline_ns_) {
    // Resend the oldest segment not SACKed, not every segment older than
    // the RTO: on a busy host most timeouts are a late ack (a peer that was
    // not scheduled), and resending the window then doubled the bytes sent.
    // The ack the resent segment draws dates it (tsecr), so RACK marks
    // whatever was really lost before it.
    bool marked = false;
    for (Segment& s : inflight_) {
      if (s.sacked) continue;
      if (!s.lost) {
        s.lost = true;
        marked = true;
      }
      break;
    }
    if (backoff_ < 16) ++backoff_;
    ++timeouts_;
    rto_deadline_ns_ = now + RtoNs();
    if (marked) OnLossLocked(true, 1);
  }

  // Retransmissions first.
  for (Segment& s : inflight_) {
    if (budget <= 0) break;
    if (!s.lost) continue;
    if (!SendSegmentLocked(out, s, now)) return;
    --budget;
  }
  // New data within the peer's window and our in-flight bound (the send buffer).
  if (cwnd_ == 0) cwnd_ = kInitialCwndSegments * mss;
  while (budget > 0 && snd_nxt_ < snd_.end()) {
    const uint64_t pipe = snd_nxt_ - snd_una_ - std::min(sacked_bytes_, snd_nxt_ - snd_una_);
    if (pipe >= cwnd_) break;  // congestion window full
    uint64_t allowed = peer_edge_ > snd_nxt_ ? peer_edge_ - snd_nxt_ : 0;
    allowed = std::min<uint64_t>(allowed, cwnd_ - pipe + mss - 1);
    uint64_t len = std::min<uint64_t>({mss, snd_.end() - snd_nxt_, allowed});
    if (len == 0) break;
    if (len < mss && len < snd_.end() - snd_nxt_ && allowed < mss && !inflight_.empty())
      break;  // wait for a full window
    Segment seg;
    seg.seq = snd_nxt_;
    seg.len = static_cast<uint32_t>(len);
    if (!SendSegmentLocked(out, seg, now)) return;
    inflight_.push_back(seg);
    snd_nxt_ += len;
    --budget;
  }
  if (budget > 0 && fin_queued_ && !fin_sent_ && snd_nxt_ == fin_seq_) {
    Segment seg;
    seg.seq = fin_seq_;
    seg.fin = true;
    if (SendSegmentLocked(out, seg, now)) {
      inflight_.push_back(seg);
      snd_nxt_ = fin_seq_;  // the FIN's offset is accounted for by fin_sent_
      fin_sent_ = true;
      --budget;
    }
  }

  // Zero-window probe and keepalive: an ACK that asks for an immediate answer.
  const uint64_t keepalive = std::clamp<uint64_t>(io_timeout / 4, 20 * kMs, 1000 * kMs);
  bool window_blocked = snd_nxt_ < snd_.end() && peer_edge_ <= snd_nxt_ && inflight_.empty();
  bool want_probe = (window_blocked && now >= probe_next_ns_) || Since(now, last_sent_ns_) >= keepalive ||
                    (Since(now, last_heard_ns_) >= keepalive && now >= probe_next_ns_);
  uint64_t edge_now = rcv_nxt_ + AdvertisedWindowLocked();
  bool window_update = edge_now >= advertised_edge_ + std::max<uint64_t>(rcv_.capacity() / 4, 2 * mss);
  if (ack_now_ || ack_pending_ || window_update || want_probe) {
    SegmentHeader h = BaseHeaderLocked(now);
    h.seq = snd_nxt_;
    if (want_probe) {
      h.flags |= kSegFlagAckNow;
      probe_next_ns_ = now + std::min<uint64_t>(RtoNs(), keepalive);
    }
    FillSacksLocked(&h, kMaxSackBlocks);
    // Keep pure ACKs within the port's frame size.
    size_t max_blocks = mss > kSegmentHeaderSize ? (mss - kSegmentHeaderSize) / kSackBlockSize : 0;
    if (h.sacks.size() > max_blocks) h.sacks.resize(max_blocks);
    EmitLocked(out, h, nullptr, 0, now);
  }
}

bool ConnState::Finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return app_closed_ && phase_ == Phase::kDead;
}

Status ConnState::WaitEstablished(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (phase_ == Phase::kEstablished) return Status::Ok();
    if (!error_.ok()) return error_;
    if (app_closed_) return Status::Aborted("connection closed");
    if (deadline.expired()) return Status::Timeout("connect timed out");
    cv_.wait_for(lock,
                 std::min<std::chrono::milliseconds>(deadline.remaining(), std::chrono::milliseconds(50)));
  }
}

void ConnState::FlushFromApp() {
  if (!poller_ || !poller_()) Wake();
}

Status ConnState::Write(const char* data, size_t n, bool flush) {
  if (n == 0) {
    if (flush) FlushFromApp();
    return Status::Ok();
  }
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t progress_ns = NowNanos();
  uint64_t seen_begin = snd_.begin();
  while (n > 0) {
    if (app_closed_) return Status::Aborted("connection closed");
    if (!error_.ok()) return error_;
    if (fin_queued_) return Status::Aborted("send after Shutdown");
    if (snd_.space() > 0) {
      size_t chunk = snd_.Append(data, std::min<size_t>(n, 1 << 20));
      data += chunk;
      n -= chunk;
      progress_ns = NowNanos();
      const bool last = n == 0;
      const bool push = poller_ && ((flush && last) || snd_.end() - snd_nxt_ >= params_.mss);
      lock.unlock();
      // Run to completion: a full segment's worth, or the end of a flushing
      // write, goes out from this thread now; the I/O thread is woken only
      // when this thread could not send (or has no poller).
      if (push ? !poller_() : (flush && last)) Wake();
      lock.lock();
      continue;
    }
    uint64_t now = NowNanos();
    if (snd_.begin() != seen_begin) {
      seen_begin = snd_.begin();
      progress_ns = now;
    }
    if (Since(now, progress_ns) >= Ns(params_.io_timeout)) {
      return Status::Timeout("send made no progress for " + Ms(Since(now, progress_ns)) +
                             " (peer not reading)");
    }
    WaitLocked(lock, Deadline::After(std::chrono::milliseconds(20)),
               [&] { return snd_.space() > 0 || app_closed_ || !error_.ok(); });
  }
  return Status::Ok();
}

Status ConnState::WriteWith(size_t n, const Filler& fill) {
  if (n == 0) {
    FlushFromApp();
    return Status::Ok();
  }
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t progress_ns = NowNanos();
  uint64_t seen_begin = snd_.begin();
  while (n > 0) {
    if (app_closed_) return Status::Aborted("connection closed");
    if (!error_.ok()) return error_;
    if (fin_queued_) return Status::Aborted("send after Shutdown");
    if (snd_.space() > 0) {
      // [end, end + room) is free ring space nobody else touches (the
      // datapath reads only below end(), acks only move begin() up), so it
      // is filled without the mutex.
      const size_t room = std::min({n, snd_.space(), snd_.ContiguousFrom(snd_.end()), size_t{1} << 20});
      char* dst = snd_.At(snd_.end());
      lock.unlock();
      Result<size_t> filled = fill(dst, room);
      lock.lock();
      if (!filled.ok()) return filled.status();
      const size_t got = std::min(*filled, room);
      if (got == 0) return Status::Internal("WriteWith: the filler produced no bytes");
      snd_.AppendWith(got, [](char*, size_t, size_t) {});
      n -= got;
      progress_ns = NowNanos();
      const bool push = poller_ && (n == 0 || snd_.end() - snd_nxt_ >= params_.mss);
      lock.unlock();
      if (push ? !poller_() : n == 0) Wake();
      lock.lock();
      continue;
    }
    uint64_t now = NowNanos();
    if (snd_.begin() != seen_begin) {
      seen_begin = snd_.begin();
      progress_ns = now;
    }
    if (Since(now, progress_ns) >= Ns(params_.io_timeout)) {
      return Status::Timeout("send made no progress for " + Ms(Since(now, progress_ns)) +
                             " (peer not reading)");
    }
    WaitLocked(lock, Deadline::After(std::chrono::milliseconds(20)),
               [&] { return snd_.space() > 0 || app_closed_ || !error_.ok(); });
  }
  return Status::Ok();
}

Result<size_t> ConnState::ReadWith(size_t max, const Drainer& drain, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (app_closed_) return Status::Aborted("connection closed");
    if (rcv_.size() > 0) {
      // [begin, begin + len) stays put while unlocked: new in-order bytes
      // land at end() (no Read buffer is posted meanwhile), out-of-order ones
      // past it, and only this reader consumes.
      const size_t len = std::min({max, rcv_.size(), rcv_.ContiguousFrom(rcv_.begin())});
      const char* src = rcv_.At(rcv_.begin());
      lock.unlock();
      Result<size_t> drained = drain(src, len);
      lock.lock();
      if (!drained.ok()) return drained.status();
      const size_t used = std::min(*drained, len);
      if (used == 0) return Status::Internal("ReadWith: the drainer consumed no bytes");
      rcv_.ConsumeTo(rcv_.begin() + used);
      bool wake = rcv_.begin() + rcv_.capacity() >= advertised_edge_ + rcv_.capacity() / 4;
      lock.unlock();
      if (wake) Wake();
      return used;
    }
    if (eof_) return Status::Closed("peer closed the connection");
    if (!error_.ok()) return error_;
    if (deadline.expired()) return Status::Timeout("receive deadline passed");
    if (max == 0) return size_t{0};
    // Post the drainer: in-order bytes this thread's polls receive while it
    // waits go to it straight from their frames (DeliverLocked).
    posted_drain_ = &drain;
    posted_drain_thread_ = std::this_thread::get_id();
    posted_drain_max_ = max;
    posted_drained_ = 0;
    posted_drain_status_ = Status::Ok();
    WaitLocked(lock, deadline, [&] {
      return posted_drained_ > 0 || !posted_drain_status_.ok() || rcv_.size() > 0 || eof_ || !error_.ok() ||
             app_closed_;
    });
    const size_t drained = posted_drained_;
    Status drain_status = std::move(posted_drain_status_);
    posted_drain_ = nullptr;
    posted_drain_max_ = posted_drained_ = 0;
    posted_drain_status_ = Status::Ok();
    if (!drain_status.ok()) return drain_status;
    if (drained > 0) {
      bool wake = rcv_.begin() + rcv_.capacity() >= advertised_edge_ + rcv_.capacity() / 4;
      lock.unlock();
      if (wake) Wake();
      return drained;
    }
  }
}

Result<size_t> ConnState::Read(char* dst, size_t max, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (app_closed_) return Status::Aborted("connection closed");
    if (rcv_.size() > 0) {
      size_t n = rcv_.Read(dst, max);
      bool wake = rcv_.begin() + rcv_.capacity() >= advertised_edge_ + rcv_.capacity() / 4;
      lock.unlock();
      if (wake) Wake();
      return n;
    }
    if (eof_) return Status::Closed("peer closed the connection");
    if (!error_.ok()) return error_;
    if (deadline.expired()) return Status::Timeout("receive deadline passed");
    if (max == 0) return size_t{0};
    // Post dst: in-order bytes arriving while we wait are copied straight into it.
    posted_dst_ = dst;
    posted_max_ = max;
    posted_len_ = 0;
    WaitLocked(lock, deadline,
               [&] { return posted_len_ > 0 || rcv_.size() > 0 || eof_ || !error_.ok() || app_closed_; });
    size_t got = posted_len_;
    posted_dst_ = nullptr;
    posted_max_ = posted_len_ = 0;
    if (got > 0) return got;
  }
}

Status ConnState::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (app_closed_) return Status::Aborted("connection closed");
    if (!error_.ok()) return error_;
    if (!fin_queued_) {
      fin_queued_ = true;
      fin_seq_ = snd_.end();
    }
  }
  Wake();
  return Status::Ok();
}

bool ConnState::WaitFinAcked(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (fin_queued_ && !fin_acked_ && error_.ok() && phase_ != Phase::kDead && !deadline.expired()) {
    cv_.wait_for(lock,
                 std::min<std::chrono::milliseconds>(deadline.remaining(), std::chrono::milliseconds(10)));
  }
  return fin_queued_ && fin_acked_;
}

void ConnState::Abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (app_closed_) return;
    app_closed_ = true;
    last_space_ns_ = NowNanos();
    if (phase_ == Phase::kSynSent) {
      phase_ = Phase::kDead;
    } else if (phase_ == Phase::kEstablished && (rcv_.size() > 0 || !ooo_.empty())) {
      rst_pending_ = true;  // unread data: reset rather than pretend an orderly close
    } else if (phase_ != Phase::kDead && !fin_queued_) {
      fin_queued_ = true;
      fin_seq_ = snd_.end();
    }
    cv_.notify_all();
  }
  Wake();
}

}  // namespace canopy::transport::dpdk
