#include "common/metrics.h"

#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include <exception>

#include "absl/status/status.h"

namespace pacer {

MetricsRegistry::MetricsRegistry() : registry_(std::make_shared<prometheus::Registry>()) {}

MetricsRegistry::~MetricsRegistry() = default;

prometheus::Counter& MetricsRegistry::Counter(const std::string& name, const std::string& help,
                                              const prometheus::Labels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add(labels);
}

prometheus::Gauge& MetricsRegistry::Gauge(const std::string& name, const std::string& help,
                                          const prometheus::Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(labels);
}

prometheus::Histogram& MetricsRegistry::Histogram(
    const std::string& name, const std::string& help,
    const prometheus::Histogram::BucketBoundaries& buckets, const prometheus::Labels& labels) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_).Add(labels,
                                                                                     buckets);
}

absl::StatusOr<int> MetricsRegistry::Serve(const std::string& host_port) {
  if (exposer_) return absl::FailedPreconditionError("metrics: already serving");
  try {
    // prometheus-cpp (civetweb) throws on a bad address or a port in use.
    exposer_ = std::make_unique<prometheus::Exposer>(host_port, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError("metrics: cannot listen on '" + host_port + "': " + e.what());
  }
  exposer_->RegisterCollectable(registry_);
  auto ports = exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError("metrics: no listening port");
  return static_cast<int>(ports.front());
}

std::string MetricsRegistry::RenderText() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

}  // namespace pacer
