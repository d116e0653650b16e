// GlooCollective: the CPU all-reduce backend on Gloo's TCP transport.
//
// Rendezvous goes through a Gloo store: either a FileStore in a directory every rank can see
// (local runs: tests, the examples, one machine; each run must use a fresh directory or a
// fresh `prefix`, since keys of an old run would be read as this run's), or any store the
// caller passes, such as pacerd's rendezvous store (rendezvous_client.h). For ranks on
// several machines, and to regroup after a worker restarts without restarting the job, use
// ElasticGlooCollective (elastic_gloo.h), which builds this class under pacerd's store.
//
// Owns the Gloo context (a full mesh of TCP pairs). Every operation has a timeout, so a dead
// peer yields UNAVAILABLE instead of a hang. Create() sets SIGPIPE to SIG_IGN when it still has
// its default action (a write to a dead peer must fail, not kill the process). Gloo reports errors by exceptions; they are caught
// here and become absl::Status. Not thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker_sdk/collective.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace pacer {

struct GlooOptions {
  int rank = 0;
  int size = 1;
  std::string store_dir;          // FileStore directory shared by every rank (when no `store`)
  gloo::rendezvous::Store* store = nullptr;  // used instead of a FileStore; only during Create
  std::string prefix = "pacer";   // namespace inside the store (a run / generation id)
  std::string hostname = "127.0.0.1";  // address this rank listens on
  int64_t timeout_ms = 60'000;    // rendezvous and every collective
  // All-reduce algorithm: kRing (2(n-1) sequential steps, bandwidth-optimal for large buffers)
  // or kBcube (about 2 log2(n) steps: fewer wake-ups per collective, which is what costs on
  // loaded or CPU-limited hosts with gradients of a few hundred KB).
  enum class Algorithm { kRing, kBcube };
  Algorithm algorithm = Algorithm::kRing;
};

// "ring" | "bcube" (flags); false for anything else.
bool ParseGlooAlgorithm(const std::string& name, GlooOptions::Algorithm* out);

class GlooCollective final : public Collective {
 public:
  // Blocks until every rank has joined (or the timeout passes: UNAVAILABLE).
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Create(const GlooOptions& options);
  ~GlooCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(std::span<float> data) override;
  absl::Status Barrier() override;

 private:
  GlooCollective(int rank, int size, std::chrono::milliseconds timeout, GlooOptions::Algorithm algorithm)
      : rank_(rank), size_(size), timeout_(timeout), algorithm_(algorithm) {}
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  GlooOptions::Algorithm algorithm_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 1;
};

}  // namespace pacer
