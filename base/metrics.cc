#include "base/metrics.h"

#include <map>
#include <mutex>
#include <sstream>

#include <prometheus/text_serializer.h>

namespace canopy::metrics {
namespace {

struct State {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::mutex lookup_mu;      // Get*: family lookup and Add
  std::mutex exposition_mu;  // one exposition at a time; guards refreshers
  std::map<uint64_t, std::function<void()>> refreshers;
  uint64_t next_id = 1;
};

State& TheState() {
  static State* state = new State();  // never destroyed: metrics are used until exit
  return *state;
}

}  // namespace

prometheus::Registry& Registry() { return *TheState().registry; }

prometheus::Counter& GetCounter(const std::string& name, const std::string& help, const prometheus::Labels& labels) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.lookup_mu);
  return prometheus::BuildCounter().Name(name).Help(help).Register(*s.registry).Add(labels);
}

prometheus::Gauge& GetGauge(const std::string& name, const std::string& help, const prometheus::Labels& labels) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.lookup_mu);
  return prometheus::BuildGauge().Name(name).Help(help).Register(*s.registry).Add(labels);
}

prometheus::Histogram& GetHistogram(const std::string& name, const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets,
                                    const prometheus::Labels& labels) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.lookup_mu);
  return prometheus::BuildHistogram().Name(name).Help(help).Register(*s.registry).Add(labels, buckets);
}

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return buckets;
}

std::string Exposition() {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.exposition_mu);
  for (auto& [id, refresh] : s.refreshers) refresh();
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, s.registry->Collect());
  return out.str();
}

Refresher::Refresher(std::function<void()> refresh) {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.exposition_mu);
  id_ = s.next_id++;
  s.refreshers[id_] = std::move(refresh);
}

Refresher::~Refresher() {
  State& s = TheState();
  std::lock_guard<std::mutex> lock(s.exposition_mu);
  s.refreshers.erase(id_);
}

}  // namespace canopy::metrics
