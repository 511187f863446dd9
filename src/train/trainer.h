// Trainer: Megatron's pretraining loop in one process.
//
// Each iteration: zero gradients; for each of global_batch / micro_batch micro-batches, forward,
// loss = masked mean over the micro-batch's tokens divided by the number of micro-batches (so
// gradients sum to the global-batch mean, as in Megatron), backward; then the global gradient
// norm, clipping, an AdamW step at the scheduled learning rate, and the log line. Everything that
// varies between iterations (data, dropout masks) is a pure function of (seed, iteration), so two
// identical runs print identical losses.
#pragma once

#include <memory>
#include <vector>

#include "data/mock_gpt_dataset.h"
#include "models/gpt_model.h"
#include "optim/adamw.h"
#include "optim/lr_scheduler.h"
#include "train/arguments.h"
#include "train/tensorboard_writer.h"

namespace megatron {

class Trainer {
 public:
  // Builds model, optimizer, schedule and data from args (already validated by the CLI) and
  // prints the start-up lines.
  explicit Trainer(const Arguments& args);
  ~Trainer();

  // Runs args.train_iters iterations.
  void train();

  // Mean loss of each iteration run so far (for tests and tools).
  const std::vector<double>& losses() const { return losses_; }
  GPTModel& model() { return *model_; }
  ParamSet& params() { return *params_; }

 private:
  struct StepResult {
    double loss = 0, grad_norm = 0;
  };
  StepResult train_step(int64_t iteration, double lr);

  Arguments args_;
  TransformerConfig cfg_;
  std::unique_ptr<GPTModel> model_;
  std::unique_ptr<ParamSet> params_;
  std::unique_ptr<AdamW> optimizer_;
  LrSchedule schedule_;
  std::unique_ptr<MockGPTDataset> data_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  int64_t num_microbatches_ = 1;
  double peak_gflops_ = 0;
  std::vector<double> losses_;
};

}  // namespace megatron
