#include "common/metrics.h"

#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"

namespace pacer {

const char* MetricTypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "?";
}

const std::vector<double>& LatencySecondsBuckets() {
  static const std::vector<double> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                        5,      10};
  return b;
}

namespace {

bool ValidName(const std::string& s, bool allow_colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                       (allow_colon && c == ':');
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateMetricDefs(const std::vector<MetricDef>& defs) {
  std::set<std::string> names;
  for (const MetricDef& d : defs) {
    const std::string where = "metric '" + d.name + "' (field " + d.field + ")";
    if (!ValidName(d.name, false) || !absl::StartsWith(d.name, "pacer_")) {
      return absl::InvalidArgumentError(where + ": not a pacer_[a-z0-9_] name");
    }
    if (!names.insert(d.name).second) return absl::InvalidArgumentError(where + ": declared twice");
    const bool total = absl::EndsWith(d.name, "_total");
    if ((d.type == MetricType::kCounter) != total) {
      return absl::InvalidArgumentError(where + ": a " + MetricTypeName(d.type) + (total ? " must not end" : " must end") + " in _total");
    }
    for (const char* reserved : {"_count", "_sum", "_bucket", "_created"}) {
      if (absl::EndsWith(d.name, reserved)) {
        return absl::InvalidArgumentError(where + ": ends in the reserved suffix " + reserved);
      }
    }
    if (d.help.empty()) return absl::InvalidArgumentError(where + ": no help text");
    std::set<std::string> labels;
    for (const std::string& l : d.labels) {
      if (!ValidName(l, false) || absl::StartsWith(l, "__") || l == "le" || l == "quantile") {
        return absl::InvalidArgumentError(where + ": bad label name '" + l + "'");
      }
      if (!labels.insert(l).second) {
        return absl::InvalidArgumentError(where + ": label '" + l + "' listed twice");
      }
    }
  }
  return absl::OkStatus();
}

namespace metrics_internal {

LabelCap::LabelCap(MetricsRegistry* registry, const MetricDef& def)
    : registry_(registry), def_(def), seen_(def.labels.size()) {}

prometheus::Labels LabelCap::Resolve(std::initializer_list<std::string_view> values) {
  if (values.size() != def_.labels.size()) {
    // A programming error: the call site and the declaration disagree.
    std::cerr << "metrics: " << def_.name << " takes " << def_.labels.size()
              << " label values, given " << values.size() << std::endl;
    std::abort();
  }
  prometheus::Labels labels;
  std::vector<size_t> overflowed;
  {
    absl::MutexLock l(&mu_);
    size_t i = 0;
    for (std::string_view v : values) {
      std::string value(v.substr(0, kMaxLabelValueBytes));
      auto& seen = seen_[i];
      if (!seen.contains(value)) {
        if (seen.size() >= kMaxLabelValues) {
          value = kOverflowLabelValue;
          overflowed.push_back(i);
        } else {
          seen.insert(value);
        }
      }
      labels.emplace(def_.labels[i], std::move(value));
      ++i;
    }
  }
  for (size_t i : overflowed) registry_->CountOverflow(def_.name, def_.labels[i]);
  return labels;
}

prometheus::Family<prometheus::Counter>* Build(MetricsRegistry* r, const MetricDef& d,
                                               prometheus::Counter*) {
  return &prometheus::BuildCounter().Name(d.name).Help(d.help).Register(r->registry());
}
prometheus::Family<prometheus::Gauge>* Build(MetricsRegistry* r, const MetricDef& d,
                                             prometheus::Gauge*) {
  return &prometheus::BuildGauge().Name(d.name).Help(d.help).Register(r->registry());
}
prometheus::Family<prometheus::Histogram>* Build(MetricsRegistry* r, const MetricDef& d,
                                                 prometheus::Histogram*) {
  return &prometheus::BuildHistogram().Name(d.name).Help(d.help).Register(r->registry());
}

}  // namespace metrics_internal

MetricsRegistry::MetricsRegistry()
    : registry_(std::make_shared<prometheus::Registry>()),
      own_(std::make_unique<RegistryMetrics>(this)) {}

MetricsRegistry::~MetricsRegistry() = default;

void MetricsRegistry::CountOverflow(const std::string& metric, const std::string& label) {
  own_->label_overflow.With({metric, label}).Increment();
}

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
