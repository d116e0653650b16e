// ElasticGlooCollective: Gloo all-reduce that rendezvouses through pacerd and regroups when
// the job's collective membership changes, without a job restart.
//
// Owns a GlooCollective built under one *generation* of pacerd's rendezvous store
// (rendezvous/rendezvous_service.h has the rules that move the generation) and a
// RendezvousClient. Uses the Client only for its registration (worker id, incarnation) and its
// regroup_generation() (RegroupCommands on heartbeat replies).
//
// Regroup protocol, as the trainer sees it:
//   1. Create() Joins the group (rank and world size; the reply names the generation) and
//      builds the collective under it.
//   2. At each step boundary the trainer checks regroup_pending(): pacerd announced a newer
//      generation (a worker restarted), or this collective failed.
//   3. A collective call that fails (a peer died: UNAVAILABLE) tears the Gloo context down at
//      once, so peers blocked on this rank fail too instead of waiting for the timeout, and
//      marks the collective broken.
//   4. Regroup(): if broken and no newer generation is known, Reform the current one (the
//      first rank to do so bumps it); Join again (idempotent; learns the newest generation);
//      build under it. A build that fails because the generation moved on meanwhile (ABORTED)
//      or a peer was not there in time starts over under the newest, until regroup_timeout_ms.
//   5. After Regroup() the ranks hold fresh contexts but may have finished different numbers
//      of steps (a step whose all-reduce failed on one rank may have completed on another; a
//      restarted worker starts from its checkpoint). The trainer re-synchronises: e.g. agree on
//      the step with one all-reduce and broadcast the model from the rank that holds it.
// The world size is fixed: a worker that never comes back makes Regroup() fail with
// UNAVAILABLE at regroup_timeout_ms (shrinking the group is not implemented).
//
// Not thread-safe (one training thread), like every Collective.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker_sdk/client.h"
#include "worker_sdk/collective.h"
#include "worker_sdk/gloo_collective.h"
#include "worker_sdk/rendezvous_client.h"

namespace pacer {

struct ElasticGlooOptions {
  int rank = -1;             // -1: keep this worker's previous rank, or the lowest free one
  uint32_t world_size = 0;   // required; the same on every rank
  std::string hostname = "127.0.0.1";  // address this rank listens on
  int64_t timeout_ms = 30'000;          // each collective, and each rendezvous attempt
  int64_t regroup_timeout_ms = 120'000; // one Create()/Regroup() in all
  // Empty: rendezvous through pacerd's store. Otherwise a directory every rank sees: Gloo's
  // FileStore under the key prefix "gen-<N>" (generations still come from pacerd; a superseded
  // generation is only noticed at timeout_ms; the directory must be fresh for each pacerd).
  std::string store_dir;
};

struct ElasticGlooStats {
  uint64_t regroups = 0;          // successful rebuilds after the first
  uint64_t failed_attempts = 0;   // rendezvous attempts that had to start over
  uint64_t collective_failures = 0;
};

class ElasticGlooCollective final : public Collective {
 public:
  // `client` must outlive the collective.
  static absl::StatusOr<std::unique_ptr<ElasticGlooCollective>> Create(Client* client,
                                                                       const ElasticGlooOptions& options);
  ~ElasticGlooCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_size_); }
  // UNAVAILABLE, and the collective is broken, when a peer is gone or the call timed out;
  // FAILED_PRECONDITION while broken (call Regroup()).
  absl::Status AllReduceSum(std::span<float> data) override;
  absl::Status Barrier() override;

  uint64_t generation() const { return generation_; }
  bool broken() const { return gloo_ == nullptr; }
  // Cheap (an atomic read): true when the collective must be rebuilt before the next step.
  bool regroup_pending() const {
    return broken() || client_->regroup_generation() > generation_;
  }
  absl::Status Regroup();
  const ElasticGlooStats& stats() const { return stats_; }

 private:
  ElasticGlooCollective(Client* client, const ElasticGlooOptions& options);
  absl::Status Check(absl::Status s);

  Client* client_;
  const ElasticGlooOptions options_;
  RendezvousClient rendezvous_;
  int rank_ = -1;
  uint32_t world_size_ = 0;
  uint64_t generation_ = 0;
  std::unique_ptr<GlooCollective> gloo_;  // null: broken (or not built yet)
  ElasticGlooStats stats_;
};

}  // namespace pacer
