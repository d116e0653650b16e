// Metrics: a prometheus-cpp registry per process, optionally served on /metrics.
//
// Components declare their metrics once (a struct of references built from this registry) and
// update them lock-free. Names follow `pacer_<component>_<what>_<unit>` (docs/design.md §9).
// Thread-safe: prometheus-cpp metrics are atomic; the registry is shared.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
}

namespace pacer {

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();

  prometheus::Registry& registry() { return *registry_; }
  std::shared_ptr<prometheus::Registry> shared() { return registry_; }

  prometheus::Counter& Counter(const std::string& name, const std::string& help,
                               const prometheus::Labels& labels = {});
  prometheus::Gauge& Gauge(const std::string& name, const std::string& help,
                           const prometheus::Labels& labels = {});
  prometheus::Histogram& Histogram(const std::string& name, const std::string& help,
                                   const prometheus::Histogram::BucketBoundaries& buckets,
                                   const prometheus::Labels& labels = {});

  // Serves /metrics on `host:port` (port 0 picks a free one). Returns the bound port.
  absl::StatusOr<int> Serve(const std::string& host_port);

  // Renders the registry in the Prometheus text format (for tests and pacerctl).
  std::string RenderText() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace pacer
