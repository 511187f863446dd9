// `megatron convert`: model weights between Hugging Face directories (GPT-2, Llama) and our
// sharded checkpoints, in any direction:
//   --load-hf IN  --save-hf OUT    re-export through our layout (exact round trip; --dtype)
//   --load-hf IN  --save CKPT      a checkpoint (weights only, marked "release") that
//                                  `megatron train --load CKPT` reads into any parallel layout
//   --load CKPT   --save-hf OUT    the checkpoint's weights (any layout saved them) as HF files
//   --load CKPT   --save CKPT2     a weights-only copy
// A checkpoint records every tensor by its global shape, so no target layout is needed: the
// layout is chosen when training loads it. One process; no MPI job.
#include "checkpoint/sharded_checkpoint.h"
#include "cli/commands.h"
#include "cli/train_args.h"
#include "cli/whole_model.h"
#include "comm/agreement.h"
#include "core/logging.h"
#include "models/model_spec.h"
#include "train/checkpointing.h"
#include "train/model_config.h"

namespace megatron::cli {

int convert_command(int argc, char** argv) {
  CLI::App app("Convert model weights between Hugging Face directories and checkpoints", "convert");
  std::string load_hf, save_hf, load, save, dtype, model = "gpt";
  int64_t ckpt_step = -1;
  app.add_option("--pretrained-checkpoint,--load-hf", load_hf,
                 "Hugging Face model directory to read");
  app.add_option("--model", model,
                 "Model architecture of a Hugging Face input: " + model_names() +
                     " (a checkpoint records its own)");
  app.add_option("--load", load, "Checkpoint directory to read (its tracker's iteration)");
  app.add_option("--ckpt-step", ckpt_step, "With --load: this iteration instead of the tracker's");
  app.add_option("--save-hf", save_hf, "Hugging Face model directory to write");
  app.add_option("--save", save, "Checkpoint directory to write (iteration 0, weights only)");
  app.add_option("--dtype", dtype,
                 "Weights dtype of a Hugging Face output: float32, bfloat16 or float16 "
                 "(default: as read, float32 from a checkpoint)");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  MEGATRON_CHECK(load_hf.empty() != load.empty(),
                 "convert: give one input, --load-hf DIR (Hugging Face) or --load DIR "
                 "(checkpoint)");
  MEGATRON_CHECK(save_hf.empty() != save.empty(),
                 "convert: give one output, --save-hf DIR (Hugging Face) or --save DIR "
                 "(checkpoint)");
  MEGATRON_CHECK(ckpt_step < 0 || !load.empty(), "convert: --ckpt-step needs --load");
  WholeModel m = load.empty() ? whole_model_from_hf(load_hf, model)
                              : whole_model_from_checkpoint(load, ckpt_step);
  const std::string from = load.empty() ? load_hf : load;
  if (!save.empty()) {
    MEGATRON_CHECK(dtype.empty(),
                   "convert: --dtype applies to --save-hf only (checkpoints "
                   "hold fp32 weights)");
    try {
      save_whole_checkpoint(m, save, 0);
    } catch (const AgreedFailure& e) {
      throw InvalidArgument(e.what());
    }
    log_line("converted " + from + " -> " + save + " (checkpoint, iteration 0)");
    return 0;
  }
  std::optional<DType> out_dtype;
  if (!dtype.empty()) {
    MEGATRON_CHECK(dtype == "float32" || dtype == "bfloat16" || dtype == "float16",
                   "--dtype: unknown '", dtype, "'; choose float32, bfloat16 or float16");
    out_dtype = dtype == "bfloat16" ? DType::kBF16 : dtype == "float16" ? DType::kF16 : DType::kF32;
  }
  // From a Hugging Face input its config.json (and dtype) carry over; from a checkpoint the
  // config is made from the model's.
  m.spec->hf.save(save_hf, *m.chunks.front(), load_hf, out_dtype);
  log_line("converted " + from + " -> " + save_hf);
  return 0;
}

}  // namespace megatron::cli
