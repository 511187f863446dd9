// Watchdog: the per-rank hang detector behind --distributed-timeout-minutes.
//
// A collective whose peer died or diverged (a rank that skipped a call, a lost connection) never
// returns, and neither does the job: it sits on its allocation until the scheduler's wall-clock
// limit. Megatron bounds that with the process-group timeout; here a background thread checks that
// the main thread reports progress (enter()) at least every `timeout_seconds` while armed, and
// when it does not, prints one line saying which rank, phase and iteration stalled and calls
// `on_expiry` (the trainer's aborts the whole MPI job, which a rank stuck inside a collective
// cannot do itself). It fires at most once.
//
// It is not a timeout on a single call (it cannot interrupt anything; it only notices), and not a
// profiler: the phase is a label for the message. Detection lags the deadline by at most one check
// period, min(1 s, timeout / 4).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace megatron {

class Watchdog {
 public:
  // timeout_seconds <= 0: disabled, no thread, enter() and disarm() do nothing. Starts disarmed.
  Watchdog(double timeout_seconds, int rank, std::function<void()> on_expiry);
  // Stops and joins the thread without waiting out a check period.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Progress: (re)arms the deadline to now + timeout, for `phase` (a string literal, or any string
  // that outlives the watchdog: the pointer is kept) at `iteration`.
  void enter(const char* phase, int64_t iteration);
  // No deadline until the next enter() (e.g. while saving a checkpoint of unknown duration).
  void disarm();
  // A new limit from now on (> 0; starts the thread of a disabled watchdog), named by `flag` in
  // the message: Megatron core 0.19's --distributed-timeout-seconds-after-init, which replaces
  // the process groups' timeout once the first iteration is done.
  void set_timeout(double seconds, const char* flag);

 private:
  using Clock = std::chrono::steady_clock;
  void run();

  double timeout_seconds_;  // guarded by mutex_ once the thread runs
  const char* limit_flag_ = "--distributed-timeout-minutes";
  const int rank_;
  const std::function<void()> on_expiry_;
  std::mutex mutex_;
  std::condition_variable wake_;
  // Guarded by mutex_.
  bool stop_ = false;
  bool armed_ = false;
  Clock::time_point last_progress_;
  const char* phase_ = "";
  int64_t iteration_ = 0;
  std::thread thread_;  // last: it starts once the members above are initialised
};

}  // namespace megatron
