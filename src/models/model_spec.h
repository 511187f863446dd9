// ModelSpec: everything the trainer and the tools need of one architecture, found by name.
//
// What it is: the builder of a rank's model chunks, the loss, the micro-batch (which fields, made
// from which samples), Megatron's FLOPs formula, the activation estimate, the Hugging Face
// mapping and the scoring wrapper, as plain functions (the shape of torchtitan's TrainSpec).
// `megatron train --model NAME` and Megatron's entry-point names (`megatron pretrain_gpt`) look
// the spec up here; Trainer, the pipeline, checkpoints and the CLI know no model class. What it is
// not: a plugin system; every spec is compiled in and listed in model_specs().
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "data/data_config.h"
#include "data/sample_source.h"
#include "data/tokenizer.h"
#include "models/model_chunk.h"
#include "parallel/context_parallel.h"
#include "parallel/param.h"
#include "pipeline/layer_split.h"
#include "transformer/config.h"

namespace megatron {

// Where this rank's chunks sit in the parallel layout.
struct ChunkPlacement {
  std::shared_ptr<ProcessGroup> tp;  // null: no tensor parallelism
  bool sequence_parallel = false;    // --sequence-parallel (ignored without TP)
  int pp_size = 1, pp_rank = 0;
  int virtual_stages = 1;             // chunks per pipeline rank (interleaved schedules)
  ContextParallelContext cp = {};     // --context-parallel-size (none by default)
  ExpertParallelContext expert = {};  // MoE experts' split (default: EP 1, ETP = TP)
  ProcessGroup* amax = nullptr;       // FP8 delayed scaling's amax reduction group (null: none)
  PipelineSplit split = {};           // uneven stages (--decoder-first-pipeline-num-layers, ...)
};

// The layers and ends of each of this rank's chunks: chunk c of pipeline rank r is virtual stage
// g = c * pp + r, holding the g-th block of layers (Megatron's interleaved layout; the blocks'
// sizes are the split's, pipeline/layer_split.h); the first stage embeds, the last holds the
// heads.
struct ChunkLayers {
  int64_t first_layer = 0, num_layers = 0;
  bool pre_process = false, post_process = false;
};
std::vector<ChunkLayers> chunk_layers(int64_t num_layers, const ChunkPlacement& p);

// What shapes a model besides its placement.
struct ModelOptions {
  TransformerConfig config;
  bool reset_attention_mask = false;  // attention stays inside documents (--reset-attention-mask)
  // The documents are packed sequences (--dataloader-inter-document-masking; implies
  // reset_attention_mask): recurrent layers and multi-token prediction respect them too.
  bool packed_documents = false;
};

// The micro-batch of samples [first, first + b) of a source, as named fields.
using BatchFn = std::function<TensorMap(const SampleSource& data, int64_t first, int64_t b)>;

// Hugging Face model directories (config.json + safetensors), for a whole model in one process.
struct HfMapping {
  // The architecture config.json fixes (padded_vocab_size left to the caller). Errors name the
  // file, the key and the fix.
  std::function<TransformerConfig(const std::string& dir)> read_config;
  // dir's weights into the whole model's fp32 main weights; refreshes the compute copy.
  std::function<void(const std::string& dir, ModelChunk& whole, ParamSet& params)> load;
  // Writes dir from the whole model's main weights, with HF's names and layouts: config.json
  // and dtype from `source_dir` (an HF directory the weights came from) when given, else made
  // from the config in fp32; `dtype` overrides the dtype.
  std::function<void(const std::string& dir, const ModelChunk& whole, const std::string& source_dir,
                     std::optional<DType> dtype)>
      save;
  // Refuses (InvalidArgument naming the flags) a config no HF architecture of this model holds.
  std::function<void(const TransformerConfig& cfg)> check_exportable;
  // Vision-language models (null for the others): a Hugging Face vision tower directory
  // (--pretrained-vision-checkpoint) into the first stage's vision encoder.
  std::function<void(const std::string& dir, ModelChunk& first_stage, ParamSet& params)>
      load_vision;
};

struct ModelSpec {
  std::string name;         // --model NAME
  std::string entry_point;  // the Megatron script it stands for: `megatron pretrain_gpt`
  // Other names of that script (a later Megatron's rename), accepted as entry_point.
  std::vector<std::string> entry_point_aliases;
  bool answers_to(const std::string& command) const;
  std::string summary;  // one line for usage texts

  // This rank's chunks, one per virtual pipeline stage (chunk c of pipeline rank r is virtual
  // stage c * pp + r), each with its parameters initialised lazily by the caller's ParamSet.
  std::function<std::vector<std::unique_ptr<ModelChunk>>(const ModelOptions&,
                                                         const ChunkPlacement&)>
      build_chunks;
  std::function<std::unique_ptr<LossFn>(const TransformerConfig&)> make_loss;
  // The spec (shape, dtype) of batch field `name` for micro-batches of b sequences of the
  // model's lengths (cfg.seq_length; an encoder-decoder's decoder fields cfg.decoder_seq_length).
  std::function<TensorSpec(const std::string& name, int64_t b, const TransformerConfig& cfg)>
      batch_field;
  // The micro-batch maker of a run's data config (masks, positions) and tokenizer (special ids).
  std::function<BatchFn(const DataConfig& config, const Tokenizer& tokenizer)> batch_maker;
  // The train, validation and test sample sources, each with at least `counts` samples' worth
  // of data where the source is finite (the trainer checks); log: print the build lines.
  std::function<Datasets(const DataConfig& config, const Tokenizer& tokenizer, int64_t seq_length,
                         const SampleCounts& counts, bool log)>
      build_datasets;
  // Megatron's model FLOPs of one iteration (the numerator of MFU).
  std::function<double(const TransformerConfig& cfg, int64_t global_batch_size)>
      flops_per_iteration;
  // Bytes one micro-batch of `micro_batch_size` sequences leaves saved for backward in `chunk`.
  std::function<int64_t(const ModelChunk& chunk, const TransformerConfig& cfg,
                        int64_t micro_batch_size)>
      activation_bytes;
  HfMapping hf;
  // Scoring: the per-token loss [1, n] of labels after tokens ([1, n] i64) under a whole model.
  std::function<Tensor(const ModelChunk& whole, const Tensor& tokens, const Tensor& labels)>
      token_losses;
};

// Every model, in the order usage texts list them.
const std::vector<const ModelSpec*>& model_specs();
// The names of every model, comma-separated, for usage texts and messages.
std::string model_names();
// The model called `name` (--model; the entry points, pretrain_gpt, are commands: `megatron
// pretrain_gpt` passes --model gpt); refuses an unknown name, listing the known ones.
const ModelSpec& model_spec(const std::string& name);

}  // namespace megatron
