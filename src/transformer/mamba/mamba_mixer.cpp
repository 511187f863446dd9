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
               cfg.output_init_std(), *tp.group,
               {.with_bias = false, .input_is_parallel = true, .sequence_parallel = tp.sp()}),
      layer_(layer_number),
      cp_(tp.cp.for_layer(layer_number)) {
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
  conv1d_weight.megatron_ndim = 3;        // not a matrix for Muon
  conv1d_bias =
      tp_param(name + ".conv1d.bias", {conv_dim_}, Init::kUniform, conv_bound, tp, {di, gn, gn});
  A_log = tp_param(name + ".A_log", {heads_}, Init::kMambaALog, 0, tp);
  D = tp_param(name + ".D", {heads_}, Init::kOnes, 0, tp);
  dt_bias = tp_param(name + ".dt_bias", {heads_}, Init::kMambaDtBias, 0, tp);
  norm_weight = tp_param(name + ".norm.weight", {d_inner_}, Init::kOnes, 0, tp);
  if (cp_.enabled()) {  // Megatron's MambaContextParallel assertions
    const int64_t ncp = cp_.size();
    MEGATRON_CHECK(heads_ % ncp == 0, "the Mamba heads per tensor-parallel rank (", heads_,
                   ") must be divisible by --context-parallel-size (", ncp, ")");
    MEGATRON_CHECK(groups_ % ncp == 0 || ncp % groups_ == 0,
                   "--mamba-num-groups per "
                   "tensor-parallel rank (",
                   groups_, ") and --context-parallel-size (", ncp, ") must divide one another");
  }
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

MambaMixer::Part MambaMixer::part() const {
  if (!cp_.enabled()) return Part{heads_, groups_, 0, 0, 1};
  const int64_t n = cp_.size(), k = cp_.rank(), hc = heads_ / n;
  if (groups_ >= n) return Part{hc, groups_ / n, k * hc, k * (groups_ / n), 1};
  const int64_t r = n / groups_;  // each group serves r CP ranks (Megatron's group_repeat_count)
  return Part{hc, 1, k * hc, k / r, r};
}

namespace {

// Rows [begin, begin + count) of each range of t ([R, ...]), concatenated: a CP rank's slice of
// a parameter ([x | B | C] rows of the convolution, a head range of A_log, D, dt_bias).
using Ranges = std::vector<std::pair<int64_t, int64_t>>;
Tensor take_rows(const Tensor& t, const Ranges& ranges) {
  int64_t rows = 0;
  for (const auto& r : ranges) rows += r.second;
  Shape shape = t.shape();
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, t.dtype(), t.device());
  int64_t at = 0;
  for (const auto& [begin, count] : ranges) {
    out.slice0(at, at + count).copy_from(t.slice0(begin, begin + count));
    at += count;
  }
  return out;
}

// p's gradient rows of `ranges` += g's rows in order (nothing for a parameter without gradient
// storage: frozen weights).
void accumulate_rows(const Param& p, const Tensor& g, const Ranges& ranges) {
  if (!p.main_grad.defined()) return;
  Tensor& dst = const_cast<Tensor&>(p.main_grad);
  int64_t at = 0;
  for (const auto& [begin, count] : ranges) {
    Tensor rows = dst.slice0(begin, begin + count);
    const Tensor src = g.slice0(at, at + count);
    ops::add_inplace(rows, src.dtype() == rows.dtype() ? src : src.to(rows.dtype()));
    at += count;
  }
}

// [rows, G N] -> [rows, G r N]: each group's N columns repeated r times in place (Megatron's
// "l b (g n) -> l b (g r n)"), and its adjoint (the r copies summed).
template <typename T>
Tensor repeat_groups(const Tensor& x, int64_t G, int64_t N, int64_t r) {
  const int64_t rows = x.dim(0);
  Tensor out = Tensor::empty({rows, G * r * N}, x.dtype(), x.device());
  const T* src = x.data<T>();
  T* dst = out.data<T>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t j = 0; j < r; ++j)
        std::copy(src + (i * G + g) * N, src + (i * G + g + 1) * N,
                  dst + ((i * G + g) * r + j) * N);
  return out;
}
template <typename T>
Tensor sum_repeats(const Tensor& x, int64_t G, int64_t N, int64_t r) {
  const int64_t rows = x.dim(0);
  Tensor out = Tensor::zeros({rows, G * N}, x.dtype(), x.device());
  const T* src = x.data<T>();
  T* dst = out.data<T>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t j = 0; j < r; ++j)
        for (int64_t n = 0; n < N; ++n)
          dst[(i * G + g) * N + n] += src[((i * G + g) * r + j) * N + n];
  return out;
}

// Columns [start, start + n) of [rows, cols] as the 4-D [L, b, n / X, X] row tensor of the CP
// all-to-all.
Tensor as_rows(const Tensor& cols, int64_t L, int64_t b, int64_t X) {
  return cols.view({L, b, cols.dim(1) / X, X});
}

}  // namespace

std::pair<ssm::ConvShape, ssm::ScanShape> MambaMixer::kernel_shapes(const Part& p, int64_t s,
                                                                    int64_t b,
                                                                    const Tensor& starts) const {
  const int32_t* docs = ptr<int32_t>(starts);
  const int64_t conv_ch = p.heads * head_dim_ + 2 * p.groups * state_;
  return {ssm::ConvShape{.s = s, .b = b, .channels = conv_ch, .width = d_conv_, .doc_start = docs},
          ssm::ScanShape{.s = s,
                         .b = b,
                         .heads = p.heads,
                         .head_dim = head_dim_,
                         .groups = p.groups,
                         .state = state_,
                         .doc_start = docs}};
}

MambaMixer::Ranges MambaMixer::conv_rows(const Part& p) const {
  const int64_t gn = groups_ * state_;
  return {{p.h0 * head_dim_, p.heads * head_dim_},
          {d_inner_ + p.g0 * state_, p.groups * state_},
          {d_inner_ + gn + p.g0 * state_, p.groups * state_}};
}

Tensor MambaMixer::to_heads(const Tensor& xbc, const Tensor& dt, int64_t L, int64_t b,
                            Tensor& dt_out) const {
  // Context parallelism: this rank's rows of every head -> every row of this rank's heads.
  const Part p = part();
  const int64_t gn = groups_ * state_;
  const Tensor x = cp_rows_to_groups(as_rows(columns(xbc, 0, d_inner_), L, b, head_dim_), heads_,
                                     head_dim_, cp_);
  auto bc = [&](int64_t start) {
    Tensor cols = columns(xbc, start, gn);
    if (p.repeat > 1)
      cols = xbc.dtype() == DType::kF64 ? repeat_groups<double>(cols, groups_, state_, p.repeat)
                                        : repeat_groups<float>(cols, groups_, state_, p.repeat);
    return cp_rows_to_groups(as_rows(cols, L, b, state_), groups_ * p.repeat, state_, cp_);
  };
  const Tensor B = bc(d_inner_), C = bc(d_inner_ + gn);
  dt_out = cp_rows_to_groups(as_rows(dt, L, b, 1), heads_, 1, cp_);
  const int64_t rows = x.dim(0) * b;
  dt_out = dt_out.view({rows, p.heads});
  Tensor out = Tensor::empty({rows, (p.heads * head_dim_) + 2 * p.groups * state_}, xbc.dtype());
  ops::concat_last_dim(out, {x.view({rows, p.heads * head_dim_}), B.view({rows, p.groups * state_}),
                             C.view({rows, p.groups * state_})});
  return out;
}

Tensor MambaMixer::forward(const Tensor& h, const Tensor& doc_start, Ctx& ctx,
                           const ForwardMode& mode) const {
  MEGATRON_CHECK(h.device() == Device::kCPU,
                 "Mamba layers run on the CPU only (their scan has no GPU kernel here)");
  const Tensor zx = in_proj.forward(h, ctx.in_ctx);  // [L, b, in_proj/tp], all L positions
  const int64_t L = zx.dim(0), b = zx.dim(1), rows = L * b;
  const DType w = work_dtype(zx);
  const Tensor flat = zx.view({rows, zx.dim(2)}).to(w);
  KvCache::Recurrent* carried = mode.kv_cache ? &mode.kv_cache->recurrent(layer_) : nullptr;
  MEGATRON_CHECK(!carried || !cp_.enabled(), "generation under context parallelism");
  MEGATRON_CHECK(!carried || !doc_start.defined(), "generation with packed documents");
  const Part p = part();
  // The convolution and scan run on this CP rank's heads over the whole sequence (all heads
  // over this rank's rows without CP).
  const int64_t s = L * cp_.size(), conv_ch = p.heads * head_dim_ + 2 * p.groups * state_;
  ctx.s = L;
  ctx.b = b;
  ctx.z = columns(flat, 0, d_inner_);
  const Tensor xbc_local = columns(flat, d_inner_, conv_dim_);
  const Tensor dt_local = columns(flat, d_inner_ + conv_dim_, heads_);
  if (cp_.enabled()) {
    ctx.xbc = to_heads(xbc_local, dt_local, L, b, ctx.dt);
  } else {
    ctx.xbc = xbc_local;
    ctx.dt = dt_local;
  }
  ctx.xbc_act = Tensor::empty({s * b, conv_ch}, w);
  // The whole sequence's document starts in sequence order (the kernels' rows).
  if (doc_start.defined()) check_shape(doc_start, {b, s}, "Mamba doc_start");
  ctx.doc_start = doc_start.defined() ? to_host(doc_start) : Tensor();
  const auto [conv, scan] = kernel_shapes(p, s, b, ctx.doc_start);
  // Backward may follow any forward but a generation's (whose state carries over instead).
  const bool keep = !carried;
  const Ranges heads{{p.h0, p.heads}};
  const Tensor cw = take_rows(conv1d_weight.value_as(w), conv_rows(p));
  const Tensor cb = take_rows(conv1d_bias.value_as(w), conv_rows(p));
  const Tensor a_log = take_rows(A_log.value_as(w), heads), d = take_rows(D.value_as(w), heads),
               bias = take_rows(dt_bias.value_as(w), heads);
  Tensor y = Tensor::empty({s * b, p.heads * head_dim_}, w);
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
    const int64_t xs = p.heads * head_dim_, gn = p.groups * state_;
    const Tensor x = columns(ctx.xbc_act, 0, xs);
    const Tensor B = columns(ctx.xbc_act, xs, gn);
    const Tensor C = columns(ctx.xbc_act, xs + gn, gn);
    ssm::scan_forward<T>(scan, x.data<T>(), ctx.dt.data<T>(), a_log.data<T>(), B.data<T>(),
                         C.data<T>(), d.data<T>(), bias.data<T>(), y.data<T>(),
                         carried ? carried->ssm.data<T>() : nullptr, ptr<T>(ctx.kept));
  };
  auto norm = [&]<typename T>(T) {
    const OpTimer timer(OpCategory::kStateSpace, "mamba_forward");
    const Tensor nw = norm_weight.value_as(w);
    ssm::gated_norm_forward<T>(rows, d_inner_, groups_, 1e-5, ctx.y.data<T>(), ctx.z.data<T>(),
                               nw.data<T>(), normed.data<T>(), ctx.rstd.data<T>());
  };
  if (w == DType::kF64) {
    run(double{});
  } else {
    run(float{});
  }
  // Back to this rank's rows of every head for the gated norm (its groups are whole heads).
  ctx.y = cp_.enabled() ? cp_groups_to_rows(as_rows(y, s, b, head_dim_), heads_, head_dim_, cp_)
                              .view({rows, d_inner_})
                        : y;
  if (w == DType::kF64) {
    norm(double{});
  } else {
    norm(float{});
  }
  const DType gd = out_proj.gemm_input_dtype();
  const Tensor normed3 = normed.view({L, b, d_inner_});
  Tensor out = out_proj.forward(gd == w ? normed3 : normed3.to(gd), ctx.out_ctx);
  if (!keep) ctx = Ctx{};
  return out;
}

Tensor MambaMixer::backward(const Tensor& dy, Ctx& ctx) const {
  MEGATRON_CHECK(ctx.kept.defined(), "MambaMixer::backward without a training forward");
  const Tensor dnorm_in = out_proj.backward(dy, ctx.out_ctx);
  const int64_t L = ctx.s, b = ctx.b, rows = L * b, s = L * cp_.size();
  const DType w = ctx.y.dtype();
  const Tensor dnormed = dnorm_in.view({rows, d_inner_}).to(w);
  const Part p = part();
  const int64_t xs = p.heads * head_dim_, gn = p.groups * state_, conv_ch = xs + 2 * gn;
  const auto [conv, scan] = kernel_shapes(p, s, b, ctx.doc_start);
  const Ranges heads{{p.h0, p.heads}};
  Tensor dy_local = Tensor::empty({rows, d_inner_}, w), dz = Tensor::empty({rows, d_inner_}, w);
  Tensor dxbc, ddt;  // the scan's and convolution's input gradients, this rank's heads
  auto norm = [&]<typename T>(T) {
    const OpTimer timer(OpCategory::kStateSpace, "mamba_backward");
    Tensor dnw = Tensor::zeros({d_inner_}, w);
    const Tensor nw = norm_weight.value_as(w);
    ssm::gated_norm_backward<T>(rows, d_inner_, groups_, ctx.y.data<T>(), ctx.z.data<T>(),
                                nw.data<T>(), ctx.rstd.data<T>(), dnormed.data<T>(),
                                dy_local.data<T>(), dz.data<T>(), dnw.data<T>());
    accumulate_rows(norm_weight, dnw, {{0, d_inner_}});
  };
  auto run = [&]<typename T>(T, const Tensor& dy_scan) {
    const OpTimer timer(OpCategory::kStateSpace, "mamba_backward");
    const Tensor x = columns(ctx.xbc_act, 0, xs);
    const Tensor B = columns(ctx.xbc_act, xs, gn);
    const Tensor C = columns(ctx.xbc_act, xs + gn, gn);
    const Tensor a_log = take_rows(A_log.value_as(w), heads), d = take_rows(D.value_as(w), heads),
                 bias = take_rows(dt_bias.value_as(w), heads);
    Tensor dx = Tensor::empty({s * b, xs}, w);
    ddt = Tensor::empty({s * b, p.heads}, w);
    Tensor dB = Tensor::empty({s * b, gn}, w), dC = Tensor::empty({s * b, gn}, w);
    Tensor dA = Tensor::zeros({p.heads}, w), dD = Tensor::zeros({p.heads}, w),
           dbias = Tensor::zeros({p.heads}, w);
    ssm::scan_backward<T>(scan, x.data<T>(), ctx.dt.data<T>(), a_log.data<T>(), B.data<T>(),
                          C.data<T>(), d.data<T>(), bias.data<T>(), ctx.kept.data<T>(),
                          dy_scan.data<T>(), dx.data<T>(), ddt.data<T>(), dB.data<T>(),
                          dC.data<T>(), dA.data<T>(), dD.data<T>(), dbias.data<T>());
    accumulate_rows(A_log, dA, heads);
    accumulate_rows(D, dD, heads);
    accumulate_rows(dt_bias, dbias, heads);
    Tensor dact = Tensor::empty({s * b, conv_ch}, w);
    ops::concat_last_dim(dact, {dx, dB, dC});
    dxbc = Tensor::empty({s * b, conv_ch}, w);
    Tensor dcw = Tensor::zeros({conv_ch, d_conv_}, w), dcb = Tensor::zeros({conv_ch}, w);
    const Tensor cw = take_rows(conv1d_weight.value_as(w), conv_rows(p));
    const Tensor cb = take_rows(conv1d_bias.value_as(w), conv_rows(p));
    ssm::conv_silu_backward<T>(conv, ctx.xbc.data<T>(), cw.data<T>(), cb.data<T>(), dact.data<T>(),
                               dxbc.data<T>(), dcw.data<T>(), dcb.data<T>());
    accumulate_rows(conv1d_weight, dcw, conv_rows(p));
    accumulate_rows(conv1d_bias, dcb, conv_rows(p));
  };
  const bool f64 = w == DType::kF64;
  if (f64) {
    norm(double{});
  } else {
    norm(float{});
  }
  const Tensor dy_scan =
      cp_.enabled() ? cp_rows_to_groups(as_rows(dy_local, L, b, head_dim_), heads_, head_dim_, cp_)
                          .view({s * b, xs})
                    : dy_local;
  if (f64) {
    run(double{}, dy_scan);
  } else {
    run(float{}, dy_scan);
  }
  Tensor dzx = Tensor::empty({rows, d_inner_ + conv_dim_ + heads_}, w);
  if (!cp_.enabled()) {
    ops::concat_last_dim(dzx, {dz, dxbc, ddt});
  } else {
    // Back to this rank's rows of every head; B's and C's copies (groups repeated over ranks)
    // summed.
    const Tensor dx =
        cp_groups_to_rows(as_rows(columns(dxbc, 0, xs), s, b, head_dim_), heads_, head_dim_, cp_)
            .view({rows, d_inner_});
    auto bc = [&](int64_t start) {
      Tensor r = cp_groups_to_rows(as_rows(columns(dxbc, start, gn), s, b, state_),
                                   groups_ * p.repeat, state_, cp_)
                     .view({rows, groups_ * p.repeat * state_});
      if (p.repeat == 1) return r;
      return f64 ? sum_repeats<double>(r, groups_, state_, p.repeat)
                 : sum_repeats<float>(r, groups_, state_, p.repeat);
    };
    const Tensor dB = bc(xs), dC = bc(xs + gn);
    const Tensor dt = cp_groups_to_rows(as_rows(ddt, s, b, 1), heads_, 1, cp_).view({rows, heads_});
    ops::concat_last_dim(dzx, {dz, dx, dB, dC, dt});
  }
  Tensor dh = in_proj.backward(dzx.view({L, b, dzx.dim(1)}), ctx.in_ctx);
  ctx = Ctx{};
  return dh;
}

}  // namespace megatron
