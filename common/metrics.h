// Metrics: a prometheus-cpp registry per process, optionally served on /metrics, and the way
// every component declares its metrics -- once.
//
// A component lists its metrics in ONE X-macro (in the spirit of Envoy's stats macros); each
// entry gives the C++ field, the type, the Prometheus name, the help text and the label names:
//
//   #define PACER_EXAMPLE_METRICS(X)   (one entry per line, each line continued)
//     X(requests, Counter, "pacer_example_requests_total", "Requests served", "outcome")
//     X(queue, Gauge, "pacer_example_queue_depth", "Requests waiting")
//   PACER_DECLARE_METRICS(ExampleMetrics, PACER_EXAMPLE_METRICS);
//
// That one list makes the struct (`ExampleMetrics m(&registry); m.requests.With({"ok"}).Increment();`)
// and its catalogue (`ExampleMetrics::Defs()`), from which docs/metrics.md's tables are
// generated and checked (tests/monitoring/metrics_doc_test.cc), so code and docs cannot drift.
// Names follow Prometheus' conventions, which `promtool check metrics` enforces: counters end in
// `_total`, nothing else does; units are base units (`_seconds`, `_bytes`) spelt in the name.
//
// Cardinality: a label's values come from clients (worker, server, node and dataset ids), so each
// family accepts at most kMaxLabelValues (4096) distinct values per label. A value past that cap
// is exported as kOverflowLabelValue ("_overflow"): counters and histograms of the overflowing
// entities add up there (sums stay exact), a gauge there holds the last overflowing entity's
// value; every such substitution is counted in pacer_metrics_label_overflow_total{metric,label}.
// So one family holds at most 4097 series per label value combination of its other labels.
//
// Thread-safe: prometheus-cpp metrics are atomic; a MetricFamily's label lookup takes its own
// mutex; the registry is shared.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace prometheus {
class Exposer;
}

namespace pacer {

enum class MetricType { kCounter, kGauge, kHistogram };
const char* MetricTypeName(MetricType t);  // "counter", "gauge", "histogram"

// One declared metric family.
struct MetricDef {
  std::string field;  // the C++ member
  std::string name;   // the Prometheus name
  MetricType type = MetricType::kGauge;
  std::string help;
  std::vector<std::string> labels;
};

// At most this many distinct values per label of one family (see the header comment).
inline constexpr size_t kMaxLabelValues = 4096;
inline constexpr char kOverflowLabelValue[] = "_overflow";
// A label value longer than this is cut (ids are bounded well below it by the services).
inline constexpr size_t kMaxLabelValueBytes = 128;

// The bucket bounds (seconds) of every latency histogram: 100 µs to 10 s, roughly ×2.5.
const std::vector<double>& LatencySecondsBuckets();

class MetricsRegistry;
struct RegistryMetrics;  // below

// Checks a catalogue against Prometheus' naming rules and those of the header comment: valid
// names, `_total` exactly on counters, no reserved suffix (_count, _sum, _bucket) on histograms'
// base names, valid and unique label names ("le" and "quantile" reserved), names unique.
absl::Status ValidateMetricDefs(const std::vector<MetricDef>& defs);

namespace metrics_internal {

// The label bookkeeping shared by every MetricFamily<T>: caps, overflow, validation.
class LabelCap {
 public:
  LabelCap(MetricsRegistry* registry, const MetricDef& def);
  // The label set for `values` (in the order of def.labels), with capped values replaced.
  prometheus::Labels Resolve(std::initializer_list<std::string_view> values);
  const MetricDef& def() const { return def_; }
  MetricsRegistry* registry() const { return registry_; }

 private:
  MetricsRegistry* registry_;
  MetricDef def_;
  absl::Mutex mu_;
  std::vector<absl::flat_hash_set<std::string>> seen_ ABSL_GUARDED_BY(mu_);  // per label
};

}  // namespace metrics_internal

// A declared family of one type (prometheus::Counter, Gauge or Histogram).
template <class T>
class MetricFamily {
 public:
  MetricFamily(MetricsRegistry* registry, MetricDef def);
  MetricFamily(const MetricFamily&) = delete;
  MetricFamily& operator=(const MetricFamily&) = delete;

  // The series of a family without labels (created with the family: it is exported at 0 before
  // its first event, so rate() and increase() see that event).
  T& Get() { return With({}); }
  // The series for these label values, in the order the declaration lists the labels. A wrong
  // number of values is a programming error (aborts).
  T& With(std::initializer_list<std::string_view> values);
  const MetricDef& def() const { return cap_.def(); }

 private:
  metrics_internal::LabelCap cap_;
  prometheus::Family<T>* family_;
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();

  prometheus::Registry& registry() { return *registry_; }
  std::shared_ptr<prometheus::Registry> shared() { return registry_; }

  // Undeclared one-off series (prefer a declared list: these are not in the catalogue).
  prometheus::Counter& Counter(const std::string& name, const std::string& help,
                               const prometheus::Labels& labels = {});
  prometheus::Gauge& Gauge(const std::string& name, const std::string& help,
                           const prometheus::Labels& labels = {});
  prometheus::Histogram& Histogram(const std::string& name, const std::string& help,
                                   const prometheus::Histogram::BucketBoundaries& buckets,
                                   const prometheus::Labels& labels = {});

  // Counts a label value replaced by kOverflowLabelValue.
  void CountOverflow(const std::string& metric, const std::string& label);

  // Serves /metrics on `host:port` (port 0 picks a free one). Returns the bound port.
  absl::StatusOr<int> Serve(const std::string& host_port);

  // Renders the registry in the Prometheus text format (for tests and pacerctl).
  std::string RenderText() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<RegistryMetrics> own_;
};

// The registry's own metrics (declared like any component's).
#define PACER_REGISTRY_METRICS(X)                                                            \
  X(label_overflow, Counter, "pacer_metrics_label_overflow_total",                           \
    "Label values exported as \"_overflow\" because their family already had 4096 values " \
    "of that label",                                                                         \
    "metric", "label")

// ---- the declaration macros ----------------------------------------------------------------

#define PACER_METRIC_DEF_(field, type, name, help, ...) \
  ::pacer::MetricDef{#field, name, ::pacer::MetricType::k##type, help, {__VA_ARGS__}},
#define PACER_METRIC_FIELD_(field, type, name, help, ...)    \
  ::pacer::MetricFamily<::prometheus::type> field{registry_, \
      ::pacer::MetricDef{#field, name, ::pacer::MetricType::k##type, help, {__VA_ARGS__}}};

// Declares `struct Name` with one MetricFamily member per entry of LIST and `static Defs()`, the
// catalogue. The registry must outlive the struct.
#define PACER_DECLARE_METRICS(Name, LIST)                                            \
  struct Name {                                                                      \
    explicit Name(::pacer::MetricsRegistry* registry) : registry_(registry) {}      \
    Name(const Name&) = delete;                                                      \
    Name& operator=(const Name&) = delete;                                           \
    static std::vector<::pacer::MetricDef> Defs() { return {LIST(PACER_METRIC_DEF_)}; } \
    ::pacer::MetricsRegistry* registry_;                                             \
    LIST(PACER_METRIC_FIELD_)                                                        \
  }

PACER_DECLARE_METRICS(RegistryMetrics, PACER_REGISTRY_METRICS);

// ---- MetricFamily<T> -------------------------------------------------------------------------

namespace metrics_internal {
prometheus::Family<prometheus::Counter>* Build(MetricsRegistry* r, const MetricDef& d,
                                               prometheus::Counter*);
prometheus::Family<prometheus::Gauge>* Build(MetricsRegistry* r, const MetricDef& d,
                                             prometheus::Gauge*);
prometheus::Family<prometheus::Histogram>* Build(MetricsRegistry* r, const MetricDef& d,
                                                 prometheus::Histogram*);
inline prometheus::Counter& Add(prometheus::Family<prometheus::Counter>* f,
                                const prometheus::Labels& l) {
  return f->Add(l);
}
inline prometheus::Gauge& Add(prometheus::Family<prometheus::Gauge>* f,
                              const prometheus::Labels& l) {
  return f->Add(l);
}
inline prometheus::Histogram& Add(prometheus::Family<prometheus::Histogram>* f,
                                  const prometheus::Labels& l) {
  return f->Add(l, LatencySecondsBuckets());
}
}  // namespace metrics_internal

template <class T>
MetricFamily<T>::MetricFamily(MetricsRegistry* registry, MetricDef def)
    : cap_(registry, def),
      family_(metrics_internal::Build(registry, cap_.def(), static_cast<T*>(nullptr))) {
  if (cap_.def().labels.empty()) Get();  // exported from the start, at 0
}

template <class T>
T& MetricFamily<T>::With(std::initializer_list<std::string_view> values) {
  return metrics_internal::Add(family_, cap_.Resolve(values));
}

}  // namespace pacer
