// RendezvousServiceImpl: the key-value store collective backends rendezvous through, and the
// job's collective membership generation (proto/pacer/rendezvous.proto).
//
// Owns, in memory only (soft state, not journaled; see the proto): the group (world size and,
// per rank, the worker id and incarnation that hold it), the current generation, the keys of
// the current generation, and the Get calls waiting for keys.
//
// Generations. The first Join opens generation 1. The generation moves on (a *regroup*) when
//   1. a member Joins again with a new incarnation (the worker restarted), or
//   2. a rank Reforms the generation its collective failed in (compare-and-bump: the first of
//      several ranks reporting the same generation bumps it, the rest see the new one).
// A new generation drops the keys of older ones and fails their waiting Gets with ABORTED, so
// a rank stuck rendezvousing in an old generation learns at once that it must rebuild. Every
// live member whose heartbeat reports an older generation gets a RegroupCommand in the reply
// (OnHeartbeat), until it reports the new one.
//
// Thread-safe: one mutex; `done` callbacks run outside it (inline, or on the thread of the Set,
// Reform, Join or CancelWait that completed them).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/byte_budget.h"
#include "common/metrics.h"
#include "rendezvous/rendezvous_metrics.h"
#include "proto/pacer/rendezvous.pb.h"
#include "proto/pacer/sharding.pb.h"

namespace pacer {

// Every limit a client can reach (RESOURCE_EXHAUSTED / INVALID_ARGUMENT past it), in bytes
// where the resource is memory. A caller is one credential (the gRPC adapter names it).
struct RendezvousOptions {
  // Keys + values of the current generation (Set and Add), each key charged
  // kStoreEntryOverheadBytes more for the store's own structures.
  size_t max_bytes = 64 << 20;
  size_t max_bytes_per_caller = 16 << 20;  // what one caller's keys and values may hold
  size_t max_keys_per_get = 4096;   // also per Check
  size_t max_value_bytes = 1 << 20;
  size_t max_key_bytes = 4096;      // Set, Add, and every key of a Get or Check
  size_t max_waiting_gets = 16384;  // Get calls parked at once
  // What parked Gets hold (their keys, twice: the request and the parked copy, plus
  // kWaitingGetOverheadBytes each for the call), in all and per caller.
  size_t max_waiting_bytes = 64 << 20;
  size_t max_waiting_bytes_per_caller = 8 << 20;
  // Get replies built and not yet sent (a client that does not read its replies keeps them), in
  // all and per caller. One reply is at most kMaxReplyBytes (common/reply_limit.h).
  size_t max_reply_bytes_in_flight = 128 << 20;
  size_t max_reply_bytes_in_flight_per_caller = 32 << 20;
};

// What the store charges besides keys and values (measured: a std::map node and two strings).
inline constexpr size_t kStoreEntryOverheadBytes = 128;
// What one parked Get costs besides its keys: the gRPC call and its request, the waiter.
inline constexpr size_t kWaitingGetOverheadBytes = 4096;
inline constexpr size_t kWaitingKeyOverheadBytes = 64;

// Who may do what in a Join (from the caller's credential, common/auth.h).
struct JoinAuthority {
  // May open the group, i.e. fix its world size: the chief credential, the job or admin token.
  // A Join without it waits (UNAVAILABLE, retried by the SDK) until the group is open.
  bool may_open = true;
};

struct RendezvousStats {
  uint64_t generation = 0;
  uint64_t regroups = 0;  // generation bumps after the first
  size_t keys = 0;
  size_t waiting = 0;
};

class RendezvousServiceImpl {
 public:
  using Done = std::function<void(absl::Status)>;

  // Metrics (pacer_rendezvous_*) go to `metrics`, or to a private registry when null.
  explicit RendezvousServiceImpl(RendezvousOptions options = {}, MetricsRegistry* metrics = nullptr);
  ~RendezvousServiceImpl();  // fails waiting Gets with CANCELLED
  // Fails waiting Gets, and every later waiting Get at once, with UNAVAILABLE (pacerd is
  // stopping; the client retries against the next pacerd). Lets the server shut down at once.
  void Shutdown();

  absl::Status Join(const RendezvousJoinRequest& req, RendezvousJoinResponse* resp,
                    JoinAuthority authority = {});
  // A request naming a worker_id moves the generation on only when that worker is a member of
  // the group; otherwise it returns the current generation and changes nothing (no worker_id:
  // pacerd itself, or a launcher through the gRPC adapter).
  absl::Status Reform(const RendezvousReformRequest& req, RendezvousReformResponse* resp);
  // A key is charged to the caller that wrote it last (RendezvousOptions::max_bytes_per_caller).
  absl::Status Set(const RendezvousSetRequest& req, RendezvousSetResponse* resp,
                   const std::string& caller = "");
  absl::Status Add(const RendezvousAddRequest& req, RendezvousAddResponse* resp,
                   const std::string& caller = "");
  absl::Status Check(const RendezvousCheckRequest& req, RendezvousCheckResponse* resp);
  // Fills `resp` and calls `done`: at once, or (req.wait and a key missing) once every key is
  // set, the generation is superseded (ABORTED), or CancelWait(tag) is called (CANCELLED; the
  // gRPC adapter calls it when the call's deadline passes or the client goes away).
  // `tag` identifies the call (unique among calls not yet Finished); `caller` the credential
  // whose budgets its waiting and its reply are charged to (ByteBudget, common/byte_budget.h).
  void Get(const RendezvousGetRequest& req, RendezvousGetResponse* resp, const void* tag,
           Done done, const std::string& caller = "");
  void CancelWait(const void* tag);
  // The reply of the Get `tag` has been sent (or dropped): its bytes leave the in-flight budget.
  // The gRPC adapter calls it when the call is done.
  void Finished(const void* tag);

  // Heartbeat hook: adds a RegroupCommand for a member whose reported generation is older.
  void OnHeartbeat(const HeartbeatRequest& req, HeartbeatResponse* resp);

  RendezvousStats stats() const;

 private:
  struct Member {
    std::string worker_id;
    uint64_t incarnation = 0;
  };
  struct Waiter {
    uint64_t generation;
    std::vector<std::string> keys;
    RendezvousGetResponse* resp;
    Done done;
    std::string caller;
    uint64_t charged = 0;  // to waiting_budget_
  };
  struct Reply {
    std::string caller;
    uint64_t charged = 0;  // to reply_budget_
  };
  using Completion = std::pair<Done, absl::Status>;

  // Writes `key` for `caller` within the store's budgets (RESOURCE_EXHAUSTED, nothing changed,
  // otherwise).
  absl::Status Store(const std::string& key, std::string value, const std::string& caller,
                     const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checks shared by Set/Get/Add/Check: the generation is the current one.
  absl::Status CheckGeneration(uint64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens generation_ + 1: drops the old keys, aborts the old waiters (into *out).
  void Bump(std::vector<Completion>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the waiters whose keys are now all set (into *out).
  void WakeReady(std::vector<Completion>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllSet(const std::vector<std::string>& keys) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills `resp` with the values of `keys` (all set) for the call `tag` of `caller`, once the
  // reply fits kMaxReplyBytes and the caller's in-flight reply budget; RESOURCE_EXHAUSTED naming
  // the limit otherwise (and `resp` left empty).
  absl::Status FillValues(const std::vector<std::string>& keys, RendezvousGetResponse* resp,
                          const void* tag, const std::string& caller)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `it` out of the waiters, releasing its charge; returns its `done`.
  Done TakeWaiter(std::map<const void*, Waiter>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(std::vector<Completion>& completions);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);


  const RendezvousOptions options_;
  std::unique_ptr<MetricsRegistry> own_metrics_;
  RendezvousMetrics metrics_;  // rendezvous/rendezvous_metrics.h
  mutable absl::Mutex mu_;
  uint32_t world_size_ ABSL_GUARDED_BY(mu_) = 0;  // 0: no Join yet
  std::map<int32_t, Member> members_ ABSL_GUARDED_BY(mu_);  // by rank
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t regroups_ ABSL_GUARDED_BY(mu_) = 0;
  struct Entry {
    std::string value;
    std::string caller;  // who wrote it: its bytes are charged to them in store_budget_
  };
  std::map<std::string, Entry> kv_ ABSL_GUARDED_BY(mu_);  // of generation_
  ByteBudget store_budget_ ABSL_GUARDED_BY(mu_);
  std::map<const void*, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  ByteBudget waiting_budget_ ABSL_GUARDED_BY(mu_);
  std::map<const void*, Reply> replies_ ABSL_GUARDED_BY(mu_);  // filled, not yet Finished
  ByteBudget reply_budget_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pacer
