// Interval timers and their (min, max) report across ranks.
#include "train/step_timers.h"

#include <algorithm>

#include "core/logging.h"

namespace megatron {

void StepTimers::add(const std::string& name, double seconds) {
  for (auto& [n, s] : entries_) {
    if (n == name) {
      s += seconds;
      return;
    }
  }
  entries_.emplace_back(name, seconds);
}

std::vector<StepTimers::Extremes> StepTimers::reduce(ProcessGroup& world,
                                                     int64_t iterations) const {
  // One max-reduction gives both extremes: max of t and max of -t.
  const auto n = static_cast<int64_t>(entries_.size());
  Tensor t = Tensor::empty({2 * n}, DType::kF64);
  double* v = t.data<double>();
  const double scale = 1000.0 / static_cast<double>(std::max<int64_t>(iterations, 1));
  for (int64_t i = 0; i < n; ++i) {
    v[i] = entries_[i].second * scale;
    v[n + i] = -v[i];
  }
  world.all_reduce(t, ReduceOp::kMax);
  std::vector<Extremes> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(Extremes{entries_[i].first, -v[n + i], v[i]});
  return out;
}

std::vector<std::string> StepTimers::format(const std::vector<Extremes>& times) {
  std::vector<std::string> lines{"(min, max) time across ranks (ms):"};
  for (const Extremes& t : times) {
    std::string name = t.name + " ";
    if (name.size() < 48) name += std::string(48 - name.size(), '.');
    lines.push_back(strprintf("    %s: (%.2f, %.2f)", name.c_str(), t.min_ms, t.max_ms));
  }
  return lines;
}

}  // namespace megatron
