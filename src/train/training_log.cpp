// The log interval's bookkeeping and Megatron's iteration line and TensorBoard tags.
#include "train/training_log.h"

#include <algorithm>
#include <cmath>

#include "core/logging.h"
#include "train/memory_report.h"

namespace megatron {

void TrainingLog::add(const Step& s) {
  if (s.skipped) {
    ++skipped_;
    if (!std::isfinite(s.loss)) ++nan_;
  } else if (s.terms) {
    for (const LossTerms::Term& t : s.terms->terms()) {
      auto at = std::find_if(sums_.begin(), sums_.end(),
                             [&](const auto& e) { return e.first == t.name; });
      if (at == sums_.end()) {
        sums_.emplace_back(t.name, t.value());
      } else {
        at->second += t.value();
      }
    }
  }
  seconds_ += s.seconds;
  samples_ += s.batch_size;
  ++iters_;
}

TrainingLog::Values TrainingLog::interval_means() const {
  Values means;
  if (iters_ <= skipped_) return means;  // the same on every rank: skips are agreed
  const auto ok = static_cast<double>(iters_ - skipped_);
  for (const auto& [name, sum] : sums_) means.emplace_back(name, sum / ok);
  return means;
}

std::string TrainingLog::close_interval(const Step& s, const Values& means) {
  const double ms = seconds_ / static_cast<double>(iters_) * 1000.0;
  const auto samples = static_cast<double>(samples_);
  const double tflops = o_.flops_per_sample * samples / seconds_ / 1e12;
  std::string line =
      strprintf(" [%s] iteration %8ld/%8ld | consumed samples: %12ld |", timestamp().c_str(),
                static_cast<long>(s.iteration), static_cast<long>(o_.train_iters),
                static_cast<long>(s.consumed_samples));
  if (s.skipped_samples > 0) {
    line += strprintf(" skipped samples: %12ld |", static_cast<long>(s.skipped_samples));
  }
  line += strprintf(
      " elapsed time per iteration (ms): %.1f | throughput per GPU (TFLOP/s/GPU): %.3f | "
      "learning rate: %.6E |",
      ms, tflops, s.next_lr);
  if (s.next_decoupled_lr == s.next_decoupled_lr) {
    line += strprintf(" decoupled learning rate: %.6E |", s.next_decoupled_lr);
  }
  line += strprintf(" global batch size: %5ld |", static_cast<long>(s.batch_size));
  if (iters_ > skipped_) {
    for (const auto& [name, value] : means) line += strprintf(" %s: %.6E |", name.c_str(), value);
  }
  line += strprintf(" loss scale: %.1f |", s.loss_scale);
  if (!s.skipped) line += strprintf(" grad norm: %.3f |", s.grad_norm);
  if (s.num_zeros >= 0) line += strprintf(" num zeros: %ld |", static_cast<long>(s.num_zeros));
  if (s.params_norm == s.params_norm) line += strprintf(" params norm: %.3f |", s.params_norm);
  if (s.max_attention_logit == s.max_attention_logit) {
    line += strprintf(" max attention logit: %.6E |", s.max_attention_logit);
  }
  line += strprintf(
      " number of skipped iterations: %3ld | number of nan iterations: %3ld | tokens per "
      "second: %.1f | model FLOPs utilisation: %.1f%% |",
      static_cast<long>(skipped_), static_cast<long>(nan_),
      samples * static_cast<double>(o_.seq_length) / seconds_,
      100.0 * tflops * 1e3 / o_.peak_gflops);
  last_seconds_per_iteration_ = ms / 1000.0;
  last_tflops_ = tflops;
  sums_.clear();
  seconds_ = 0;
  iters_ = skipped_ = nan_ = samples_ = 0;
  return line;
}

void TrainingLog::tensorboard(TensorBoardWriter& tb, const Step& s) const {
  // Megatron's tags, in its order; each also "vs samples" (x: consumed samples).
  Values by_iter, by_samples;
  auto both = [&](const std::string& tag, double v) {
    by_iter.emplace_back(tag, v);
    by_samples.emplace_back(tag + " vs samples", v);
  };
  both("learning-rate", s.next_lr);
  if (s.next_decoupled_lr == s.next_decoupled_lr) {
    by_iter.emplace_back("decoupled-learning-rate", s.next_decoupled_lr);
  }
  if (s.skipped_samples > 0) {
    by_iter.emplace_back("skipped-train-samples", static_cast<double>(s.skipped_samples));
  }
  both("batch-size", static_cast<double>(s.batch_size));
  if (s.terms) {
    for (const LossTerms::Term& t : s.terms->terms()) both(t.name, t.value());
  }
  if (o_.loss_scale_to_tensorboard) both("loss-scale", s.loss_scale);
  if (o_.world_size > 0) both("world-size", static_cast<double>(o_.world_size));
  // A skipped (fp16 overflow) iteration has no gradient norm (nor zeros) to plot.
  if (!s.skipped) both("grad-norm", s.grad_norm);
  if (s.num_zeros >= 0) both("num-zeros", static_cast<double>(s.num_zeros));
  if (s.params_norm == s.params_norm) both("params-norm", s.params_norm);
  // Megatron's tag (by iteration only).
  if (s.max_attention_logit == s.max_attention_logit) {
    by_iter.emplace_back("max_attention_logit", s.max_attention_logit);
  }
  if (o_.memory_to_tensorboard) {
    // The CPU's counterparts of the CUDA allocator's statistics: the resident set now (what the
    // process holds) and its peak.
    by_iter.emplace_back("mem-reserved-bytes", resident_mb() * 1048576.0);
    by_iter.emplace_back("mem-max-allocated-bytes", max_resident_mb() * 1048576.0);
  }
  tb.add_scalars(by_iter, s.iteration);
  tb.add_scalars(by_samples, s.consumed_samples);
}

void TrainingLog::interval_tensorboard(TensorBoardWriter& tb, int64_t iteration) const {
  if (!o_.timers_to_tensorboard) return;
  tb.add_scalars({{"iteration-time", last_seconds_per_iteration_}, {"throughput", last_tflops_}},
                 iteration);
}

}  // namespace megatron
