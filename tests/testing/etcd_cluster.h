// EtcdCluster: a real etcd cluster (Debian's etcd-server, 3 members by default) on loopback, for
// tests of the etcd journal, election and fencing. Never a single member: etcd 3.4 can lose an
// acknowledged write when a single-member cluster crashes.
//
// Owns its member processes (every one reaped: testing::Subprocess) and, under the test's
// TempDir, one folder per member holding its data dir and its log (etcd.log). Errors carry the
// tail of the member's log.
//
// Start, step by step:
//   1. Ask the OS for two free ports per member (bind port 0 on 127.0.0.1, read, close).
//   2. Start every member with the whole --initial-cluster and a token unique to this cluster.
//   3. Poll each member's /health until all say true, with a deadline.
//   4. If a member exited because its port was taken in between (another process bound it
//      after step 1), kill them all, clear the data dirs and go back to 1, a bounded number of
//      times. Any other failure is returned at once.
//
// Not thread-safe: one test thread drives it. No system etcd is used (2379/2380 stay free).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/test_util.h"

namespace pacer::testing {

// Whether etcd and etcdctl are installed (scripts/install-deps.sh installs both). Tests call
//   if (!EtcdAvailable()) GTEST_SKIP() << kEtcdMissing;
bool EtcdAvailable();
inline constexpr char kEtcdMissing[] =
    "etcd or etcdctl not found (PACER_ETCD_BIN_DIR, /usr/bin): run scripts/install-deps.sh";

// `count` distinct ports that were free a moment ago: all bound at once to 127.0.0.1:0, read,
// closed. Another process may take one before its server binds it: callers retry then.
absl::StatusOr<std::vector<int>> FreePorts(int count);

class EtcdCluster {
 public:
  struct Options {
    // --quota-backend-bytes; 0 keeps etcd's default (2 GiB).
    int64_t quota_backend_bytes = 0;
    // --auto-compaction-mode ("periodic" or "revision") and --auto-compaction-retention
    // ("1h", "1000", ...); empty keeps etcd's default (compaction off).
    std::string auto_compaction_mode;
    std::string auto_compaction_retention;
    // Added to every member's command line, e.g. {"--max-request-bytes=2097152"}.
    std::vector<std::string> extra_flags;
    // How long Start and Restart wait for the members to be healthy.
    std::chrono::milliseconds start_timeout{30000};
    // How many times Start picks new ports after one was taken before a member bound it.
    int start_attempts = 4;
  };

  // Starts `members` members and waits until each reports healthy. Folders go under
  // dir.Sub("etcd-N"), N the first number not in use, so one TempDir can hold several clusters.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(const TempDir& dir, int members,
                                                            Options options);
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(const TempDir& dir, int members = 3) {
    return Start(dir, members, Options());
  }

  // Kills (SIGKILL) and reaps every member.
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // Client addresses, "127.0.0.1:PORT", in member order (stable across Restart).
  std::vector<std::string> endpoints() const;
  std::string endpoint(int i) const;
  // endpoints() joined with commas (etcdctl --endpoints, pacerd --journal etcd://...).
  std::string endpoints_csv() const;
  // Peer port of member i (for a proxy between members, or to check it is free).
  int peer_port(int i) const;
  // Member i's folder (its data dir is data/, its log etcd.log) and the tail of its log.
  std::string member_dir(int i) const;
  std::string LogTail(int i, size_t bytes = 4000) const;

  // SIGKILL + reap; the member's data dir stays for Restart.
  void Kill(int i);
  // SIGTERM, wait for a clean exit (SIGKILL after `timeout`); an error if it had to be killed.
  absl::Status Stop(int i, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  // Starts a stopped or killed member again (same name, data dir and ports; killed first if it
  // still runs) and waits until it is healthy.
  absl::Status Restart(int i);
  // SIGSTOP / SIGCONT: a frozen member holds its connections open but answers nothing. Each
  // returns once the kernel reports every thread of the member stopped (or no longer stopped).
  void Pause(int i);
  void Resume(int i);
  bool running(int i);
  // Member i's process id; -1 once it is known to have exited (Kill, Stop, running()).
  pid_t pid(int i) const { return members_[static_cast<size_t>(i)].proc.pid(); }

  // Whether member i answers /health with true (it has a leader and a read through raft
  // succeeded), within `timeout`. A NOSPACE alarm (quota reached) does not count: the member
  // still serves reads and deletes, and can be restarted.
  bool Healthy(int i, std::chrono::milliseconds timeout = std::chrono::milliseconds(1000));
  // Waits until every running, not paused member is healthy.
  absl::Status WaitHealthy(std::chrono::milliseconds timeout);

  // The index of the member that the running members agree is the raft leader, or -1 when
  // none is known (during an election, or no member answers).
  int LeaderIndex();
  // Waits until LeaderIndex() >= 0 and returns it; -1 past `timeout`.
  int WaitForLeader(std::chrono::milliseconds timeout = std::chrono::milliseconds(15000));

  // Runs etcdctl (API v3) with `args` against every member's endpoint (or only `endpoints`,
  // a CSV) and returns its stdout; an error with its stderr when it fails or runs past
  // `timeout`. Examples: Etcdctl({"put", "k", "v"}), Etcdctl({"get", "k", "--print-value-only"}).
  absl::StatusOr<std::string> Etcdctl(const std::vector<std::string>& args,
                                      const std::string& endpoints = "",
                                      std::chrono::milliseconds timeout =
                                          std::chrono::milliseconds(15000));

 private:
  struct Member {
    std::string name;
    std::string dir;
    int client_port = 0;
    int peer_port = 0;
    Subprocess proc;
    bool paused = false;
  };

  EtcdCluster(std::string dir, Options options) : dir_(std::move(dir)), options_(std::move(options)) {}
  // One try of Start's steps 2-3 on the ports already chosen.
  absl::Status StartAll();
  void StartMember(int i, bool first_start);
  std::vector<std::string> MemberArgv(int i) const;
  std::string initial_cluster() const;

  const std::string dir_;
  const Options options_;
  std::string token_;
  std::vector<Member> members_;
  int etcdctl_runs_ = 0;
};

}  // namespace pacer::testing
