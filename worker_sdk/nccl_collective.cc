#include "worker_sdk/nccl_collective.h"

#include <cuda_runtime.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>

namespace pacer {
namespace {

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(std::string(what) + ": " + cudaGetErrorString(e));
}

absl::Status Nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(std::string(what) + ": " + ncclGetErrorString(r));
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  // Without a GPU the runtime returns an error (35, insufficient driver): no devices.
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

struct NcclCollective::Impl {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* buffer = nullptr;
  size_t capacity = 0;
  ~Impl() {
    if (buffer) cudaFree(buffer);
    if (comm) ncclCommDestroy(comm);
    if (stream) cudaStreamDestroy(stream);
  }
};

NcclCollective::NcclCollective(int rank, int size)
    : rank_(rank), size_(size), impl_(std::make_unique<Impl>()) {}

NcclCollective::~NcclCollective() = default;

absl::StatusOr<std::unique_ptr<NcclCollective>> NcclCollective::Create(const NcclOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError("nccl: need 0 <= rank < size");
  }
  const int devices = CudaDeviceCount();
  if (devices == 0) return absl::FailedPreconditionError("nccl: no CUDA device on this machine");
  std::unique_ptr<NcclCollective> c(new NcclCollective(o.rank, o.size));
  c->impl_->device = o.device >= 0 ? o.device : o.rank % devices;
  if (auto s = Cuda(cudaSetDevice(c->impl_->device), "cudaSetDevice"); !s.ok()) return s;
  ncclUniqueId id;
  try {
    std::filesystem::create_directories(o.store_dir);
    gloo::rendezvous::FileStore file_store(o.store_dir);
    gloo::rendezvous::PrefixStore store(o.prefix, file_store);
    if (o.rank == 0) {
      if (auto s = Nccl(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
      store.set("id", std::vector<char>(reinterpret_cast<char*>(&id),
                                        reinterpret_cast<char*>(&id) + sizeof(id)));
    } else {
      store.wait({"id"}, std::chrono::milliseconds(o.timeout_ms));
      std::vector<char> bytes = store.get("id");
      if (bytes.size() != sizeof(id)) return absl::DataLossError("nccl: bad unique id in store");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(std::string("nccl rendezvous: ") + e.what());
  }
  if (auto s = Cuda(cudaStreamCreate(&c->impl_->stream), "cudaStreamCreate"); !s.ok()) return s;
  if (auto s = Nccl(ncclCommInitRank(&c->impl_->comm, o.size, id, o.rank), "ncclCommInitRank");
      !s.ok()) {
    return s;
  }
  return c;
}

absl::Status NcclCollective::AllReduceSum(std::span<float> data) {
  if (data.empty()) return absl::OkStatus();
  Impl& m = *impl_;
  if (m.capacity < data.size()) {
    if (m.buffer) cudaFree(m.buffer);
    m.buffer = nullptr;
    if (auto s = Cuda(cudaMalloc(&m.buffer, data.size() * sizeof(float)), "cudaMalloc"); !s.ok()) {
      m.capacity = 0;
      return s;
    }
    m.capacity = data.size();
  }
  const size_t bytes = data.size() * sizeof(float);
  if (auto s = Cuda(cudaMemcpyAsync(m.buffer, data.data(), bytes, cudaMemcpyHostToDevice, m.stream),
                    "copy to device");
      !s.ok()) {
    return s;
  }
  if (auto s = Nccl(ncclAllReduce(m.buffer, m.buffer, data.size(), ncclFloat, ncclSum, m.comm,
                                  m.stream),
                    "ncclAllReduce");
      !s.ok()) {
    return s;
  }
  if (auto s = Cuda(cudaMemcpyAsync(data.data(), m.buffer, bytes, cudaMemcpyDeviceToHost, m.stream),
                    "copy to host");
      !s.ok()) {
    return s;
  }
  return Cuda(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
}

absl::Status NcclCollective::Barrier() {
  float one = 1.0f;
  return AllReduceSum(std::span<float>(&one, 1));
}

}  // namespace pacer
