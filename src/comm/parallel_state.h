// ParallelState: this rank's place in the hybrid-parallel layout and its process groups.
//
// Built once, from the world group and the sizes the user asked for; then passed explicitly to
// whatever communicates (there are no global process groups). The layout is Megatron's: ranks are
// ordered "tp-cp-ep-dp-pp" (tensor parallel fastest, pipeline slowest) and
// data_parallel_size = world / (tp * pp * cp), so with 8 ranks, tp 2, pp 2:
//   tp groups [0,1] [2,3] [4,5] [6,7]; dp groups [0,2] [1,3] [4,6] [5,7]; pp groups [0,4] [1,5]
//   [2,6] [3,7]; model-parallel (tp x pp) [0,1,4,5] [2,3,6,7]; embedding = first and last stage
//   of each pipeline group ([0,4] ...).
// The group lists come from RankGenerator, so they match Megatron's rank for rank.
//
// Not here: expert parallelism (ep must be 1 for now; its groups come from a second grid), and
// checks that depend on the model (heads, layers, batch sizes divisible by the sizes).
#pragma once

#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/rank_generator.h"

namespace megatron {

// The parallel sizes as given on the command line.
struct ParallelConfig {
  int tensor_model_parallel_size = 1;    // --tensor-model-parallel-size
  int pipeline_model_parallel_size = 1;  // --pipeline-model-parallel-size
  int context_parallel_size = 1;         // --context-parallel-size (groups only; no CP layers yet)
  int expert_model_parallel_size = 1;    // --expert-model-parallel-size (must be 1 for now)
};

// Validates `config` against `world_size` and derives the data-parallel size. Throws
// InvalidArgument naming the flags, the numbers and the fix (same message on every rank, with no
// communication, so a bad layout fails everywhere instead of hanging).
ParallelGrid make_parallel_grid(int world_size, const ParallelConfig& config);

class ParallelState {
 public:
  // Collective over `world`: every rank calls it with the same config.
  ParallelState(std::shared_ptr<ProcessGroup> world, const ParallelConfig& config);

  const ParallelGrid& grid() const { return grid_; }
  int world_size() const { return world_->size(); }
  int rank() const { return world_->rank(); }

  int tp_size() const { return grid_.tp; }
  int pp_size() const { return grid_.pp; }
  int dp_size() const { return grid_.dp; }
  int cp_size() const { return grid_.cp; }
  int ep_size() const { return grid_.ep; }

  // This rank's coordinates: its rank inside each group.
  int tp_rank() const { return tp_->rank(); }
  int pp_rank() const { return pp_->rank(); }
  int dp_rank() const { return dp_->rank(); }
  int cp_rank() const { return cp_->rank(); }
  bool is_first_stage() const { return pp_rank() == 0; }
  bool is_last_stage() const { return pp_rank() == pp_size() - 1; }

  ProcessGroup& world_group() const { return *world_; }
  ProcessGroup& tp_group() const { return *tp_; }
  // The TP group as shared ownership, for layers that keep it.
  const std::shared_ptr<ProcessGroup>& tp_group_ptr() const { return tp_; }
  ProcessGroup& pp_group() const { return *pp_; }
  ProcessGroup& dp_group() const { return *dp_; }
  ProcessGroup& cp_group() const { return *cp_; }
  // Data parallel x context parallel: where gradients are reduced.
  ProcessGroup& dp_cp_group() const { return *dp_cp_; }
  // Tensor x pipeline parallel: all ranks holding one copy of the model.
  ProcessGroup& model_parallel_group() const { return *mp_; }
  // First and last stage of this rank's pipeline, which hold the tied word embeddings. Middle
  // stages are in no embedding group; embedding_group() throws there.
  bool in_embedding_group() const { return embedding_ != nullptr; }
  ProcessGroup& embedding_group() const;

  // One line for the startup log, e.g. "world 8 = tensor-model-parallel 2 x context-parallel 1
  // x data-parallel 2 x pipeline-model-parallel 2; rank 5: tp 1, cp 0, dp 0, pp 1".
  std::string str() const;

 private:
  ParallelGrid grid_;
  std::shared_ptr<ProcessGroup> world_, tp_, pp_, dp_, cp_, dp_cp_, mp_, embedding_;
};

}  // namespace megatron
