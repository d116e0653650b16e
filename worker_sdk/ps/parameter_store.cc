#include "worker_sdk/ps/parameter_store.h"

#include <algorithm>
#include <cmath>
#include <numeric>
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

ParameterStore::ParameterStore(PsLimits limits) : limits_(limits) {
  if (limits_.max_server_bytes == 0) (void)limits_.Resolve();  // fills the automatic values
  if (limits_.max_table_bytes == 0) limits_.max_table_bytes = limits_.max_server_bytes;
}

absl::StatusOr<bool> ParameterStore::CreateTable(const PsTableSpec& spec) {
  if (absl::Status v = ValidateSpec(spec); !v.ok()) return v;
  absl::MutexLock l(&mu_);
  auto it = tables_.find(spec.name());
  if (it != tables_.end()) {
    if (google::protobuf::util::MessageDifferencer::Equals(it->second->spec, spec)) return false;
    return absl::AlreadyExistsError("table '" + spec.name() + "' exists with a different spec");
  }
  if (tables_.size() >= limits_.max_tables) {
    return absl::ResourceExhaustedError("table '" + spec.name() + "' refused: this server holds " +
                                        std::to_string(tables_.size()) + " tables (--max-tables " +
                                        std::to_string(limits_.max_tables) + ")");
  }
  tables_.emplace(spec.name(), std::make_unique<Table>(spec));
  ++changes_;
  return true;
}

absl::Status ParameterStore::ValidateSpec(const PsTableSpec& spec) {
  if (spec.name().empty()) return absl::InvalidArgumentError("table name is empty");
  if (spec.name().size() > 256) return absl::InvalidArgumentError("table name longer than 256 bytes");
  if (spec.dim() == 0 || spec.dim() > (1u << 20)) {
    return absl::InvalidArgumentError("table '" + spec.name() + "': dim must be 1..2^20");
  }
  if (!PsOptimizer::Kind_IsValid(spec.optimizer().kind())) {
    return absl::InvalidArgumentError("table '" + spec.name() + "': unknown optimizer kind " +
                                      std::to_string(spec.optimizer().kind()));
  }
  // Finite and bounded, so that no row starts, or is pushed, out of the floats' range.
  if (!(spec.optimizer().learning_rate() > 0 && spec.optimizer().learning_rate() <= 1e6f)) {
    return absl::InvalidArgumentError("table '" + spec.name() + "': learning_rate must be in (0, 1e6]");
  }
  if (spec.optimizer().kind() == PsOptimizer::ADAGRAD &&
      !(spec.optimizer().initial_accumulator() > 0 && spec.optimizer().initial_accumulator() <= 1e12f)) {
    return absl::InvalidArgumentError("table '" + spec.name() + "': Adagrad needs initial_accumulator in (0, 1e12]");
  }
  if (!(spec.init_scale() >= 0 && spec.init_scale() <= 1e6f)) {
    return absl::InvalidArgumentError("table '" + spec.name() + "': init_scale must be in [0, 1e6]");
  }
  return absl::OkStatus();
}

absl::StatusOr<ParameterStore::Table*> ParameterStore::Find(const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) return absl::NotFoundError("no table '" + name + "' on this server");
  return it->second.get();
}

void ParameterStore::InitialRow(const PsTableSpec& spec, uint64_t key, float* w) {
  const uint32_t dim = spec.dim();
  const float scale = spec.init_scale();
  for (uint32_t i = 0; i < dim; ++i) {
    // uniform in [-scale, scale) from (seed, key, i): the same on every server and restart
    const uint64_t r = SplitMix64(SplitMix64(spec.seed() ^ SplitMix64(key)) + i);
    w[i] = scale == 0 ? 0.0f : scale * (2.0f * static_cast<float>(r >> 40) / 16777216.0f - 1.0f);
  }
}

ParameterStore::Row ParameterStore::NewRow(const PsTableSpec& spec, uint64_t key) {
  Row r;
  r.w.resize(spec.dim());
  InitialRow(spec, key, r.w.data());
  if (spec.optimizer().kind() == PsOptimizer::ADAGRAD) {
    r.acc.assign(spec.dim(), spec.optimizer().initial_accumulator());
  }
  return r;
}

absl::Status ParameterStore::CheckRequest(const std::string& table, uint64_t keys, uint32_t dim) const {
  if (keys > limits_.max_keys_per_request) {
    return absl::ResourceExhaustedError("request to '" + table + "': " + std::to_string(keys) +
                                        " keys, over --max-keys-per-request " +
                                        std::to_string(limits_.max_keys_per_request));
  }
  if (keys * dim > limits_.max_values_per_request) {  // keys <= 2^23, dim <= 2^20: no overflow
    return absl::ResourceExhaustedError("request to '" + table + "': " + std::to_string(keys) + " keys x dim " +
                                        std::to_string(dim) + " = " + std::to_string(keys * dim) +
                                        " values, over --max-values-per-request " +
                                        std::to_string(limits_.max_values_per_request) + "; split it");
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::Reserve(uint64_t rows, uint64_t bytes) {
  uint64_t r = rows_.load();
  do {
    if (r + rows > limits_.max_server_rows) {
      return absl::ResourceExhaustedError("this server holds " + std::to_string(r) + " rows; " +
                                          std::to_string(rows) + " more would pass --max-server-rows " +
                                          std::to_string(limits_.max_server_rows));
    }
  } while (!rows_.compare_exchange_weak(r, r + rows));
  uint64_t b = bytes_.load();
  do {
    if (b + bytes > limits_.max_server_bytes) {
      rows_ -= rows;
      return absl::ResourceExhaustedError("this server holds " + std::to_string(b) + " bytes of rows; " +
                                          std::to_string(bytes) + " more would pass --max-server-bytes " +
                                          std::to_string(limits_.max_server_bytes));
    }
  } while (!bytes_.compare_exchange_weak(b, b + bytes));
  return absl::OkStatus();
}

absl::Status ParameterStore::Pull(const std::string& table, absl::Span<const uint64_t> keys,
                                  std::vector<float>* values) {
  return PullInto(table, keys, [values](size_t n) {
    const size_t at = values->size();
    values->resize(at + n);
    return values->data() + at;
  });
}

absl::Status ParameterStore::PullInto(const std::string& table, absl::Span<const uint64_t> keys,
                                      const std::function<float*(size_t)>& out) {
  auto t = Find(table);
  if (!t.ok()) return t.status();
  Table& tab = **t;
  const uint32_t dim = tab.spec.dim();
  if (absl::Status c = CheckRequest(table, keys.size(), dim); !c.ok()) return c;
  float* dst = out(keys.size() * dim);
  absl::MutexLock l(&tab.mu);
  for (uint64_t k : keys) {
    auto it = tab.rows.find(k);
    if (it != tab.rows.end()) {
      std::copy(it->second.w.begin(), it->second.w.end(), dst);
    } else {
      InitialRow(tab.spec, k, dst);  // not stored: only a push makes a row
    }
    dst += dim;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParameterStore::Push(const std::string& table, absl::Span<const uint64_t> keys,
                                              absl::Span<const float> gradients) {
  auto t = Find(table);
  if (!t.ok()) return t.status();
  Table& tab = **t;
  const uint32_t dim = tab.spec.dim();
  if (absl::Status c = CheckRequest(table, keys.size(), dim); !c.ok()) return c;
  if (gradients.size() != keys.size() * dim) {
    return absl::InvalidArgumentError("push to '" + table + "': " + std::to_string(gradients.size()) +
                                      " gradients for " + std::to_string(keys.size()) + " keys of dim " +
                                      std::to_string(dim));
  }
  for (float g : gradients) {
    if (!std::isfinite(g)) return absl::InvalidArgumentError("push to '" + table + "': non-finite gradient");
  }
  // Duplicates are summed first: one optimizer step per row and push. The positions sorted by
  // key group them (4 bytes a key; each key's gradients are summed into one dim-sized buffer).
  std::vector<uint32_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
  const PsOptimizer& opt = tab.spec.optimizer();
  const bool adagrad = opt.kind() == PsOptimizer::ADAGRAD;
  const float lr = opt.learning_rate();
  const uint64_t row_bytes = RowBytes(dim, adagrad);
  absl::MutexLock l(&tab.mu);
  uint64_t fresh = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const uint64_t key = keys[order[i]];
    if ((i == 0 || keys[order[i - 1]] != key) && tab.rows.count(key) == 0) ++fresh;
  }
  if (fresh > 0) {
    if (tab.rows.size() + fresh > limits_.max_table_rows) {
      return absl::ResourceExhaustedError("push to '" + table + "' refused: " + std::to_string(fresh) +
                                          " new rows would pass --max-table-rows " +
                                          std::to_string(limits_.max_table_rows) + " (it holds " +
                                          std::to_string(tab.rows.size()) + ")");
    }
    if (tab.bytes + fresh * row_bytes > limits_.max_table_bytes) {
      return absl::ResourceExhaustedError("push to '" + table + "' refused: " + std::to_string(fresh) +
                                          " new rows of " + std::to_string(row_bytes) +
                                          " bytes would pass --max-table-bytes " +
                                          std::to_string(limits_.max_table_bytes) + " (it holds " +
                                          std::to_string(tab.bytes) + ")");
    }
    if (absl::Status r = Reserve(fresh, fresh * row_bytes); !r.ok()) {
      return absl::ResourceExhaustedError("push to '" + table + "' refused: " + std::string(r.message()));
    }
    tab.bytes += fresh * row_bytes;
  }
  // Two passes: the updated rows are computed first and applied only when every value is finite,
  // so a push whose gradients (or their sum over duplicate keys) would overflow a weight changes
  // nothing — a non-finite weight would poison every later pull and the snapshot.
  std::vector<uint64_t> unique;
  std::vector<float> new_w, new_acc;
  std::vector<float> g(dim);
  bool finite = true;
  for (size_t i = 0; i < order.size();) {
    const uint64_t key = keys[order[i]];
    std::fill(g.begin(), g.end(), 0.0f);
    for (; i < order.size() && keys[order[i]] == key; ++i) {
      const float* src = gradients.data() + static_cast<size_t>(order[i]) * dim;
      for (uint32_t j = 0; j < dim; ++j) g[j] += src[j];
    }
    unique.push_back(key);
    const size_t at = new_w.size();
    auto it = tab.rows.find(key);
    if (it != tab.rows.end()) {
      new_w.insert(new_w.end(), it->second.w.begin(), it->second.w.end());
      if (adagrad) new_acc.insert(new_acc.end(), it->second.acc.begin(), it->second.acc.end());
    } else {
      new_w.resize(at + dim);
      InitialRow(tab.spec, key, new_w.data() + at);
      if (adagrad) new_acc.resize(at + dim, opt.initial_accumulator());
    }
    for (uint32_t j = 0; j < dim; ++j) {
      float& w = new_w[at + j];
      if (adagrad) {
        float& a = new_acc[at + j];
        a += g[j] * g[j];
        w -= lr * g[j] / std::sqrt(a);
        finite = finite && std::isfinite(a);
      } else {
        w -= lr * g[j];
      }
      finite = finite && std::isfinite(w);
    }
  }
  if (!finite) {
    if (fresh > 0) {
      tab.bytes -= fresh * row_bytes;  // the reservation above is given back
      rows_ -= fresh;
      bytes_ -= fresh * row_bytes;
    }
    return absl::InvalidArgumentError("push to '" + table + "' refused: it would make a weight or "
                                      "accumulator non-finite (gradients too large for the learning rate)");
  }
  for (size_t u = 0; u < unique.size(); ++u) {
    Row& r = tab.rows[unique[u]];
    const float* w = new_w.data() + u * dim;
    r.w.assign(w, w + dim);
    if (adagrad) {
      const float* a = new_acc.data() + u * dim;
      r.acc.assign(a, a + dim);
    }
  }
  ++changes_;
  return ++tab.pushes;
}

uint64_t ParameterStore::rows() const {
  absl::MutexLock l(&mu_);
  uint64_t n = 0;
  for (const auto& [name, t] : tables_) {
    absl::MutexLock tl(&t->mu);
    n += t->rows.size();
  }
  return n;
}

PsSnapshot ParameterStore::Snapshot() const {
  PsSnapshot snap;
  absl::MutexLock l(&mu_);
  for (const auto& [name, t] : tables_) {
    PsSnapshotTable* out = snap.add_tables();
    absl::MutexLock tl(&t->mu);
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
  if (static_cast<uint64_t>(snapshot.tables_size()) > limits_.max_tables) {
    return absl::ResourceExhaustedError("snapshot: " + std::to_string(snapshot.tables_size()) +
                                        " tables, over --max-tables " + std::to_string(limits_.max_tables));
  }
  uint64_t total_rows = 0, total_bytes = 0;
  for (const PsSnapshotTable& t : snapshot.tables()) {
    const uint64_t n = static_cast<uint64_t>(t.keys_size());
    const uint64_t b = n * RowBytes(t.spec().dim(), t.spec().optimizer().kind() == PsOptimizer::ADAGRAD);
    if (n > limits_.max_table_rows || b > limits_.max_table_bytes) {
      return absl::ResourceExhaustedError("snapshot table '" + t.spec().name() + "': " + std::to_string(n) +
                                          " rows (" + std::to_string(b) + " bytes), over --max-table-rows " +
                                          std::to_string(limits_.max_table_rows) + " / --max-table-bytes " +
                                          std::to_string(limits_.max_table_bytes));
    }
    total_rows += n;
    total_bytes += b;
  }
  if (total_rows > limits_.max_server_rows || total_bytes > limits_.max_server_bytes) {
    return absl::ResourceExhaustedError("snapshot: " + std::to_string(total_rows) + " rows (" +
                                        std::to_string(total_bytes) + " bytes), over --max-server-rows " +
                                        std::to_string(limits_.max_server_rows) + " / --max-server-bytes " +
                                        std::to_string(limits_.max_server_bytes));
  }
  absl::MutexLock l(&mu_);
  if (!tables_.empty()) return absl::FailedPreconditionError("restore into a store that holds tables");
  rows_ = total_rows;
  bytes_ = total_bytes;
  for (const PsSnapshotTable& t : snapshot.tables()) {
    auto tab = std::make_unique<Table>(t.spec());
    absl::MutexLock tl(&tab->mu);  // not shared yet: for the annotations
    tab->bytes = static_cast<uint64_t>(t.keys_size()) *
                 RowBytes(t.spec().dim(), t.spec().optimizer().kind() == PsOptimizer::ADAGRAD);
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
