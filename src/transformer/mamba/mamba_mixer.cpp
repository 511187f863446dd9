// Mamba-2 mixer: projections around the convolution, scan and gated norm kernels.
#include "transformer/mamba/mamba_mixer.h"

#include <cmath>

#include "core/error.h"
#include "parallel/mappings.h"
#include "tensor/op_profile.h"
#include "tensor/ops.h"
#include "transformer/kv_cache.h"
#include "transformer/mamba/ssm_kernels.h"

namespace megatron {

namespace {

// A 1-D (or [channels, d_conv]) parameter split on dim 0 over the TP group, in `sections` (full
// sizes; empty: one block).
Param tp_param(const std::string& name, Shape shape, Init init, double init_std,
               const TensorParallelContext& tp, std::vector<int64_t> sections = {}) {
  Param p;
  p.name = name;
  p.shape = std::move(shape);
  p.init = init;
  p.init_std = init_std;
  p.no_weight_decay = p.shape.ndim() == 1;  // Megatron's rule: biases and 1-D parameters
  p.tp_partition_dim = 0;
  p.tp_partition_sections = std::move(sections);
  p.tp_rank = tp.rank();
  p.tp_size = tp.size();
  return p;
}

// The kernels' dtype: f64 in f64 runs, else f32.
DType work_dtype(const Tensor& t) {
  return t.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
}

// Columns [start, start + n) of x [rows, cols] as a new [rows, n] tensor.
Tensor columns(const Tensor& x, int64_t start, int64_t n) {
  Tensor out = Tensor::empty({x.dim(0), n}, x.dtype(), x.device());
  ops::slice_last_dim(out, x, start);
  return out;
}

// grad += g, where the parameter has gradient storage (frozen weights have none).
void accumulate(const Param& p, const Tensor& g) {
  if (!p.main_grad.defined()) return;
  Tensor& dst = const_cast<Tensor&>(p.main_grad);
  ops::add_inplace(
      dst, g.dtype() == dst.dtype() ? g.view(dst.shape()) : g.to(dst.dtype()).view(dst.shape()));
}

template <typename T>
T* ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

MambaMixer::MambaMixer(const std::string& name, const TransformerConfig& cfg, int64_t layer_number,
                       const TensorParallelContext& tp)
    : in_proj(name + ".in_proj", cfg.hidden_size, cfg.mamba.in_proj_dim(cfg.hidden_size),
              cfg.init_method_std, *tp.group,
              {.with_bias = false,
               .sequence_parallel = tp.sp(),
               .sections = {cfg.mamba.d_inner(cfg.hidden_size), cfg.mamba.d_inner(cfg.hidden_size),
                            cfg.mamba.num_groups * cfg.mamba.state_dim,
                            cfg.mamba.num_groups * cfg.mamba.state_dim,
                            cfg.mamba.heads(cfg.hidden_size)}}),
      out_proj(name + ".out_proj", cfg.mamba.d_inner(cfg.hidden_size), cfg.hidden_size,
               cfg.init_method_std / std::sqrt(static_cast<double>(cfg.num_layers)), *tp.group,
               {.with_bias = false, .input_is_parallel = true, .sequence_parallel = tp.sp()}),
      layer_(layer_number) {
  const MambaConfig& m = cfg.mamba;
  const int n = tp.size();
  heads_ = m.heads(cfg.hidden_size) / n;
  groups_ = m.num_groups / n;
  head_dim_ = m.head_dim;
  state_ = m.state_dim;
  d_inner_ = heads_ * head_dim_;
  conv_dim_ = d_inner_ + 2 * groups_ * state_;
  d_conv_ = m.d_conv;
  const int64_t di = m.d_inner(cfg.hidden_size), gn = m.num_groups * m.state_dim;
  const double conv_bound = 1.0 / std::sqrt(static_cast<double>(d_conv_));
  conv1d_weight = tp_param(name + ".conv1d.weight", {conv_dim_, d_conv_}, Init::kUniform,
                           conv_bound, tp, {di, gn, gn});
  conv1d_weight.no_weight_decay = false;  // Megatron's is 3-D [channels, 1, d_conv]: decayed
  conv1d_bias =
      tp_param(name + ".conv1d.bias", {conv_dim_}, Init::kUniform, conv_bound, tp, {di, gn, gn});
  A_log = tp_param(name + ".A_log", {heads_}, Init::kMambaALog, 0, tp);
  D = tp_param(name + ".D", {heads_}, Init::kOnes, 0, tp);
  dt_bias = tp_param(name + ".dt_bias", {heads_}, Init::kMambaDtBias, 0, tp);
  norm_weight = tp_param(name + ".norm.weight", {d_inner_}, Init::kOnes, 0, tp);
}

void MambaMixer::collect(std::vector<Param*>& out) {
  in_proj.collect(out);
  for (Param* p : {&conv1d_weight, &conv1d_bias, &A_log, &D, &dt_bias, &norm_weight})
    out.push_back(p);
  out_proj.collect(out);
}

std::vector<Fp8GemmScaling*> MambaMixer::enable_fp8(const Fp8Config& cfg) {
  return {in_proj.enable_fp8(cfg), out_proj.enable_fp8(cfg)};
}

Tensor MambaMixer::forward(const Tensor& h, Ctx& ctx, const ForwardMode& mode) const {
  MEGATRON_CHECK(h.device() == Device::kCPU,
                 "Mamba layers run on the CPU only (their scan has no GPU kernel here)");
  const Tensor zx = in_proj.forward(h, ctx.in_ctx);  // [s, b, in_proj/tp], all s positions
  const int64_t s = zx.dim(0), b = zx.dim(1), rows = s * b;
  const DType w = work_dtype(zx);
  const Tensor flat = zx.view({rows, zx.dim(2)}).to(w);
  ctx.s = s;
  ctx.b = b;
  ctx.z = columns(flat, 0, d_inner_);
  ctx.xbc = columns(flat, d_inner_, conv_dim_);
  ctx.dt = columns(flat, d_inner_ + conv_dim_, heads_);
  ctx.xbc_act = Tensor::empty({rows, conv_dim_}, w);

  const ssm::ConvShape conv{.s = s, .b = b, .channels = conv_dim_, .width = d_conv_};
  const ssm::ScanShape scan{
      .s = s, .b = b, .heads = heads_, .head_dim = head_dim_, .groups = groups_, .state = state_};
  KvCache::Recurrent* carried = mode.kv_cache ? &mode.kv_cache->recurrent(layer_) : nullptr;
  // Backward may follow any forward but a generation's (whose state carries over instead).
  const bool keep = !carried;
  const Tensor cw = conv1d_weight.value_as(w), cb = conv1d_bias.value_as(w);
  const Tensor a_log = A_log.value_as(w), d = D.value_as(w), bias = dt_bias.value_as(w);
  ctx.y = Tensor::empty({rows, d_inner_}, w);
  ctx.rstd = Tensor::empty({rows, groups_}, w);
  Tensor normed = Tensor::empty({rows, d_inner_}, w);
  ctx.kept = keep ? Tensor::empty({scan.kept_states()}, w) : Tensor();
  if (carried && !carried->ssm.defined())
    carried->ssm = Tensor::zeros({b, heads_, head_dim_, state_}, w);

  auto run = [&]<typename T>(T) {
    const OpTimer timer(OpCategory::kStateSpace, "mamba_forward");
    if (carried) {
      Tensor next = Tensor::empty({b, d_conv_ - 1, conv_dim_}, w);
      ssm::conv_history<T>(conv, ctx.xbc.data<T>(), ptr<T>(carried->conv), next.data<T>());
      ssm::conv_silu_forward<T>(conv, ctx.xbc.data<T>(), ptr<T>(carried->conv), cw.data<T>(),
                                cb.data<T>(), ctx.xbc_act.data<T>());
      carried->conv = next;
    } else {
      ssm::conv_silu_forward<T>(conv, ctx.xbc.data<T>(), nullptr, cw.data<T>(), cb.data<T>(),
                                ctx.xbc_act.data<T>());
    }
    const Tensor x = columns(ctx.xbc_act, 0, d_inner_);
    const Tensor B = columns(ctx.xbc_act, d_inner_, groups_ * state_);
    const Tensor C = columns(ctx.xbc_act, d_inner_ + groups_ * state_, groups_ * state_);
    ssm::scan_forward<T>(scan, x.data<T>(), ctx.dt.data<T>(), a_log.data<T>(), B.data<T>(),
                         C.data<T>(), d.data<T>(), bias.data<T>(), ctx.y.data<T>(),
                         carried ? carried->ssm.data<T>() : nullptr, ptr<T>(ctx.kept));
    const Tensor nw = norm_weight.value_as(w);
    ssm::gated_norm_forward<T>(rows, d_inner_, groups_, 1e-5, ctx.y.data<T>(), ctx.z.data<T>(),
                               nw.data<T>(), normed.data<T>(), ctx.rstd.data<T>());
  };
  if (w == DType::kF64) {
    run(double{});
  } else {
    run(float{});
  }
  const DType gd = out_proj.gemm_input_dtype();
  const Tensor normed3 = normed.view({s, b, d_inner_});
  Tensor out = out_proj.forward(gd == w ? normed3 : normed3.to(gd), ctx.out_ctx);
  if (!keep) ctx = Ctx{};
  return out;
}

Tensor MambaMixer::backward(const Tensor& dy, Ctx& ctx) const {
  MEGATRON_CHECK(ctx.kept.defined(), "MambaMixer::backward without a training forward");
  const Tensor dnorm_in = out_proj.backward(dy, ctx.out_ctx);
  const int64_t rows = ctx.s * ctx.b;
  const DType w = ctx.y.dtype();
  const Tensor dnormed = dnorm_in.view({rows, d_inner_}).to(w);
  const ssm::ConvShape conv{.s = ctx.s, .b = ctx.b, .channels = conv_dim_, .width = d_conv_};
  const ssm::ScanShape scan{.s = ctx.s,
                            .b = ctx.b,
                            .heads = heads_,
                            .head_dim = head_dim_,
                            .groups = groups_,
                            .state = state_};
  const int64_t gn = groups_ * state_;
  Tensor dzx = Tensor::empty({rows, d_inner_ + conv_dim_ + heads_}, w);
  auto run = [&]<typename T>(T) {
    const OpTimer timer(OpCategory::kStateSpace, "mamba_backward");
    Tensor dy_scan = Tensor::empty({rows, d_inner_}, w), dz = Tensor::empty({rows, d_inner_}, w);
    Tensor dnw = Tensor::zeros({d_inner_}, w);
    const Tensor nw = norm_weight.value_as(w);
    ssm::gated_norm_backward<T>(rows, d_inner_, groups_, ctx.y.data<T>(), ctx.z.data<T>(),
                                nw.data<T>(), ctx.rstd.data<T>(), dnormed.data<T>(),
                                dy_scan.data<T>(), dz.data<T>(), dnw.data<T>());
    accumulate(norm_weight, dnw);
    const Tensor x = columns(ctx.xbc_act, 0, d_inner_);
    const Tensor B = columns(ctx.xbc_act, d_inner_, gn);
    const Tensor C = columns(ctx.xbc_act, d_inner_ + gn, gn);
    const Tensor a_log = A_log.value_as(w), d = D.value_as(w), bias = dt_bias.value_as(w);
    Tensor dx = Tensor::empty({rows, d_inner_}, w), ddt = Tensor::empty({rows, heads_}, w);
    Tensor dB = Tensor::empty({rows, gn}, w), dC = Tensor::empty({rows, gn}, w);
    Tensor dA = Tensor::zeros({heads_}, w), dD = Tensor::zeros({heads_}, w),
           dbias = Tensor::zeros({heads_}, w);
    ssm::scan_backward<T>(scan, x.data<T>(), ctx.dt.data<T>(), a_log.data<T>(), B.data<T>(),
                          C.data<T>(), d.data<T>(), bias.data<T>(), ctx.kept.data<T>(),
                          dy_scan.data<T>(), dx.data<T>(), ddt.data<T>(), dB.data<T>(),
                          dC.data<T>(), dA.data<T>(), dD.data<T>(), dbias.data<T>());
    accumulate(A_log, dA);
    accumulate(D, dD);
    accumulate(dt_bias, dbias);
    Tensor dact = Tensor::empty({rows, conv_dim_}, w);
    ops::concat_last_dim(dact, {dx, dB, dC});
    Tensor dxbc = Tensor::empty({rows, conv_dim_}, w);
    Tensor dcw = Tensor::zeros({conv_dim_, d_conv_}, w), dcb = Tensor::zeros({conv_dim_}, w);
    const Tensor cw = conv1d_weight.value_as(w), cb = conv1d_bias.value_as(w);
    ssm::conv_silu_backward<T>(conv, ctx.xbc.data<T>(), cw.data<T>(), cb.data<T>(), dact.data<T>(),
                               dxbc.data<T>(), dcw.data<T>(), dcb.data<T>());
    accumulate(conv1d_weight, dcw);
    accumulate(conv1d_bias, dcb);
    ops::concat_last_dim(dzx, {dz, dxbc, ddt});
  };
  if (w == DType::kF64) {
    run(double{});
  } else {
    run(float{});
  }
  Tensor dh = in_proj.backward(dzx.view({ctx.s, ctx.b, dzx.dim(1)}), ctx.in_ctx);
  ctx = Ctx{};
  return dh;
}

}  // namespace megatron
