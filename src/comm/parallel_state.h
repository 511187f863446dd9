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
// MoE experts use Megatron's second grid over the same ranks ("MoE parallel folding"): order
// tp-cp-ep-dp-pp with tp = ETP (expert tensor parallel), cp = 1, ep = EP and dp = EDP = world /
// (ETP x EP x PP), so that EP is carved out of the tp x cp x dp ranks of each pipeline stage. Its
// pipeline groups are the dense grid's. Not here: checks that depend on the model (heads, layers,
// experts, batch sizes divisible by the sizes).
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
  int expert_model_parallel_size = 1;    // --expert-model-parallel-size
  int expert_tensor_parallel_size = 0;   // --expert-tensor-parallel-size (0: the TP size)
  // The rank order of both grids: Megatron's default, or "tp-cp-ep-pp-dp" with
  // --use-tp-pp-dp-mapping (pipeline stages of one data-parallel replica on adjacent ranks).
  std::string order = std::string(kDefaultRankOrder);
  // --num-distributed-optimizer-instances: the data x context parallel ranks of a stage split into
  // this many consecutive instances of the distributed optimizer (ParallelState's intra-instance
  // and inter-instance groups).
  int num_distributed_optimizer_instances = 1;
};

// The expert grid's sizes (see above): ETP, EP and the expert-data-parallel size.
struct ExpertGrid {
  int etp = 1, ep = 1, edp = 1;
};
// Validates the expert sizes against the dense grid; errors name the flags and the fix.
ExpertGrid make_expert_grid(const ParallelGrid& dense, const ParallelConfig& config);

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
  // --num-distributed-optimizer-instances K: this rank's instance, the dp x cp / K consecutive
  // ranks of its data x context parallel group that share one copy of the optimizer state
  // (the whole group when K is 1), and the K ranks at its place in every instance (null when K
  // is 1). Megatron's intra-partial data-parallel and inter distributed-optimizer-instance groups.
  ProcessGroup& intra_instance_group() const { return *intra_dp_cp_; }
  ProcessGroup* inter_instance_group() const { return inter_instance_.get(); }
  // The same cut of the expert-data-parallel group (experts split apart): its K consecutive
  // blocks and the ranks at one place in each (Megatron's intra- and inter-partial expert
  // data-parallel groups); the dense ones' when experts are not apart.
  ProcessGroup& intra_instance_expert_group() const { return *intra_edp_; }
  ProcessGroup* inter_instance_expert_group() const { return inter_edp_.get(); }
  int num_distributed_optimizer_instances() const { return instances_; }
  // Tensor x data x context parallel: every rank of this pipeline stage, where FP8 delayed
  // scaling reduces its amaxes (Megatron's amax reduction group, with context parallelism).
  ProcessGroup& amax_reduction_group() const { return *amax_; }
  // Tensor x pipeline parallel: all ranks holding one copy of the model.
  ProcessGroup& model_parallel_group() const { return *mp_; }
  // First and last stage of this rank's pipeline, which hold the tied word embeddings. Middle
  // stages are in no embedding group; embedding_group() throws there.
  bool in_embedding_group() const { return embedding_ != nullptr; }
  ProcessGroup& embedding_group() const;

  // The expert grid (MoE): sizes, this rank's coordinates and groups. Without MoE flags EP is 1
  // and ETP = TP, and the groups coincide with the dense ones (tp_ep = etp = tp; expert dp =
  // dp x cp).
  const ExpertGrid& expert_grid() const { return expert_grid_; }
  int ep_size() const { return expert_grid_.ep; }
  int etp_size() const { return expert_grid_.etp; }
  int edp_size() const { return expert_grid_.edp; }
  int ep_rank() const { return ep_->rank(); }
  int edp_rank() const { return edp_->rank(); }
  // Whether experts are split otherwise than the dense layers (EP > 1 or ETP != TP): then their
  // gradients, norms and optimizer shards use the expert groups.
  bool experts_apart() const { return expert_grid_.ep > 1 || expert_grid_.etp != grid_.tp; }
  ProcessGroup& ep_group() const { return *ep_; }
  ProcessGroup& etp_group() const { return *etp_; }
  ProcessGroup& tp_ep_group() const { return *tp_ep_; }
  ProcessGroup& edp_group() const { return *edp_; }
  // ETP x EP x PP: every copy of the experts of one expert-data-parallel replica (norms).
  ProcessGroup& expert_model_parallel_group() const { return *emp_; }

  // One line for the startup log, e.g. "world 8 = tensor-model-parallel 2 x context-parallel 1
  // x data-parallel 2 x pipeline-model-parallel 2; rank 5: tp 1, cp 0, dp 0, pp 1".
  std::string str() const;

 private:
  ParallelGrid grid_;
  ExpertGrid expert_grid_;
  std::shared_ptr<ProcessGroup> world_, tp_, pp_, dp_, cp_, dp_cp_, mp_, embedding_, amax_;
  std::shared_ptr<ProcessGroup> ep_, etp_, tp_ep_, edp_, emp_;
  std::shared_ptr<ProcessGroup> intra_dp_cp_, inter_instance_, intra_edp_, inter_edp_;
  int instances_ = 1;
};

}  // namespace megatron
