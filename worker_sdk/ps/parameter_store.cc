#include "worker_sdk/ps/parameter_store.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_set>

#include "google/protobuf/util/message_differencer.h"

namespace pacer {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace

uint32_t PsServerFor(const std::string& table, uint64_t key, uint32_t num_servers) {
  return static_cast<uint32_t>(SplitMix64(Fnv1a(table) ^ SplitMix64(key)) % num_servers);
}

absl::StatusOr<bool> ParameterStore::CreateTable(const PsTableSpec& spec) {
  if (absl::Status v = ValidateSpec(spec); !v.ok()) return v;
  std::lock_guard<std::mutex> l(mu_);
  auto it = tables_.find(spec.name());
  if (it != tables_.end()) {
    if (google::protobuf::util::MessageDifferencer::Equals(it->second->spec, spec)) return false;
    return absl::AlreadyExistsError("table '" + spec.name() + "' exists with a different spec");
  }
  tables_.emplace(spec.name(), std::make_unique<Table>(spec));
  ++changes_;
  return true;
}

absl::Status ParameterStore::ValidateSpec(const PsTableSpec& spec) {
  if (spec.name().empty()) return absl::InvalidArgumentError("table name is empty");
  if (spec.dim() == 0 || spec.dim() > (1u << 20)) {
    return absl::InvalidArgumentError("table '" + spec.name() + "': dim must be 1..2^20");
  }
  if (!(spec.optimizer().learning_rate() > 0)) {
    return absl::InvalidArgumentError("table '" + spec.name() + "': learning_rate must be > 0");
  }
  if (spec.optimizer().kind() == PsOptimizer::ADAGRAD && !(spec.optimizer().initial_accumulator() > 0)) {
    return absl::InvalidArgumentError("table '" + spec.name() + "': Adagrad needs initial_accumulator > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<ParameterStore::Table*> ParameterStore::Find(const std::string& name) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) return absl::NotFoundError("no table '" + name + "' on this server");
  return it->second.get();
}

ParameterStore::Row& ParameterStore::RowFor(Table& t, uint64_t key) {
  auto [it, inserted] = t.rows.try_emplace(key);
  if (inserted) {
    const uint32_t dim = t.spec.dim();
    it->second.w.resize(dim);
    const float scale = t.spec.init_scale();
    for (uint32_t i = 0; i < dim; ++i) {
      // uniform in [-scale, scale) from (seed, key, i): the same on every server and restart
      const uint64_t r = SplitMix64(SplitMix64(t.spec.seed() ^ SplitMix64(key)) + i);
      it->second.w[i] = scale == 0 ? 0.0f : scale * (2.0f * static_cast<float>(r >> 40) / 16777216.0f - 1.0f);
    }
    if (t.spec.optimizer().kind() == PsOptimizer::ADAGRAD) {
      it->second.acc.assign(dim, t.spec.optimizer().initial_accumulator());
    }
  }
  return it->second;
}

absl::Status ParameterStore::Pull(const std::string& table, const std::vector<uint64_t>& keys,
                                  std::vector<float>* values) {
  auto t = Find(table);
  if (!t.ok()) return t.status();
  Table& tab = **t;
  const uint32_t dim = tab.spec.dim();
  values->reserve(values->size() + keys.size() * dim);
  std::lock_guard<std::mutex> l(tab.mu);
  for (uint64_t k : keys) {
    const Row& r = RowFor(tab, k);
    values->insert(values->end(), r.w.begin(), r.w.end());
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParameterStore::Push(const std::string& table, const std::vector<uint64_t>& keys,
                                              const std::vector<float>& gradients) {
  auto t = Find(table);
  if (!t.ok()) return t.status();
  Table& tab = **t;
  const uint32_t dim = tab.spec.dim();
  if (gradients.size() != keys.size() * dim) {
    return absl::InvalidArgumentError("push to '" + table + "': " + std::to_string(gradients.size()) +
                                      " gradients for " + std::to_string(keys.size()) + " keys of dim " +
                                      std::to_string(dim));
  }
  for (float g : gradients) {
    if (!std::isfinite(g)) return absl::InvalidArgumentError("push to '" + table + "': non-finite gradient");
  }
  // Sum duplicates first: one optimizer step per row and push.
  std::unordered_map<uint64_t, std::vector<float>> summed;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto& g = summed[keys[i]];
    if (g.empty()) g.assign(dim, 0.0f);
    for (uint32_t j = 0; j < dim; ++j) g[j] += gradients[i * dim + j];
  }
  const PsOptimizer& opt = tab.spec.optimizer();
  const float lr = opt.learning_rate();
  std::lock_guard<std::mutex> l(tab.mu);
  for (const auto& [key, g] : summed) {
    Row& r = RowFor(tab, key);
    if (opt.kind() == PsOptimizer::ADAGRAD) {
      for (uint32_t j = 0; j < dim; ++j) {
        r.acc[j] += g[j] * g[j];
        r.w[j] -= lr * g[j] / std::sqrt(r.acc[j]);
      }
    } else {
      for (uint32_t j = 0; j < dim; ++j) r.w[j] -= lr * g[j];
    }
  }
  ++changes_;
  return ++tab.pushes;
}

uint64_t ParameterStore::rows() const {
  std::lock_guard<std::mutex> l(mu_);
  uint64_t n = 0;
  for (const auto& [name, t] : tables_) {
    std::lock_guard<std::mutex> tl(t->mu);
    n += t->rows.size();
  }
  return n;
}

PsSnapshot ParameterStore::Snapshot() const {
  PsSnapshot snap;
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [name, t] : tables_) {
    PsSnapshotTable* out = snap.add_tables();
    std::lock_guard<std::mutex> tl(t->mu);
    *out->mutable_spec() = t->spec;
    out->set_pushes(t->pushes);
    std::vector<uint64_t> keys;
    keys.reserve(t->rows.size());
    for (const auto& [k, r] : t->rows) keys.push_back(k);
    std::sort(keys.begin(), keys.end());
    const bool adagrad = t->spec.optimizer().kind() == PsOptimizer::ADAGRAD;
    out->mutable_keys()->Reserve(static_cast<int>(keys.size()));
    out->mutable_weights()->Reserve(static_cast<int>(keys.size() * t->spec.dim()));
    for (uint64_t k : keys) {
      const Row& r = t->rows.at(k);
      out->add_keys(k);
      out->mutable_weights()->Add(r.w.begin(), r.w.end());
      if (adagrad) out->mutable_accumulators()->Add(r.acc.begin(), r.acc.end());
    }
  }
  return snap;
}

absl::Status ParameterStore::Restore(const PsSnapshot& snapshot) {
  // Validate everything before touching the store.
  std::set<std::string> names;
  for (const PsSnapshotTable& t : snapshot.tables()) {
    const std::string where = "snapshot table '" + t.spec().name() + "': ";
    if (absl::Status v = ValidateSpec(t.spec()); !v.ok()) {
      return absl::InvalidArgumentError("snapshot: " + std::string(v.message()));
    }
    if (!names.insert(t.spec().name()).second) return absl::InvalidArgumentError(where + "appears twice");
    const uint64_t n = static_cast<uint64_t>(t.keys_size()), dim = t.spec().dim();
    const bool adagrad = t.spec().optimizer().kind() == PsOptimizer::ADAGRAD;
    if (static_cast<uint64_t>(t.weights_size()) != n * dim) {
      return absl::InvalidArgumentError(where + std::to_string(t.weights_size()) + " weights for " +
                                        std::to_string(n) + " rows of dim " + std::to_string(dim));
    }
    if (static_cast<uint64_t>(t.accumulators_size()) != (adagrad ? n * dim : 0)) {
      return absl::InvalidArgumentError(where + std::to_string(t.accumulators_size()) +
                                        " accumulators for " + std::to_string(n) + " rows (" +
                                        (adagrad ? "Adagrad" : "SGD") + ")");
    }
    std::unordered_set<uint64_t> keys(t.keys().begin(), t.keys().end());
    if (keys.size() != n) return absl::InvalidArgumentError(where + "a key appears twice");
    for (float x : t.weights()) {
      if (!std::isfinite(x)) return absl::InvalidArgumentError(where + "a non-finite weight");
    }
    for (float x : t.accumulators()) {
      if (!(x > 0) || !std::isfinite(x)) return absl::InvalidArgumentError(where + "an accumulator not > 0");
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  if (!tables_.empty()) return absl::FailedPreconditionError("restore into a store that holds tables");
  for (const PsSnapshotTable& t : snapshot.tables()) {
    auto tab = std::make_unique<Table>(t.spec());
    const uint32_t dim = t.spec().dim();
    const bool adagrad = t.spec().optimizer().kind() == PsOptimizer::ADAGRAD;
    tab->pushes = t.pushes();
    tab->rows.reserve(t.keys_size());
    for (int i = 0; i < t.keys_size(); ++i) {
      Row& r = tab->rows[t.keys(i)];
      r.w.assign(t.weights().begin() + i * dim, t.weights().begin() + (i + 1) * dim);
      if (adagrad) r.acc.assign(t.accumulators().begin() + i * dim, t.accumulators().begin() + (i + 1) * dim);
    }
    tables_.emplace(t.spec().name(), std::move(tab));
  }
  return absl::OkStatus();
}

}  // namespace pacer
