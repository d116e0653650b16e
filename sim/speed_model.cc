#include "sim/speed_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pacer::sim {

double SplitMix::Exponential(double mean) { return -mean * std::log1p(-Uniform()); }

double SplitMix::Normal() {
  // Box–Muller; one draw per call keeps the stream simple.
  const double u1 = 1.0 - Uniform(), u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

uint64_t MixSeed(uint64_t a, uint64_t b) {
  SplitMix m{a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL)};
  m.Next();
  return m.Next();
}

namespace {

// A seeded choice of round(fraction × n) distinct indices out of n (partial Fisher–Yates).
std::vector<int64_t> Choose(int64_t n, double fraction, SplitMix& rng) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = std::min<int64_t>(n, std::llround(fraction * static_cast<double>(n)));
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = i + static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(n - i));
    std::swap(idx[i], idx[j]);
  }
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

SpeedModel::SpeedModel(const Scenario& sc) : sc_(sc) {
  const int64_t n = sc.job.workers;
  job_nodes_ = sc.nodes();
  SplitMix rng{MixSeed(sc.seed, 1)};
  base_.resize(static_cast<size_t>(n));
  for (auto& b : base_) b = sc.speeds.median * std::exp(sc.speeds.sigma * rng.Normal());
  hardware_.assign(static_cast<size_t>(job_nodes_ + sc.spare_nodes()), 1.0);
  // Groups take disjoint node sets: one permutation, consumed in order.
  std::vector<int64_t> perm = Choose(job_nodes_, 1.0, rng);
  for (int64_t i = job_nodes_ - 1; i > 0; --i)
    std::swap(perm[i], perm[static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(i + 1))]);
  size_t cursor = 0;
  for (const auto& g : sc.speeds.groups) {
    const int64_t k = std::llround(g.fraction * static_cast<double>(job_nodes_));
    for (int64_t i = 0; i < k && cursor < perm.size(); ++i) hardware_[perm[cursor++]] = g.factor;
  }

  for (size_t ei = 0; ei < sc.events.size(); ++ei) {
    const ScenarioEvent& e = sc.events[ei];
    SplitMix erng{MixSeed(sc.seed, 1000 + ei)};
    const double end = e.duration_s > 0 ? e.at_s + e.duration_s : kForever;
    auto add = [&](Scope scope, int64_t target) {
      Episode ep;
      ep.start_s = e.at_s;
      ep.end_s = end;
      ep.scope = scope;
      ep.target = target;
      ep.factor = e.factor;
      ep.contention = e.contention;
      scheduled_.push_back(ep);
    };
    switch (e.kind) {
      case EventKind::kSlowdown:
        if (e.worker >= 0) add(Scope::kWorker, e.worker);
        else
          for (int64_t w : Choose(n, e.fraction, erng)) add(Scope::kWorker, w);
        break;
      case EventKind::kNodeContention:
        if (e.node >= 0) add(Scope::kNode, e.node);
        else
          for (int64_t nd : Choose(job_nodes_, e.fraction, erng)) add(Scope::kNode, nd);
        break;
      case EventKind::kHotServer:
        add(Scope::kServer, e.server);
        break;
      case EventKind::kFailure:
        if (e.worker >= 0) {
          failures_.push_back({e.at_s, e.worker});
          break;
        }
        [[fallthrough]];
      case EventKind::kTransient: {
        std::vector<int64_t> who;
        if (e.fraction > 0) who = Choose(n, e.fraction, erng);
        else {
          who.resize(static_cast<size_t>(n));
          std::iota(who.begin(), who.end(), 0);
        }
        for (int64_t w : who) streams_.push_back({ei, w, e.at_s, end});
        break;
      }
    }
  }
  std::stable_sort(scheduled_.begin(), scheduled_.end(),
                   [](const Episode& a, const Episode& b) { return a.start_s < b.start_s; });
  std::stable_sort(failures_.begin(), failures_.end(),
                   [](const Failure& a, const Failure& b) { return a.at_s < b.at_s; });
}

SpeedState::SpeedState(const SpeedModel* model) : model_(model) {
  const int64_t n = model->workers();
  node_.resize(static_cast<size_t>(n));
  on_node_.resize(static_cast<size_t>(model->nodes()));
  for (int64_t w = 0; w < n; ++w) {
    node_[w] = model->home_node(w);
    on_node_[node_[w]].push_back(w);
  }
  wf_.assign(static_cast<size_t>(n), 1.0);
  nf_.assign(static_cast<size_t>(model->nodes()), 1.0);
  sf_.assign(static_cast<size_t>(model->scenario().job.servers), 1.0);
  w_active_.resize(wf_.size());
  n_active_.resize(nf_.size());
  s_active_.resize(sf_.size());
  const auto& streams = model->streams();
  rng_.resize(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    rng_[i] = SplitMix{MixSeed(model->scenario().seed,
                               (uint64_t{streams[i].event} << 32) ^ static_cast<uint64_t>(streams[i].worker))};
    StreamNext(i, streams[i].from_s);
  }
  all_dirty_ = true;
}

void SpeedState::StreamNext(size_t i, double after_s) {
  const auto& st = model_->streams()[i];
  const ScenarioEvent& e = model_->scenario().events[st.event];
  const double t = after_s + rng_[i].Exponential(3600.0 / e.rate_per_worker_hour);
  if (t < st.to_s) arrivals_.push({t, i});
}

double SpeedState::NextChange() const {
  double t = kForever;
  if (next_scheduled_ < model_->scheduled().size()) t = std::min(t, model_->scheduled()[next_scheduled_].start_s);
  if (next_failure_ < model_->scheduled_failures().size())
    t = std::min(t, model_->scheduled_failures()[next_failure_].at_s);
  if (!ends_.empty()) t = std::min(t, ends_.top().t);
  if (!arrivals_.empty()) t = std::min(t, arrivals_.top().t);
  return t;
}

void SpeedState::AdvanceTo(double t, std::vector<int64_t>* failed) {
  for (;;) {
    // The earliest due change first; at equal times: ends, then scheduled, then arrivals.
    double best = kForever;
    int which = -1;
    if (!ends_.empty() && ends_.top().t <= t) best = ends_.top().t, which = 0;
    if (next_scheduled_ < model_->scheduled().size() &&
        model_->scheduled()[next_scheduled_].start_s <= t &&
        model_->scheduled()[next_scheduled_].start_s < best)
      best = model_->scheduled()[next_scheduled_].start_s, which = 1;
    if (next_failure_ < model_->scheduled_failures().size() &&
        model_->scheduled_failures()[next_failure_].at_s <= t &&
        model_->scheduled_failures()[next_failure_].at_s < best)
      best = model_->scheduled_failures()[next_failure_].at_s, which = 2;
    if (!arrivals_.empty() && arrivals_.top().t <= t && arrivals_.top().t < best)
      best = arrivals_.top().t, which = 3;
    if (which < 0) return;
    if (which == 0) {
      const uint64_t id = ends_.top().id;
      ends_.pop();
      Close(id);
    } else if (which == 1) {
      Open(model_->scheduled()[next_scheduled_++], 0);
    } else if (which == 2) {
      const auto& f = model_->scheduled_failures()[next_failure_++];
      if (failed) failed->push_back(f.worker);
    } else {
      const Due d = arrivals_.top();
      arrivals_.pop();
      const auto& st = model_->streams()[d.id];
      const ScenarioEvent& e = model_->scenario().events[st.event];
      if (e.kind == EventKind::kFailure) {
        if (failed) failed->push_back(st.worker);
      } else {
        Episode ep;
        ep.start_s = d.t;
        ep.end_s = std::min(st.to_s, d.t + rng_[d.id].Exponential(e.mean_duration_s));
        ep.scope = Scope::kWorker;
        ep.target = st.worker;
        ep.factor = e.factor;
        ep.contention = e.contention;
        Open(ep, 0);
      }
      StreamNext(d.id, d.t);
    }
  }
}

void SpeedState::Open(const Episode& e, uint64_t) {
  const uint64_t id = episodes_.size();
  episodes_.push_back(e);
  if (e.end_s < kForever) ends_.push({e.end_s, id});
  const Active a{id, e.factor, e.contention};
  switch (e.scope) {
    case Scope::kWorker:
      w_active_[e.target].push_back(a);
      RecomputeWorker(e.target);
      break;
    case Scope::kNode:
      n_active_[e.target].push_back(a);
      RecomputeNode(e.target);
      break;
    case Scope::kServer:
      s_active_[e.target].push_back(a);
      sf_[e.target] *= 1.0;  // recomputed below
      {
        double f = 1;
        for (const auto& x : s_active_[e.target]) f *= x.factor;
        sf_[e.target] = f;
      }
      server_changed_ = true;
      break;
  }
}

void SpeedState::Close(uint64_t id) {
  const Episode& e = episodes_[id];
  auto drop = [id](std::vector<Active>& v) {
    auto it = std::find_if(v.begin(), v.end(), [id](const Active& a) { return a.id == id; });
    if (it == v.end()) return false;  // already cured
    v.erase(it);
    return true;
  };
  switch (e.scope) {
    case Scope::kWorker:
      if (drop(w_active_[e.target])) RecomputeWorker(e.target);
      break;
    case Scope::kNode:
      if (drop(n_active_[e.target])) RecomputeNode(e.target);
      break;
    case Scope::kServer:
      if (drop(s_active_[e.target])) {
        double f = 1;
        for (const auto& x : s_active_[e.target]) f *= x.factor;
        sf_[e.target] = f;
        server_changed_ = true;
      }
      break;
  }
}

void SpeedState::RecomputeWorker(int64_t w) {
  double f = 1;
  for (const auto& a : w_active_[w]) f *= a.factor;
  wf_[w] = f;
  dirty_.push_back(w);
}

void SpeedState::RecomputeNode(int64_t n) {
  double f = 1;
  for (const auto& a : n_active_[n]) f *= a.factor;
  nf_[n] = f;
  MarkNode(n);
}

void SpeedState::MarkNode(int64_t n) {
  for (int64_t w : on_node_[n]) dirty_.push_back(w);
}

double SpeedState::MinServerFactor() const {
  double m = 1;
  for (double f : sf_) m = std::min(m, f);
  return m;
}

double SpeedState::NodeContention(int64_t n) const {
  double c = 0;
  for (const auto& a : n_active_[n])
    if (a.contention) c = std::max(c, 1 - a.factor);
  for (int64_t w : on_node_[n])
    for (const auto& a : w_active_[w])
      if (a.contention) c = std::max(c, 1 - a.factor);
  return c;
}

void SpeedState::Restart(int64_t w) {
  auto& v = w_active_[w];
  v.erase(std::remove_if(v.begin(), v.end(), [](const Active& a) { return a.contention; }), v.end());
  RecomputeWorker(w);
}

void SpeedState::Migrate(int64_t w, int64_t new_node) {
  w_active_[w].clear();
  RecomputeWorker(w);
  auto& from = on_node_[node_[w]];
  from.erase(std::find(from.begin(), from.end(), w));
  node_[w] = new_node;
  on_node_[new_node].push_back(w);
}

void SpeedState::RelieveServer(int64_t s) {
  s_active_[s].clear();
  sf_[s] = 1;
  server_changed_ = true;
}

std::vector<int64_t> SpeedState::TakeDirty(bool* all) {
  *all = all_dirty_ || dirty_.size() > node_.size();
  all_dirty_ = false;
  std::vector<int64_t> out;
  out.swap(dirty_);
  if (*all) out.clear();
  return out;
}

}  // namespace pacer::sim
