#include "replication/failure_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace canopy::replication {

namespace {
double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
}  // namespace

void FailureDetector::Heard(const std::string& peer, Clock::time_point now) {
  Peer& p = peers_[peer];
  if (!p.heard) {
    p.heard = true;
    p.last_sample = now;
  } else if (now - p.last_sample >= options_.expected_interval / 2) {
    double gap = Millis(now - p.last_sample);
    p.gaps_ms.push_back(gap);
    p.sum += gap;
    p.sum_sq += gap * gap;
    while (p.gaps_ms.size() > std::max<size_t>(1, options_.window)) {
      double old = p.gaps_ms.front();
      p.gaps_ms.pop_front();
      p.sum -= old;
      p.sum_sq -= old * old;
    }
    p.last_sample = now;
  }
  if (now >= p.last_arrival) p.last_arrival = now;
  p.lost = false;
}

void FailureDetector::Lost(const std::string& peer, Clock::time_point now) {
  Peer& p = peers_[peer];
  if (!p.heard || now >= p.last_arrival) p.lost = true;
}

double FailureDetector::Phi(const std::string& peer, Clock::time_point now) const {
  auto it = peers_.find(peer);
  if (it == peers_.end() || !it->second.heard) return std::numeric_limits<double>::infinity();
  const Peer& p = it->second;
  // Too few gaps to know this peer's rhythm (a member that SWIM probes
  // every N rounds has a very different one from a leader stream): only
  // loss evidence counts until then.
  if (p.gaps_ms.size() < kMinSamples) return 0;
  double n = static_cast<double>(p.gaps_ms.size());
  double mean = p.sum / n;
  double variance = std::max(0.0, p.sum_sq / n - mean * mean);
  double stddev = std::max(std::sqrt(variance), static_cast<double>(options_.min_stddev.count()));
  mean += static_cast<double>(options_.acceptable_pause.count());
  double elapsed = Millis(now - p.last_arrival);
  // Logistic approximation of the normal CDF (as Akka's detector uses):
  // P(gap > elapsed) = e / (1 + e) for e = exp(-y (1.5976 + 0.070566 y^2)).
  double y = (elapsed - mean) / stddev;
  double e = std::exp(-y * (1.5976 + 0.070566 * y * y));
  double p_later = elapsed > mean ? e / (1.0 + e) : 1.0 - 1.0 / (1.0 + e);
  if (p_later <= 0) return std::numeric_limits<double>::infinity();
  return -std::log10(p_later);
}

bool FailureDetector::Suspected(const std::string& peer, Clock::time_point now) const {
  auto it = peers_.find(peer);
  if (it == peers_.end() || !it->second.heard || it->second.lost) return true;
  return Phi(peer, now) > options_.phi_threshold;
}

bool FailureDetector::HasLossEvidence(const std::string& peer) const {
  auto it = peers_.find(peer);
  return it != peers_.end() && it->second.lost;
}

std::optional<Clock::time_point> FailureDetector::LastHeard(const std::string& peer) const {
  auto it = peers_.find(peer);
  if (it == peers_.end() || !it->second.heard) return std::nullopt;
  return it->second.last_arrival;
}

}  // namespace canopy::replication
