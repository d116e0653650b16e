#include "worker_sdk/ps/ps_client.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include "common/auth.h"
#include "common/status.h"
#include "worker_sdk/ps/parameter_store.h"

namespace pacer {

PsClient::PsClient(PsClientOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(PsClientOptions options) {
  if (options.servers.empty()) return absl::InvalidArgumentError("PsClient: no servers");
  if (!options.server_ids.empty() && options.server_ids.size() != options.servers.size()) {
    return absl::InvalidArgumentError("PsClient: server_ids must match servers");
  }
  if (options.server_ids.empty()) {
    for (size_t i = 0; i < options.servers.size(); ++i) options.server_ids.push_back("ps" + std::to_string(i));
  }
  std::unique_ptr<PsClient> c(new PsClient(std::move(options)));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  for (const auto& s : c->options_.servers) {
    auto channel = DialChannel(s, c->options_.tls, args);
    if (!channel.ok()) {
      return absl::InvalidArgumentError("parameter server " + s + ": " + std::string(channel.status().message()));
    }
    c->stubs_.push_back(ParameterServer::NewStub(*channel));
  }
  absl::MutexLock l(&c->mu_);  // not shared yet: for the annotations
  c->latencies_ms_.resize(c->stubs_.size());
  return c;
}

namespace {
// A per-call context with the token and deadline.
void Prepare(grpc::ClientContext* ctx, const std::string& token, int64_t timeout_ms) {
  if (!token.empty()) AttachToken(ctx, token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

// gRPC's synchronous server answers a call it has no thread for (pacer-ps serves at most
// --max-threads at once) with RESOURCE_EXHAUSTED and this message, before any handler runs:
// nothing of the call was applied. A limit of the store is RESOURCE_EXHAUSTED too, but names
// its --max-* flag and is final.
bool TurnedAwayForWantOfAThread(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && s.error_message() == "Server Threadpool Exhausted";
}

// Runs `call(ctx)` on a fresh context until it is served, calling again after a growing pause
// (2 ms doubling to 100 ms, jittered so that turned-away callers do not return together) while
// the server turns it away for want of a thread, all within one deadline of timeout_ms. A push
// retried this way is applied once: the refusals applied nothing.
template <typename Call>
grpc::Status CallUntilServed(const std::string& token, int64_t timeout_ms, Call call) {
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms);
  thread_local std::minstd_rand jitter(std::random_device{}());
  int64_t pause_us = 2'000;
  for (int turned_away = 0;; ++turned_away) {
    grpc::ClientContext ctx;
    if (!token.empty()) AttachToken(&ctx, token);
    ctx.set_deadline(deadline);
    grpc::Status s = call(&ctx);
    if (!TurnedAwayForWantOfAThread(s)) return s;
    const auto wake = std::chrono::system_clock::now() +
                      std::chrono::microseconds(pause_us / 2 + static_cast<int64_t>(jitter() % (pause_us / 2 + 1)));
    if (wake >= deadline) {
      return grpc::Status(s.error_code(), s.error_message() + " (turned away " + std::to_string(turned_away + 1) +
                                              " times within the call's timeout; pacer-ps --max-threads bounds the calls it serves at once)");
    }
    std::this_thread::sleep_until(wake);
    pause_us = std::min<int64_t>(pause_us * 2, 100'000);
  }
}

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

void PsClient::Record(size_t server, double ms) {
  absl::MutexLock l(&mu_);
  latencies_ms_[server].push_back(ms);
}

absl::StatusOr<uint32_t> PsClient::Dim(const std::string& table) const {
  absl::MutexLock l(&mu_);
  auto it = dims_.find(table);
  if (it == dims_.end()) {
    return absl::FailedPreconditionError("table '" + table + "' was not created through this client");
  }
  return it->second;
}

absl::Status PsClient::CreateTable(const PsTableSpec& spec) {
  for (size_t i = 0; i < stubs_.size(); ++i) {
    CreateTableRequest req;
    *req.mutable_spec() = spec;
    CreateTableResponse resp;
    absl::Status s = FromGrpcStatus(CallUntilServed(options_.token, options_.rpc_timeout_ms, [&](grpc::ClientContext* ctx) {
      return stubs_[i]->CreateTable(ctx, req, &resp);
    }));
    if (!s.ok()) {
      return absl::Status(s.code(), "create table on " + options_.servers[i] + ": " + std::string(s.message()));
    }
  }
  absl::MutexLock l(&mu_);
  dims_[spec.name()] = spec.dim();
  return absl::OkStatus();
}

absl::Status PsClient::Pull(const std::string& table, const std::vector<uint64_t>& keys,
                            std::vector<float>* values) {
  auto dim = Dim(table);
  if (!dim.ok()) return dim.status();
  const uint32_t n = static_cast<uint32_t>(stubs_.size());
  std::vector<PullRequest> reqs(n);
  std::vector<std::vector<size_t>> where(n);  // positions in `keys`
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t s = PsServerFor(table, keys[i], n);
    reqs[s].add_keys(keys[i]);
    where[s].push_back(i);
  }
  std::vector<std::future<absl::StatusOr<PullResponse>>> calls(n);
  for (uint32_t s = 0; s < n; ++s) {
    if (reqs[s].keys_size() == 0) continue;
    reqs[s].set_table(table);
    calls[s] = std::async(std::launch::async, [this, s, &reqs]() -> absl::StatusOr<PullResponse> {
      PullResponse resp;
      const auto start = std::chrono::steady_clock::now();
      absl::Status st = FromGrpcStatus(CallUntilServed(options_.token, options_.rpc_timeout_ms, [&](grpc::ClientContext* ctx) {
        return stubs_[s]->Pull(ctx, reqs[s], &resp);
      }));
      Record(s, MsSince(start));
      if (!st.ok()) return absl::Status(st.code(), "pull from " + options_.servers[s] + ": " + std::string(st.message()));
      return resp;
    });
  }
  const size_t base = values->size();
  values->resize(base + keys.size() * *dim);
  absl::Status first;
  for (uint32_t s = 0; s < n; ++s) {
    if (!calls[s].valid()) continue;
    auto r = calls[s].get();
    if (!r.ok()) {
      if (first.ok()) first = r.status();
      continue;
    }
    if (static_cast<size_t>(r->values_size()) != where[s].size() * *dim) {
      if (first.ok()) first = absl::InternalError("pull: wrong number of values from " + options_.servers[s]);
      continue;
    }
    for (size_t j = 0; j < where[s].size(); ++j) {
      std::copy_n(r->values().begin() + static_cast<long>(j * *dim), *dim,
                  values->begin() + static_cast<long>(base + where[s][j] * *dim));
    }
  }
  if (!first.ok()) values->resize(base);
  return first;
}

std::future<absl::Status> PsClient::PushAsync(const std::string& table, std::vector<uint64_t> keys,
                                              std::vector<float> gradients) {
  return std::async(std::launch::async, [this, table, keys = std::move(keys),
                                         gradients = std::move(gradients)]() -> absl::Status {
    auto dim = Dim(table);
    if (!dim.ok()) return dim.status();
    if (gradients.size() != keys.size() * *dim) {
      return absl::InvalidArgumentError("push to '" + table + "': gradients are not keys x dim");
    }
    const uint32_t n = static_cast<uint32_t>(stubs_.size());
    std::vector<PushRequest> reqs(n);
    for (size_t i = 0; i < keys.size(); ++i) {
      PushRequest& r = reqs[PsServerFor(table, keys[i], n)];
      r.add_keys(keys[i]);
      r.mutable_gradients()->Add(gradients.begin() + static_cast<long>(i * *dim),
                                 gradients.begin() + static_cast<long>((i + 1) * *dim));
    }
    std::vector<std::future<absl::Status>> calls(n);
    for (uint32_t s = 0; s < n; ++s) {
      if (reqs[s].keys_size() == 0) continue;
      reqs[s].set_table(table);
      calls[s] = std::async(std::launch::async, [this, s, &reqs]() -> absl::Status {
        PushResponse resp;
        const auto start = std::chrono::steady_clock::now();
        absl::Status st = FromGrpcStatus(CallUntilServed(options_.token, options_.rpc_timeout_ms, [&](grpc::ClientContext* ctx) {
          return stubs_[s]->Push(ctx, reqs[s], &resp);
        }));
        Record(s, MsSince(start));
        if (!st.ok()) return absl::Status(st.code(), "push to " + options_.servers[s] + ": " + std::string(st.message()));
        return absl::OkStatus();
      });
    }
    absl::Status first;
    for (auto& c : calls) {
      if (!c.valid()) continue;
      absl::Status s = c.get();
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  });
}

absl::Status PsClient::PullDense(const std::string& table, size_t size, std::vector<float>* values) {
  auto dim = Dim(table);
  if (!dim.ok()) return dim.status();
  std::vector<uint64_t> keys((size + *dim - 1) / *dim);
  std::iota(keys.begin(), keys.end(), 0);
  const size_t base = values->size();
  absl::Status s = Pull(table, keys, values);
  if (s.ok()) values->resize(base + size);
  return s;
}

std::future<absl::Status> PsClient::PushDenseAsync(const std::string& table, std::vector<float> gradients) {
  auto dim = Dim(table);
  if (!dim.ok()) {
    std::promise<absl::Status> p;
    p.set_value(dim.status());
    return p.get_future();
  }
  std::vector<uint64_t> keys((gradients.size() + *dim - 1) / *dim);
  std::iota(keys.begin(), keys.end(), 0);
  gradients.resize(keys.size() * *dim, 0.0f);
  return PushAsync(table, std::move(keys), std::move(gradients));
}

std::vector<ServerLatency> PsClient::TakeLatency(int64_t now_ms) {
  std::vector<std::vector<double>> taken(stubs_.size());
  {
    absl::MutexLock l(&mu_);
    taken.swap(latencies_ms_);
    latencies_ms_.resize(stubs_.size());
  }
  std::vector<ServerLatency> out;
  for (size_t s = 0; s < taken.size(); ++s) {
    auto& v = taken[s];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    ServerLatency l;
    l.set_server_id(options_.server_ids[s]);
    l.set_reporter(options_.reporter);
    l.set_requests(v.size());
    l.set_mean_latency_ms(std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()));
    l.set_p99_latency_ms(v[std::min(v.size() - 1, static_cast<size_t>(0.99 * static_cast<double>(v.size())))]);
    l.set_time_ms(now_ms);
    out.push_back(std::move(l));
  }
  return out;
}

absl::Status PsClient::ReportLatency(Monitor::StubInterface* monitor, int64_t now_ms) {
  ReportStepsRequest req;
  for (auto& l : TakeLatency(now_ms)) *req.add_server_latency() = std::move(l);
  if (req.server_latency_size() == 0) return absl::OkStatus();
  grpc::ClientContext ctx;
  Prepare(&ctx, options_.token, options_.rpc_timeout_ms);
  ReportStepsResponse resp;
  return FromGrpcStatus(monitor->ReportSteps(&ctx, req, &resp));
}

}  // namespace pacer
