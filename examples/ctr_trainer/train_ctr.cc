// pacer-train-ctr: example (b) of the worker SDK — an asynchronous parameter-server trainer of
// a sparse click-through-rate model (docs/design.md §6; the AntDT use case).
//
// Task (generated, the same in every process): record i has kFields categorical features,
// field f taking a skewed value in [0, kVocab); the click probability is
// sigmoid(bias + sum_f t(f, value)) with hidden per-value weights t, and the label is drawn
// from it with a hash of i. Model: per feature key a row [w, e_1..e_K] in the PS table "emb"
// (Adagrad): logit = b + sum_f w_f + d . x + u . relu(W x + c), x = concat(e_f), with the dense
// parameters in the table "dense" (SGD): d and the bias b, and with --hidden H > 0 a tower of H
// ReLU units (W, c, u; Wide & Deep style). The tower is what makes a step cost compute rather
// than mostly parameter-server round trips (the demo's `--mode ps` uses it, so that CPU
// contention shows in the monitor's compute-time speed); --hidden 0 (default) has no tower. Each worker reads leased shards (ShardReader), pulls the
// rows its batch needs from the 2+ PS servers, computes the gradient of the mean log loss,
// and pushes it asynchronously (one push in flight; the next batch is computed meanwhile).
// Every 50 steps it reports per-server latency to the monitor (ReportSteps.server_latency).
// At the end it prints {"auc":..,"accuracy":..,"samples":..} measured on held-out records
// (accuracy: the prediction thresholded at 0.5). --ledger keeps the exactly-once ledger of
// examples/consumer/ledger.h (the demo's `--mode ps` checks it with pacer-ledger-check).
//
//   pacer-train-ctr --addr 127.0.0.1:7070 --token-file data/job.token --worker-id w0 \
//     --ps 127.0.0.1:7100,127.0.0.1:7101 --register-records 40000 --epochs 2 --target-auc 0.75
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <numeric>
#include <optional>
#include <unordered_map>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/log.h"
#include "examples/consumer/trainer_start.h"
#include "proto/pacer/monitor.grpc.pb.h"
#include "worker_sdk/client.h"
#include "worker_sdk/ps/ps_client.h"
#include "worker_sdk/shard_reader.h"
#include "worker_sdk/step_timer.h"

namespace po = boost::program_options;
using namespace pacer;

namespace {

constexpr int kFields = 8;
constexpr uint64_t kVocab = 500;
constexpr int kEmbed = 4;                            // K
constexpr int kRow = 1 + kEmbed;                     // [w, e_1..e_K]
constexpr int kIn = kFields * kEmbed;                // x = concat(e_f)
constexpr int kDense = kIn + 1;                      // d and the bias b (then the tower)
constexpr uint64_t kEvalIdBase = 1ull << 40;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
double Unit(uint64_t h) { return static_cast<double>(h >> 11) / 9007199254740992.0; }  // [0,1)

struct Example {
  uint64_t keys[kFields];
  float label;
};

Example Sample(uint64_t id) {
  Example ex;
  double logit = -1.0;
  for (int f = 0; f < kFields; ++f) {
    // skewed values: u^2 concentrates on small ids (a few frequent, many rare)
    const double u = Unit(Mix(id * 131 + f));
    const uint64_t v = static_cast<uint64_t>(u * u * kVocab);
    ex.keys[f] = static_cast<uint64_t>(f) * 1'000'000 + v;
    // hidden weight of (f, v): roughly uniform in [-1.2, 1.2]
    logit += 2.4 * (Unit(Mix(ex.keys[f] ^ 0x5eed)) - 0.5);
  }
  const double p = 1.0 / (1.0 + std::exp(-logit));
  ex.label = Unit(Mix(id ^ 0xc11c)) < p ? 1.0f : 0.0f;
  return ex;
}

double Auc(std::vector<std::pair<float, float>> scored) {  // (score, label)
  std::sort(scored.begin(), scored.end());
  double pos = 0, neg = 0, rank_sum = 0;
  for (size_t i = 0; i < scored.size();) {
    size_t j = i;
    while (j < scored.size() && scored[j].first == scored[i].first) ++j;
    const double avg_rank = (static_cast<double>(i) + static_cast<double>(j) + 1) / 2.0;  // 1-based
    for (size_t k = i; k < j; ++k) {
      if (scored[k].second > 0.5f) {
        rank_sum += avg_rank;
        ++pos;
      } else {
        ++neg;
      }
    }
    i = j;
  }
  return pos > 0 && neg > 0 ? (rank_sum - pos * (pos + 1) / 2) / (pos * neg) : 0.5;
}

[[noreturn]] void Fail(const std::string& what, const absl::Status& s) {
  ExitWithError("pacer-train-ctr", what + ": " + s.ToString(), 1);
}

// Dense parameters: [d (kIn), b, W (hidden x kIn), c (hidden), u (hidden)].
size_t DenseSize(int hidden) { return kDense + static_cast<size_t>(hidden) * (kIn + 2); }

// Forward pass of one example given pulled rows; returns the click probability and leaves x
// and the tower's activations h (size hidden) for the backward pass.
float Predict(const Example& ex, const std::unordered_map<uint64_t, const float*>& rows, const float* dense,
              int hidden, float* x, float* h) {
  double logit = dense[kDense - 1];
  for (int f = 0; f < kFields; ++f) {
    const float* r = rows.at(ex.keys[f]);
    logit += r[0];
    for (int k = 0; k < kEmbed; ++k) {
      x[f * kEmbed + k] = r[1 + k];
      logit += dense[f * kEmbed + k] * r[1 + k];
    }
  }
  const float* W = dense + kDense;
  const float* c = W + static_cast<size_t>(hidden) * kIn;
  const float* u = c + hidden;
  for (int j = 0; j < hidden; ++j) {
    float a = c[j];
    for (int i = 0; i < kIn; ++i) a += W[static_cast<size_t>(j) * kIn + i] * x[i];
    h[j] = a > 0 ? a : 0;
    logit += u[j] * h[j];
  }
  return static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
}

// Adds the gradients of one example, g = d loss / d logit, to grad_dense and returns dL/dx in dx.
void Backward(float g, const float* dense, int hidden, const float* x, const float* h, float* grad_dense,
              float* dx) {
  grad_dense[kDense - 1] += g;
  for (int i = 0; i < kIn; ++i) {
    grad_dense[i] += g * x[i];
    dx[i] = g * dense[i];
  }
  const float* W = dense + kDense;
  const float* u = W + static_cast<size_t>(hidden) * kIn + hidden;
  float* gW = grad_dense + kDense;
  float* gc = gW + static_cast<size_t>(hidden) * kIn;
  float* gu = gc + hidden;
  for (int j = 0; j < hidden; ++j) {
    gu[j] += g * h[j];
    if (h[j] <= 0) continue;
    const float dh = g * u[j];
    gc[j] += dh;
    for (int i = 0; i < kIn; ++i) {
      gW[static_cast<size_t>(j) * kIn + i] += dh * x[i];
      dx[i] += dh * W[static_cast<size_t>(j) * kIn + i];
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  SetLogProgramName("pacer-train-ctr");
  ClientOptions copts;
  std::string dataset = "ctr", ps_list, result_file, ledger_path;
  uint64_t register_records = 0, shard_size = 500, eval_records = 4000;
  uint32_t epochs = 2, batch = 64;
  int hidden = 0;
  float lr_emb = 0.1f, lr_dense = 0.05f;
  double target = 0;
  po::options_description desc("Options");
  AddClientFlags(desc, &copts);
  desc.add_options()
      ("ps", po::value(&ps_list), "comma-separated pacer-ps addresses (the same order on every worker)")
      ("dataset", po::value(&dataset)->default_value(dataset), "dataset to train on")
      ("register-records", po::value(&register_records), "register the dataset with this many records first")
      ("shard-size", po::value(&shard_size)->default_value(shard_size), "records per shard when registering")
      ("epochs", po::value(&epochs)->default_value(epochs), "epochs when registering")
      ("batch", po::value(&batch)->default_value(batch), "examples per step")
      ("lr-emb", po::value(&lr_emb)->default_value(lr_emb), "Adagrad learning rate of the embedding rows")
      ("lr-dense", po::value(&lr_dense)->default_value(lr_dense), "SGD learning rate of the dense layer")
      ("hidden", po::value(&hidden)->default_value(hidden), "ReLU units of the dense tower (0: none)")
      ("eval-records", po::value(&eval_records)->default_value(eval_records), "held-out examples")
      ("target-auc", po::value(&target)->default_value(0), "exit 3 when the final AUC is below")
      ("result-file", po::value(&result_file), "write a JSON line with the results here")
      ("ledger", po::value(&ledger_path), "keep the exactly-once ledger here");
  ParseFlagsOrExit(argc, argv, "Usage: pacer-train-ctr [options]", desc);
  if (absl::Status s = copts.Resolve(); !s.ok()) Fail("options", s);
  if (ps_list.empty()) ExitWithError("pacer-train-ctr", "--ps is required");
  if (hidden < 0 || hidden > 4096) ExitWithError("pacer-train-ctr", "--hidden must be in [0, 4096]");
  if (batch == 0) ExitWithError("pacer-train-ctr", "--batch must be > 0");
  const size_t dense_size = DenseSize(hidden);
  copts.initial_micro_batch = batch;

  auto started = StartTrainer(copts, {.dataset = dataset, .ledger_path = ledger_path,
                                      .register_records = register_records, .shard_size = shard_size,
                                      .epochs = epochs, .shuffle_seed = 23});
  if (!started.ok()) ExitWithError("pacer-train-ctr", std::string(started.status().message()), 1);
  Client& client = *started->client;

  PsClientOptions popts;
  popts.servers = absl::StrSplit(ps_list, ',', absl::SkipEmpty());
  popts.token = client.options().token;
  popts.reporter = client.worker_id();
  popts.tls = client.options().tls;  // the same CA / client certificate for pacer-ps as for pacerd
  auto ps_or = PsClient::Connect(popts);
  if (!ps_or.ok()) Fail("ps", ps_or.status());
  PsClient& ps = **ps_or;
  PsTableSpec emb;
  emb.set_name("emb");
  emb.set_dim(kRow);
  emb.mutable_optimizer()->set_kind(PsOptimizer::ADAGRAD);
  emb.mutable_optimizer()->set_learning_rate(lr_emb);
  emb.mutable_optimizer()->set_initial_accumulator(0.1f);
  emb.set_init_scale(0.05f);
  emb.set_seed(3);
  PsTableSpec dense_spec;
  dense_spec.set_name("dense");
  dense_spec.set_dim(8);
  dense_spec.mutable_optimizer()->set_kind(PsOptimizer::SGD);
  dense_spec.mutable_optimizer()->set_learning_rate(lr_dense);
  dense_spec.set_init_scale(0.1f);
  dense_spec.set_seed(4);
  for (const auto* t : {&emb, &dense_spec}) {
    if (absl::Status s = ps.CreateTable(*t); !s.ok()) Fail("create table", s);
  }

  grpc::ChannelArguments monitor_args;
  ApplyTlsChannelArgs(client.options().tls, &monitor_args);
  auto monitor_channel =
      grpc::CreateCustomChannel(client.options().address, client.options().credentials, monitor_args);
  auto monitor = Monitor::NewStub(monitor_channel);

  auto reader_or = ShardReader::Create(&client, started->reader_options);
  if (!reader_or.ok()) Fail("reader", reader_or.status());
  ShardReader& reader = **reader_or;
  StepTimer timer(&client);

  std::vector<uint64_t> ids, keys;
  std::vector<float> rows, dense, grad_rows, grad_dense, x(kIn), dx(kIn), h(std::max(hidden, 1));
  std::vector<Example> exs;
  std::future<absl::Status> in_flight;
  uint64_t step = 0, samples = 0, latency_reports = 0;
  double loss_sum = 0;
  const auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch()).count();
  };
  const auto start = std::chrono::steady_clock::now();
  for (;; ++step) {
    client.SetStep(step);
    timer.BeginStep(step);
    ids.clear();
    absl::StatusOr<ShardReader::Outcome> got;
    {
      auto w = timer.Time(StepTimer::Phase::kDataWait);
      got = reader.Next(batch, &ids, ShardReader::Blocking::kUntilPrefetched);
      if (got.ok() && ids.empty() && *got == ShardReader::Outcome::kWait) {
        // Nothing ready and nothing of ours held in this call: wait for one record, then take
        // what is ready (never wait while holding records of the last lease; see the Python
        // binding's ShardReader.next for why).
        got = reader.Next(1, &ids, ShardReader::Blocking::kUntilData);
        if (got.ok() && !ids.empty()) got = reader.Next(batch - 1, &ids, ShardReader::Blocking::kUntilPrefetched);
      }
    }
    if (!got.ok()) Fail("read", got.status());
    if (ids.empty()) break;  // end of data
    exs.resize(ids.size());
    keys.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      exs[i] = Sample(ids[i]);
      keys.insert(keys.end(), exs[i].keys, exs[i].keys + kFields);
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    rows.clear();
    dense.clear();
    {
      auto c = timer.Time(StepTimer::Phase::kCommunication);
      if (absl::Status s = ps.Pull("emb", keys, &rows); !s.ok()) Fail("pull", s);
      if (absl::Status s = ps.PullDense("dense", dense_size, &dense); !s.ok()) Fail("pull dense", s);
    }
    std::unordered_map<uint64_t, const float*> row_of;
    std::unordered_map<uint64_t, size_t> index_of;
    for (size_t i = 0; i < keys.size(); ++i) {
      row_of[keys[i]] = &rows[i * kRow];
      index_of[keys[i]] = i;
    }
    grad_rows.assign(rows.size(), 0.0f);
    grad_dense.assign(dense_size, 0.0f);
    const float inv_n = 1.0f / static_cast<float>(exs.size());
    for (const Example& ex : exs) {
      const float p = Predict(ex, row_of, dense.data(), hidden, x.data(), h.data());
      loss_sum += -(ex.label * std::log(std::max(p, 1e-7f)) + (1 - ex.label) * std::log(std::max(1 - p, 1e-7f)));
      const float g = (p - ex.label) * inv_n;  // d mean-loss / d logit
      Backward(g, dense.data(), hidden, x.data(), h.data(), grad_dense.data(), dx.data());
      for (int f = 0; f < kFields; ++f) {
        const size_t r = index_of[ex.keys[f]];
        grad_rows[r * kRow] += g;
        for (int k = 0; k < kEmbed; ++k) grad_rows[r * kRow + 1 + k] += dx[f * kEmbed + k];
      }
    }
    {
      auto c = timer.Time(StepTimer::Phase::kCommunication);
      if (in_flight.valid()) {
        if (absl::Status s = in_flight.get(); !s.ok()) Fail("push", s);
      }
      // One future for both pushes: the embedding rows and the dense layer.
      in_flight = std::async(std::launch::async, [&ps, k = keys, gr = grad_rows, gd = grad_dense]() mutable {
        auto a = ps.PushAsync("emb", std::move(k), std::move(gr));
        auto b = ps.PushDenseAsync("dense", std::move(gd));
        absl::Status sa = a.get(), sb = b.get();
        return sa.ok() ? sb : sa;
      });
    }
    reader.MarkConsumed();
    samples += exs.size();
    timer.EndStep(batch, exs.size());
    if (step % 50 == 49) {
      if (ps.ReportLatency(monitor.get(), now_ms()).ok()) ++latency_reports;
    }
    if (client.stop_requested()) break;
  }
  if (in_flight.valid()) {
    if (absl::Status s = in_flight.get(); !s.ok()) Fail("push", s);
  }
  if (ps.ReportLatency(monitor.get(), now_ms()).ok()) ++latency_reports;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (absl::Status s = client.Flush(30'000); !s.ok()) Fail("flush", s);

  // Held-out AUC with the current PS model.
  std::vector<std::pair<float, float>> scored;
  dense.clear();
  if (absl::Status s = ps.PullDense("dense", dense_size, &dense); !s.ok()) Fail("pull dense", s);
  for (uint64_t lo = 0; lo < eval_records; lo += 512) {
    exs.clear();
    keys.clear();
    for (uint64_t i = lo; i < std::min(eval_records, lo + 512); ++i) {
      exs.push_back(Sample(kEvalIdBase + i));
      keys.insert(keys.end(), exs.back().keys, exs.back().keys + kFields);
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    rows.clear();
    if (absl::Status s = ps.Pull("emb", keys, &rows); !s.ok()) Fail("pull", s);
    std::unordered_map<uint64_t, const float*> row_of;
    for (size_t i = 0; i < keys.size(); ++i) row_of[keys[i]] = &rows[i * kRow];
    for (const Example& ex : exs) scored.emplace_back(Predict(ex, row_of, dense.data(), hidden, x.data(), h.data()), ex.label);
  }
  uint64_t correct = 0;
  for (const auto& [p, label] : scored) correct += (p >= 0.5f) == (label > 0.5f);
  const double accuracy = scored.empty() ? 0 : static_cast<double>(correct) / static_cast<double>(scored.size());
  const double auc = Auc(std::move(scored));
  char line[400];
  std::snprintf(line, sizeof line,
                "{\"worker\":\"%s\",\"auc\":%.4f,\"accuracy\":%.4f,\"steps\":%llu,\"samples\":%llu,\"train_loss\":%.4f,"
                "\"latency_reports\":%llu,\"seconds\":%.2f}",
                client.worker_id().c_str(), auc, accuracy, static_cast<unsigned long long>(step),
                static_cast<unsigned long long>(samples), samples ? loss_sum / static_cast<double>(samples) : 0.0,
                static_cast<unsigned long long>(latency_reports), secs);
  std::cout << line << std::endl;
  if (!result_file.empty()) std::ofstream(result_file) << line << "\n";
  client.Close();
  reader_or->reset();
  if (target > 0 && auc < target) {
    std::cerr << "pacer-train-ctr: AUC " << auc << " below target " << target << "\n";
    return 3;
  }
  return 0;
}
