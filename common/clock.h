// Time for Pacer: every component reads time through an injected Clock (docs/style.md §5).
//
// RealClock is the only place that reads the system clock. SimulatedClock advances only when
// told, so tests and the simulator run the real components on a logical timeline.
// Both are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace pacer {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch (wall time; used for deadlines and audit records).
  virtual int64_t NowMs() const = 0;
  // Monotonic nanoseconds (never goes back; used for durations).
  virtual int64_t MonotonicNs() const = 0;
  double NowSeconds() const { return static_cast<double>(NowMs()) / 1000.0; }
};

class RealClock final : public Clock {
 public:
  int64_t NowMs() const override;
  int64_t MonotonicNs() const override;
  // The process-wide real clock.
  static RealClock* Get();
};

class SimulatedClock final : public Clock {
 public:
  explicit SimulatedClock(int64_t start_ms = 1'700'000'000'000) : now_ns_(start_ms * 1'000'000) {}
  int64_t NowMs() const override { return now_ns_.load(std::memory_order_acquire) / 1'000'000; }
  int64_t MonotonicNs() const override { return now_ns_.load(std::memory_order_acquire); }
  void AdvanceMs(int64_t ms) { now_ns_.fetch_add(ms * 1'000'000, std::memory_order_acq_rel); }
  void AdvanceNs(int64_t ns) { now_ns_.fetch_add(ns, std::memory_order_acq_rel); }
  void SetMs(int64_t ms) { now_ns_.store(ms * 1'000'000, std::memory_order_release); }

 private:
  std::atomic<int64_t> now_ns_;
};

// Measures elapsed monotonic time on a Clock.
class Stopwatch {
 public:
  explicit Stopwatch(const Clock* clock) : clock_(clock), start_(clock->MonotonicNs()) {}
  int64_t ElapsedNs() const { return clock_->MonotonicNs() - start_; }
  double ElapsedSeconds() const { return static_cast<double>(ElapsedNs()) / 1e9; }
  void Reset() { start_ = clock_->MonotonicNs(); }

 private:
  const Clock* clock_;
  int64_t start_;
};

}  // namespace pacer
