// Column/RowParallelLinear: the local GEMM is our Linear on the shard; the communication is the
// mappings' conjugate pairs around it.
#include "parallel/tensor_parallel_linear.h"

#include "parallel/mappings.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

Shape with_last(const Shape& s, int64_t n) {
  Shape out = s;
  out[-1] = n;
  return out;
}

// Marks p as the shard of a tensor split on `dim` (or replicated, dim -1) over `tp`.
void mark_shard(Param& p, ProcessGroup& tp, int dim, int stride = 1) {
  p.tp_partition_dim = dim;
  p.tp_partition_stride = stride;
  p.tp_rank = tp.rank();
  p.tp_size = tp.size();
}

}  // namespace

// ---- ColumnParallelLinear -----------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(const std::string& name, int64_t in, int64_t out,
                                           double init_std, ProcessGroup& tp, Options options)
    : tp_(tp),
      options_(options),
      in_(in),
      out_(out),
      out_local_(
          divide(out, tp.size(), name + ": output features by --tensor-model-parallel-size")),
      local_(name, in, out_local_, options.with_bias, init_std) {
  MEGATRON_CHECK(options.stride >= 1 && out_local_ % options.stride == 0, name, ": ", out_local_,
                 " output features per rank do not split into ", options.stride, " blocks");
  mark_shard(local_.weight, tp, 0, options.stride);
  if (local_.has_bias()) mark_shard(local_.bias, tp, 0, options.stride);
  if (!options.sections.empty()) {
    MEGATRON_CHECK(options.stride == 1, name, ": a stride and sections together");
    int64_t sum = 0;
    for (int64_t n : options.sections) {
      sum += n;
      MEGATRON_CHECK(n % tp.size() == 0, name, ": an output block of ", n,
                     " features does not split over --tensor-model-parallel-size ", tp.size());
    }
    MEGATRON_CHECK(sum == out, name, ": output blocks of ", sum, " features, expected ", out);
    local_.weight.tp_partition_sections = options.sections;
    if (local_.has_bias()) local_.bias.tp_partition_sections = options.sections;
  }
  local_.set_skip_bias_add(options.skip_bias_add);
}

Tensor ColumnParallelLinear::forward(const Tensor& x, Ctx& ctx) const {
  MEGATRON_CHECK(x.dim(-1) == in_, local_.weight.name, ": input has ", x.dim(-1),
                 " features, expected ", in_);
  ctx.in_shape = x.shape();
  // Under sequence parallelism each rank holds s/p tokens; the GEMM needs all of them.
  Tensor total = options_.sequence_parallel ? gather_from_sequence_parallel_region_forward(x, tp_)
                                            : copy_to_tp_region_forward(x, tp_);
  Tensor y = local_.forward(total, ctx.linear).view(with_last(total.shape(), out_local_));
  return options_.gather_output ? gather_from_tp_region_forward(y, tp_) : y;
}

void ColumnParallelLinear::keep_input(const Tensor& x, Ctx& ctx) const {
  ctx.in_shape = x.shape();
  local_.keep_input(options_.sequence_parallel
                        ? gather_from_sequence_parallel_region_forward(x, tp_)
                        : copy_to_tp_region_forward(x, tp_),
                    ctx.linear);
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, Ctx& ctx) const {
  Tensor dy_local = options_.gather_output ? gather_from_tp_region_backward(dy, tp_) : dy;
  Shape total_shape = ctx.in_shape;
  if (options_.sequence_parallel) total_shape[0] *= tp_.size();
  // dX_i = dY_i A_i is this rank's partial sum of dX: summed over ranks (and scattered back to
  // this rank's tokens under sequence parallelism).
  Tensor dx = local_.backward(dy_local, ctx.linear).view(total_shape);
  return options_.sequence_parallel ? gather_from_sequence_parallel_region_backward(dx, tp_)
                                    : copy_to_tp_region_backward(dx, tp_);
}

// ---- RowParallelLinear --------------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(const std::string& name, int64_t in, int64_t out,
                                     double init_std, ProcessGroup& tp, Options options)
    : tp_(tp),
      options_(options),
      in_(in),
      out_(out),
      in_local_(divide(in, tp.size(), name + ": input features by --tensor-model-parallel-size")),
      local_(name, in_local_, out, /*with_bias=*/false, init_std) {
  // Megatron's rule: the sequence-parallel reduce-scatter assumes the input was already split by
  // the preceding column-parallel layer.
  MEGATRON_CHECK(!options.sequence_parallel || options.input_is_parallel, name,
                 ": --sequence-parallel needs input_is_parallel (a column-parallel producer)");
  if (options.with_bias) {
    bias.name = name + ".bias";
    bias.shape = {out};
    bias.init = Init::kZeros;
    bias.no_weight_decay = true;
    mark_shard(bias, tp, -1);
    bias.sequence_parallel = options.sequence_parallel && tp.size() > 1;
  }
  mark_shard(local_.weight, tp, 1);
}

void RowParallelLinear::collect(std::vector<Param*>& out) {
  local_.collect(out);
  if (has_bias()) out.push_back(&bias);
}

Tensor RowParallelLinear::forward(const Tensor& x, Ctx& ctx) const {
  Tensor x_local = options_.input_is_parallel ? x : scatter_to_tp_region_forward(x, tp_);
  MEGATRON_CHECK(x_local.dim(-1) == in_local_, local_.weight.name, ": input has ", x.dim(-1),
                 " features, expected ", options_.input_is_parallel ? in_local_ : in_,
                 options_.input_is_parallel ? " (this rank's split of the input)" : "");
  ctx.in_shape = x.shape();
  Tensor partial = local_.forward(x_local, ctx.linear).view(with_last(x_local.shape(), out_));
  Tensor y = options_.sequence_parallel
                 ? reduce_scatter_to_sequence_parallel_region_forward(partial, tp_)
                 : reduce_from_tp_region_forward(partial, tp_);
  // After the reduction: the bias is added once, not once per rank.
  if (has_bias()) ops::bias_add(y, bias.value_as(y.dtype()));
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy, Ctx& ctx) const {
  // Under sequence parallelism dy holds this rank's tokens only: the bias gradient is partial
  // (see Param::sequence_parallel) and the GEMM needs every token's gradient.
  if (has_bias() && bias.main_grad.defined()) {
    Tensor db = bias.main_grad;
    ops::bias_backward(db, dy);
  }
  Tensor dy_total = options_.sequence_parallel
                        ? reduce_scatter_to_sequence_parallel_region_backward(dy, tp_)
                        : reduce_from_tp_region_backward(dy, tp_);
  Shape local_shape = with_last(ctx.in_shape, in_local_);
  Tensor dx = local_.backward(dy_total, ctx.linear).view(local_shape);
  return options_.input_is_parallel ? dx : scatter_to_tp_region_backward(dx, tp_);
}

}  // namespace megatron
