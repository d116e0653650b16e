// EtcdElection: which pacerd of a job leads, decided by etcd's v3 election service, with the
// fencing token every journal write carries.
//
// A candidate grants itself a lease (TTL >= 2 s, etcd's minimum), keeps it alive, and campaigns
// under "<prefix>/leader" with its advertised address as the value. Campaign returns once its key
// is the oldest: it leads, and the key's create revision is its fencing token — every journal
// transaction compares the key's create revision with it (EtcdLog), so a deposed leader's write
// is refused by etcd itself, whatever the leader believes.
//
// Two facts of etcd 3.4.23 shape the rest:
//  - Campaign does not check again, after its wait, that the candidate's key still exists (its
//    lease may have expired meanwhile): after winning, a fenced no-op transaction confirms the
//    key; if it is gone the candidate campaigns again.
//  - A keepalive can report success on a revoked lease. So the leader does not trust renewals
//    alone: it holds leadership until (send time of its last acknowledged keepalive) + TTL —
//    before etcd could expire the lease and elect another — and demotes itself then, whatever
//    it hears. Fenced writes catch the rest.
// Leadership ends (the `on_lost` callback, once) when that deadline passes, when a keepalive says
// the lease is gone, or when a fenced write is refused (Lost()). pacerd exits at once then: a
// deposed leader serves nothing more, and its supervisor starts it again as a standby.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "journal/etcd_client.h"

namespace pacer {

struct EtcdFence {
  std::string key;   // the leader's election key
  int64_t rev = 0;   // its create revision
};

struct EtcdElectionOptions {
  std::string name;   // the election's key prefix ("<job prefix>/leader")
  std::string value;  // what the leader advertises (its client address)
  int64_t ttl_s = 2;  // the lease's TTL (>= 2)
};

class EtcdElection {
 public:
  EtcdElection(EtcdClient* client, EtcdElectionOptions options);
  ~EtcdElection();  // stops keepalives; does not resign (Resign() does)

  // Blocks until this candidate leads (OK), Stop() is called (CANCELLED), or etcd refuses in a
  // way retrying cannot fix. `on_waiting` is called with the current leader's value while this
  // candidate waits (for the log), each time it changes.
  absl::Status Campaign(const std::function<void(const std::string& leader)>& on_waiting = nullptr);
  // Cancels a Campaign in progress and stops keepalives.
  void Stop();

  // Leading, and the deadline not passed.
  bool IsLeader() const;
  EtcdFence fence() const;
  int64_t lease_id() const { return lease_id_.load(); }
  // Milliseconds of leadership left (<= 0: none).
  int64_t remaining_ms() const;

  // Called once (on the keepalive thread, or the caller of Lost) when leadership ends.
  void set_on_lost(std::function<void(const std::string& why)> fn);
  // A fenced write was refused: leadership is over.
  void Lost(const std::string& why);

  // Gives leadership up at once (clean shutdown): resigns and revokes the lease, so a standby
  // takes over without waiting for the lease to expire.
  absl::Status Resign();

 private:
  void KeepAliveLoop();
  absl::Status GrantLease();
  absl::Status ConfirmKey(const EtcdFence& fence);

  EtcdClient* const client_;
  const EtcdElectionOptions options_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::atomic<int64_t> lease_id_{0};
  int64_t valid_until_ms_ ABSL_GUARDED_BY(mu_) = 0;  // steady clock; leadership (and the lease) trusted until then
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool lease_lost_ ABSL_GUARDED_BY(mu_) = false;     // the lease expired while campaigning: grant another
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  EtcdFence fence_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_lost_;
  std::unique_ptr<grpc::ClientContext> campaign_ctx_ ABSL_GUARDED_BY(mu_);  // the Campaign in flight (to cancel it)
  std::thread keepalive_;
};

}  // namespace pacer
