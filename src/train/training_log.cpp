// The log interval's bookkeeping and Megatron's iteration line and TensorBoard tags.
#include "train/training_log.h"

#include <algorithm>
#include <cmath>

#include "core/logging.h"

namespace megatron {

TrainingLog::TrainingLog(int64_t train_iters, int64_t seq_length, double flops_per_sample,
                         double peak_gflops)
    : train_iters_(train_iters),
      seq_length_(seq_length),
      flops_per_sample_(flops_per_sample),
      peak_gflops_(peak_gflops) {}

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
  const double tflops = flops_per_sample_ * samples / seconds_ / 1e12;
  std::string line = strprintf(
      " [%s] iteration %8ld/%8ld | consumed samples: %12ld | elapsed time per iteration (ms): "
      "%.1f | throughput per GPU (TFLOP/s/GPU): %.3f | learning rate: %.6E | global batch "
      "size: %5ld |",
      timestamp().c_str(), static_cast<long>(s.iteration), static_cast<long>(train_iters_),
      static_cast<long>(s.consumed_samples), ms, tflops, s.next_lr,
      static_cast<long>(s.batch_size));
  if (iters_ > skipped_) {
    for (const auto& [name, value] : means) line += strprintf(" %s: %.6E |", name.c_str(), value);
  }
  line += strprintf(" loss scale: %.1f |", s.loss_scale);
  if (!s.skipped) line += strprintf(" grad norm: %.3f |", s.grad_norm);
  line += strprintf(
      " number of skipped iterations: %3ld | number of nan iterations: %3ld | tokens per "
      "second: %.1f | model FLOPs utilisation: %.1f%% |",
      static_cast<long>(skipped_), static_cast<long>(nan_),
      samples * static_cast<double>(seq_length_) / seconds_, 100.0 * tflops * 1e3 / peak_gflops_);
  sums_.clear();
  seconds_ = 0;
  iters_ = skipped_ = nan_ = samples_ = 0;
  return line;
}

void TrainingLog::tensorboard(TensorBoardWriter& tb, const Step& s) const {
  const double tflops = flops_per_sample_ * static_cast<double>(s.batch_size) / s.seconds / 1e12;
  Values by_iter{{"learning-rate", s.next_lr}, {"batch-size", static_cast<double>(s.batch_size)}};
  Values by_samples{{"learning-rate vs samples", s.next_lr}};
  if (s.terms) {
    for (const LossTerms::Term& t : s.terms->terms()) {  // Megatron's tags: each term's name
      by_iter.emplace_back(t.name, t.value());
      by_samples.emplace_back(t.name + " vs samples", t.value());
    }
  }
  by_iter.insert(
      by_iter.end(),
      {{"loss-scale", s.loss_scale}, {"iteration-time", s.seconds}, {"throughput", tflops}});
  // A skipped (fp16 overflow) iteration has no gradient norm to plot.
  if (!s.skipped) {
    by_iter.emplace_back("grad-norm", s.grad_norm);
    by_samples.emplace_back("grad-norm vs samples", s.grad_norm);
  }
  tb.add_scalars(by_iter, s.iteration);
  tb.add_scalars(by_samples, s.consumed_samples);
}

}  // namespace megatron
