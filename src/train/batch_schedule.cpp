// Megatron's ConstantNumMicroBatchesCalculator and RampupBatchsizeNumMicroBatchesCalculator, and
// update_train_iters, on plain integers.
#include "train/batch_schedule.h"

#include <cstdlib>

#include "core/error.h"
#include "core/logging.h"

namespace megatron {

BatchRampup parse_rampup_batch_size(const std::vector<std::string>& values) {
  MEGATRON_CHECK(values.size() == 3,
                 "--rampup-batch-size takes three values: <start batch size> <batch size "
                 "increment> <ramp-up samples> (e.g. --rampup-batch-size 16 8 300000), got ",
                 values.size());
  int64_t v[3];
  for (int i = 0; i < 3; ++i) {
    const std::string& s = values[static_cast<size_t>(i)];
    char* end = nullptr;
    v[i] = std::strtoll(s.c_str(), &end, 10);
    MEGATRON_CHECK(end != s.c_str() && *end == '\0', "--rampup-batch-size: '", s,
                   "' is not an integer");
  }
  const BatchRampup r{v[0], v[1], v[2]};
  MEGATRON_CHECK(r.start > 0, "--rampup-batch-size: start batch size should be positive, got ",
                 r.start);
  MEGATRON_CHECK(r.increment > 0,
                 "--rampup-batch-size: batch size increment should be positive, got ", r.increment);
  MEGATRON_CHECK(r.samples >= 0,
                 "--rampup-batch-size: ramp-up samples should be non-negative, got ", r.samples);
  return r;
}

BatchSchedule::BatchSchedule(int64_t global_batch_size, int64_t micro_batch_size,
                             int64_t data_parallel_size, bool decrease_if_needed,
                             std::optional<BatchRampup> rampup)
    : global_(global_batch_size),
      micro_(micro_batch_size),
      dp_(data_parallel_size),
      decrease_(decrease_if_needed),
      rampup_(rampup) {
  const int64_t piece = micro_ * dp_;
  if (rampup_) {
    const int64_t diff = global_ - rampup_->start;
    MEGATRON_CHECK(diff >= 0, "--rampup-batch-size: the start batch size (", rampup_->start,
                   ") exceeds --global-batch-size (", global_, ")");
    // Megatron divides by the number of increments; none is no ramp-up.
    MEGATRON_CHECK(diff > 0,
                   "--rampup-batch-size: the start batch size equals --global-batch-size (",
                   global_, "): there is nothing to ramp up; drop --rampup-batch-size");
    MEGATRON_CHECK(diff % rampup_->increment == 0,
                   "--rampup-batch-size: the global batch size interval (", diff,
                   " = --global-batch-size ", global_, " - start ", rampup_->start,
                   ") must be divisible by the batch size increment (", rampup_->increment, ")");
    samples_per_increment_ =
        static_cast<double>(rampup_->samples) / static_cast<double>(diff / rampup_->increment);
  }
  for (const Batch& b : all_batches()) {
    if (decrease_) {
      MEGATRON_CHECK(b.microbatches >= 1, "global batch size ", b.global,
                     " is below micro batch size (", micro_, ") times data parallel size (", dp_,
                     "): even --decrease-batch-size-if-needed leaves no micro-batch");
    } else {
      MEGATRON_CHECK(b.global % piece == 0, "global batch size (", b.global,
                     rampup_ ? ", a step of --rampup-batch-size" : "",
                     ") is not divisible by micro batch size (", micro_,
                     ") times data parallel size (", dp_,
                     "): fix --global-batch-size, --micro-batch-size or --rampup-batch-size, or "
                     "pass --decrease-batch-size-if-needed");
    }
  }
}

BatchSchedule::Batch BatchSchedule::batch_of(int64_t global) const {
  const int64_t piece = micro_ * dp_;
  const int64_t running = decrease_ ? global / piece * piece : global;
  return Batch{global, running, running / piece};
}

BatchSchedule::Batch BatchSchedule::at(int64_t consumed) const {
  if (!rampup_ || consumed > rampup_->samples) return batch_of(global_);
  // int() of the quotient, as the calculator does (truncation of a non-negative float). With 0
  // ramp-up samples Megatron divides 0 by 0; the limit is the start batch for the first step.
  const auto steps =
      samples_per_increment_ > 0
          ? static_cast<int64_t>(static_cast<double>(consumed) / samples_per_increment_)
          : 0;
  return batch_of(rampup_->start + steps * rampup_->increment);
}

std::vector<BatchSchedule::Batch> BatchSchedule::all_batches() const {
  std::vector<Batch> out;
  if (rampup_) {
    for (int64_t g = rampup_->start; g < global_; g += rampup_->increment)
      out.push_back(batch_of(g));
  }
  out.push_back(batch_of(global_));
  return out;
}

int64_t BatchSchedule::iterations_for(int64_t train_samples) const {
  if (!rampup_) return train_samples / global_;
  // Megatron counts the ramp-up phase with the schedule's (not the running) batch sizes.
  int64_t iterations = 0, consumed = 0;
  while (consumed <= rampup_->samples && consumed <= train_samples) {
    consumed += at(consumed).global;
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / global_;
  return iterations;
}

int64_t BatchSchedule::samples_in(int64_t iterations) const {
  int64_t consumed = 0, it = 0;
  for (; it < iterations && rampup_ && consumed <= rampup_->samples; ++it) {
    consumed += at(consumed).running;
  }
  return consumed + (iterations - it) * batch_of(global_).running;
}

std::string BatchSchedule::describe() const {
  if (!rampup_) {
    return strprintf("setting number of microbatches to constant %ld",
                     static_cast<long>(batch_of(global_).microbatches));
  }
  return strprintf(
      "will use batch size rampup starting from global batch size %ld to global batch size %ld "
      "with batch size increments %ld over %ld samples.",
      static_cast<long>(rampup_->start), static_cast<long>(global_),
      static_cast<long>(rampup_->increment), static_cast<long>(rampup_->samples));
}

}  // namespace megatron
