// Building and loading the inference model (inference_model.h).
#include "cli/inference_model.h"

#include "checkpoint/sharded_checkpoint.h"
#include "cli/train_args.h"
#include "core/logging.h"
#include "core/threads.h"
#include "train/checkpointing.h"
#include "train/model_config.h"
#include "train/trainer.h"

namespace megatron::cli {

namespace cp = checkpoint;

void register_inference_args(ArgTable& t, Arguments& a) {
  register_model_args(t, a);
  t.concern("checkpoint");
  t.add("--load", a.load,
        "Checkpoint directory to load the weights from (its tracker's iteration)");
  t.add("--ckpt-step", a.ckpt_step, "Load this iteration instead of the tracker's");
  t.negative_flag("--no-use-tokenizer-model-from-checkpoint-args",
                  "use_tokenizer_model_from_checkpoint_args",
                  a.use_tokenizer_model_from_checkpoint_args,
                  "Do not take --tokenizer-model from the checkpoint (pass it)");
  t.alias("--disable-use-tokenizer-model-from-checkpoint-args",
          "--no-use-tokenizer-model-from-checkpoint-args");
}

void resolve_inference_args(Arguments& a, const ArgTable& t, int world_size, bool report) {
  MEGATRON_CHECK(a.load.empty() != a.pretrained_checkpoint.empty(),
                 "give the model's weights: --load CKPT (a checkpoint) or --pretrained-checkpoint "
                 "DIR (a Hugging Face directory), one of them");
  MEGATRON_CHECK(a.ckpt_step < 0 || !a.load.empty(), "--ckpt-step needs --load");
  if (!a.load.empty()) {
    a.use_checkpoint_args = true;  // the checkpoint knows its model
    merge_checkpoint_args(a, t, report);
  }
  merge_pretrained_config(a, t);
  for (const std::string& note : resolve_hybrid_pattern(a))
    if (report) log_line("WARNING: " + note);
  resolve_encoder_decoder(a, t, /*training=*/false);
  resolve_vocab_size(a, t);
  // A heterogeneous block list given by path (a checkpoint or config.json brings its text).
  validate_heterogeneous_args(a);
  const int64_t tp = a.tensor_model_parallel_size, pp = a.pipeline_model_parallel_size;
  MEGATRON_CHECK(tp >= 1 && pp >= 1,
                 "--tensor-model-parallel-size and "
                 "--pipeline-model-parallel-size must be >= 1");
  MEGATRON_CHECK(tp * pp == world_size, "inference runs one model replica: the ", world_size,
                 " ranks must be --tensor-model-parallel-size x --pipeline-model-parallel-size (",
                 tp, " x ", pp, "); launch ", tp * pp, " ranks");
  MEGATRON_CHECK(a.pretrained_checkpoint.empty() || world_size == 1,
                 "--pretrained-checkpoint reads a whole Hugging Face model in one process; in a "
                 "parallel layout convert it first (`megatron convert --load-hf DIR --save "
                 "CKPT`) and pass --load CKPT");
  const PipelineSplit split = pipeline_split(a);
  MEGATRON_CHECK(static_cast<int64_t>(split.layout.size()) <= pp,
                 "inference runs one model chunk per pipeline rank: ",
                 a.hybrid_pipeline_segments.empty() ? "--pipeline-model-parallel-layout"
                                                    : "the hybrid pattern's '|' segments",
                 " give ", split.layout.size(), " stages for --pipeline-model-parallel-size ", pp,
                 "; give one stage per rank",
                 a.hybrid_pipeline_segments.empty()
                     ? ""
                     : " (a given --hybrid-layer-pattern with the same layers "
                       "replaces the checkpoint's)",
                 " (the checkpoint loads into any split)");
  validate_pipeline_split(a.num_layers, pp, 1, split);
  a.hidden_dropout = a.attention_dropout = 0;
  a.sequence_parallel = false;  // one position per decode step: nothing to split
  a.context_parallel_size = 1;
  // FP8 primary weights are a training layout (the distributed optimizer quantises their codes
  // after each step); Megatron accepts the flag in inference, where our forward quantises the
  // bf16 weights with the same scales to the same FP8 values.
  a.fp8_param_gather = false;
  transformer_config_from_args(a);  // the model-shape errors, before any rank builds it
}

InferenceModel load_inference_model(const Arguments& args, const MpiRuntime& mpi, bool log) {
  InferenceModel m;
  m.args = args;
  ParallelConfig pc;
  pc.tensor_model_parallel_size = static_cast<int>(args.tensor_model_parallel_size);
  pc.pipeline_model_parallel_size = static_cast<int>(args.pipeline_model_parallel_size);
  pc.expert_model_parallel_size = static_cast<int>(args.expert_model_parallel_size);
  pc.expert_tensor_parallel_size = static_cast<int>(args.expert_tensor_parallel_size);
  m.parallel = std::make_shared<ParallelState>(mpi.world(), pc);
  const ParallelState& ps = *m.parallel;
  set_num_threads(args.num_threads > 0 ? static_cast<int>(args.num_threads)
                                       : mpi.default_threads_per_rank());
  m.tokenizer = build_tokenizer(tokenizer_args(args));
  m.config = transformer_config_from_args(args);
  m.spec = &model_spec(args.model);
  ExpertParallelContext expert{.tp_ep = &ps.tp_ep_group(),
                               .etp = &ps.etp_group(),
                               .ep = &ps.ep_group(),
                               .ep_rank = ps.ep_rank(),
                               .ep_size = ps.ep_size()};
  // Assigned field by field: GCC 12 warns (wrongly) of an uninitialised member when a
  // designated initializer skips the context-parallel one here.
  ChunkPlacement placement;
  placement.tp = ps.tp_group_ptr();
  placement.pp_size = ps.pp_size();
  placement.pp_rank = ps.pp_rank();
  placement.expert = expert;
  placement.split = pipeline_split(args);
  std::vector<std::unique_ptr<ModelChunk>> chunks =
      m.spec->build_chunks(ModelOptions{m.config, false}, placement);
  MEGATRON_CHECK(chunks.size() == 1, "inference runs one model chunk per rank");
  m.chunk = std::move(chunks.front());
  m.params = std::make_unique<ParamSet>(m.chunk->parameters(), m.config.compute_dtype);
  if (!args.pretrained_checkpoint.empty()) {
    m.spec->hf.load(args.pretrained_checkpoint, *m.chunk, *m.params);
    if (log) log_line(" > loaded " + args.pretrained_checkpoint);
    return m;
  }
  std::vector<std::string> notes;  // the same checkpoint training would resume from
  const std::optional<CheckpointChoice> choice = checkpoint_to_load(args, &notes);
  if (log)
    for (const std::string& note : notes) log_line(note);
  MEGATRON_CHECK(choice.has_value(), "--load ", args.load, " has no checkpoint (no ", args.load,
                 "/", cp::kTrackerFile, "): pass the directory --save wrote");
  const std::optional<int64_t> it = choice->iteration;
  const std::string dir = cp::iteration_dir(choice->root, *it);
  cp::CheckpointReader reader = cp::CheckpointReader::open(dir);
  load_shards(reader,
              CheckpointTarget{
                  m.params.get(), nullptr, nullptr, 0, ps.experts_apart() ? ps.edp_rank() : 0, {}},
              /*optim=*/false);
  if (log) {
    log_line(strprintf(" > loaded checkpoint %s at iteration %ld", choice->root.c_str(),
                       static_cast<long>(*it)));
  }
  return m;
}

}  // namespace megatron::cli
