// BatchSchedule: the global batch size of every iteration, as Megatron's num-microbatches
// calculator decides it from the samples consumed so far.
//
// Constant: every iteration takes --global-batch-size samples. With --rampup-batch-size START
// INCR SAMPLES the batch starts at START and grows by INCR each time another
// SAMPLES / ((GLOBAL - START) / INCR) samples have been consumed, reaching GLOBAL once more than
// SAMPLES have (the calculator's int(consumed / samples_per_increment) steps). Because the batch
// is a function of the consumed samples alone, a run resumed from a checkpoint in the middle of a
// ramp-up takes exactly the batches the uninterrupted run would have.
//
// With --decrease-batch-size-if-needed a batch that does not split into micro-batch x
// data-parallel pieces is rounded down to one that does (the "running" batch); the samples left
// out are counted as skipped. Without it such a batch is refused at start-up (check()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megatron {

struct BatchRampup {
  int64_t start = 0;      // global batch size of the first iteration
  int64_t increment = 0;  // growth per step
  int64_t samples = 0;    // samples over which the batch grows to the final global batch
};

// --rampup-batch-size's three values; an error names the flag.
BatchRampup parse_rampup_batch_size(const std::vector<std::string>& values);

class BatchSchedule {
 public:
  struct Batch {
    int64_t global = 0;        // the schedule's global batch size at this point
    int64_t running = 0;       // the one the iteration runs (global, or rounded down)
    int64_t microbatches = 0;  // running / (micro batch x data parallel)
  };

  // Throws InvalidArgument naming the flags when the ramp-up does not reach the global batch in
  // whole increments, or some batch of the schedule does not split into micro-batch x
  // data-parallel pieces (without decrease_if_needed).
  BatchSchedule(int64_t global_batch_size, int64_t micro_batch_size, int64_t data_parallel_size,
                bool decrease_if_needed, std::optional<BatchRampup> rampup);

  // The batch of the iteration that starts after `consumed` training samples.
  Batch at(int64_t consumed) const;
  // Every distinct batch the schedule runs, smallest first (the ramp-up's steps, then the final).
  std::vector<Batch> all_batches() const;
  // Megatron's update_train_iters: the iterations that --train-samples makes (the ramp-up
  // iterations one by one, then whole final batches; a partial last batch is dropped).
  int64_t iterations_for(int64_t train_samples) const;
  // The samples the first `iterations` iterations consume (their running batches).
  int64_t samples_in(int64_t iterations) const;
  bool ramps_up() const { return rampup_.has_value(); }
  // The start-up lines Megatron's calculator prints.
  std::string describe() const;

 private:
  Batch batch_of(int64_t global) const;

  int64_t global_, micro_, dp_;
  bool decrease_;
  std::optional<BatchRampup> rampup_;
  double samples_per_increment_ = 0;
};

}  // namespace megatron
