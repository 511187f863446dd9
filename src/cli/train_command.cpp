// `megatron train`: Megatron's pretrain_gpt.py in one process.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/arg_table.h"
#include "cli/commands.h"
#include "cli/megatron_flags.h"
#include "cli/mpi_command.h"
#include "cli/train_args.h"
#include "cli/upcycling.h"
#include "comm/agreement.h"
#include "comm/mpi_runtime.h"
#include "comm/nccl/nccl_process_group.h"
#include "comm/parallel_state.h"
#include "core/logging.h"
#include "core/threads.h"
#include "tensor/tensor.h"
#include "train/device_choice.h"
#include "train/model_config.h"
#include "train/trainer.h"

namespace megatron::cli {

namespace {

int run_train(int argc, char** argv, MpiRuntime& mpi) {
  // As `train`, or as a Megatron entry point (`pretrain_gpt`, which adds --model gpt).
  CLI::App app("Pretrain or finetune a model (--model; Megatron's pretrain_*.py)", argv[0]);
  Arguments args;
  ArgTable table(app);
  register_train_args(table, args);
  const MegatronCompatFlags compat(table);  // the rest of Megatron's flags
  std::vector<std::string> compat_lines;
  const int rc = agreed_argument_phase(mpi, app, argc, argv, [&] {
    compat_lines = compat.resolve();
    // --lr 0 is a valid learning rate (the weights stay fixed); a missing --lr is not.
    MEGATRON_CHECK(table.given("--lr"), "--lr is required (the peak learning rate)");
    merge_pretrained_config(args, table);
    merge_checkpoint_args(args, table, mpi.rank() == 0);
    read_data_args_files(args);
    resolve_encoder_decoder(args, table, /*training=*/true);
    resolve_finetuning(args, table);
    validate_train_args(args, mpi.world_size(), mpi.rank());
    const bool per_split = !args.train_data_path.empty() || !args.valid_data_path.empty() ||
                           !args.test_data_path.empty();
    MEGATRON_CHECK(!(table.given("--split") && per_split),
                   "--split applies to --data-path only; with --train-data-path/"
                   "--valid-data-path/--test-data-path each split has its own data: drop --split");
    resolve_vocab_size(args, table);
    // Model-shape errors (heads not dividing hidden, sequence beyond positions, ...) surface
    // here, before the argument dump, as Megatron's argument validation does.
    transformer_config_from_args(args);
  });
  if (rc >= 0) return rc;
  args.argument_record = table.record();
  args.ranks_per_core = std::max(1.0, static_cast<double>(mpi.local_size()) /
                                          static_cast<double>(std::max(1, mpi.node_cores())));
  ParallelConfig pc;
  pc.tensor_model_parallel_size = static_cast<int>(args.tensor_model_parallel_size);
  pc.pipeline_model_parallel_size = static_cast<int>(args.pipeline_model_parallel_size);
  pc.context_parallel_size = static_cast<int>(args.context_parallel_size);
  pc.expert_model_parallel_size = static_cast<int>(args.expert_model_parallel_size);
  pc.expert_tensor_parallel_size = static_cast<int>(args.expert_tensor_parallel_size);
  pc.num_distributed_optimizer_instances =
      static_cast<int>(args.num_distributed_optimizer_instances);
  if (args.use_tp_pp_dp_mapping) pc.order = "tp-cp-ep-pp-dp";
  // One GPU per rank by local rank; ranks share GPUs when there are more ranks than GPUs. NCCL
  // carries the GPU tensors' collectives where every rank has a GPU of its own (it refuses two
  // ranks on one GPU); otherwise MPI does, through host copies.
  const Device device = resolve_device(args.device);
  args.device_index = mpi.local_rank();
  std::shared_ptr<ProcessGroup> world = mpi.world();
  if (device == Device::kCUDA) {
    use_gpu(mpi.local_rank() % gpu_count());
    args.device_index = mpi.local_rank() % gpu_count();
    if (nccl_available() && mpi.world_size() > 1 && mpi.local_size() <= gpu_count()) {
      world = make_nccl_process_group(world);
    }
  }
  set_cuda_tf32(args.tf32);
  auto parallel = std::make_shared<ParallelState>(world, pc);
  set_num_threads(args.num_threads > 0 ? static_cast<int>(args.num_threads)
                                       : mpi.default_threads_per_rank());
  if (mpi.rank() == 0) {
    table.print_dump();
    for (const std::string& line : compat_lines) log_line(line);
  }
  if (mpi.rank() == 0) log_line("[after megatron is initialized] datetime: " + timestamp());
  if (args.moe_use_upcycling) {
    // Rank 0 converts --load's dense model into --save (one process, no communication: every
    // rank learns of a failure together); then the run loads that checkpoint as any other.
    run_agreed(parallel->world_group(), [&] {
      if (mpi.rank() == 0) upcycle_checkpoint(args);
    });
    args.load = args.save;
    args.ckpt_step = -1;
  }
  Trainer trainer(args, parallel);
  return trainer.train();
}

}  // namespace

int train_command(int argc, char** argv) {
  // MPI is initialised for every run (a plain `megatron train` is a world of one).
  MpiRuntime mpi;
  return run_mpi_command(mpi, [&](MpiRuntime& m) { return run_train(argc, argv, m); });
}

}  // namespace megatron::cli
