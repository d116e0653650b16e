// NcclCollective: the GPU all-reduce backend on NCCL (built only when CUDA and NCCL are
// found: PACER_HAVE_NCCL). One rank per GPU (NCCL refuses two ranks of one communicator on one
// device). Rank 0 creates the NCCL unique id and publishes it through a Gloo FileStore in
// `store_dir` (the same rendezvous as GlooCollective); the others read it.
//
// AllReduceSum takes host memory (the SDK's trainers keep parameters on the host): it copies to
// a device buffer owned here, all-reduces on a stream owned here, and copies back. Trainers that
// keep gradients on the device would call NCCL on their own buffers; the weighting is the same.
// Not thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker_sdk/collective.h"

namespace pacer {

struct NcclOptions {
  int rank = 0;
  int size = 1;
  int device = -1;             // CUDA device; -1: rank % device count
  std::string store_dir;       // shared directory for the unique-id exchange
  std::string prefix = "pacer-nccl";
  int64_t timeout_ms = 60'000; // waiting for rank 0's id
};

// Number of usable CUDA devices; 0 when there is no GPU or no driver (never an error).
int CudaDeviceCount();

class NcclCollective final : public Collective {
 public:
  static absl::StatusOr<std::unique_ptr<NcclCollective>> Create(const NcclOptions& options);
  ~NcclCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(std::span<float> data) override;
  absl::Status Barrier() override;

 private:
  struct Impl;
  NcclCollective(int rank, int size);
  int rank_;
  int size_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pacer
