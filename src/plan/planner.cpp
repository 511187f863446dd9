// Layout enumeration and ranking (see planner.h).
#include "plan/planner.h"

#include <algorithm>

#include "core/error.h"
#include "core/logging.h"
#include "pipeline/schedule.h"

namespace megatron::plan {

namespace {

std::vector<int64_t> divisors(int64_t n, int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t v = 1; v <= std::min(n, limit); ++v)
    if (n % v == 0) out.push_back(v);
  return out;
}

std::vector<int64_t> powers_of_two(int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t v = 1; v <= limit; v *= 2) out.push_back(v);
  return out;
}

// The context-parallel exchanges searched: one without context parallelism or when fixed.
std::vector<std::string> cp_comms(int64_t cp, const std::string& fixed) {
  if (!fixed.empty()) return {fixed};
  if (cp == 1) return {"p2p"};
  return {"p2p", "allgather", "a2a"};
}

template <typename T>
std::vector<T> fixed_or(int64_t fixed, std::vector<T> all) {
  if (fixed > 0) return {static_cast<T>(fixed)};
  return all;
}

}  // namespace

std::string layout_rule_violation(const Workload& w, const Layout& l, int64_t world) {
  const TransformerConfig& c = w.config;
  auto why = [](auto... parts) { return (std::string() + ... + std::string(parts)); };
  if (c.num_attention_heads % l.tp != 0 || c.num_query_groups % l.tp != 0)
    return "--tensor-model-parallel-size must divide the heads and query groups";
  if (l.world() != world)
    return why("tp x cp x pp x dp = ", std::to_string(l.world()), " is not the ",
               std::to_string(world), " devices");
  if (l.sp && l.tp == 1) return "--sequence-parallel needs tp > 1";
  try {
    validate_pipeline_split(c.num_layers, l.pp, l.vpp, l.split);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  if (l.vpp > 1 && l.pp == 1) return "virtual pipeline stages need pp > 1";
  if (w.global_batch % (l.mbs * l.dp) != 0)
    return "--global-batch-size must divide by micro-batch x data-parallel size";
  const int64_t m = l.microbatches(w.global_batch);
  if (l.vpp > 1) {
    try {  // the interleaved schedule's micro-batch groups (pipeline/schedule.h)
      validate_interleaving(static_cast<int>(l.pp), static_cast<int>(m), static_cast<int>(l.vpp),
                            static_cast<int>(l.vpp_group));
    } catch (const InvalidArgument& e) {
      return e.what();
    }
  }
  if (l.cp > 1 && c.seq_length % (2 * l.cp) != 0)
    return "--seq-length must divide by 2 x context-parallel size";
  if (c.moe.num_experts > 0) {
    if (c.moe.num_experts % l.ep != 0)
      return "--expert-model-parallel-size must divide --num-experts";
    if ((l.tp * l.cp * l.dp) % (l.ep * l.etp) != 0)
      return "expert x expert-tensor parallel size must divide tp x cp x dp";
  } else if (l.ep != 1 || l.etp != l.tp) {
    return "expert parallelism needs --num-experts";
  }
  if ((l.sharding == Sharding::kFsdp || l.sharding == Sharding::kFsdpGrads) && l.pp > 1)
    return "Megatron-FSDP runs without pipelining";
  // (The trainer takes K dividing dp x cp; the model splits the data-parallel ranks.)
  if (l.instances > 1 && (l.sharding == Sharding::kNone || l.dp % l.instances != 0))
    return "--num-distributed-optimizer-instances needs a sharded optimizer and must divide the "
           "data-parallel size (as the planner models it)";
  if (l.instances > 1 && c.moe.num_experts > 0 &&
      (l.tp * l.cp * l.dp / (l.ep * l.etp)) % l.instances != 0)
    return "--num-distributed-optimizer-instances must divide the expert-data-parallel size";
  if (l.cp_comm_type == "a2a" && c.num_attention_heads % (l.tp * l.cp) != 0)
    return "--cp-comm-type a2a needs the heads divisible by tp x cp";
  return "";
}

std::vector<Candidate> plan_layouts(const PlanRequest& r) {
  const Workload& w = r.workload;
  const TransformerConfig& c = w.config;
  const Constraints& k = r.constraints;
  const int64_t world = r.cluster.world();
  const bool moe = c.moe.num_experts > 0;
  std::vector<Recompute> recomputes = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  if (!k.recompute.empty()) {
    recomputes = {k.recompute == "full"        ? Recompute::kFull
                  : k.recompute == "selective" ? Recompute::kSelective
                                               : Recompute::kNone};
  }
  std::vector<Sharding> shardings = {Sharding::kNone, Sharding::kDistributedOptimizer,
                                     Sharding::kFsdpGrads, Sharding::kFsdp};
  if (!k.sharding.empty()) {
    shardings = {k.sharding == "fsdp"         ? Sharding::kFsdp
                 : k.sharding == "fsdp-grads" ? Sharding::kFsdpGrads
                 : k.sharding == "dist-opt"   ? Sharding::kDistributedOptimizer
                                              : Sharding::kNone};
  }
  std::vector<Candidate> out;
  for (int64_t tp : fixed_or(k.tp, divisors(world, 64)))
    for (int64_t cp : fixed_or(k.cp, divisors(world / tp, 64)))
      for (int64_t pp :
           fixed_or(k.pp, divisors(world / (tp * cp), split_units(c.num_layers, k.split)))) {
        if (world % (tp * cp * pp) != 0) continue;
        const int64_t dp = world / (tp * cp * pp);
        // Virtual stages: those the split allows (layout_rule_violation checks them); a layout
        // string fixes them (its stages over pp).
        const auto layout_stages = static_cast<int64_t>(k.split.layout.size());
        const std::vector<int64_t> vpps =
            layout_stages > 0 ? std::vector<int64_t>{std::max<int64_t>(1, layout_stages / pp)}
            : pp > 1          ? std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}
                              : std::vector<int64_t>{1};
        for (int64_t vpp : fixed_or(k.vpp, vpps)) {
          // The split is checked once per (pp, vpp), not for every layout beneath it.
          try {
            validate_pipeline_split(c.num_layers, pp, vpp, k.split);
          } catch (const InvalidArgument&) {
            continue;
          }
          for (int64_t ep :
               fixed_or(k.ep, moe ? divisors(c.moe.num_experts, world) : std::vector<int64_t>{1}))
            for (int64_t etp : fixed_or(
                     k.etp, moe && tp > 1 ? std::vector<int64_t>{1, tp} : std::vector<int64_t>{tp}))
              for (int64_t mbs : fixed_or(k.mbs, powers_of_two(r.max_micro_batch)))
                for (Recompute rc : recomputes)
                  for (Sharding sh : shardings)
                    for (const std::string& cp_comm : cp_comms(cp, k.cp_comm_type)) {
                      if (sh != Sharding::kNone && dp == 1) continue;  // nothing to shard
                      Layout l;
                      l.tp = tp;
                      l.cp = cp;
                      l.pp = pp;
                      l.vpp = vpp;
                      l.ep = ep;
                      l.etp = etp;
                      l.dp = dp;
                      l.mbs = mbs;
                      l.sp = tp > 1;
                      l.recompute = rc;
                      l.sharding = sh;
                      l.cp_comm_type = cp_comm;
                      l.split = k.split;
                      l.vpp_group = vpp > 1 ? k.vpp_group : 0;
                      l.instances = sh == Sharding::kNone ? 1 : k.instances;
                      l.overlap_grad_reduce = dp > 1;
                      l.overlap_param_gather = dp > 1 && sh == Sharding::kDistributedOptimizer;
                      if (!layout_rule_violation(w, l, world).empty()) continue;
                      if (r.refuse && !r.refuse(l).empty()) continue;
                      Candidate cand;
                      cand.layout = l;
                      cand.prediction = predict(w, l, r.cluster);
                      cand.fits = cand.prediction.total_bytes <= r.cluster.device.memory_bytes;
                      out.push_back(cand);
                    }
        }
      }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.prediction.step < b.prediction.step
                  : a.prediction.total_bytes < b.prediction.total_bytes;
  });
  return out;
}

}  // namespace megatron::plan
