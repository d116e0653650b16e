// Minimal leveled logging to stderr: PACER_LOG(INFO) << "text";
//
// Lines look like `I1130 10:41:17.123 pacerd sharding_service.cc:120] text`. The level comes
// from PACER_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default INFO). Each line is written with
// one write(2), so lines from threads do not interleave. FATAL logs and aborts: use it only for
// broken invariants (docs/style.md §3).
#pragma once

#include <sstream>
#include <string_view>

namespace pacer {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Sets the program name shown in each line (defaults to "pacer").
void SetLogProgramName(std::string_view name);
bool LogEnabled(LogLevel level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace pacer

#define PACER_LOG_LEVEL_DEBUG ::pacer::LogLevel::kDebug
#define PACER_LOG_LEVEL_INFO ::pacer::LogLevel::kInfo
#define PACER_LOG_LEVEL_WARNING ::pacer::LogLevel::kWarning
#define PACER_LOG_LEVEL_ERROR ::pacer::LogLevel::kError
#define PACER_LOG_LEVEL_FATAL ::pacer::LogLevel::kFatal

#define PACER_LOG(level)                                 \
  if (!::pacer::LogEnabled(PACER_LOG_LEVEL_##level)) {   \
  } else                                                 \
    ::pacer::LogMessage(PACER_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

// Crashes with a message when an invariant is broken.
#define PACER_CHECK(cond)                                                      \
  if (cond) {                                                                  \
  } else                                                                       \
    ::pacer::LogMessage(::pacer::LogLevel::kFatal, __FILE__, __LINE__).stream() \
        << "Check failed: " #cond " "
