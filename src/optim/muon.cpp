// Muon's step (optim/muon.h): momentum and decay with the elementwise ops, Newton-Schulz with the
// GEMMs, the tensor-parallel modes with the TP group's collectives, Adam for everything else.
#include "optim/muon.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "tensor/ops.h"

namespace megatron {

bool parse_muon_scale_mode(const std::string& s, MuonScaleMode* out) {
  if (s == "spectral")
    *out = MuonScaleMode::kSpectral;
  else if (s == "unit_rms_norm")
    *out = MuonScaleMode::kUnitRmsNorm;
  else if (s == "shape_scaling")
    *out = MuonScaleMode::kShapeScaling;
  else
    return false;
  return true;
}

bool parse_muon_tp_mode(const std::string& s, MuonTpMode* out) {
  if (s == "blockwise")
    *out = MuonTpMode::kBlockwise;
  else if (s == "duplicated")
    *out = MuonTpMode::kDuplicated;
  else if (s == "distributed")
    *out = MuonTpMode::kDistributed;
  else
    return false;
  return true;
}

std::vector<std::array<double, 3>> muon_coefficients(const std::string& type, int64_t steps) {
  // emerging_optimizers' coefficient sets (each value the f32 rounding of the published one).
  static const std::vector<std::array<double, 3>> kSimple = {{3.4445, -4.7750, 2.0315}};
  // Keller Jordan's modded-nanogpt quintic schedule.
  static const std::vector<std::array<double, 3>> kQuintic = {{4.0848, -6.8946, 2.9270},
                                                              {3.9505, -6.3029, 2.6377},
                                                              {3.7418, -5.5913, 2.3037},
                                                              {2.8769, -3.1427, 1.2046},
                                                              {2.8366, -3.0525, 1.2012}};
  // Polar Express (arXiv 2505.16932), its 1.01^degree safety division included.
  static const std::vector<std::array<double, 3>> kPolarExpress = {
      {8.2051, -22.9019, 16.4607}, {4.0664, -2.8612, 0.5184}, {3.9096, -2.8234, 0.5250},
      {3.2856, -2.4153, 0.4853},   {2.2779, -1.6198, 0.3985}, {1.8726, -1.2307, 0.3585},
      {1.8564, -1.2132, 0.3568},   {1.8750, -1.2500, 0.3750}};
  // flash-newton-schulz's AOL set.
  static const std::vector<std::array<double, 3>> kAol = {{4.0098, -7.0585, 2.4635},
                                                          {3.4585, -5.5479, 2.5959},
                                                          {2.7573, -3.2939, 1.4254},
                                                          {2.7215, -3.0494, 1.3169}};
  const std::vector<std::array<double, 3>>* set = type == "simple"          ? &kSimple
                                                  : type == "quintic"       ? &kQuintic
                                                  : type == "polar_express" ? &kPolarExpress
                                                  : type == "aol"           ? &kAol
                                                                            : nullptr;
  if (!set) return {};
  const bool repeat_last = type == "polar_express";  // the others cycle
  std::vector<std::array<double, 3>> out;
  for (int64_t i = 0; i < steps; ++i) {
    const auto n = static_cast<int64_t>(set->size());
    out.push_back((*set)[static_cast<size_t>(repeat_last ? std::min(i, n - 1) : i % n)]);
  }
  return out;
}

double muon_scale(MuonScaleMode mode, int64_t out, int64_t in) {
  const auto o = static_cast<double>(out), i = static_cast<double>(in);
  switch (mode) {
    case MuonScaleMode::kSpectral:
      return std::sqrt(std::max(o, i));
    case MuonScaleMode::kUnitRmsNorm:
      return std::sqrt(o / i);
    case MuonScaleMode::kShapeScaling:
      return std::sqrt(std::max(1.0, o / i));
  }
  return 1.0;
}

namespace {

Tensor transposed(const Tensor& x) {
  Tensor t = Tensor::empty({x.shape()[1], x.shape()[0]}, x.dtype(), x.device());
  ops::transpose_2d(t, x);
  return t;
}

// y = alpha y + prod, in f32.
void axpy_scaled(Tensor& y, double alpha, const Tensor& prod) {
  if (alpha != 1.0) ops::scale_inplace(y, alpha);
  ops::add_inplace(y, prod);
}

// The medium precision's bf16 outputs: x rounded to bf16 and back (in place).
void round_bf16(Tensor& x) {
  x.copy_from(x.to(DType::kBF16));
}

}  // namespace

Tensor newton_schulz(const Tensor& x, const std::vector<std::array<double, 3>>& coefficients,
                     bool transpose, bool bf16, ProcessGroup* sum_group) {
  MEGATRON_CHECK(x.shape().ndim() == 2 && x.dtype() == DType::kF32,
                 "Newton-Schulz takes an f32 matrix");
  Tensor X = transpose ? transposed(x) : x.clone();
  double ss = ops::sum_squares(X);
  if (sum_group) {
    Tensor s = Tensor::full({1}, ss, DType::kF64);
    sum_group->all_reduce(s);
    ss = s.item(0);
  }
  // emerging_optimizers' normalisation: x / max(|x|_F, eps), eps 1e-7.
  ops::scale_inplace(X, 1.0 / std::max(std::sqrt(ss), 1e-7));
  if (bf16) round_bf16(X);
  const int64_t m = X.shape()[0];
  const DType gemm = bf16 ? DType::kBF16 : DType::kF32;
  Tensor A = Tensor::empty({m, m}, DType::kF32, X.device());
  Tensor AA = Tensor::empty({m, m}, DType::kF32, X.device());
  Tensor BX = Tensor::empty(X.shape(), DType::kF32, X.device());
  for (const auto& [a, b, c] : coefficients) {
    const Tensor Xg = X.to(gemm);
    ops::matmul(A, Xg, false, Xg, true);  // A = X X^T
    if (bf16) round_bf16(A);
    if (sum_group) {
      sum_group->all_reduce(A);
      // A bf16 all-reduce's result over two ranks (one rounding of the sum; NCCL's ring rounds
      // each partial sum beyond two).
      if (bf16) round_bf16(A);
    }
    const Tensor Ag = A.to(gemm);
    ops::matmul(AA, Ag, false, Ag, false);  // B = b A + c A A
    ops::scale_inplace(AA, c);
    Tensor bA = A.clone();
    ops::scale_inplace(bA, b);
    ops::add_inplace(AA, bA);
    if (bf16) round_bf16(AA);
    ops::matmul(BX, AA.to(gemm), false, Xg, false);  // X = a X + B X
    axpy_scaled(X, a, BX);
    if (bf16) round_bf16(X);
  }
  return transpose ? transposed(X) : X;
}

bool is_muon_matrix(const Param& p) {
  const int64_t ndim = p.megatron_ndim > 0 ? p.megatron_ndim : static_cast<int64_t>(p.shape.ndim());
  return p.requires_grad && !p.frozen && ndim == 2 && !p.is_embedding_or_output;
}

Muon::Muon(ParamSet& params, const AdamWConfig& cfg, const MuonConfig& muon, ProcessGroup& tp,
           ProcessGroup& etp, const LayerWiseGroups& layer_wise)
    : AdamW(params, cfg), muon_(muon), tp_(tp), etp_(etp), layer_wise_(layer_wise) {
  coefficients_ = muon_coefficients(muon.coefficient_type, muon.num_ns_steps);
  MEGATRON_CHECK(muon.num_ns_steps >= 1 && !coefficients_.empty(), "--muon-coefficient-type ",
                 muon.coefficient_type, " with --muon-num-ns-steps ", muon.num_ns_steps,
                 ": need a known type and at least one step");
  MEGATRON_CHECK(cfg.emerging(), "Muon takes an AdamWConfig with rule kMuon or kLion");
  if (layer_wise_.dense && !layer_wise_.expert) layer_wise_.expert = layer_wise_.dense;
  // Owners: each parameter to the rank of its group holding the fewest elements so far.
  std::unordered_map<const ProcessGroup*, std::vector<int64_t>> load;
  int64_t first = 0, second = 0;
  for (const Param* p : params_.params()) {
    if (!p->requires_grad) continue;
    Held h;
    // Frozen parameters (a router's expert bias, updated outside the optimizer on every rank)
    // stay on every rank: their step leaves them as they are and refreshes the compute copy.
    if (layer_wise_.dense && !p->frozen) {
      ProcessGroup& g = owner_group(*p);
      std::vector<int64_t>& l = load[&g];
      if (l.empty()) l.assign(static_cast<size_t>(g.size()), 0);
      h.owner = static_cast<int>(std::min_element(l.begin(), l.end()) - l.begin());
      l[static_cast<size_t>(h.owner)] += p->shape.numel();
      if (h.owner != g.rank()) {
        held_[p] = h;
        continue;
      }
    }
    h.first = first;
    first += p->shape.numel();
    if (states_of(cfg_, *p) >= 2) {
      h.second = second;
      second += p->shape.numel();
    }
    held_[p] = h;
  }
  exp_avg_ = Tensor::zeros({first}, params_.main().dtype(), params_.main().device());
  exp_avg_sq_ = Tensor::zeros({second}, params_.main().dtype(), params_.main().device());
}

int64_t Muon::state_offset(const Param& p, int k) const {
  const auto it = held_.find(&p);
  if (it == held_.end()) return -1;
  return k == 0 ? it->second.first : it->second.second;
}

Tensor Muon::orthogonalize_matrix(const Param& p, const Tensor& x) {
  ProcessGroup& group = p.expert_parallel ? etp_ : tp_;
  const bool split = p.is_tensor_parallel() && muon_.tp_mode != MuonTpMode::kBlockwise;
  MEGATRON_CHECK(!split || group.size() == p.tp_size, "Muon: ", p.name, " is split over ",
                 p.tp_size, " ranks, its tensor-parallel group has ", group.size());
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  const int dim = split ? p.tp_partition_dim : -1;
  // The [out, in] size the scale sees: the whole matrix's unless each shard stands alone.
  const int64_t out = rows * (dim == 0 ? p.tp_size : 1), in = cols * (dim == 1 ? p.tp_size : 1);
  const double scale = muon_scale(muon_.scale_mode, out, in) * muon_.extra_scale_factor;
  Tensor o;
  if (!split) {
    o = newton_schulz(x, coefficients_, rows > cols, muon_.bf16_iteration);
  } else if (muon_.tp_mode == MuonTpMode::kDuplicated) {
    // Gather the shards as rows (a column split through its transpose), orthogonalise the whole
    // (rows in rank order: a permutation of the one-process matrix at most), keep this rank's.
    const Tensor local = dim == 0 ? x : transposed(x);
    const int64_t lr = local.shape()[0], lc = local.shape()[1];
    Tensor whole = Tensor::empty({lr * group.size(), lc}, DType::kF32, x.device());
    group.all_gather(whole, local);
    // The one-process orientation: the full [out, in] matrix is iterated transposed when
    // out > in; `whole` is that matrix itself for a row split, its transpose for a column split.
    const int64_t full_rows = dim == 0 ? whole.shape()[0] : lc,
                  full_cols = dim == 0 ? lc : whole.shape()[0];
    Tensor ow = newton_schulz(whole, coefficients_,
                              dim == 0 ? full_rows > full_cols : full_rows <= full_cols,
                              muon_.bf16_iteration);
    Tensor mine = ow.slice0(lr * group.rank(), lr * (group.rank() + 1)).clone();
    o = dim == 0 ? mine : transposed(mine);
  } else {
    // Megatron's distributed mode iterates on the side that is split: a row split transposed so
    // that the split dimension is the columns of X, whose Gram matrix X X^T sums over the group.
    o = newton_schulz(x, coefficients_, dim == 0, muon_.bf16_iteration, &group);
  }
  ops::scale_inplace(o, scale);
  return o;
}

Tensor Muon::orthogonalize(const Param& p, const Tensor& u) {
  const int64_t rows = u.shape()[0], cols = u.shape()[1];
  if (!muon_.split_qkv || p.qkv_split.empty()) return orthogonalize_matrix(p, u);
  // A fused QKV: per query group its query, key and value rows; every group's queries form one
  // matrix, their keys another, their values a third (Megatron's split view and cat back).
  int64_t per_group = 0;
  for (int64_t s : p.qkv_split) per_group += s;
  MEGATRON_CHECK(rows % per_group == 0, "Muon QKV split: ", p.name, " has ", rows,
                 " rows, not a multiple of a query group's ", per_group);
  const int64_t groups = rows / per_group;
  Tensor out = Tensor::empty(u.shape(), DType::kF32, u.device());
  int64_t at = 0;
  for (int64_t s : p.qkv_split) {
    Tensor part = Tensor::empty({groups * s, cols}, DType::kF32, u.device());
    for (int64_t g = 0; g < groups; ++g)
      part.slice0(g * s, (g + 1) * s)
          .copy_from(u.slice0(g * per_group + at, g * per_group + at + s));
    const Tensor o = orthogonalize_matrix(p, part);
    for (int64_t g = 0; g < groups; ++g)
      out.slice0(g * per_group + at, g * per_group + at + s)
          .copy_from(o.slice0(g * s, (g + 1) * s));
    at += s;
  }
  return out;
}

void Muon::step(const StepRates& rates, double grad_scale) {
  // The matrices take Muon's update (or Lion's); the other parameters Adam's (its bias correction
  // counts these steps) or Lion's.
  ++step_;
  const double mu = muon_.momentum;
  for (Param* p : params_.params()) {
    if (!p->requires_grad) {
      if (p->value.raw() != p->main.raw()) p->value.copy_from(p->main);
      continue;
    }
    if (!owns(*p)) continue;  // its owner updates it (layer-wise), broadcast below
    const int64_t n = p->main.numel();
    Tensor w = p->main.view({n});
    Tensor rounded = p->value.raw() != p->main.raw() ? p->value.view({n}) : Tensor();
    const double gs = rates.grad_scale_of(*p, grad_scale);
    // Lion: --optimizer lion's matrices with Adam's betas (Megatron's registry Lion takes
    // adam_beta1/2), or Muon's other parameters with --lion-beta1/2.
    const bool matrix = is_muon_matrix(*p);
    const bool lion_matrix = matrix && cfg_.rule == UpdateRule::kLion;
    const bool lion_scalar = !matrix && cfg_.rule == UpdateRule::kMuon && cfg_.muon_scalar_lion;
    if (lion_matrix || lion_scalar) {
      Tensor m = exp_avg_.flat_view(state_offset(*p, 0), {n});
      const ops::LionSpec spec = lion_matrix
                                     ? lion_spec(cfg_.beta1, cfg_.beta2, rates, *p, gs)
                                     : lion_spec(cfg_.lion_beta1, cfg_.lion_beta2, rates, *p, gs);
      ops::lion_step(w, m, p->main_grad.view({n}), spec, rounded.defined() ? &rounded : nullptr);
      continue;
    }
    if (!matrix) {
      Tensor m = exp_avg_.flat_view(state_offset(*p, 0), {n});
      Tensor v = exp_avg_sq_.flat_view(state_offset(*p, 1), {n});
      ops::adamw_step(w, m, v, p->main_grad.view({n}), adam_spec(cfg_, rates, *p, step_, gs),
                      rounded.defined() ? &rounded : nullptr);
      continue;
    }
    const double lr = rates.lr_of(*p), wd = rates.decay_of(*p);
    if (wd != 0 && lr != 0) ops::scale_inplace(w, 1.0 - lr * wd);  // decoupled decay, first
    // m <- mu m + (1 - mu) g, g the clipped gradient (rounded as clipping in place leaves it).
    Tensor m = exp_avg_.flat_view(state_offset(*p, 0), {n});
    Tensor share = p->main_grad.view({n}).clone();
    if (gs != 1.0) ops::scale_inplace(share, gs);
    ops::scale_inplace(share, 1.0 - mu);
    axpy_scaled(m, mu, share);
    // Nesterov: u = (1 - mu) g + mu m (the share above), else u = m.
    Tensor u = m.clone();
    if (muon_.nesterov) axpy_scaled(u, mu, share);
    Tensor o = orthogonalize(*p, u.view(p->main.shape()));
    ops::scale_inplace(o, -lr);
    ops::add_inplace(w, o.view({n}));
    if (rounded.defined()) rounded.copy_from(w);
  }
  if (!layer_wise_.dense) return;
  // Every parameter from its owner (Megatron's allgather of the layer-wise parameters), then the
  // compute copies of the ones updated elsewhere.
  for (Param* p : params_.params()) {
    if (!p->requires_grad || p->frozen) continue;
    ProcessGroup& g = owner_group(*p);
    if (g.size() == 1) continue;
    const int owner = held_.at(p).owner;
    Tensor w = p->main.view({p->main.numel()});
    g.broadcast(w, owner);
    if (owner != g.rank() && p->value.raw() != p->main.raw()) p->value.copy_from(p->main);
  }
}

}  // namespace megatron
