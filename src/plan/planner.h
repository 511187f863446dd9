// Planner: every valid layout of a workload on a cluster, predicted and ranked.
//
// Enumerates tensor parallelism (with sequence parallelism), context parallelism (ring, all-gather
// or all-to-all exchange), pipeline parallelism with its virtual stages, expert parallelism
// (expert tensor parallelism 1 or tp),
// data parallelism with each sharding (DDP, distributed optimizer, FSDP), the micro-batch size
// and recomputation (none, selective, full), keeping those that satisfy Megatron's rules
// (divisibility of heads, groups, layers, experts, batch and sequence; interleaving only with
// pipelining and micro-batches divisible by pp) and the caller's own check (the CLI's full flag
// validation, so that every printed command runs). Ranked by predicted step time, layouts that
// fit in memory first. Overlapped gradient reduction (and parameter gathering with a sharded
// optimizer) is on wherever there is data parallelism, as Megatron's performance guides advise.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "plan/cost_model.h"

namespace megatron::plan {

// Degrees the user fixed (0: free).
struct Constraints {
  int64_t tp = 0, cp = 0, pp = 0, vpp = 0, ep = 0, etp = 0, mbs = 0;
  std::string recompute;     // "" free, or none / selective / full
  std::string sharding;      // "" free, or ddp / dist-opt / fsdp-grads / fsdp
  std::string cp_comm_type;  // "" free, or p2p / allgather / a2a
  PipelineSplit split;       // every layout's layer split (default: even)
  // --microbatch-group-size-per-virtual-pipeline-stage for the interleaved layouts (0: pp).
  int64_t vpp_group = 0;
  int64_t instances = 1;  // --num-distributed-optimizer-instances (every layout's)
};

struct Candidate {
  Layout layout;
  Prediction prediction;
  bool fits = false;
};

struct PlanRequest {
  Workload workload;
  Cluster cluster;
  Constraints constraints;
  int64_t max_micro_batch = 16;
  // Returns why a layout is refused ("" to accept): the CLI's flag validation.
  std::function<std::string(const Layout&)> refuse;
};

// Every valid layout, ranked: fitting ones by step time, then the rest by memory.
std::vector<Candidate> plan_layouts(const PlanRequest& request);

// Megatron's rules for one layout of the workload on `world` devices; "" when valid, else the
// first broken rule naming the flags.
std::string layout_rule_violation(const Workload& w, const Layout& l, int64_t world);

}  // namespace megatron::plan
