// Weight/optimizer estimate and resident-memory measurement (Linux: /proc/self/statm, getrusage).
#include "train/memory_report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/logging.h"

namespace megatron {

std::string theoretical_memory_line(int64_t params, DType compute_dtype, int64_t shards,
                                    ShardedState sharded, int64_t activation_bytes,
                                    int64_t fp8_weights, int64_t frozen) {
  // An FP8 primary weight's compute copy is its one-byte code: one byte less than the 16-bit
  // copy, shared like the compute copy.
  const double fp8_saving = is_half(compute_dtype) && fp8_weights > 0
                                ? static_cast<double>(fp8_weights) *
                                      (sharded.compute ? 1.0 / static_cast<double>(shards) : 1.0)
                                : 0.0;
  const double frozen_bytes =
      static_cast<double>(frozen) * (4.0 + (is_half(compute_dtype) ? 2.0 : 0.0));
  const double mb = (static_cast<double>(params - frozen) *
                         weight_and_optimizer_bytes_per_param(compute_dtype, shards, sharded) -
                     fp8_saving + frozen_bytes) /
                    1048576.0;
  const double act = static_cast<double>(activation_bytes) / 1048576.0;
  return strprintf(
      "Theoretical memory footprints: weight and optimizer=%.2f MB, activation=%.2f MB, "
      "total=%.2f MB",
      mb, act, mb + act);
}

double resident_mb() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  const int got = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  if (got != 2) return 0;
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
         1048576.0;
}

double max_resident_mb() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  // Linux reports KiB. Its high-water mark is only updated at some points (unmaps, exits), so
  // it can trail the current resident set: the peak is at least what is resident now.
  return std::max(static_cast<double>(u.ru_maxrss) / 1024.0, resident_mb());
}

}  // namespace megatron
