// Pooler forward and backward: gather (sequence parallel), pick one position, dense, tanh.
#include "models/common/pooler.h"

#include "parallel/mappings.h"
#include "tensor/ops.h"

namespace megatron {

Pooler::Pooler(const std::string& name, int64_t hidden_size, double init_std,
               const TensorParallelContext& tp, int64_t sequence_index)
    : dense(name + ".dense", hidden_size, hidden_size, /*with_bias=*/true, init_std),
      tp_(tp),
      h_(hidden_size),
      index_(sequence_index) {
  for (Param* p : {&dense.weight, &dense.bias}) {
    p->tp_rank = tp_.rank();
    p->tp_size = tp_.size();
  }
}

void Pooler::collect(std::vector<Param*>& out) {
  dense.collect(out);
}

Tensor Pooler::forward(const Tensor& hidden, Ctx& ctx) const {
  MEGATRON_CHECK(hidden.ndim() == 3 && hidden.dim(2) == h_, dense.weight.name,
                 ": hidden must be [s, b, ", h_, "], got ", hidden.str());
  const Tensor full =
      tp_.sp() ? gather_from_sequence_parallel_region_forward(hidden, *tp_.group) : hidden;
  ctx.s = full.dim(0);
  ctx.b = full.dim(1);
  MEGATRON_CHECK(index_ < ctx.s, dense.weight.name, ": position ", index_,
                 " is past the sequence (length ", ctx.s, ")");
  // Position index_ of every sequence: rows [index_ b, (index_ + 1) b) of the [s b, h] view.
  const Tensor x = full.view({ctx.s * ctx.b, h_}).slice0(index_ * ctx.b, (index_ + 1) * ctx.b);
  const Tensor z = dense.forward(x, ctx.dense);
  ctx.y = Tensor::empty(z.shape(), z.dtype(), z.device());
  ops::tanh_forward(ctx.y, z);
  return ctx.y;
}

Tensor Pooler::backward(const Tensor& dpooled, Ctx& ctx) const {
  check_shape(dpooled, {ctx.b, h_}, "Pooler dpooled");
  Tensor dz = Tensor::empty(ctx.y.shape(), ctx.y.dtype(), ctx.y.device());
  const Tensor d = dpooled.dtype() == dz.dtype() ? dpooled : dpooled.to(dz.dtype());
  ops::tanh_backward(dz, d, ctx.y);
  const Tensor dx = dense.backward(dz, ctx.dense);
  Tensor dfull = Tensor::zeros({ctx.s, ctx.b, h_}, dx.dtype(), dx.device());
  Tensor rows = dfull.view({ctx.s * ctx.b, h_}).slice0(index_ * ctx.b, (index_ + 1) * ctx.b);
  ops::add_inplace(rows, dx);  // 0 + dx: exact
  const Tensor out = tp_.sp() ? gather_from_sequence_parallel_region_backward(
                                    dfull, *tp_.group, /*tp_output_grad=*/false)
                              : dfull;
  ctx = Ctx{};
  return out;
}

}  // namespace megatron
