// Metrics: counters, gauges and histograms in one process-wide registry,
// exposed in the Prometheus text format (version 0.0.4).
//
// The model and the text writer are Debian's prometheus-cpp (core): metric
// families with labels, lock-free increments (atomics) on a metric once it is
// looked up. This header adds what canopy's components share: the registry,
// one-call lookups, the latency buckets, and refreshers — functions run just
// before each exposition to set gauges from a component's state (replica
// versions, server totals) instead of updating them on every change.
//
// Naming: canopy_<component>_<what>[_<unit>][_total], labels in snake case;
// a component that can run several times in one process (a node in a test
// cluster) labels its series with its identity (node="3").
//
// Ownership: the registry lives for the whole process; references returned by
// Get* stay valid until exit. A Refresher unregisters its function when it is
// destroyed (and waits for a running exposition to finish with it).
//
// Thread safety: everything here may be called from any thread. Get* take a
// lock (look up once, keep the reference); Increment/Set/Observe on the
// returned metrics are lock-free. Refresher functions run on the thread that
// asked for the exposition, one exposition at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/labels.h>
#include <prometheus/registry.h>

namespace canopy::metrics {

// The Content-Type of Exposition()'s text.
inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// The process-wide registry.
prometheus::Registry& Registry();

// The series of family `name` (created with `help` on first use) with
// `labels`. A name already registered as another type throws
// std::invalid_argument (a programming error).
prometheus::Counter& GetCounter(const std::string& name, const std::string& help, const prometheus::Labels& labels = {});
prometheus::Gauge& GetGauge(const std::string& name, const std::string& help, const prometheus::Labels& labels = {});
prometheus::Histogram& GetHistogram(const std::string& name, const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets,
                                    const prometheus::Labels& labels = {});

// Bucket bounds in seconds for latencies from 50 µs to 10 s (roughly x2.5).
const prometheus::Histogram::BucketBoundaries& LatencyBuckets();

// Runs the refreshers, then writes every family of Registry() in the text
// exposition format.
std::string Exposition();

// Registers `refresh` to run before each Exposition() while this object lives.
class Refresher {
 public:
  explicit Refresher(std::function<void()> refresh);
  ~Refresher();
  Refresher(const Refresher&) = delete;
  Refresher& operator=(const Refresher&) = delete;

 private:
  uint64_t id_;
};

}  // namespace canopy::metrics
