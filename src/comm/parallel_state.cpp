// ParallelState: validates the layout, creates this rank's groups and coordinates.
#include "comm/parallel_state.h"

#include <utility>

#include "core/error.h"

namespace megatron {

ParallelGrid make_parallel_grid(int world_size, const ParallelConfig& config) {
  const int tp = config.tensor_model_parallel_size, pp = config.pipeline_model_parallel_size;
  const int cp = config.context_parallel_size, ep = config.expert_model_parallel_size;
  MEGATRON_CHECK(world_size >= 1, "the world has ", world_size, " processes");
  MEGATRON_CHECK(tp >= 1, "--tensor-model-parallel-size must be >= 1, got ", tp);
  MEGATRON_CHECK(pp >= 1, "--pipeline-model-parallel-size must be >= 1, got ", pp);
  MEGATRON_CHECK(cp >= 1, "--context-parallel-size must be >= 1, got ", cp);
  MEGATRON_CHECK(ep >= 1, "--expert-model-parallel-size must be >= 1, got ", ep);
  const int64_t model_size = static_cast<int64_t>(tp) * pp * cp;
  // Megatron's wording ("world size (W) is not divisible by total_model_size (M)"), then how the
  // number came about and what to change.
  MEGATRON_CHECK(world_size % model_size == 0, "world size (", world_size,
                 ") is not divisible by total_model_size (", model_size,
                 ") = --tensor-model-parallel-size (", tp, ") x --pipeline-model-parallel-size (",
                 pp, ") x --context-parallel-size (", cp, "); launch a multiple of ", model_size,
                 " processes (e.g. mpirun -np ", model_size,
                 ") or choose sizes whose product divides ", world_size);
  ParallelGrid grid;
  grid.tp = tp;
  grid.cp = cp;
  grid.pp = pp;  // ep lives in the expert grid (make_expert_grid); the dense grid's is 1
  grid.dp = static_cast<int>(world_size / model_size);
  const int k = config.num_distributed_optimizer_instances;
  MEGATRON_CHECK(k >= 1, "--num-distributed-optimizer-instances must be >= 1, got ", k);
  MEGATRON_CHECK(static_cast<int64_t>(grid.dp) * cp % k == 0,
                 "Data parallel size should be divisible by partial DistOpt shard factor: the "
                 "data-parallel size (",
                 grid.dp, ") x --context-parallel-size (", cp,
                 ") must be divisible by --num-distributed-optimizer-instances (", k, ")");
  return grid;
}

ExpertGrid make_expert_grid(const ParallelGrid& dense, const ParallelConfig& config) {
  ExpertGrid g;
  g.ep = config.expert_model_parallel_size;
  g.etp = config.expert_tensor_parallel_size > 0 ? config.expert_tensor_parallel_size : dense.tp;
  MEGATRON_CHECK(g.etp >= 1, "--expert-tensor-parallel-size must be >= 1, got ", g.etp);
  const int64_t stage = static_cast<int64_t>(dense.tp) * dense.cp * dense.dp;  // ranks per stage
  const int64_t experts = static_cast<int64_t>(g.etp) * g.ep;
  MEGATRON_CHECK(stage % experts == 0, "--expert-tensor-parallel-size (", g.etp,
                 ") x --expert-model-parallel-size (", g.ep, ") = ", experts,
                 " must divide the ranks of a pipeline stage, tensor x context x data parallel = ",
                 dense.tp, " x ", dense.cp, " x ", dense.dp, " = ", stage,
                 "; launch more processes or choose smaller expert sizes");
  g.edp = static_cast<int>(stage / experts);
  // With the pipeline before data parallelism in the rank order (--use-tp-pp-dp-mapping) a
  // pipeline group's stride is tp x cp in the dense grid and etp x ep in the expert grid: under
  // pipeline parallelism both grids must share their pipeline groups (Megatron asserts it).
  if (dense.pp > 1 && config.order.find("pp") < config.order.find("dp")) {
    MEGATRON_CHECK(experts == static_cast<int64_t>(dense.tp) * dense.cp,
                   "--use-tp-pp-dp-mapping with --pipeline-model-parallel-size ", dense.pp,
                   ": --expert-tensor-parallel-size x --expert-model-parallel-size (", experts,
                   ") must equal --tensor-model-parallel-size x --context-parallel-size (",
                   static_cast<int64_t>(dense.tp) * dense.cp,
                   ") so that the expert layers' pipeline groups are the dense layers'; drop the "
                   "flag or change the sizes");
  }
  return g;
}

namespace {
int world_size_of(const std::shared_ptr<ProcessGroup>& world) {
  MEGATRON_CHECK(world != nullptr, "ParallelState: the world group is null");
  return world->size();
}
}  // namespace

ParallelState::ParallelState(std::shared_ptr<ProcessGroup> world, const ParallelConfig& config)
    : grid_(make_parallel_grid(world_size_of(world), config)), world_(std::move(world)) {
  RankGenerator gen(grid_, config.order);
  // Every rank splits in the same order, so the collective splits pair up.
  tp_ = world_->split(gen.get_ranks("tp"));
  pp_ = world_->split(gen.get_ranks("pp"));
  dp_ = world_->split(gen.get_ranks("dp"));
  cp_ = world_->split(gen.get_ranks("cp"));
  dp_cp_ = world_->split(gen.get_ranks("dp-cp"));
  mp_ = world_->split(gen.get_ranks("tp-pp"));
  embedding_ = world_->split(embedding_rank_groups(gen.get_ranks("pp")));
  amax_ = world_->split(gen.get_ranks("tp-dp-cp"));
  // Each of these lists partitions the world, so this rank is in one group of each.
  MEGATRON_ASSERT(tp_ && pp_ && dp_ && cp_ && dp_cp_ && mp_ && amax_);
  // The expert grid over the same ranks (Megatron's expert RankGenerator: cp 1).
  expert_grid_ = make_expert_grid(grid_, config);
  ParallelGrid eg;
  eg.tp = expert_grid_.etp;
  eg.ep = expert_grid_.ep;
  eg.dp = expert_grid_.edp;
  eg.pp = grid_.pp;
  RankGenerator expert_gen(eg, config.order);
  // (make_expert_grid refuses the sizes for which they would differ.)
  MEGATRON_ASSERT(expert_gen.get_ranks("pp") == gen.get_ranks("pp"),
                  "the expert grid's pipeline groups differ from the dense grid's");
  ep_ = world_->split(expert_gen.get_ranks("ep"));
  etp_ = world_->split(expert_gen.get_ranks("tp"));
  tp_ep_ = world_->split(expert_gen.get_ranks("tp-ep"));
  edp_ = world_->split(expert_gen.get_ranks("dp"));
  emp_ = world_->split(expert_gen.get_ranks("tp-ep-pp"));
  MEGATRON_ASSERT(ep_ && etp_ && tp_ep_ && edp_ && emp_);
  // Distributed-optimizer instances: each data x context parallel group (and expert data
  // parallel group) cut into K consecutive blocks (Megatron's intra-partial groups), and the
  // ranks at the same place in each block.
  instances_ = config.num_distributed_optimizer_instances;
  if (instances_ == 1) {
    intra_dp_cp_ = dp_cp_;
    intra_edp_ = edp_;
    return;
  }
  const auto cut = [&](const RankGroups& groups, RankGroups& intra, RankGroups& inter) {
    const auto k = static_cast<size_t>(instances_);
    for (const std::vector<int>& g : groups) {
      MEGATRON_CHECK(g.size() % k == 0, "--num-distributed-optimizer-instances (", instances_,
                     ") must divide the data x context parallel and expert-data-parallel sizes (",
                     g.size(), " here)");
      const size_t n = g.size() / k;
      for (size_t i = 0; i < k; ++i)
        intra.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(i * n),
                           g.begin() + static_cast<std::ptrdiff_t>((i + 1) * n));
      for (size_t j = 0; j < n; ++j) {
        std::vector<int> across;
        for (size_t i = 0; i < k; ++i) across.push_back(g[i * n + j]);
        inter.push_back(std::move(across));
      }
    }
  };
  RankGroups intra, inter, intra_e, inter_e;
  cut(gen.get_ranks("dp-cp"), intra, inter);
  cut(expert_gen.get_ranks("dp"), intra_e, inter_e);
  intra_dp_cp_ = world_->split(intra);
  inter_instance_ = world_->split(inter);
  intra_edp_ = world_->split(intra_e);
  inter_edp_ = world_->split(inter_e);
  MEGATRON_ASSERT(intra_dp_cp_ && inter_instance_ && intra_edp_ && inter_edp_);
}

ProcessGroup& ParallelState::embedding_group() const {
  MEGATRON_CHECK(embedding_ != nullptr, "rank ", rank(), " is pipeline stage ", pp_rank(), " of ",
                 pp_size(),
                 ": only the first and last stage are in an embedding group (check "
                 "in_embedding_group() first)");
  return *embedding_;
}

std::string ParallelState::str() const {
  std::string s =
      detail::concat("world ", world_size(), " = tensor-model-parallel ", tp_size(),
                     " x context-parallel ", cp_size(), " x data-parallel ", dp_size(),
                     " x pipeline-model-parallel ", pp_size(), "; rank ", rank(), ": tp ",
                     tp_rank(), ", cp ", cp_rank(), ", dp ", dp_rank(), ", pp ", pp_rank());
  if (experts_apart()) {
    s += detail::concat("; experts: expert-tensor-parallel ", etp_size(),
                        " x expert-model-parallel ", ep_size(), " x expert-data-parallel ",
                        edp_size(), ", ep ", ep_rank(), ", edp ", edp_rank());
  }
  return s;
}

}  // namespace megatron
