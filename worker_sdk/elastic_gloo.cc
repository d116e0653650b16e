#include "worker_sdk/elastic_gloo.h"

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>

#include "common/log.h"
#include "common/status.h"

namespace pacer {
namespace {

RendezvousClientOptions RendezvousOptionsFor(const Client& client) {
  RendezvousClientOptions o;
  o.address = client.options().address;
  o.token = client.options().token;
  o.credentials = client.options().credentials;
  o.tls = client.options().tls;
  o.rpc_timeout_ms = client.options().rpc_timeout_ms;
  return o;
}

}  // namespace

ElasticGlooCollective::ElasticGlooCollective(Client* client, const ElasticGlooOptions& options)
    : client_(client), options_(options), rendezvous_(RendezvousOptionsFor(*client)), rank_(options.rank) {}

ElasticGlooCollective::~ElasticGlooCollective() = default;

absl::StatusOr<std::unique_ptr<ElasticGlooCollective>> ElasticGlooCollective::Create(
    Client* client, const ElasticGlooOptions& options) {
  if (client == nullptr) return absl::InvalidArgumentError("elastic gloo: client is null");
  if (options.world_size == 0) return absl::InvalidArgumentError("elastic gloo: world_size must be > 0");
  if (options.rank < -1 || options.rank >= static_cast<int>(options.world_size)) {
    return absl::InvalidArgumentError("elastic gloo: rank " + std::to_string(options.rank) +
                                      " outside [-1, world_size)");
  }
  std::unique_ptr<ElasticGlooCollective> c(new ElasticGlooCollective(client, options));
  RETURN_IF_ERROR(c->Regroup());
  return c;
}

absl::Status ElasticGlooCollective::Regroup() {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.regroup_timeout_ms);
  const bool was_built = generation_ != 0;
  const std::string& worker = client_->worker_id();
  gloo_.reset();  // closes this rank's connections: peers still in the old context fail at once
  // Step 4: a failed collective with no newer generation announced asks for one.
  bool reform = was_built && client_->regroup_generation() <= generation_;
  absl::Status last;
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0 && std::chrono::steady_clock::now() >= deadline) {
      return absl::UnavailableError("elastic gloo: no regroup within " +
                                    std::to_string(options_.regroup_timeout_ms) +
                                    " ms (is every rank alive?); last attempt: " + last.ToString());
    }
    if (reform) {
      auto g = rendezvous_.Reform(worker, generation_);
      // FAILED_PRECONDITION: pacerd restarted and has no group yet; the Join below opens one.
      if (!g.ok() && g.status().code() != absl::StatusCode::kFailedPrecondition) return g.status();
      reform = false;
    }
    auto joined = rendezvous_.Join(worker, client_->registration().incarnation(), rank_,
                                   options_.world_size);
    if (!joined.ok()) return joined.status();
    const uint64_t generation = joined->generation();
    rank_ = joined->rank();
    world_size_ = joined->world_size();

    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    GlooOptions go;
    go.rank = rank_;
    go.size = static_cast<int>(world_size_);
    go.hostname = options_.hostname;
    go.timeout_ms = std::max<int64_t>(1'000, std::min<int64_t>(options_.timeout_ms, left.count()));
    go.prefix = "gen-" + std::to_string(generation);
    absl::Status store_error;
    std::unique_ptr<gloo::rendezvous::Store> store;
    if (options_.store_dir.empty()) {
      store = MakePacerdStore(&rendezvous_, generation, std::chrono::milliseconds(go.timeout_ms),
                              &store_error);
    } else {
      std::error_code ec;
      std::filesystem::create_directories(options_.store_dir, ec);
      if (ec) {
        return absl::InvalidArgumentError("elastic gloo: cannot create store dir '" +
                                          options_.store_dir + "': " + ec.message());
      }
      try {
        store = std::make_unique<gloo::rendezvous::FileStore>(options_.store_dir);
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError("elastic gloo: store dir '" + options_.store_dir +
                                          "': " + e.what());
      }
    }
    go.store = store.get();
    auto built = GlooCollective::Create(go);
    if (built.ok()) {
      gloo_ = std::move(*built);
      generation_ = generation;
      client_->NoteRegroupGeneration(generation);
      if (was_built) ++stats_.regroups;
      PACER_LOG(INFO) << "worker '" << worker << "': collective rank " << rank_ << " of "
                      << world_size_ << " in generation " << generation;
      return absl::OkStatus();
    }
    ++stats_.failed_attempts;
    last = built.status();
    // Superseded while rendezvousing: the next Join names the new generation. Otherwise (a
    // peer missing past the timeout, a refused connection) this generation cannot form: ask
    // for a new one.
    reform = store_error.code() != absl::StatusCode::kAborted;
    generation_ = std::max(generation_, generation);
    PACER_LOG(WARNING) << "worker '" << worker << "': rendezvous in generation " << generation
                       << " failed, retrying: " << last.message();
  }
}

absl::Status ElasticGlooCollective::Check(absl::Status s) {
  if (!s.ok()) {
    ++stats_.collective_failures;
    gloo_.reset();  // step 3: peers blocked on this rank fail now, not at their timeout
  }
  return s;
}

absl::Status ElasticGlooCollective::AllReduceSum(std::span<float> data) {
  if (!gloo_) return absl::FailedPreconditionError("elastic gloo: broken; call Regroup()");
  return Check(gloo_->AllReduceSum(data));
}

absl::Status ElasticGlooCollective::Barrier() {
  if (!gloo_) return absl::FailedPreconditionError("elastic gloo: broken; call Regroup()");
  return Check(gloo_->Barrier());
}

}  // namespace pacer
