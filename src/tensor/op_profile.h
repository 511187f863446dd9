// Op profile: wall-clock seconds spent inside the ops of each category, for the per-step time
// breakdown of --timing-log-level 2 (GEMMs, attention, norms and elementwise, cross entropy,
// optimizer). Each public op opens an OpTimer for its category; nested ops count once, in the
// outermost one. Off by default: a disabled OpTimer costs one relaxed load.
//
// Process-wide counters, like the tensor memory statistics: ops are called from the main thread
// (OpenMP teams run inside them), so the times are wall-clock time of that thread. It is not a
// profiler: no per-call attribution (perf does that); GEMMs alone are also kept by shape, because
// their speed depends on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace megatron {

// kStateSpace: a hybrid Mamba model's convolution, scan and gated norm
// (transformer/mamba/ssm_kernels.h).
enum class OpCategory : uint8_t {
  kGemm,
  kAttention,
  kNormElementwise,
  kCrossEntropy,
  kOptimizer,
  kStateSpace
};
inline constexpr int kOpCategories = 6;
// "gemm", "attention", "norms and elementwise", "cross entropy", "optimizer", "state space".
const char* op_category_name(OpCategory c);

void set_op_profiling(bool on);
bool op_profiling();
// Seconds inside ops of category c since the start of the process (while profiling was on).
double op_seconds(OpCategory c);
// The same time by op (the public op's name, e.g. "layernorm_backward"), largest first: what a
// category's time is made of.
std::vector<std::pair<std::string, double>> op_seconds_by_op();

// GEMM time by shape, keyed "MxNxK XY dtype" (XY: N or T for A and B; "+=" when accumulating).
struct ShapeTime {
  double seconds = 0;
  int64_t calls = 0;
  double flops = 0;  // 2 m n k per call, summed
};
std::vector<std::pair<std::string, ShapeTime>> gemm_times_by_shape();

class OpTimer {
 public:
  // op: the op's name (a string literal such as __func__), or null.
  explicit OpTimer(OpCategory c, const char* op = nullptr);
  ~OpTimer();
  // Whether this timer is the outermost one while profiling (the one that adds its time).
  bool active() const { return active_; }
  // Also adds this call's time under a GEMM shape (gemm_times_by_shape); call when active().
  void set_gemm_shape(std::string key, double flops) {
    shape_ = std::move(key);
    flops_ = flops;
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  bool nested_ = false;  // counted in this thread's depth (profiling was on)
  bool active_ = false;  // the outermost timer: adds its time
  OpCategory category_;
  const char* op_;
  std::string shape_;
  double flops_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace megatron
