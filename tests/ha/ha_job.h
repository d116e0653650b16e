// HaJob: one job's pacerds (real processes) sharing a journal in a real etcd cluster, and its
// consumer processes with ledgers, for the failover and fencing tests. Every pacerd of the job
// uses the same token files and its own fixed port (chosen by the OS once), so clients name them
// all ("127.0.0.1:P0,127.0.0.1:P1").
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "journal/etcd_client.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/ledger_check.h"
#include "tests/testing/test_util.h"

namespace pacer::testing {

inline bool Accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

class HaJob {
 public:
  static constexpr char kPrefix[] = "jobs/ha";
  static constexpr int kPacerds = 2;

  HaJob(const TempDir& dir, EtcdCluster* cluster, uint64_t records, uint32_t epochs)
      : dir_(dir), cluster_(cluster), records_(records), epochs_(epochs), pacerds_(kPacerds) {
    WriteToken(dir.Sub("job.token"), std::string(64, 'a'));
    WriteToken(dir.Sub("admin.token"), std::string(64, 'b'));
    auto ports = FreePorts(kPacerds);
    EXPECT_TRUE(ports.ok()) << ports.status();
    if (ports.ok()) ports_ = *ports;
    EtcdClientOptions eo;
    eo.endpoints = cluster->endpoints();
    auto etcd = EtcdClient::Connect(eo);
    EXPECT_TRUE(etcd.ok()) << etcd.status();
    if (etcd.ok()) etcd_ = std::move(*etcd);
  }

  int port(int i) const { return ports_[i]; }
  std::string address(int i) const { return absl::StrCat("127.0.0.1:", ports_[i]); }
  // Every pacerd, `first` first (clients connect to the first that accepts).
  std::string addresses(int first = 0) const { return address(first) + "," + address(1 - first); }
  Subprocess& pacerd(int i) { return pacerds_[i]; }
  std::string pacerd_log(int i) const { return ReadFileOrEmpty(dir_.Sub(absl::StrCat("pacerd-", i, ".log"))); }

  // Starts pacerd i (a standby until it wins the election); its journal through `etcd_csv`
  // (default: the cluster's members directly).
  void StartPacerd(int i, const std::string& etcd_csv = "") {
    pacerds_[i] = Subprocess::Start(
        {BinaryPath("pacerd"), "--data-dir", data_dir(i), "--listen", address(i), "--metrics-listen", "",
         "--journal", absl::StrCat("etcd://", etcd_csv.empty() ? cluster_->endpoints_csv() : etcd_csv, "/", kPrefix),
         "--job-token-file", dir_.Sub("job.token"), "--admin-token-file", dir_.Sub("admin.token"),
         "--lease-timeout-ms", "3000", "--worker-timeout-ms", "8000", "--snapshot-every", "300",
         "--election-ttl-s", "2"},
        {}, dir_.Sub(absl::StrCat("pacerd-", i, ".log")));
  }
  std::string data_dir(int i) const { return dir_.Sub(absl::StrCat("pacerd-", i)); }

  // The pacerd that etcd's election names and that accepts connections (-1: none now).
  int ServingLeader() {
    auto kv = etcd_->Leader(std::string(kPrefix) + "/leader");
    if (!kv.ok()) return -1;
    for (int i = 0; i < kPacerds; ++i) {
      if (kv->value() == address(i) && Accepts(ports_[i])) return i;
    }
    return -1;
  }

  // A consumer of the job's dataset, with a ledger, connecting to `addresses`.
  Subprocess StartWorker(int i, const std::string& addresses, const std::string& step_ms = "2") {
    return Subprocess::Start(
        {BinaryPath("pacer-consume"), "--addr", addresses, "--token-file", dir_.Sub("job.token"), "--worker-id",
         absl::StrCat("w", i), "--dataset", "train", "--register-records", std::to_string(records_),
         "--shard-size", "64", "--epochs", std::to_string(epochs_), "--shuffle", "shards", "--max-attempts",
         "1000000", "--batch", "8", "--step-ms", step_ms, "--quiet", "--ledger", ledger(i)},
        {}, dir_.Sub(absl::StrCat("worker-", i, ".log")));
  }
  std::string ledger(int i) const { return dir_.Sub(absl::StrCat("ledger-", i)); }
  std::string worker_log(int i) const { return ReadFileOrEmpty(dir_.Sub(absl::StrCat("worker-", i, ".log"))); }

  // `pacerctl status` against every pacerd (its output, and the exit status).
  std::pair<std::string, int> PacerctlStatus() {
    const std::string out = dir_.Sub(absl::StrCat("pacerctl-", ++pacerctl_runs_, ".out"));
    Subprocess p = Subprocess::Start({BinaryPath("pacerctl"), "--addr", addresses(), "--token-file",
                                      dir_.Sub("admin.token"), "status"},
                                     {}, out);
    const int status = p.Wait(std::chrono::seconds(30));
    return {ReadFileOrEmpty(out), WIFEXITED(status) ? WEXITSTATUS(status) : -1};
  }

  // The service agrees with the ledgers (testing::ExpectServiceCountedAll).
  void ExpectServiceCountedAll() {
    testing::ExpectServiceCountedAll(addresses(), std::string(64, 'a'), epochs_, records_);
  }

 private:
  static void WriteToken(const std::string& path, const std::string& token) {
    std::ofstream(path) << token << "\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }

  const TempDir& dir_;
  EtcdCluster* cluster_;
  const uint64_t records_;
  const uint32_t epochs_;
  std::vector<int> ports_ = {0, 0};
  std::vector<Subprocess> pacerds_;
  std::unique_ptr<EtcdClient> etcd_;
  int pacerctl_runs_ = 0;
};

// Whether every worker exited (an ADD_FAILURE for each that did not exit 0).
inline bool AllWorkersDone(std::vector<Subprocess>& workers, HaJob& job) {
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i].running()) return false;
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    const int status = workers[i].exit_status();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << "worker " << i << " failed (status " << status << "):\n" << job.worker_log(i);
    }
  }
  return true;
}

}  // namespace pacer::testing
