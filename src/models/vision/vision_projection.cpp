// The vision projection's forward and backward (see the header).
#include "models/vision/vision_projection.h"

#include "core/error.h"
#include "tensor/ops.h"

namespace megatron {

namespace {

bool is_affine(const TransformerConfig& lm) {
  const std::string& t = lm.vision.projection_type;
  MEGATRON_CHECK(t == "mlp" || t == "affine", "--vision-projection-type: unknown '", t,
                 "'; choose mlp or affine");
  return t == "affine";
}

int64_t projection_ffn(const TransformerConfig& lm) {
  return lm.vision.projection_ffn_hidden_size > 0 ? lm.vision.projection_ffn_hidden_size
                                                  : lm.hidden_size;
}

}  // namespace

VisionProjection::VisionProjection(const TransformerConfig& lm, int64_t vision_hidden,
                                   const TensorParallelContext& tp)
    : linear_fc1(
          is_affine(lm) ? "vision_projection.encoder" : "vision_projection.encoder.linear_fc1",
          vision_hidden, is_affine(lm) ? lm.hidden_size : projection_ffn(lm), lm.init_method_std,
          *tp.group,
          ColumnParallelLinear::Options{
              .with_bias = true, .gather_output = is_affine(lm), .sequence_parallel = false}),
      affine_(is_affine(lm)) {
  if (!affine_) {
    linear_fc2 = std::make_unique<RowParallelLinear>(
        "vision_projection.encoder.linear_fc2", projection_ffn(lm), lm.hidden_size,
        lm.init_method_std, *tp.group,
        RowParallelLinear::Options{.with_bias = true, .input_is_parallel = true});
  }
  std::vector<Param*> ps;
  collect(ps);
  for (Param* p : ps) {
    if (p->tp_partition_dim < 0) {
      p->tp_rank = tp.rank();
      p->tp_size = tp.size();
    }
  }
}

void VisionProjection::collect(std::vector<Param*>& out) {
  linear_fc1.collect(out);
  if (linear_fc2) linear_fc2->collect(out);
}

std::vector<const Param*> VisionProjection::params() const {
  std::vector<Param*> ps;
  const_cast<VisionProjection*>(this)->collect(ps);
  return {ps.begin(), ps.end()};
}

Tensor VisionProjection::forward(const Tensor& x, Ctx& ctx, const ForwardMode& mode) const {
  const ForwardMode::Use use(mode, params());
  if (affine_) return linear_fc1.forward(x, ctx.fc1);
  ctx.pre_act = linear_fc1.forward(x, ctx.fc1);
  Tensor act = Tensor::empty(ctx.pre_act.shape(), ctx.pre_act.dtype(), ctx.pre_act.device());
  ops::gelu_forward(act, ctx.pre_act, /*tanh_approx=*/false);  // Megatron's and HF's exact GELU
  return linear_fc2->forward(act, ctx.fc2);
}

Tensor VisionProjection::backward(const Tensor& dy, Ctx& ctx, const ParamsDone& done) const {
  done.begin(params());
  Tensor dx;
  if (affine_) {
    dx = linear_fc1.backward(dy, ctx.fc1);
  } else {
    const Tensor dact = linear_fc2->backward(dy, ctx.fc2);
    Tensor dpre = Tensor::empty(ctx.pre_act.shape(), dact.dtype(), dact.device());
    ops::gelu_backward(dpre, dact, ctx.pre_act, /*tanh_approx=*/false);
    dx = linear_fc1.backward(dpre, ctx.fc1);
  }
  if (done) done(params());
  ctx = Ctx{};
  return dx;
}

}  // namespace megatron
