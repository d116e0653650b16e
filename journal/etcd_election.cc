#include "journal/etcd_election.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/cond_wait.h"
#include "common/log.h"
#include "common/status.h"

namespace pacer {
namespace {

int64_t NowMs() { return RealClock::Get()->MonotonicNs() / 1'000'000; }

}  // namespace

EtcdElection::EtcdElection(EtcdClient* client, EtcdElectionOptions options)
    : client_(client), options_(std::move(options)) {}

EtcdElection::~EtcdElection() { Stop(); }

void EtcdElection::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    if (campaign_ctx_) campaign_ctx_->TryCancel();
  }
  cv_.SignalAll();
  if (keepalive_.joinable()) keepalive_.join();
}

bool EtcdElection::IsLeader() const {
  absl::MutexLock l(&mu_);
  return leading_ && !lost_ && NowMs() < valid_until_ms_;
}

int64_t EtcdElection::remaining_ms() const {
  absl::MutexLock l(&mu_);
  if (!leading_ || lost_) return 0;
  return valid_until_ms_ - NowMs();
}

EtcdFence EtcdElection::fence() const {
  absl::MutexLock l(&mu_);
  return fence_;
}

void EtcdElection::set_on_lost(std::function<void(const std::string&)> fn) {
  absl::MutexLock l(&mu_);
  on_lost_ = std::move(fn);
}

void EtcdElection::Lost(const std::string& why) {
  std::function<void(const std::string&)> fn;
  {
    absl::MutexLock l(&mu_);
    if (!leading_ || lost_) return;
    lost_ = true;
    leading_ = false;
    fn = on_lost_;
  }
  PACER_LOG(ERROR) << "etcd election '" << options_.name << "': leadership lost: " << why;
  if (fn) fn(why);
}

absl::Status EtcdElection::GrantLease() {
  const int64_t sent = NowMs();
  ASSIGN_OR_RETURN(etcdserverpb::LeaseGrantResponse grant, client_->LeaseGrant(options_.ttl_s));
  {
    absl::MutexLock l(&mu_);
    lease_id_ = grant.id();
    lease_lost_ = false;
    valid_until_ms_ = sent + options_.ttl_s * 1000;
    if (!keepalive_.joinable() && !stopping_) keepalive_ = std::thread([this] { KeepAliveLoop(); });
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

void EtcdElection::KeepAliveLoop() {
  const int64_t ttl_ms = options_.ttl_s * 1000;
  const int64_t period_ms = std::max<int64_t>(ttl_ms / 4, 100);
  int64_t next_ms = NowMs() + period_ms;
  absl::MutexLock l(&mu_);
  while (!stopping_ && !lost_) {
    const int64_t wake = leading_ ? std::min(next_ms, valid_until_ms_) : next_ms;
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(std::max<int64_t>(0, wake - NowMs())));
    if (stopping_ || lost_) break;
    const int64_t now = NowMs();
    if (now >= valid_until_ms_) {
      if (leading_) {
        mu_.Unlock();
        Lost(absl::StrCat("no keepalive acknowledged within the lease's ", options_.ttl_s, " s TTL"));
        mu_.Lock();
        break;
      }
      if (!lease_lost_) {
        lease_lost_ = true;  // campaigning on an expired lease: Campaign grants another
        if (campaign_ctx_) campaign_ctx_->TryCancel();
      }
    }
    if (now < next_ms) continue;
    next_ms = now + period_ms;
    const int64_t id = lease_id_;
    if (id == 0 || lease_lost_) continue;
    const int64_t budget = leading_ ? std::max<int64_t>(1, valid_until_ms_ - now) : period_ms;
    mu_.Unlock();
    const int64_t sent = NowMs();
    absl::StatusOr<int64_t> ttl = client_->LeaseKeepAliveOnce(id, std::min(budget, period_ms * 2));
    mu_.Lock();
    if (lease_id_ != id) continue;  // replaced meanwhile
    if (!ttl.ok()) {
      PACER_LOG(WARNING) << "etcd election: keepalive of lease " << id << " failed: " << ttl.status().message();
      continue;
    }
    if (*ttl <= 0) {
      if (leading_) {
        mu_.Unlock();
        Lost(absl::StrCat("etcd says lease ", id, " is gone"));
        mu_.Lock();
        break;
      }
      lease_lost_ = true;
      if (campaign_ctx_) campaign_ctx_->TryCancel();
      continue;
    }
    valid_until_ms_ = std::max(valid_until_ms_, sent + ttl_ms);
  }
}

absl::Status EtcdElection::ConfirmKey(const EtcdFence& fence) {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* c = txn.add_compare();
  c->set_key(fence.key);
  c->set_target(etcdserverpb::Compare::CREATE);
  c->set_result(etcdserverpb::Compare::EQUAL);
  c->set_create_revision(fence.rev);
  ASSIGN_OR_RETURN(etcdserverpb::TxnResponse resp, client_->Txn(txn, /*retry=*/true));
  if (!resp.succeeded()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the election key '", fence.key, "' is gone (its lease expired while campaigning)"));
  }
  return absl::OkStatus();
}

absl::Status EtcdElection::Campaign(const std::function<void(const std::string& leader)>& on_waiting) {
  std::string reported;
  int64_t backoff_ms = 50;
  auto pause = [&]() -> bool {
    absl::MutexLock l(&mu_);
    CvWaitFor(cv_, mu_, std::chrono::milliseconds(backoff_ms), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; });
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 1000);
    return !stopping_;
  };
  for (;;) {
    int64_t lease;
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return absl::CancelledError("stopped while campaigning");
      lease = lease_lost_ ? 0 : lease_id_.load();
    }
    if (lease == 0) {
      absl::Status s = GrantLease();
      if (!s.ok()) {
        PACER_LOG(WARNING) << "etcd election: " << s.message();
        if (!pause()) return absl::CancelledError("stopped while campaigning");
        continue;
      }
      lease = lease_id_;
    }
    std::unique_ptr<grpc::ClientContext> ctx = client_->StreamContext(0);
    grpc::ClientContext* raw = ctx.get();
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return absl::CancelledError("stopped while campaigning");
      campaign_ctx_ = std::move(ctx);
    }
    // While Campaign waits: who leads, reported each time it changes (every second).
    std::atomic<bool> waiting{true};
    std::thread reporter;
    if (on_waiting) {
      reporter = std::thread([&] {
        absl::MutexLock l(&mu_);
        while (waiting && !stopping_) {
          mu_.Unlock();
          absl::StatusOr<mvccpb::KeyValue> leader = client_->Leader(options_.name);
          const std::string now = leader.ok() ? leader->value() : "";
          if (!now.empty() && now != reported && now != options_.value && waiting) {
            reported = now;
            on_waiting(now);
          }
          mu_.Lock();
          CvWaitFor(cv_, mu_, std::chrono::seconds(1), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !waiting || stopping_; });
        }
      });
    }
    absl::StatusOr<v3electionpb::LeaderKey> won = client_->Campaign(raw, options_.name, lease, options_.value);
    {
      absl::MutexLock l(&mu_);
      waiting = false;
    }
    cv_.SignalAll();
    if (reporter.joinable()) reporter.join();
    bool lease_lost;
    {
      absl::MutexLock l(&mu_);
      campaign_ctx_.reset();
      if (stopping_) return absl::CancelledError("stopped while campaigning");
      lease_lost = lease_lost_;
    }
    if (lease_lost) {
      (void)client_->LeaseRevoke(lease);
      continue;
    }
    if (!won.ok()) {
      const absl::StatusCode code = won.status().code();
      if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded &&
          code != absl::StatusCode::kCancelled && code != absl::StatusCode::kUnknown) {
        return won.status();
      }
      PACER_LOG(WARNING) << "etcd election: " << won.status().message();
      if (!pause()) return absl::CancelledError("stopped while campaigning");
      continue;
    }
    EtcdFence fence{won->key(), won->rev()};
    absl::Status confirmed = ConfirmKey(fence);
    if (!confirmed.ok()) {
      PACER_LOG(WARNING) << "etcd election: " << confirmed.message() << "; campaigning again";
      absl::MutexLock l(&mu_);
      lease_lost_ = true;
      continue;
    }
    absl::MutexLock l(&mu_);
    if (NowMs() >= valid_until_ms_) {
      lease_lost_ = true;  // won too late to trust the lease: campaign again on a new one
      continue;
    }
    fence_ = fence;
    leading_ = true;
    PACER_LOG(INFO) << "etcd election '" << options_.name << "': leading as '" << options_.value
                    << "' (key " << fence.key << ", revision " << fence.rev << ")";
    return absl::OkStatus();
  }
}

absl::Status EtcdElection::Resign() {
  EtcdFence fence;
  int64_t lease;
  {
    absl::MutexLock l(&mu_);
    if (!leading_ || lost_) return absl::OkStatus();
    lost_ = true;
    leading_ = false;
    fence = fence_;
    lease = lease_id_;
  }
  v3electionpb::LeaderKey key;
  key.set_name(options_.name);
  key.set_key(fence.key);
  key.set_rev(fence.rev);
  key.set_lease(lease);
  absl::Status s = client_->Resign(key);
  absl::Status r = client_->LeaseRevoke(lease);
  return s.ok() ? r : s;
}

}  // namespace pacer
