#include "worker_sdk/gloo_collective.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <exception>
#include <filesystem>

namespace pacer {
namespace {

// Gloo's TCP transport writes with writev(), which raises SIGPIPE when a peer has died; its
// default action would kill this trainer silently instead of letting the write fail (EPIPE ->
// UNAVAILABLE -> regroup). Ignore it unless the program installed its own handler.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCollective>> GlooCollective::Create(const GlooOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError("gloo: need 0 <= rank < size (rank " +
                                      std::to_string(o.rank) + ", size " +
                                      std::to_string(o.size) + ")");
  }
  if (o.store == nullptr) {
    if (o.store_dir.empty()) return absl::InvalidArgumentError("gloo: store_dir or store is required");
    std::error_code ec;
    std::filesystem::create_directories(o.store_dir, ec);
    if (ec) {
      return absl::InvalidArgumentError("gloo: cannot create store dir '" + o.store_dir +
                                        "': " + ec.message());
    }
  }
  IgnoreSigpipeUnlessHandled();
  const auto timeout = std::chrono::milliseconds(o.timeout_ms);
  std::unique_ptr<GlooCollective> c(new GlooCollective(o.rank, o.size, timeout, o.algorithm));
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    std::unique_ptr<gloo::rendezvous::FileStore> file_store;
    if (o.store == nullptr) file_store = std::make_unique<gloo::rendezvous::FileStore>(o.store_dir);
    gloo::rendezvous::PrefixStore store(o.prefix, o.store ? *o.store : *file_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);
    c->context_ = std::move(context);
  } catch (const std::exception& e) {
    return absl::UnavailableError(std::string("gloo rendezvous (rank ") + std::to_string(o.rank) +
                                  " of " + std::to_string(o.size) + ", store '" +
                                  (o.store ? std::string("given") : o.store_dir) + "'): " + e.what());
  }
  return c;
}

GlooCollective::~GlooCollective() = default;

bool ParseGlooAlgorithm(const std::string& name, GlooOptions::Algorithm* out) {
  if (name == "ring") {
    *out = GlooOptions::Algorithm::kRing;
  } else if (name == "bcube") {
    *out = GlooOptions::Algorithm::kBcube;
  } else {
    return false;
  }
  return true;
}

absl::Status GlooCollective::AllReduceSum(std::span<float> data) {
  if (size_ == 1 || data.empty()) return absl::OkStatus();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    opts.setAlgorithm(algorithm_ == GlooOptions::Algorithm::kBcube
                          ? gloo::AllreduceOptions::Algorithm::BCUBE
                          : gloo::AllreduceOptions::Algorithm::RING);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return absl::UnavailableError(std::string("gloo allreduce: ") + e.what());
  }
  return absl::OkStatus();
}

absl::Status GlooCollective::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  try {
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  } catch (const std::exception& e) {
    return absl::UnavailableError(std::string("gloo barrier: ") + e.what());
  }
  return absl::OkStatus();
}

}  // namespace pacer
