// `megatron convert`: Hugging Face model directory in, Hugging Face model directory out, through
// our model's parameter layout (GPT-2's Conv1D weights transposed, QKV packed per query group,
// vocabulary padded and unpadded). The round trip is exact; --dtype re-encodes the weights.
#include "checkpoint/hf_checkpoint.h"
#include "cli/commands.h"
#include "cli/train_args.h"
#include "core/logging.h"
#include "train/model_config.h"

namespace megatron::cli {

int convert_command(int argc, char** argv) {
  CLI::App app("Convert model weights between formats", "convert");
  std::string load_dir, save_dir, dtype;
  app.add_option("--pretrained-checkpoint,--load-hf", load_dir,
                 "Hugging Face model directory to read")
      ->required();
  app.add_option("--save-hf", save_dir, "Hugging Face model directory to write")->required();
  app.add_option("--dtype", dtype,
                 "Weights dtype of the output: float32, bfloat16 or float16 "
                 "(default: as read)");
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  HfModelInfo info = read_hf_config(load_dir);
  TransformerConfig cfg = info.config;
  cfg.padded_vocab_size = pad_vocab_size(cfg.vocab_size, 128);
  cfg.finalize();
  GPTModel model(cfg);
  ParamSet params(model.parameters(), DType::kF32);
  load_hf_weights(load_dir, info, model, params);
  if (!dtype.empty()) {
    MEGATRON_CHECK(dtype == "float32" || dtype == "bfloat16" || dtype == "float16",
                   "--dtype: unknown '", dtype, "'; choose float32, bfloat16 or float16");
    info.dtype = dtype == "bfloat16"  ? DType::kBF16
                 : dtype == "float16" ? DType::kF16
                                      : DType::kF32;
    info.raw["torch_dtype"] = dtype;
  }
  save_hf(save_dir, info, model);
  log_line("converted " + load_dir + " -> " + save_dir);
  return 0;
}

}  // namespace megatron::cli
