// The weight-hash comparison across data-parallel replicas (replica_check.h).
#include "train/replica_check.h"

#include "checkpoint/checksum.h"
#include "core/error.h"

namespace megatron {

namespace {

// Mismatch lines of `params` (the same list, in the same order, on every rank of `group`).
void compare_over(const std::vector<const Param*>& params, ProcessGroup& group,
                  std::vector<std::string>* out) {
  const auto n = static_cast<int64_t>(params.size());
  if (n == 0 || group.size() == 1) return;
  Tensor mine = Tensor::empty({n}, DType::kI64);
  for (int64_t i = 0; i < n; ++i) {
    const Param& p = *params[static_cast<size_t>(i)];
    MEGATRON_CHECK(p.value.defined(),
                   "the weight-hash check needs every weight whole on its "
                   "rank; ",
                   p.name, " is a shard (Megatron-FSDP)");
    const Tensor host = p.value.device() == Device::kCPU ? p.value : p.value.to(Device::kCPU);
    const uint64_t h = checkpoint::xxh3_64(host.raw(), host.nbytes());
    mine.data<int64_t>()[i] = static_cast<int64_t>(h);
  }
  Tensor all = Tensor::empty({n * group.size()}, DType::kI64);
  group.all_gather(all, mine);
  const int64_t* h = all.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::string ranks;
    int count = 0;
    for (int r = 1; r < group.size(); ++r) {
      if (h[r * n + i] == h[i]) continue;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      ++count;
    }
    if (count > 0) {
      out->push_back(params[static_cast<size_t>(i)]->name + (count == 1 ? ": rank " : ": ranks ") +
                     ranks + " of its data-parallel group " + (count == 1 ? "differs" : "differ") +
                     " from rank 0");
    }
  }
}

}  // namespace

std::vector<std::string> replica_weight_mismatches(const std::vector<Param*>& params,
                                                   ProcessGroup& dense, ProcessGroup& expert) {
  std::vector<const Param*> dense_params, expert_params;
  for (const Param* p : params) (p->expert_parallel ? expert_params : dense_params).push_back(p);
  std::vector<std::string> out;
  compare_over(dense_params, dense, &out);
  compare_over(expert_params, expert, &out);
  return out;
}

}  // namespace megatron
