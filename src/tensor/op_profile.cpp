// The op profile's counters: one per category, added to by the outermost OpTimer of a thread.
#include "tensor/op_profile.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

namespace megatron {

namespace {

std::atomic<bool> g_enabled{false};
// Nanoseconds per category. Atomic although ops run on one thread: tests and tools may not.
std::atomic<int64_t> g_nanos[kOpCategories];
thread_local int t_depth = 0;
// Nanoseconds per op name, while profiling is on (a map behind a lock: profiled ops wait for
// their device anyway, so the lookup costs nothing measurable).
std::mutex g_by_op_mutex;
std::map<std::string, int64_t>& by_op() {
  static std::map<std::string, int64_t> m;
  return m;
}
std::map<std::string, ShapeTime>& by_shape() {
  static std::map<std::string, ShapeTime> m;
  return m;
}

}  // namespace

const char* op_category_name(OpCategory c) {
  switch (c) {
    case OpCategory::kGemm:
      return "gemm";
    case OpCategory::kAttention:
      return "attention";
    case OpCategory::kNormElementwise:
      return "norms and elementwise";
    case OpCategory::kCrossEntropy:
      return "cross entropy";
    case OpCategory::kOptimizer:
      return "optimizer";
    case OpCategory::kStateSpace:
      return "state space";
  }
  return "?";
}

void set_op_profiling(bool on) {
  g_enabled.store(on, std::memory_order_relaxed);
}
bool op_profiling() {
  return g_enabled.load(std::memory_order_relaxed);
}

double op_seconds(OpCategory c) {
  return static_cast<double>(g_nanos[static_cast<int>(c)].load(std::memory_order_relaxed)) * 1e-9;
}

std::vector<std::pair<std::string, double>> op_seconds_by_op() {
  std::vector<std::pair<std::string, double>> out;
  {
    const std::lock_guard<std::mutex> lock(g_by_op_mutex);
    for (const auto& [name, ns] : by_op()) out.emplace_back(name, static_cast<double>(ns) * 1e-9);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::vector<std::pair<std::string, ShapeTime>> gemm_times_by_shape() {
  const std::lock_guard<std::mutex> lock(g_by_op_mutex);
  return {by_shape().begin(), by_shape().end()};
}

OpTimer::OpTimer(OpCategory c, const char* op) : category_(c), op_(op) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  nested_ = true;
  if (t_depth++ > 0) return;  // inside another op: the outer one counts the time
  active_ = true;
  start_ = std::chrono::steady_clock::now();
}

OpTimer::~OpTimer() {
  if (!nested_) return;
  --t_depth;
  if (!active_) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  g_nanos[static_cast<int>(category_)].fetch_add(ns, std::memory_order_relaxed);
  if (op_) {
    const std::lock_guard<std::mutex> lock(g_by_op_mutex);
    by_op()[op_] += ns;
  }
  if (!shape_.empty()) {
    const std::lock_guard<std::mutex> lock(g_by_op_mutex);
    ShapeTime& t = by_shape()[shape_];
    t.seconds += static_cast<double>(ns) * 1e-9;
    t.calls += 1;
    t.flops += flops_;
  }
}

}  // namespace megatron
