// FailureDetector: which peers a node believes alive, from two kinds of
// evidence.
//
//  - Arrivals (Heard): any message from a peer proves it was alive when it
//    was sent. The detector keeps, per peer, a window of inter-arrival times
//    and turns the time since the last arrival into a suspicion level phi
//    (the phi-accrual detector of Hayashibara et al., as Cassandra and Akka
//    use it): phi = -log10(P(a gap at least this long)), with the gaps
//    modelled as a normal distribution of the window's mean and standard
//    deviation (at least min_stddev), shifted by acceptable_pause. phi 1
//    means a 10% chance that the peer is merely slow, phi 8 one in 10^8.
//    Arrivals closer together than expected_interval / 2 refresh the last
//    arrival but are not sampled, so that bursts of messages (deltas, ACKs)
//    do not teach the detector that gaps are always short.
//  - Loss evidence (Lost): a connection to the peer was refused, closed or
//    reset, or a probe (direct and indirect) went unanswered. The peer is
//    suspected at once, until something from it arrives after that moment.
//
// Phi needs kMinSamples gaps first (every peer has its own rhythm: a leader
// stream heartbeats every interval, a member that SWIM probes every N
// rounds is heard from every ~N/2); until then only loss evidence counts.
// A peer never heard from is suspected. The node itself is not tracked
// (callers treat themselves as alive).
//
// Thread safety: none; Node guards its detector with its cluster-view mutex.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "base/clock.h"

namespace canopy::replication {

struct FailureDetectorOptions {
  // The cadence peers are expected to send at (the heartbeat interval):
  // arrivals closer than half of it are not sampled.
  std::chrono::milliseconds expected_interval{100};
  std::chrono::milliseconds min_stddev{25};
  std::chrono::milliseconds acceptable_pause{50};
  double phi_threshold = 8.0;
  size_t window = 64;  // samples kept per peer
};

class FailureDetector {
 public:
  static constexpr size_t kMinSamples = 3;

  explicit FailureDetector(FailureDetectorOptions options = {}) : options_(options) {}

  void Heard(const std::string& peer, Clock::time_point now);
  void Lost(const std::string& peer, Clock::time_point now);
  void Forget(const std::string& peer) { peers_.erase(peer); }

  // Suspicion level now; +infinity for a peer never heard from.
  double Phi(const std::string& peer, Clock::time_point now) const;
  // Loss evidence not yet cleared by a later arrival, or phi above the
  // threshold, or never heard.
  bool Suspected(const std::string& peer, Clock::time_point now) const;
  // Loss evidence not yet cleared by a later arrival.
  bool HasLossEvidence(const std::string& peer) const;
  // The last arrival, if any.
  std::optional<Clock::time_point> LastHeard(const std::string& peer) const;

  const FailureDetectorOptions& options() const { return options_; }

 private:
  struct Peer {
    Clock::time_point last_arrival{};
    Clock::time_point last_sample{};
    bool heard = false;
    bool lost = false;  // loss evidence after last_arrival
    std::deque<double> gaps_ms;
    double sum = 0, sum_sq = 0;
  };
  FailureDetectorOptions options_;
  std::map<std::string, Peer> peers_;
};

}  // namespace canopy::replication
