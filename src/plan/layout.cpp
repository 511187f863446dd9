// Layout names for tables and messages.
#include "plan/layout.h"

#include "core/logging.h"

namespace megatron::plan {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::kNone:
      return "ddp";
    case Sharding::kDistributedOptimizer:
      return "dist-opt";
    case Sharding::kFsdpGrads:
      return "fsdp-grads";
    case Sharding::kFsdp:
      return "fsdp";
  }
  return "?";
}

std::string layout_name(const Layout& l) {
  std::string s = strprintf("tp%ld%s", static_cast<long>(l.tp), l.sp ? "+sp" : "");
  if (l.cp > 1)
    s += strprintf(" cp%ld%s", static_cast<long>(l.cp),
                   l.cp_comm_type == "p2p" ? "" : ("-" + l.cp_comm_type).c_str());
  s += strprintf(" pp%ld", static_cast<long>(l.pp));
  if (l.vpp > 1) s += strprintf("x%ld", static_cast<long>(l.vpp));
  if (l.split.first_stage_layers > 0)
    s += strprintf(" first%ld", static_cast<long>(l.split.first_stage_layers));
  if (l.split.last_stage_layers > 0)
    s += strprintf(" last%ld", static_cast<long>(l.split.last_stage_layers));
  if (l.split.embedding_in_split) s += " +emb";
  if (l.split.loss_in_split) s += " +loss";
  if (!l.split.layout.empty()) s += " layout";
  if (l.ep > 1 || l.etp != l.tp)
    s += strprintf(" ep%ld etp%ld", static_cast<long>(l.ep), static_cast<long>(l.etp));
  s += strprintf(" dp%ld mbs%ld", static_cast<long>(l.dp), static_cast<long>(l.mbs));
  if (l.recompute != Recompute::kNone) s += std::string(" rc-") + recompute_name(l.recompute);
  if (l.sharding != Sharding::kNone) s += std::string(" ") + sharding_name(l.sharding);
  if (l.instances > 1) s += strprintf(" x%ld", static_cast<long>(l.instances));
  return s;
}

}  // namespace megatron::plan
