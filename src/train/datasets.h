// The run's data concern from its arguments: the DataConfig (data/data_config.h) and Megatron's
// sample counts: train = --train-samples, or train_iters x global batch; validation = (train_iters
// / eval_interval + 1 - start_eval_at_iter / eval_interval) x eval_iters x eval global batch (one
// evaluation more where that count leaves out the final one), test = eval_iters x eval global
// batch. The datasets
// themselves come from the model's spec (ModelSpec::build_datasets).
#pragma once

#include "data/data_config.h"
#include "train/arguments.h"

namespace megatron {

SampleCounts sample_counts(const Arguments& args);
DataConfig data_config(const Arguments& args);

}  // namespace megatron
