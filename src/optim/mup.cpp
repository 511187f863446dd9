// The μP parameter classes (optim/mup.h).
#include "optim/mup.h"

#include "optim/muon.h"

namespace megatron {

void assign_mup_classes(const std::vector<Param*>& params, const std::string& optimizer) {
  const bool sgd = optimizer == "sgd";
  const bool muon = optimizer == "muon" || optimizer == "dist_muon";
  for (Param* p : params) {
    const int64_t ndim =
        p->megatron_ndim > 0 ? p->megatron_ndim : static_cast<int64_t>(p->shape.ndim());
    const bool embedding = p->is_embedding_or_output || p->name.rfind("embedding.", 0) == 0;
    const bool vector = embedding || ndim <= 1;
    if (sgd) {
      p->mup_class = vector ? Param::MupClass::kVector : Param::MupClass::kNone;
    } else {
      p->mup_class = !vector && !(muon && is_muon_matrix(*p)) ? Param::MupClass::kHidden
                                                              : Param::MupClass::kNone;
    }
  }
}

}  // namespace megatron
