// Trainer: Megatron's pretraining loop in one process.
//
// Each iteration: zero gradients; for each of global_batch / micro_batch micro-batches, forward,
// loss = masked mean over the micro-batch's tokens divided by the number of micro-batches (so
// gradients sum to the global-batch mean, as in Megatron), backward; then the global gradient
// norm, clipping, an AdamW step at the scheduled learning rate, and the log line. Every
// --eval-interval iterations, and at the end, the validation (and at the end the test) loss and
// perplexity in Megatron's format. Everything that varies between iterations (data, dropout
// masks) is a pure function of (seed, iteration), so two identical runs print identical losses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/parallel_state.h"
#include "data/gpt_batch.h"
#include "data/tokenizer.h"
#include "models/gpt_model.h"
#include "optim/adamw.h"
#include "optim/lr_scheduler.h"
#include "train/arguments.h"
#include "train/batch_prefetcher.h"
#include "train/datasets.h"
#include "train/tensorboard_writer.h"

namespace megatron {

class Trainer {
 public:
  // Builds tokenizer, model, optimizer, schedule and data from args (validated by the CLI) and
  // prints the start-up lines.
  // parallel: the data-parallel layout when launched under MPI; null for a single process.
  explicit Trainer(const Arguments& args, std::shared_ptr<ParallelState> parallel = nullptr);
  ~Trainer();

  // Runs args.train_iters iterations, with evaluation.
  void train();

  // Training loss of each iteration run so far, and every evaluation loss, validation and test,
  // in the order printed (for tests).
  const std::vector<double>& losses() const { return losses_; }
  const std::vector<double>& eval_losses() const { return eval_losses_; }
  GPTModel& model() { return *model_; }
  ParamSet& params() { return *params_; }

 private:
  struct StepResult {
    double loss = 0, grad_norm = 0;
  };
  StepResult train_step(int64_t iteration, double lr);
  // Token-weighted mean loss over eval_iters global batches of `data`, from sample `*consumed`.
  double evaluate(const SampleSource& data, int64_t* consumed);
  void evaluate_and_print(const std::string& prefix, const SampleSource& data, int64_t* consumed,
                          int64_t iteration);

  // Megatron prints start-up lines from rank 0 and the iteration and evaluation lines from the
  // last rank (which owns the loss once pipelines exist).
  void log_first(const std::string& line) const;
  void log_last(const std::string& line) const;

  Arguments args_;
  std::shared_ptr<ParallelState> parallel_;
  int64_t dp_size_ = 1, dp_rank_ = 0;
  bool first_rank_ = true, last_rank_ = true;
  TransformerConfig cfg_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<GPTModel> model_;
  std::unique_ptr<ParamSet> params_;
  std::unique_ptr<AdamW> optimizer_;
  LrSchedule schedule_;
  Datasets data_;
  BatchOptions batch_options_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<BatchPrefetcher> prefetcher_;
  int64_t num_microbatches_ = 1;
  int64_t consumed_valid_ = 0, consumed_test_ = 0;
  double peak_gflops_ = 0;
  std::vector<double> losses_, eval_losses_;
};

// The tokenizer arguments of a run.
TokenizerArgs tokenizer_args(const Arguments& args);

}  // namespace megatron
