// `megatron train`: Megatron's pretrain_gpt.py in one process.
#include "cli/commands.h"
#include "cli/train_args.h"
#include "core/logging.h"
#include "core/threads.h"
#include "train/model_config.h"
#include "train/trainer.h"

namespace megatron::cli {

int train_command(int argc, char** argv) {
  CLI::App app("Pretrain or finetune a GPT model", "train");
  Arguments args;
  ArgTable table(app);
  register_train_args(table, args);
  if (int rc = parse(app, argc, argv); rc >= 0) return rc;
  merge_pretrained_config(args, table);
  validate_train_args(args);
  const bool per_split = !args.train_data_path.empty() || !args.valid_data_path.empty() ||
                         !args.test_data_path.empty();
  MEGATRON_CHECK(!(table.given("--split") && per_split),
                 "--split applies to --data-path only; with --train-data-path/--valid-data-path/"
                 "--test-data-path each split has its own data: drop --split");
  resolve_vocab_size(args, table);
  // Model-shape errors (heads not dividing hidden, sequence beyond positions, ...) surface here,
  // before the argument dump, as Megatron's argument validation does.
  transformer_config_from_args(args);
  set_num_threads(static_cast<int>(args.num_threads));
  table.print_dump();
  log_line("[after megatron is initialized] datetime: " + timestamp());
  Trainer trainer(args);
  trainer.train();
  return 0;
}

}  // namespace megatron::cli
