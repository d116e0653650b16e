#include "common/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

namespace pacer {
namespace {

std::string& ProgramName() {
  static std::string name = "pacer";
  return name;
}

LogLevel MinLevel() {
  static const LogLevel level = [] {
    const char* env = std::getenv("PACER_LOG_LEVEL");
    if (env == nullptr) return LogLevel::kInfo;
    std::string v(env);
    if (v == "DEBUG" || v == "debug") return LogLevel::kDebug;
    if (v == "WARNING" || v == "warning") return LogLevel::kWarning;
    if (v == "ERROR" || v == "error") return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}

}  // namespace

void SetLogProgramName(std::string_view name) { ProgramName() = std::string(name); }

bool LogEnabled(LogLevel level) { return level >= MinLevel(); }

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static const char kLetters[] = {'D', 'I', 'W', 'E', 'F'};
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  localtime_r(&tv.tv_sec, &t);
  char head[64];
  std::snprintf(head, sizeof(head), "%c%02d%02d %02d:%02d:%02d.%03d ",
                kLetters[static_cast<int>(level)], t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min,
                t.tm_sec, static_cast<int>(tv.tv_usec / 1000));
  const char* base = std::strrchr(file, '/');
  stream_ << head << ProgramName() << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string s = stream_.str();
  // One write per line: atomic with respect to other threads' lines for pipes and files.
  ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace pacer
