// A whole model (one process, no parallelism) built from a Hugging Face directory or one of our
// checkpoints, and written as a checkpoint: what `megatron convert` and Megatron's
// --moe-use-upcycling work on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/model_spec.h"
#include "train/arguments.h"
#include "train/checkpointing.h"

namespace megatron::cli {

struct WholeModel {
  Arguments args;
  TransformerConfig cfg;
  const ModelSpec* spec = nullptr;
  std::vector<std::unique_ptr<ModelChunk>> chunks;  // one: the whole model
  std::unique_ptr<ParamSet> params;
  // A checkpoint's run state (whole_model_from_checkpoint; a release's is all zero).
  RunState state;
};

// Builds m.chunks and m.params (uninitialised) from m.args.
void build_whole_model(WholeModel& m);
// The model of a Hugging Face directory, with the flags `megatron train` would take from it.
WholeModel whole_model_from_hf(const std::string& dir, const std::string& model);
// The model of a checkpoint (its tracker's iteration, or `step` >= 0): its recorded arguments,
// then its weights.
WholeModel whole_model_from_checkpoint(const std::string& root, int64_t step);
// Writes the weights as checkpoint iteration `iteration` of `root` (no optimizer state; a release
// when the iteration is 0).
// `state` (its iteration replaced) gives the run state recorded: consumed samples and FLOPs.
void save_whole_checkpoint(const WholeModel& m, const std::string& root, int64_t iteration,
                           RunState state = {});

}  // namespace megatron::cli
