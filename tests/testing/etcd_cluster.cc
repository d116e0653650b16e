#include "tests/testing/etcd_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace pacer::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kPoll(20);

std::string EtcdBinary(const std::string& name) {
  const char* dir = std::getenv("PACER_ETCD_BIN_DIR");
  if (dir != nullptr && *dir != '\0') return std::string(dir) + "/" + name;
  for (const char* d : {"/usr/bin", "/usr/local/bin"}) {
    std::string path = std::string(d) + "/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return std::string("/usr/bin/") + name;
}

// etcd and etcdctl read ETCD_* / ETCDCTL_* variables as flags and refuse one that a flag on the
// command line also sets: a child starts through env(1) with every such variable of ours unset.
std::vector<std::string> CleanEnvPrefix() {
  std::vector<std::string> argv = {"/usr/bin/env"};
  for (char** e = environ; *e != nullptr; ++e) {
    std::string var(*e);
    std::string name = var.substr(0, var.find('='));
    if ((name.rfind("ETCD_", 0) == 0 || name.rfind("ETCDCTL_", 0) == 0) && name != "ETCDCTL_API") {
      argv.push_back("-u");
      argv.push_back(name);
    }
  }
  return argv;
}

// One HTTP/1.0 request to 127.0.0.1:port (no chunking; the server closes after the reply);
// returns the body.
absl::StatusOr<std::string> HttpRequest(int port, const std::string& method, const std::string& path,
                                        const std::string& body, milliseconds timeout) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // bounds connect too
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(err)));
  }
  const std::string request = absl::StrCat(method, " ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n",
                                           "Content-Type: application/json\r\nContent-Length: ",
                                           body.size(), "\r\n\r\n", body);
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("send to 127.0.0.1:", port, " failed"));
    }
    sent += static_cast<size_t>(n);
  }
  std::string reply;
  const auto deadline = Clock::now() + timeout;
  char buf[4096];
  while (Clock::now() < deadline) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      reply.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  close(fd);
  const size_t head_end = reply.find("\r\n\r\n");
  if (reply.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("no HTTP reply from 127.0.0.1:", port, path));
  }
  return reply.substr(head_end + 4);
}

// The string value of "key":"..." in a JSON body (grpc-gateway writes 64-bit integers as
// strings); "" when absent.
std::string JsonStringField(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\":\"";
  const size_t at = json.find(needle);
  if (at == std::string::npos) return "";
  const size_t begin = at + needle.size();
  const size_t end = json.find('"', begin);
  return end == std::string::npos ? "" : json.substr(begin, end - begin);
}

// Whether every thread of `pid` is in job-control stop (state T in /proc/PID/task/*/stat).
// kill(SIGSTOP) returns before the threads have stopped: until then the process still runs.
bool AllThreadsStopped(pid_t pid) {
  std::error_code ec;
  int threads = 0;
  for (const auto& task : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    const std::string stat = ReadFileOrEmpty(task.path().string() + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size()) continue;  // exited meanwhile
    const char state = stat[paren + 2];
    if (state != 'T' && state != 't') return false;
    ++threads;
  }
  return !ec && threads > 0;
}

bool AddressInUse(const std::string& log) {
  return log.find("address already in use") != std::string::npos;
}

std::atomic<int> g_cluster_counter{0};

}  // namespace

absl::StatusOr<std::vector<int>> FreePorts(int count) {
  std::vector<int> fds;
  std::vector<int> ports;
  absl::Status status;
  for (int i = 0; i < count && status.ok(); ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      status = absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
      break;
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::InternalError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(errno)));
      break;
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}


bool EtcdAvailable() {
  return access(EtcdBinary("etcd").c_str(), X_OK) == 0 &&
         access(EtcdBinary("etcdctl").c_str(), X_OK) == 0;
}

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(const TempDir& dir, int members,
                                                                Options options) {
  if (members < 1) return absl::InvalidArgumentError("an etcd cluster needs at least one member");
  if (!EtcdAvailable()) return absl::FailedPreconditionError(kEtcdMissing);
  std::string root;
  for (int n = 0;; ++n) {
    root = dir.Sub(absl::StrCat("etcd-", n));
    std::error_code ec;
    if (std::filesystem::create_directory(root, ec)) break;
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", root, ": ", ec.message()));
  }
  const int attempts = std::max(1, options.start_attempts);
  std::unique_ptr<EtcdCluster> cluster(new EtcdCluster(root, std::move(options)));
  cluster->members_.resize(static_cast<size_t>(members));
  for (int i = 0; i < members; ++i) {
    Member& m = cluster->members_[static_cast<size_t>(i)];
    m.name = absl::StrCat("m", i);
    m.dir = absl::StrCat(root, "/", m.name);
    std::filesystem::create_directories(m.dir);
  }
  absl::Status last;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    absl::StatusOr<std::vector<int>> ports = FreePorts(2 * members);
    if (!ports.ok()) return ports.status();
    for (int i = 0; i < members; ++i) {
      Member& m = cluster->members_[static_cast<size_t>(i)];
      m.proc.Kill();
      m.paused = false;
      std::error_code ec;
      std::filesystem::remove_all(m.dir + "/data", ec);  // a new cluster: no state of the last try
      m.client_port = (*ports)[static_cast<size_t>(2 * i)];
      m.peer_port = (*ports)[static_cast<size_t>(2 * i + 1)];
    }
    cluster->token_ = absl::StrCat("pacer-test-", getpid(), "-", g_cluster_counter.fetch_add(1));
    last = cluster->StartAll();
    if (last.ok()) return cluster;
    bool port_taken = false;
    for (int i = 0; i < members; ++i) {
      if (!cluster->running(i) && AddressInUse(cluster->LogTail(i))) port_taken = true;
    }
    if (!port_taken) break;
  }
  return last;
}

EtcdCluster::~EtcdCluster() {
  for (Member& m : members_) m.proc.Kill();
}

absl::Status EtcdCluster::StartAll() {
  for (int i = 0; i < size(); ++i) StartMember(i, /*first_start=*/true);
  const auto deadline = Clock::now() + options_.start_timeout;
  std::vector<bool> healthy(members_.size(), false);
  while (true) {
    bool all = true;
    for (int i = 0; i < size(); ++i) {
      if (!running(i)) {
        return absl::UnavailableError(absl::StrCat("etcd member ", members_[i].name, " exited during start; its log:\n",
                                                   LogTail(i)));
      }
      if (!healthy[i]) healthy[i] = Healthy(i, milliseconds(1000));
      all = all && healthy[i];
    }
    if (all) return absl::OkStatus();
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPoll);
  }
  std::string logs;
  for (int i = 0; i < size(); ++i) {
    if (!healthy[i]) absl::StrAppend(&logs, "\n--- ", members_[i].name, " (not healthy) ---\n", LogTail(i, 2000));
  }
  return absl::DeadlineExceededError(absl::StrCat("etcd cluster not healthy after ",
                                                  options_.start_timeout.count(), " ms", logs));
}

std::string EtcdCluster::initial_cluster() const {
  std::vector<std::string> parts;
  for (const Member& m : members_) {
    parts.push_back(absl::StrCat(m.name, "=http://127.0.0.1:", m.peer_port));
  }
  return absl::StrJoin(parts, ",");
}

std::vector<std::string> EtcdCluster::MemberArgv(int i) const {
  const Member& m = members_[static_cast<size_t>(i)];
  const std::string client = absl::StrCat("http://127.0.0.1:", m.client_port);
  const std::string peer = absl::StrCat("http://127.0.0.1:", m.peer_port);
  std::vector<std::string> argv = CleanEnvPrefix();
  // With a data dir that exists (a restart) etcd ignores the --initial-* flags.
  for (std::string a : std::initializer_list<std::string>{EtcdBinary("etcd"), "--name=" + m.name, "--data-dir=" + m.dir + "/data",
                        "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
                        "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
                        "--initial-cluster=" + initial_cluster(), "--initial-cluster-state=new",
                        "--initial-cluster-token=" + token_, std::string("--logger=zap"),
                        std::string("--log-outputs=stderr")}) {
    argv.push_back(std::move(a));
  }
  if (options_.quota_backend_bytes > 0) {
    argv.push_back(absl::StrCat("--quota-backend-bytes=", options_.quota_backend_bytes));
  }
  if (!options_.auto_compaction_mode.empty()) {
    argv.push_back("--auto-compaction-mode=" + options_.auto_compaction_mode);
  }
  if (!options_.auto_compaction_retention.empty()) {
    argv.push_back("--auto-compaction-retention=" + options_.auto_compaction_retention);
  }
  argv.insert(argv.end(), options_.extra_flags.begin(), options_.extra_flags.end());
  return argv;
}

void EtcdCluster::StartMember(int i, bool first_start) {
  Member& m = members_[static_cast<size_t>(i)];
  const std::string log = m.dir + "/etcd.log";
  {
    FILE* f = std::fopen(log.c_str(), "a");
    if (f != nullptr) {
      std::fprintf(f, "=== pacer test: %s %s on client %d, peer %d ===\n",
                   first_start ? "start" : "restart", m.name.c_str(), m.client_port, m.peer_port);
      std::fclose(f);
    }
  }
  m.paused = false;
  m.proc = Subprocess::Start(MemberArgv(i), {}, log);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return out;
}

std::string EtcdCluster::endpoint(int i) const {
  return absl::StrCat("127.0.0.1:", members_[static_cast<size_t>(i)].client_port);
}

std::string EtcdCluster::endpoints_csv() const { return absl::StrJoin(endpoints(), ","); }

int EtcdCluster::peer_port(int i) const { return members_[static_cast<size_t>(i)].peer_port; }

std::string EtcdCluster::member_dir(int i) const { return members_[static_cast<size_t>(i)].dir; }

std::string EtcdCluster::LogTail(int i, size_t bytes) const {
  std::string log = ReadFileOrEmpty(member_dir(i) + "/etcd.log");
  if (log.size() <= bytes) return log;
  log = log.substr(log.size() - bytes);
  const size_t nl = log.find('\n');
  return nl == std::string::npos ? log : log.substr(nl + 1);
}

void EtcdCluster::Kill(int i) {
  Member& m = members_[static_cast<size_t>(i)];
  m.proc.Kill();
  m.paused = false;
}

absl::Status EtcdCluster::Stop(int i, milliseconds timeout) {
  Member& m = members_[static_cast<size_t>(i)];
  if (!m.proc.running()) return absl::OkStatus();
  if (m.paused) Resume(i);  // a stopped process would hold SIGTERM until SIGCONT
  m.proc.Signal(SIGTERM);
  if (m.proc.Wait(timeout) == -1) {
    m.proc.Kill();
    return absl::DeadlineExceededError(absl::StrCat("etcd member ", m.name, " ignored SIGTERM for ",
                                                    timeout.count(), " ms; killed. Its log:\n", LogTail(i)));
  }
  return absl::OkStatus();
}

absl::Status EtcdCluster::Restart(int i) {
  Member& m = members_[static_cast<size_t>(i)];
  m.proc.Kill();
  StartMember(i, /*first_start=*/false);
  const auto deadline = Clock::now() + options_.start_timeout;
  while (!Healthy(i, milliseconds(1000))) {
    if (!m.proc.running()) {
      return absl::UnavailableError(absl::StrCat(
          "etcd member ", m.name, " exited on restart",
          AddressInUse(LogTail(i)) ? " (another process took its port while it was down)" : "",
          "; its log:\n", LogTail(i)));
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("etcd member ", m.name, " not healthy ",
                                                      options_.start_timeout.count(),
                                                      " ms after restart; its log:\n", LogTail(i)));
    }
    std::this_thread::sleep_for(kPoll);
  }
  return absl::OkStatus();
}

void EtcdCluster::Pause(int i) {
  Member& m = members_[static_cast<size_t>(i)];
  m.proc.Signal(SIGSTOP);
  m.paused = true;
  const pid_t pid = m.proc.pid();
  if (pid > 0) WaitFor([&] { return AllThreadsStopped(pid); }, milliseconds(10000), milliseconds(1));
}

void EtcdCluster::Resume(int i) {
  Member& m = members_[static_cast<size_t>(i)];
  m.proc.Signal(SIGCONT);
  m.paused = false;
  const pid_t pid = m.proc.pid();
  if (pid > 0) WaitFor([&] { return !AllThreadsStopped(pid); }, milliseconds(10000), milliseconds(1));
}

bool EtcdCluster::running(int i) { return members_[static_cast<size_t>(i)].proc.running(); }

bool EtcdCluster::Healthy(int i, milliseconds timeout) {
  // Without exclude=NOSPACE a full quota would make every member unhealthy: a test that fills
  // it could not restart a member.
  absl::StatusOr<std::string> body = HttpRequest(members_[static_cast<size_t>(i)].client_port, "GET",
                                                 "/health?exclude=NOSPACE", "", timeout);
  return body.ok() && body->find("\"health\":\"true\"") != std::string::npos;
}

absl::Status EtcdCluster::WaitHealthy(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (int i = 0; i < size(); ++i) {
    while (running(i) && !members_[static_cast<size_t>(i)].paused && !Healthy(i, milliseconds(1000))) {
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("etcd member ", members_[i].name,
                                                        " not healthy; its log:\n", LogTail(i)));
      }
      std::this_thread::sleep_for(kPoll);
    }
  }
  return absl::OkStatus();
}

int EtcdCluster::LeaderIndex() {
  // Member ids and the leader each running member names (Maintenance.Status through etcd's
  // JSON gateway). The answer counts only when every member that answers names the same leader
  // and that leader answers too.
  std::map<std::string, int> index_of;
  std::string leader;
  for (int i = 0; i < size(); ++i) {
    if (!running(i) || members_[static_cast<size_t>(i)].paused) continue;
    absl::StatusOr<std::string> body = HttpRequest(members_[static_cast<size_t>(i)].client_port, "POST",
                                                   "/v3/maintenance/status", "{}", milliseconds(1000));
    if (!body.ok()) continue;
    const std::string id = JsonStringField(*body, "member_id");
    const std::string named = JsonStringField(*body, "leader");
    if (id.empty() || named.empty() || named == "0") return -1;
    if (!leader.empty() && named != leader) return -1;
    leader = named;
    index_of[id] = i;
  }
  auto it = index_of.find(leader);
  return it == index_of.end() ? -1 : it->second;
}

int EtcdCluster::WaitForLeader(milliseconds timeout) {
  int leader = -1;
  WaitFor([&] { return (leader = LeaderIndex()) >= 0; }, timeout, kPoll);
  return leader;
}

absl::StatusOr<std::string> EtcdCluster::Etcdctl(const std::vector<std::string>& args,
                                                 const std::string& endpoints, milliseconds timeout) {
  const std::string base = absl::StrCat(dir_, "/etcdctl-", etcdctl_runs_++);
  const std::string out = base + ".out";
  const std::string err = base + ".err";
  // sh splits stderr from stdout ($0 and "$@" carry the command without any quoting).
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>\"$PACER_ETCDCTL_STDERR\""};
  for (std::string& a : CleanEnvPrefix()) argv.push_back(std::move(a));
  const auto seconds = std::max<int64_t>(1, timeout.count() / 1000);
  for (std::string a : std::initializer_list<std::string>{EtcdBinary("etcdctl"),
                        "--endpoints=" + (endpoints.empty() ? endpoints_csv() : endpoints),
                        std::string("--dial-timeout=2s"), absl::StrCat("--command-timeout=", seconds, "s")}) {
    argv.push_back(std::move(a));
  }
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess proc = Subprocess::Start(argv, {{"ETCDCTL_API", "3"}, {"PACER_ETCDCTL_STDERR", err}}, out);
  // etcdctl's own --command-timeout ends it first; the margin covers its start and dialling.
  const int status = proc.Wait(timeout + milliseconds(5000));
  std::string stdout_text = ReadFileOrEmpty(out);
  std::string stderr_text = ReadFileOrEmpty(err);
  std::error_code ec;
  std::filesystem::remove(out, ec);
  std::filesystem::remove(err, ec);
  const std::string what = absl::StrCat("etcdctl ", absl::StrJoin(args, " "));
  if (status == -1) {
    proc.Kill();
    return absl::DeadlineExceededError(absl::StrCat(what, ": still running after ", timeout.count(),
                                                    " ms; stderr: ", stderr_text));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(absl::StrCat(what, ": exit status ", status, "; stderr: ", stderr_text,
                                               stdout_text.empty() ? "" : "; stdout: ", stdout_text));
  }
  return stdout_text;
}

}  // namespace pacer::testing
