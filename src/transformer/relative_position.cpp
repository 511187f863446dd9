// T5's relative-position buckets and the bias built from them (see the header).
#include "transformer/relative_position.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "parallel/mappings.h"
#include "tensor/ops.h"

namespace megatron {

int64_t relative_position_bucket(int64_t d, bool bidirectional, int64_t num_buckets,
                                 int64_t max_distance) {
  int64_t bucket = 0, n = num_buckets;
  if (bidirectional) {
    n /= 2;
    if (d > 0) bucket += n;
    d = std::llabs(d);
  } else {
    d = -std::min<int64_t>(d, 0);
  }
  const int64_t max_exact = n / 2;
  if (d < max_exact) return bucket + d;
  // float32 throughout, as torch computes it: log of the float ratio, divided by the float of
  // Python's double log, times the float count, truncated.
  const float ratio = static_cast<float>(d) / static_cast<float>(max_exact);
  const auto span = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = std::log(ratio) / span * static_cast<float>(n - max_exact);
  const int64_t large = std::min<int64_t>(max_exact + static_cast<int64_t>(scaled), n - 1);
  return bucket + large;
}

RelativePositionBias::RelativePositionBias(const std::string& name, const TransformerConfig& cfg,
                                           const TensorParallelContext& tp, bool bidirectional)
    : cfg_(cfg),
      tp_(tp),
      bidirectional_(bidirectional),
      heads_local_(divide(cfg.num_attention_heads, tp.size(),
                          "--num-attention-heads by --tensor-model-parallel-size")) {
  weight.name = name + ".relative_attention_bias.weight";
  weight.shape = {cfg.relative_attention_num_buckets, cfg.num_attention_heads};
  weight.init = Init::kNormal;
  weight.init_std = cfg.init_method_std;
  weight.tp_rank = tp.rank();
  weight.tp_size = tp.size();
  // Each rank's gradient covers only its heads' columns: summed over TP (see the header).
  weight.sequence_parallel = tp.size() > 1;
}

Tensor RelativePositionBias::forward(int64_t sq, int64_t sk, DType dtype, int64_t q_offset) const {
  const int64_t heads = cfg_.num_attention_heads, np = heads_local_, h0 = tp_.rank() * np;
  const Tensor table = weight.value_as(DType::kF64);
  const double* t = table.data<double>();
  Tensor bias = Tensor::empty({1, np, sq, sk}, DType::kF64);
  double* out = bias.data<double>();
  for (int64_t i = 0; i < sq; ++i) {
    for (int64_t j = 0; j < sk; ++j) {
      const int64_t k = relative_position_bucket(j - (i + q_offset), bidirectional_,
                                                 cfg_.relative_attention_num_buckets,
                                                 cfg_.relative_attention_max_distance);
      for (int64_t h = 0; h < np; ++h) out[(h * sq + i) * sk + j] = t[k * heads + h0 + h];
    }
  }
  return dtype == DType::kF64 ? bias : bias.to(dtype);
}

void RelativePositionBias::backward(const Tensor& dbias) const {
  const int64_t heads = cfg_.num_attention_heads, np = heads_local_, h0 = tp_.rank() * np;
  MEGATRON_CHECK(dbias.ndim() == 4 && dbias.dim(0) == 1 && dbias.dim(1) == np,
                 "RelativePositionBias: dbias must be [1, ", np, ", sq, sk], got ", dbias.str());
  const int64_t sq = dbias.dim(2), sk = dbias.dim(3);
  const Tensor d = dbias.to(DType::kF64);
  const double* g = d.data<double>();
  Tensor delta = Tensor::zeros(weight.shape, DType::kF64);
  double* acc = delta.data<double>();
  for (int64_t i = 0; i < sq; ++i) {
    for (int64_t j = 0; j < sk; ++j) {
      const int64_t k =
          relative_position_bucket(j - i, bidirectional_, cfg_.relative_attention_num_buckets,
                                   cfg_.relative_attention_max_distance);
      for (int64_t h = 0; h < np; ++h) acc[k * heads + h0 + h] += g[(h * sq + i) * sk + j];
    }
  }
  Tensor grad = weight.main_grad;
  ops::add_inplace(grad, delta.to(grad.dtype()));
}

}  // namespace megatron
