// MoeAuxTracker: the load-balancing and z-losses of every MoE layer of a step, as Megatron's
// aux-losses tracker keeps them: per name ("load_balancing_loss", "seq_load_balancing_loss",
// "z_loss") one value per layer, the loss divided by its coefficient, summed over the step's
// micro-batches. The trainer reduces them over the ranks (Trainer::moe_loss_terms) and clears
// them after each step. Not thread-safe: one rank's forward/backward runs on one thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace megatron {

class MoeAuxTracker {
 public:
  explicit MoeAuxTracker(int64_t num_layers) : num_layers_(num_layers) {}

  void add(const std::string& name, int64_t layer, double value) {
    std::vector<double>& v = values_[name];
    v.resize(static_cast<size_t>(num_layers_), 0.0);
    v[static_cast<size_t>(layer)] += value;
  }
  // Per name, [num_layers] (layers this rank does not hold stay 0).
  const std::map<std::string, std::vector<double>>& values() const { return values_; }
  void clear() { values_.clear(); }
  int64_t num_layers() const { return num_layers_; }

 private:
  int64_t num_layers_;
  std::map<std::string, std::vector<double>> values_;
};

}  // namespace megatron
