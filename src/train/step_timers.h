// StepTimers: Megatron's --timing-log-level report for one log interval: named wall-clock
// totals on this rank, printed as the (min, max) over ranks of the mean time per iteration.
//
//   (min, max) time across ranks (ms):
//       forward-backward ...............................: (812.31, 815.02)
//
// Every rank must add the same names in the same order (a name that does not apply to a rank is
// added with 0), since report() reduces them position by position. It is not a profiler: the
// phases are the trainer's, timed around whole calls.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"

namespace megatron {

class StepTimers {
 public:
  struct Extremes {
    std::string name;
    double min_ms = 0, max_ms = 0;  // per iteration of the interval, over the ranks
  };

  void add(const std::string& name, double seconds);
  // Collective over `world`: each phase's (min, max) over the ranks, per iteration.
  std::vector<Extremes> reduce(ProcessGroup& world, int64_t iterations) const;
  // Lines of the report (header first).
  static std::vector<std::string> format(const std::vector<Extremes>& times);
  // reduce() then format().
  std::vector<std::string> report(ProcessGroup& world, int64_t iterations) const {
    return format(reduce(world, iterations));
  }
  void reset() { entries_.clear(); }

 private:
  std::vector<std::pair<std::string, double>> entries_;  // first-added order
};

}  // namespace megatron
