#include "monitor/straggler_classifier.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/strings/str_format.h"
#include "monitor/robust_stats.h"

namespace pacer {
namespace {

bool SameClass(const Classification& a, const Classification& b) {
  return a.worker_class() == b.worker_class() && a.persistence() == b.persistence() &&
         a.cause() == b.cause() && a.scope() == b.scope();
}

double Clamp01(double v) { return std::clamp(v, 0.0, 1.0); }

}  // namespace

StragglerClassifier::Thresholds StragglerClassifier::WorkerThresholds(const MonitorOptions& o) {
  return {o.straggler_threshold, o.leader_threshold, o.hysteresis};
}

StragglerClassifier::Thresholds StragglerClassifier::ServerThresholds(const MonitorOptions& o) {
  return {1.0 / o.hot_server_ratio, std::numeric_limits<double>::infinity(), o.hysteresis};
}

StragglerClassifier::StragglerClassifier(const MonitorOptions& options, EntityKind kind)
    : options_(options),
      kind_(kind),
      thresholds_(kind == ENTITY_SERVER ? ServerThresholds(options) : WorkerThresholds(options)),
      window_mask_(options.persistent_w >= 64 ? ~uint64_t{0}
                                              : (uint64_t{1} << options.persistent_w) - 1) {}

void StragglerClassifier::SetOptions(const MonitorOptions& options) {
  options_ = options;
  thresholds_ = kind_ == ENTITY_SERVER ? ServerThresholds(options) : WorkerThresholds(options);
  window_mask_ = options.persistent_w >= 64 ? ~uint64_t{0} : (uint64_t{1} << options.persistent_w) - 1;
}

namespace {
Classification Unclassified() {
  Classification c;
  c.set_worker_class(WORKER_CLASS_UNKNOWN);
  c.set_evidence("no window closed with data yet");
  return c;
}
}  // namespace

uint32_t StragglerClassifier::AddEntity(uint32_t node) {
  Track t;
  t.node = node;
  t.current = Unclassified();
  tracks_.push_back(std::move(t));
  return static_cast<uint32_t>(tracks_.size() - 1);
}

void StragglerClassifier::Forget(uint32_t entity) {
  Track t;
  t.node = tracks_[entity].node;
  t.current = Unclassified();
  tracks_[entity] = std::move(t);
}

std::string StragglerClassifier::NormalEvidence(double r) const {
  return absl::StrFormat("r=%.3f within [%.2f, %.2f]", r, thresholds_.straggler,
                         thresholds_.leader);
}

Classification StragglerClassifier::Get(uint32_t entity) const {
  const Track& t = tracks_[entity];
  Classification c = t.current;
  if (c.evidence().empty() && c.worker_class() != WORKER_CLASS_UNKNOWN && t.observed > 0) {
    c.set_evidence(Evidence(c, t.evidence));
  }
  return c;
}

std::string StragglerClassifier::Evidence(const Classification& c, const EvidenceInputs& in) const {
  const WorkerClass cls = c.worker_class();
  if (cls != WORKER_CLASS_STRAGGLER && cls != WORKER_CLASS_LEADER) return NormalEvidence(in.r);
  const bool straggling = cls == WORKER_CLASS_STRAGGLER;
  const double line = straggling ? thresholds_.straggler : thresholds_.leader;
  std::string evidence = absl::StrFormat("r=%.3f %s %.2f in %u/%u windows", in.r,
                                         straggling ? "<" : ">", line, in.flagged,
                                         options_.persistent_w);
  if (kind_ == ENTITY_SERVER) {
    absl::StrAppend(&evidence, "; latency above ", options_.hot_server_ratio, "x the median server");
    return evidence;
  }
  if (!straggling) return evidence;
  if (c.scope() == SCOPE_NODE) {
    absl::StrAppend(&evidence, absl::StrFormat("; node-level: %u/%u workers of its node slow",
                                               in.node_stragglers, in.node_observed));
  }
  if (c.cause() == CAUSE_CONTENTION) {
    absl::StrAppend(&evidence, absl::StrFormat("; contention score %.2f: ", in.contention_score),
                    in.contention_evidence);
  } else if (c.persistence() == PERSISTENCE_PERSISTENT && in.cv >= 0) {
    if (c.cause() == CAUSE_DETERMINISTIC) {
      absl::StrAppend(&evidence, absl::StrFormat("; stable (cv %.3f <= %.3f), no node contention "
                                                 "signal: likely hardware",
                                                 in.cv, options_.deterministic_max_cv));
    } else {
      absl::StrAppend(&evidence, absl::StrFormat("; unstable (cv %.3f), no node contention signal", in.cv));
    }
  }
  return evidence;
}

uint32_t StragglerClassifier::WindowsFlagged(uint32_t entity) const {
  const Track& t = tracks_[entity];
  const uint64_t bits = t.current.worker_class() == WORKER_CLASS_LEADER ? t.leader_bits : t.straggler_bits;
  return static_cast<uint32_t>(std::popcount(bits & window_mask_));
}

uint32_t StragglerClassifier::NodeStragglers(uint32_t node) const {
  return node < node_stragglers_.size() ? node_stragglers_[node] : 0;
}

void StragglerClassifier::Classify(const std::vector<Observation>& observed,
                                   const std::vector<Contention>& contention,
                                   std::vector<Change>* changes) {
  // 1. This window's flags, and per node how many observed workers straggle.
  flags_scratch_.assign(tracks_.size(), 0);  // bit 0 observed, 1 straggling, 2 leading
  std::fill(node_observed_.begin(), node_observed_.end(), 0);
  std::fill(node_stragglers_.begin(), node_stragglers_.end(), 0);
  for (const Observation& ob : observed) {
    const Track& t = tracks_[ob.entity];
    const WorkerClass cur = t.current.worker_class();
    const double s_line = thresholds_.straggler + (cur == WORKER_CLASS_STRAGGLER ? thresholds_.hysteresis : 0);
    const double l_line = thresholds_.leader - (cur == WORKER_CLASS_LEADER ? thresholds_.hysteresis : 0);
    uint8_t f = 1;
    if (ob.relative < s_line) f |= 2;
    else if (ob.relative > l_line) f |= 4;
    flags_scratch_[ob.entity] = f;
    if (t.node != kNoNode) {
      if (t.node >= node_observed_.size()) {
        node_observed_.resize(t.node + 1, 0);
        node_stragglers_.resize(t.node + 1, 0);
      }
      ++node_observed_[t.node];
      if (f & 2) ++node_stragglers_[t.node];
    }
  }

  // 2. Classify the observed entities.
  for (const Observation& ob : observed) {
    Track& t = tracks_[ob.entity];
    const uint8_t f = flags_scratch_[ob.entity];
    t.straggler_bits = (t.straggler_bits << 1) | ((f & 2) ? 1 : 0);
    t.leader_bits = (t.leader_bits << 1) | ((f & 4) ? 1 : 0);
    t.recent_r[t.observed % 64] = static_cast<float>(ob.relative);
    ++t.observed;
    t.missed = 0;
    bool node_level = false;
    if ((f & 2) && t.node != kNoNode && kind_ == ENTITY_WORKER) {
      const uint32_t n = node_observed_[t.node];
      node_level = n >= options_.node_level_min_workers &&
                   node_stragglers_[t.node] >= options_.node_level_fraction * n;
    }
    Classification& next = next_scratch_;
    next.Clear();
    EvidenceInputs& ev = evidence_scratch_;
    Decide(t, ob.relative, f & 2, f & 4, contention, node_level, &next, &ev);
    if (!SameClass(next, t.current)) {
      Classification previous = Get(ob.entity);  // still the previous window's evidence
      Classification current = next;
      current.set_evidence(Evidence(next, ev));
      changes->push_back({ob.entity, std::move(previous), std::move(current), ob.relative});
      t.current.Swap(&next);
    } else {
      t.current.set_confidence(next.confidence());  // same class: only the confidence moves
    }
    // Field by field (a generic swap of the struct moved three strings per entity per window):
    // the numbers are copied, the contention text's buffer is swapped only when one is set.
    t.evidence.r = ev.r;
    t.evidence.flagged = ev.flagged;
    t.evidence.node_stragglers = ev.node_stragglers;
    t.evidence.node_observed = ev.node_observed;
    t.evidence.contention_score = ev.contention_score;
    t.evidence.cv = ev.cv;
    if (!ev.contention_evidence.empty() || !t.evidence.contention_evidence.empty())
      t.evidence.contention_evidence.swap(ev.contention_evidence);
  }

  // 3. Entities that went quiet.
  for (uint32_t e = 0; e < tracks_.size(); ++e) {
    if (flags_scratch_[e] & 1) continue;
    Track& t = tracks_[e];
    ++t.missed;
    if (t.missed >= options_.stale_after_windows && t.current.worker_class() != WORKER_CLASS_UNKNOWN) {
      Classification next;
      next.set_worker_class(WORKER_CLASS_UNKNOWN);
      next.set_evidence(absl::StrFormat("no estimate for %u windows", t.missed));
      changes->push_back({e, t.current, next, 0});
      t.current = std::move(next);
    }
  }
}

void StragglerClassifier::Decide(const Track& t, double r, bool straggling, bool leading,
                                 const std::vector<Contention>& contention, bool node_level,
                                 Classification* out, EvidenceInputs* ev) const {
  const uint32_t w = options_.persistent_w;
  ev->r = r;
  ev->flagged = 0;
  ev->node_stragglers = ev->node_observed = 0;
  ev->contention_score = 0;
  ev->contention_evidence.clear();
  ev->cv = -1;
  if (!straggling && !leading) {
    out->set_worker_class(WORKER_CLASS_NORMAL);
    // Clearly inside the band (more than a factor 1.15 from both lines, with a margin far
    // above the logarithm's rounding): the clamp below gives exactly 1, without the two
    // logarithms (two per worker per window were 2 % of a 4 096-worker simulation).
    constexpr double kSure = 1.15 * (1 + 1e-9);
    if (r >= thresholds_.straggler * kSure && r * kSure <= thresholds_.leader) {
      out->set_confidence(1.0);
      return;
    }
    const double to_line = std::min(std::abs(std::log(r / thresholds_.straggler)),
                                    std::isfinite(thresholds_.leader)
                                        ? std::abs(std::log(r / thresholds_.leader))
                                        : std::numeric_limits<double>::infinity());
    out->set_confidence(0.5 + 0.5 * Clamp01(to_line / std::log(1.15)));
    return;  // evidence on demand: Evidence()
  }
  const uint64_t bits = (straggling ? t.straggler_bits : t.leader_bits) & window_mask_;
  const uint32_t flagged = static_cast<uint32_t>(std::popcount(bits));
  const bool persistent = flagged >= options_.persistent_k;
  const double line = straggling ? thresholds_.straggler : thresholds_.leader;
  out->set_worker_class(straggling ? WORKER_CLASS_STRAGGLER : WORKER_CLASS_LEADER);
  out->set_persistence(persistent ? PERSISTENCE_PERSISTENT : PERSISTENCE_TRANSIENT);
  const double margin = Clamp01(std::abs(std::log(r / line)) / std::log(1.5));
  out->set_confidence(0.4 + 0.3 * margin + 0.3 * Clamp01(static_cast<double>(flagged) / w));
  ev->flagged = flagged;
  if (kind_ == ENTITY_SERVER) {
    out->set_scope(SCOPE_SERVER);
    return;
  }
  if (!straggling) {
    out->set_scope(SCOPE_WORKER);
    return;
  }
  out->set_scope(node_level ? SCOPE_NODE : SCOPE_WORKER);
  if (node_level) {
    ev->node_stragglers = node_stragglers_[t.node];
    ev->node_observed = node_observed_[t.node];
  }
  const Contention* c =
      t.node != kNoNode && t.node < contention.size() ? &contention[t.node] : nullptr;
  if (c != nullptr && c->contended()) {
    out->set_cause(CAUSE_CONTENTION);
    ev->contention_score = c->score;
    ev->contention_evidence = c->evidence;
  } else if (persistent) {
    // r over the flagged windows among the last W.
    std::vector<double>& rs = cv_scratch_;
    rs.clear();
    for (uint32_t i = 0; i < static_cast<uint32_t>(std::min<uint64_t>(w, std::min<uint64_t>(t.observed, 64))); ++i) {
      if (bits & (uint64_t{1} << i)) rs.push_back(t.recent_r[(t.observed - 1 - i) % 64]);
    }
    const double cv = CoefficientOfVariation(rs);
    ev->cv = cv;
    if (cv <= options_.deterministic_max_cv) out->set_cause(CAUSE_DETERMINISTIC);
  }
}

size_t StragglerClassifier::MemoryBytes() const {
  size_t bytes = tracks_.capacity() * sizeof(Track);
  for (const Track& t : tracks_)
    bytes += t.current.evidence().capacity() + t.evidence.contention_evidence.capacity();
  return bytes + (node_observed_.capacity() + node_stragglers_.capacity()) * sizeof(uint32_t);
}

}  // namespace pacer
