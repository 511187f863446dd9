// The model a generation, serving or evaluation job runs: this rank's stage of one model replica
// (TP x PP ranks; no data, context or sequence parallelism, no virtual pipeline, as Megatron's
// text-generation server refuses interleaving), its weights from a checkpoint (--load, saved by
// any layout: the checkpoint's model arguments apply, as with --use-checkpoint-args) or a Hugging
// Face directory (--pretrained-checkpoint, one process), and the tokenizer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cli/arg_table.h"
#include "comm/mpi_runtime.h"
#include "comm/parallel_state.h"
#include "data/tokenizer.h"
#include "models/model_spec.h"
#include "parallel/param.h"
#include "train/arguments.h"

namespace megatron::cli {

// The model, tokenizer, layout and weights flags (--load, --ckpt-step, --pretrained-checkpoint).
void register_inference_args(ArgTable& t, Arguments& a);
// Takes the model arguments from the checkpoint or config.json, resolves the vocabulary and
// checks the layout against world_size; InvalidArgument names the flag. Reads files only.
void resolve_inference_args(Arguments& a, const ArgTable& t, int world_size, bool report);

struct InferenceModel {
  Arguments args;
  TransformerConfig config;
  const ModelSpec* spec = nullptr;
  std::shared_ptr<ParallelState> parallel;
  std::unique_ptr<ModelChunk> chunk;  // this rank's pipeline stage
  std::unique_ptr<ParamSet> params;
  std::unique_ptr<Tokenizer> tokenizer;
};

// Builds this rank's stage and loads its weights (collective only through the layout's groups).
// log: print the loading lines (rank 0).
InferenceModel load_inference_model(const Arguments& args, const MpiRuntime& mpi, bool log);

}  // namespace megatron::cli
