// The watchdog thread: a periodic check of the time since the last enter().
#include "train/watchdog.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "core/error.h"

namespace megatron {

Watchdog::Watchdog(double timeout_seconds, int rank, std::function<void()> on_expiry)
    : timeout_seconds_(timeout_seconds), rank_(rank), on_expiry_(std::move(on_expiry)) {
  MEGATRON_CHECK(!std::isnan(timeout_seconds), "Watchdog: timeout_seconds must be a number, got ",
                 timeout_seconds);
  if (timeout_seconds_ > 0) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void Watchdog::enter(const char* phase, int64_t iteration) {
  if (!thread_.joinable()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  last_progress_ = Clock::now();
  phase_ = phase;
  iteration_ = iteration;
}

void Watchdog::disarm() {
  if (!thread_.joinable()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
}

void Watchdog::set_timeout(double seconds, const char* flag) {
  MEGATRON_CHECK(seconds > 0 && !std::isnan(seconds), flag, " must be positive, got ", seconds);
  if (!thread_.joinable()) {
    timeout_seconds_ = seconds;
    limit_flag_ = flag;
    thread_ = std::thread([this] { run(); });
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timeout_seconds_ = seconds;
    limit_flag_ = flag;
  }
  wake_.notify_one();  // the next check period follows the new limit (within a second)
}

void Watchdog::run() {
  // A quarter of the timeout bounds the detection lag to 25%; 1 s keeps long timeouts responsive
  // without measurable cost (one wake-up a second).
  auto period = [this] {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::min(1.0, timeout_seconds_ / 4)));
  };
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period(), [this] { return stop_; })) {
    if (!armed_) continue;
    const double stalled = std::chrono::duration<double>(Clock::now() - last_progress_).count();
    if (stalled <= timeout_seconds_) continue;
    const char* phase = phase_;
    const int64_t iteration = iteration_;
    const double limit = timeout_seconds_;
    const char* flag = limit_flag_;
    const bool minutes = std::string(flag) == "--distributed-timeout-minutes";
    // Outside the lock: on_expiry may not return (MPI_Abort), and the main thread, if it is not
    // hung after all, must not block in enter() behind it.
    lock.unlock();
    std::fprintf(stderr,
                 "[rank %d] watchdog: no progress for %.1f s (limit %s = %g %s) in phase '%s' at "
                 "iteration %lld: a collective or a step hangs; aborting the job\n",
                 rank_, stalled, flag, minutes ? limit / 60 : limit, minutes ? "min" : "s", phase,
                 static_cast<long long>(iteration));
    std::fflush(stderr);
    if (on_expiry_) on_expiry_();
    return;  // fires once: the job is being aborted
  }
}

}  // namespace megatron
