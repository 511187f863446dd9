// Wall-clock timers for the iteration line and the per-phase time breakdown.
#pragma once

#include <chrono>

namespace megatron {

class Timer {
 public:
  void start() { t0_ = Clock::now(); }
  // Seconds since start().
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_ = Clock::now();
};

}  // namespace megatron
