// `megatron train`: Megatron's pretrain_gpt.py in one process.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/arg_table.h"
#include "cli/commands.h"
#include "cli/megatron_flags.h"
#include "cli/train_args.h"
#include "comm/agreement.h"
#include "comm/mpi_runtime.h"
#include "comm/parallel_state.h"
#include "core/logging.h"
#include "core/threads.h"
#include "tensor/tensor.h"
#include "train/model_config.h"
#include "train/trainer.h"

namespace megatron::cli {

namespace {

// Exit code every rank agrees on after the argument phase: the largest code any rank reached
// (-1 = go on, 0 = --help printed, 2 = bad input). The phase talks to no other rank; the
// agreement comes before the first collective, so all ranks then leave together with exit code 2
// and no rank is killed before its reason is printed.
int agree_on_exit_code(const MpiRuntime& mpi, int rc) {
  if (mpi.world_size() == 1) return rc;
  Tensor worst = Tensor::empty({1}, DType::kF64);
  worst.data<double>()[0] = rc;
  mpi.world()->all_reduce(worst, ReduceOp::kMax);
  return static_cast<int>(worst.data<double>()[0]);
}

// Each rank's reason for refusing the arguments (empty if it had none), printed by rank 0 as one
// block with a line per rank ("[rank r] ..."): ranks writing their own lines at once interleave
// mid-line under mpirun's output forwarding. Collective over the world.
void report_refusals(const MpiRuntime& mpi, const std::string& refusal) {
  if (mpi.world_size() == 1) {
    if (!refusal.empty()) log_error(refusal);
    return;
  }
  const std::vector<std::string> all = all_gather_strings(*mpi.world(), refusal);
  if (mpi.rank() != 0) return;
  std::string block;
  for (size_t r = 0; r < all.size(); ++r) {
    block +=
        (r == 0 ? "" : "\nerror: ") +
        strprintf("[rank %zu] %s", r,
                  all[r].empty() ? "stopping: another rank refused the arguments" : all[r].c_str());
  }
  log_error(block);
}

int run_train(int argc, char** argv, MpiRuntime& mpi) {
  // As `train`, or as a Megatron entry point (`pretrain_gpt`, which adds --model gpt).
  CLI::App app("Pretrain or finetune a model (--model; Megatron's pretrain_*.py)", argv[0]);
  Arguments args;
  ArgTable table(app);
  register_train_args(table, args);
  const MegatronCompatFlags compat(table);  // the rest of Megatron's flags
  std::vector<std::string> compat_lines;
  int rc = -1;
  std::string refusal, help;
  try {
    std::string message;
    rc = parse_quietly(app, argc, argv, &message);
    (rc == 0 ? help : refusal) = message;
    if (rc < 0) {
      compat_lines = compat.resolve();
      // --lr 0 is a valid learning rate (the weights stay fixed); a missing --lr is not.
      MEGATRON_CHECK(table.given("--lr"), "--lr is required (the peak learning rate)");
      merge_pretrained_config(args, table);
      merge_checkpoint_args(args, table, mpi.rank() == 0);
      read_data_args_files(args);
      validate_train_args(args, mpi.world_size(), mpi.rank());
      const bool per_split = !args.train_data_path.empty() || !args.valid_data_path.empty() ||
                             !args.test_data_path.empty();
      MEGATRON_CHECK(
          !(table.given("--split") && per_split),
          "--split applies to --data-path only; with --train-data-path/"
          "--valid-data-path/--test-data-path each split has its own data: drop --split");
      resolve_vocab_size(args, table);
      // Model-shape errors (heads not dividing hidden, sequence beyond positions, ...) surface
      // here, before the argument dump, as Megatron's argument validation does.
      transformer_config_from_args(args);
    }
  } catch (const InvalidArgument& e) {
    if (mpi.world_size() == 1) throw;
    refusal = e.what();
    rc = 2;
  }
  if (const int agreed = agree_on_exit_code(mpi, rc); agreed >= 0) {
    if (agreed == 0 && mpi.rank() == 0) std::fputs(help.c_str(), stdout);
    if (agreed == 2) report_refusals(mpi, refusal);
    return agreed;
  }
  args.argument_record = table.record();
  ParallelConfig pc;
  pc.tensor_model_parallel_size = static_cast<int>(args.tensor_model_parallel_size);
  pc.pipeline_model_parallel_size = static_cast<int>(args.pipeline_model_parallel_size);
  pc.context_parallel_size = static_cast<int>(args.context_parallel_size);
  pc.expert_model_parallel_size = static_cast<int>(args.expert_model_parallel_size);
  pc.expert_tensor_parallel_size = static_cast<int>(args.expert_tensor_parallel_size);
  auto parallel = std::make_shared<ParallelState>(mpi.world(), pc);
  set_num_threads(args.num_threads > 0 ? static_cast<int>(args.num_threads)
                                       : mpi.default_threads_per_rank());
  if (mpi.rank() == 0) {
    table.print_dump();
    for (const std::string& line : compat_lines) log_line(line);
  }
  if (mpi.rank() == 0) log_line("[after megatron is initialized] datetime: " + timestamp());
  Trainer trainer(args, parallel);
  return trainer.train();
}

}  // namespace

int train_command(int argc, char** argv) {
  // MPI is initialised for every run (a plain `megatron train` is a world of one). Bad arguments
  // end every rank in step (run_train). After that, with several ranks, an error on any of them
  // aborts the whole job, so no rank waits forever in a collective; the exit code (2 for bad
  // input, 1 otherwise) is passed to MPI_Abort.
  MpiRuntime mpi;
  try {
    return run_train(argc, argv, mpi);
  } catch (const AgreedFailure& e) {
    // Every rank stopped at the same point with the same message (the lowest failing rank's):
    // no rank is left waiting, and rank 0 says it once for all of them.
    if (mpi.world_size() == 1) {
      log_error(e.what());
    } else if (mpi.rank() == 0) {
      log_error(strprintf("[rank 0] all %d ranks stopped: %s", mpi.world_size(), e.what()));
    }
    return e.exit_code();
  } catch (const InvalidArgument& e) {
    if (mpi.world_size() == 1) throw;
    log_error(strprintf("[rank %d] %s", mpi.rank(), e.what()));
    MpiRuntime::abort(2);
  } catch (const std::exception& e) {
    if (mpi.world_size() == 1) throw;
    log_error(strprintf("[rank %d] %s", mpi.rank(), e.what()));
    MpiRuntime::abort(1);
  }
}

}  // namespace megatron::cli
