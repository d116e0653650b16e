#include "tests/testing/test_util.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace pacer::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/pacer-test-XXXXXX";
  std::filesystem::create_directories(std::filesystem::path(tmpl).parent_path());
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) std::abort();
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

bool WaitFor(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
             std::chrono::milliseconds poll) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    std::this_thread::sleep_for(poll);
  }
}

Subprocess::~Subprocess() { Kill(); }

Subprocess::Subprocess(Subprocess&& other) noexcept : pid_(other.pid_), status_(other.status_) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = other.pid_;
    status_ = other.status_;
    other.pid_ = -1;
  }
  return *this;
}

Subprocess Subprocess::Start(const std::vector<std::string>& argv,
                             const std::map<std::string, std::string>& env,
                             const std::string& log_path) {
  Subprocess p;
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) std::abort();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the test died: take the child with it
    if (getppid() != parent) _exit(127);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    if (!log_path.empty()) {
      int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so Signal() works at once
  p.pid_ = pid;
  return p;
}

bool Subprocess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    status_ = status;
    kill(-pid_, SIGKILL);  // leftovers in its group
    pid_ = -1;
    return false;
  }
  return true;
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0) kill(-pid_, sig);
}

int Subprocess::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return status_;
  if (!WaitFor([&] { return !running(); }, timeout, std::chrono::milliseconds(5))) return -1;
  return status_;
}

void Subprocess::Kill() {
  if (pid_ <= 0) return;
  kill(-pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  status_ = status;
  pid_ = -1;
}

int64_t RssKb(pid_t pid) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status")
                            : "/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      in >> kb;
      return kb;
    }
    std::getline(in, key);
  }
  return -1;
}

std::string BinaryPath(const std::string& name) {
  const char* dir = std::getenv("PACER_BIN_DIR");
  return std::string(dir && *dir ? dir : ".") + "/" + name;
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string LiveWal(const std::string& rocksdb_dir) {
  std::string newest;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(rocksdb_dir, ec)) {
    const std::string name = e.path().filename().string();
    // WAL names are fixed-width numbers ("000012.log"): the greatest name is the newest.
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".log") == 0 && e.path().string() > newest) {
      newest = e.path().string();
    }
  }
  return newest;
}

}  // namespace pacer::testing
