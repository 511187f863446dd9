// megatron: one binary, one subcommand per job. The only place that turns exceptions into exit
// codes: 2 for a caller error (bad flag, bad file), 1 for anything else.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/logging.h"
#include "models/model_spec.h"
#include "tensor/ops.h"

namespace {

constexpr const char* kUsage =
    "usage: megatron <command> [flags]\n"
    "\n"
    "commands:\n"
    "  train       pretrain or finetune a model (Megatron's pretrain_*.py flags; --model)\n"
    "  pretrain_gpt  `train --model gpt`: a launch line's pretrain_gpt.py ARGS as it is\n"
    "  pretrain_bert `train --model bert`: BERT pretraining (pretrain_bert.py)\n"
    "  pretrain_hybrid `train --model mamba`: hybrid Mamba models (also pretrain_mamba)\n"
    "  finetune    `train --model bert_classification --task ...`: classification finetuning\n"
    "  preprocess  tokenize JSON lines into Megatron .bin/.idx datasets (preprocess_data.py)\n"
    "  merge_datasets  a folder of .bin/.idx datasets into one (merge_datasets.py)\n"
    "  build_sequences_per_dataset  a blend's .idx counts for --per-dataset-sequences-path\n"
    "  scenes      images of simple scenes with true captions (a checkable vision-language task)\n"
    "  score       per-token log-probabilities of token sequences under a model\n"
    "  generate    text from prompts (greedy or sampled, through a KV cache)\n"
    "  serve       a text-generation server (Megatron's REST API) over HTTP\n"
    "  evaluate    zero-shot WikiText perplexity, LAMBADA accuracy, multiple choice\n"
    "  convert     Hugging Face model directory -> Hugging Face model directory via our layout\n"
    "  plan        the parallel layouts of a run on a cluster, predicted time and memory, ranked\n"
    "  bench       measured peaks of this machine (bench gemm)\n"
    "  flags       Megatron's flags and what `train` does with each (--markdown: docs/FLAGS.md)\n"
    "\n"
    "`megatron <command> --help` lists a command's flags; `megatron --version` prints what\n"
    "decides this build's arithmetic.\n";

int dispatch(int argc, char** argv) {
  using namespace megatron::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version") {
    std::printf("megatron-cpp: %s\n", megatron::ops::numerics_fingerprint().c_str());
    return 0;
  }
  // Each subcommand sees argv without the command name.
  if (cmd == "train") return train_command(argc - 1, argv + 1);
  // Megatron's entry points: `megatron pretrain_gpt ARGS` is `megatron train --model gpt ARGS`.
  for (const megatron::ModelSpec* spec : megatron::model_specs()) {
    if (!spec->answers_to(cmd)) continue;
    std::vector<char*> args{argv[1]};
    std::string flag = "--model", name = spec->name;
    args.push_back(flag.data());
    args.push_back(name.data());
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    return train_command(static_cast<int>(args.size()) - 1, args.data());
  }
  if (cmd == "score") return score_command(argc - 1, argv + 1);
  if (cmd == "generate") return generate_command(argc - 1, argv + 1);
  if (cmd == "serve") return serve_command(argc - 1, argv + 1);
  if (cmd == "evaluate") return evaluate_command(argc - 1, argv + 1);
  if (cmd == "convert") return convert_command(argc - 1, argv + 1);
  if (cmd == "bench") return bench_command(argc - 1, argv + 1);
  if (cmd == "plan") return plan_command(argc - 1, argv + 1);
  if (cmd == "flags") return flags_command(argc - 1, argv + 1);
  if (cmd == "preprocess") return preprocess_command(argc - 1, argv + 1);
  if (cmd == "merge_datasets") return merge_datasets_command(argc - 1, argv + 1);
  if (cmd == "build_sequences_per_dataset") return build_sequences_command(argc - 1, argv + 1);
  if (cmd == "scenes") return scenes_command(argc - 1, argv + 1);
  megatron::log_error("unknown command '" + cmd + "'");
  std::fputs(kUsage, stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const megatron::InvalidArgument& e) {
    megatron::log_error(e.what());
    return 2;
  } catch (const std::exception& e) {
    megatron::log_error(e.what());
    return 1;
  }
}
