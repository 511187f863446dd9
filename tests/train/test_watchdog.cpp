// Watchdog: one line and one on_expiry call after a stall, silence while enter() keeps coming or
// while disarmed, no thread when disabled, and a destructor that does not wait out a period.
//
// Timing margins: each quiet test stays at least 3x under its timeout between enter() calls and
// each firing test waits up to 5 s for the firing, so a loaded 2-core CI machine neither fakes a
// stall nor misses one.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "train/watchdog.h"

namespace megatron {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Threads of this process (Linux).
int thread_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

// Waits until `calls` is non-zero or `limit` passed.
void wait_for_call(const std::atomic<int>& calls, std::chrono::seconds limit) {
  const auto end = Clock::now() + limit;
  while (calls.load() == 0 && Clock::now() < end) std::this_thread::sleep_for(milliseconds(5));
}

TEST(Watchdog, FiresOnceWithPhaseAndIteration) {
  std::atomic<int> calls{0};
  testing::internal::CaptureStderr();
  {
    Watchdog watchdog(0.1, 3, [&] { ++calls; });
    watchdog.enter("train-step", 7);
    wait_for_call(calls, std::chrono::seconds(5));
    // After expiry it stays quiet even when progress resumes.
    watchdog.enter("train-step", 8);
    std::this_thread::sleep_for(milliseconds(400));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(err.rfind("[rank 3] watchdog: no progress for ", 0), 0u) << err;
  EXPECT_NE(err.find("--distributed-timeout-minutes"), std::string::npos) << err;
  EXPECT_NE(err.find("in phase 'train-step' at iteration 7:"), std::string::npos) << err;
}

// --distributed-timeout-seconds-after-init: a tighter limit set later fires on a stall that the
// first one would have let pass, names its flag; a disabled watchdog starts with it.
TEST(Watchdog, SetTimeoutTightensTheLimit) {
  for (const double first : {60.0, 0.0}) {
    std::atomic<int> calls{0};
    testing::internal::CaptureStderr();
    {
      Watchdog watchdog(first, 1, [&] { ++calls; });
      watchdog.set_timeout(0.1, "--distributed-timeout-seconds-after-init");
      watchdog.enter("train-step", 2);
      wait_for_call(calls, std::chrono::seconds(5));
    }
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(calls.load(), 1) << first;
    EXPECT_NE(err.find("(limit --distributed-timeout-seconds-after-init = 0.1 s)"),
              std::string::npos)
        << err;
  }
}

TEST(Watchdog, RegularProgressKeepsItQuiet) {
  std::atomic<int> calls{0};
  testing::internal::CaptureStderr();
  {
    Watchdog watchdog(0.3, 0, [&] { ++calls; });
    for (int it = 1; it <= 30; ++it) {  // 0.9 s in all, 3x the timeout
      watchdog.enter("train-step", it);
      std::this_thread::sleep_for(milliseconds(30));
    }
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(calls.load(), 0);
}

TEST(Watchdog, DisarmKeepsItQuietUntilTheNextEnter) {
  std::atomic<int> calls{0};
  testing::internal::CaptureStderr();
  {
    Watchdog watchdog(0.1, 1, [&] { ++calls; });
    watchdog.enter("save-checkpoint", 4);
    watchdog.disarm();
    std::this_thread::sleep_for(milliseconds(500));
    EXPECT_EQ(calls.load(), 0);
    // Re-armed, the same watchdog fires: the silence above was the disarm, not a dead thread.
    watchdog.enter("train-step", 5);
    wait_for_call(calls, std::chrono::seconds(5));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_NE(err.find("in phase 'train-step' at iteration 5:"), std::string::npos) << err;
}

TEST(Watchdog, NotArmedBeforeTheFirstEnter) {
  std::atomic<int> calls{0};
  {
    Watchdog watchdog(0.1, 0, [&] { ++calls; });
    std::this_thread::sleep_for(milliseconds(400));
  }
  EXPECT_EQ(calls.load(), 0);
}

TEST(Watchdog, ZeroOrNegativeTimeoutDisablesIt) {
  std::atomic<int> calls{0};
  const int threads = thread_count();
  {
    Watchdog zero(0, 0, [&] { ++calls; });
    Watchdog negative(-1, 0, [&] { ++calls; });
    EXPECT_EQ(thread_count(), threads);
    zero.enter("train-step", 1);
    negative.enter("train-step", 1);
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_EQ(calls.load(), 0);
  // The check above can see a thread: an enabled watchdog has one.
  Watchdog enabled(10, 0, [&] { ++calls; });
  EXPECT_EQ(thread_count(), threads + 1);
}

TEST(Watchdog, DestructorReturnsPromptly) {
  auto watchdog = std::make_unique<Watchdog>(10, 0, [] {});
  watchdog->enter("train-step", 1);
  std::this_thread::sleep_for(milliseconds(50));  // the thread is inside its 1 s wait now
  const auto start = Clock::now();
  watchdog.reset();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 0.5);
}

}  // namespace
}  // namespace megatron
