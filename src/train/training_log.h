// TrainingLog: Megatron's training_log for one run: the log interval's bookkeeping, the
// iteration line, and the per-iteration TensorBoard points.
//
//  [date] iteration N/ T | consumed samples: ... | [skipped samples: ... |] elapsed time per
//  iteration (ms): ... | throughput per GPU (TFLOP/s/GPU): ... | learning rate: ... |
//  [decoupled learning rate: ... |] global batch size: ... | <each loss term>: ... | loss
//  scale: ... | grad norm: ... | [num zeros: ... |] [params norm: ... |] number of skipped
//  iterations: ... | number of nan iterations: ... | tokens per second: ... | model FLOPs
//  utilisation: ...% |
//
// (the bracketed fields with --decrease-batch-size-if-needed, --decoupled-lr,
// --log-num-zeros-in-grad, --log-params-norm, as Megatron prints them).
//
// Throughput, tokens per second and MFU are the interval's samples over its time (Megatron sums
// each iteration's FLOPs since the last log line). As Megatron's: each loss term averages the
// interval's successful iterations (all terms are left out when there were none), the grad norm is
// the last iteration's (left out when it was skipped), the counters count the interval's skipped
// and NaN-loss iterations. Not the printer: the trainer decides which rank prints (and relays the
// loss terms to it).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "models/model_chunk.h"
#include "train/tensorboard_writer.h"

namespace megatron {

class TrainingLog {
 public:
  static constexpr double kUnsetValue = std::numeric_limits<double>::quiet_NaN();
  // What one training iteration reports.
  struct Step {
    int64_t iteration = 0;
    const LossTerms* terms = nullptr;  // reduced over data-parallel ranks (last stage), or empty
    double loss = 0;                   // the objective's value (for the NaN count)
    double grad_norm = 0;
    bool skipped = false;  // fp16 overflow: no update
    double seconds = 0;    // the iteration's wall time
    double next_lr = 0;    // the learning rate the scheduler set after this step
    double loss_scale = 1;
    int64_t consumed_samples = 0;
    int64_t batch_size = 0;  // the samples this iteration ran (the global batch, or its ramp-up)
    int64_t skipped_samples = 0;             // so far, left out by --decrease-batch-size-if-needed
    double next_decoupled_lr = kUnsetValue;  // --decoupled-lr's after this step
    int64_t num_zeros = -1;                  // of the gradients (-1: not counted)
    double params_norm = kUnsetValue;        // of the weights after the step
    // --qk-clip / --log-max-attention-logit: the step's largest attention score
    double max_attention_logit = kUnsetValue;
  };
  // What the run logs besides the fixed fields.
  struct Options {
    int64_t train_iters = 0;
    int64_t seq_length = 0;
    // This rank's share of the model's FLOPs per sample (an iteration's are its batch size times
    // this: batches vary under a ramp-up); peak_gflops: the MFU denominator.
    double flops_per_sample = 0;
    double peak_gflops = 0;
    bool loss_scale_to_tensorboard = true;  // --no-log-loss-scale-to-tensorboard
    bool timers_to_tensorboard = false;     // iteration-time and throughput
    bool memory_to_tensorboard = false;     // resident memory and its peak
    int64_t world_size = 0;                 // > 0: written as world-size
  };
  using Values = std::vector<std::pair<std::string, double>>;

  explicit TrainingLog(const Options& options) : o_(options) {}

  // Adds an iteration to the current interval.
  void add(const Step& s);
  // The interval's mean of each loss term over its successful iterations (empty on a rank
  // without the loss, or when every iteration was skipped).
  Values interval_means() const;
  // The iteration line closing the interval at s, with the loss terms `means` (as relayed to the
  // printing rank); starts a new interval.
  std::string close_interval(const Step& s, const Values& means);
  // The interval's iteration count so far (the timers report per iteration of it).
  int64_t interval_iterations() const { return iters_; }
  // Seconds per iteration of the open interval.
  double interval_seconds_per_iteration() const {
    return iters_ > 0 ? seconds_ / static_cast<double>(iters_) : 0.0;
  }
  // Megatron's per-iteration TensorBoard scalars of s (by iteration and by consumed samples).
  void tensorboard(TensorBoardWriter& tb, const Step& s) const;
  // After close_interval, with --log-timers-to-tensorboard: the interval's iteration-time
  // (seconds) and throughput (TFLOP/s per rank), as Megatron writes them at each log line.
  void interval_tensorboard(TensorBoardWriter& tb, int64_t iteration) const;

 private:
  Options o_;
  Values sums_;  // per loss term, the sum of its values over successful iterations
  double seconds_ = 0;
  int64_t iters_ = 0, skipped_ = 0, nan_ = 0, samples_ = 0;
  double last_seconds_per_iteration_ = 0, last_tflops_ = 0;  // of the last closed interval
};

}  // namespace megatron
