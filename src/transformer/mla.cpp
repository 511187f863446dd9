// Multi-latent attention's projections into (and back out of) the packed QKV buffer.
#include "transformer/mla.h"

#include <cmath>

#include "parallel/mappings.h"
#include "tensor/ops.h"

namespace megatron {

namespace {

ColumnParallelLinear::Options column(const TensorParallelContext& tp) {
  return {.with_bias = false, .sequence_parallel = tp.sp()};
}

// x [rows, a + b] -> its first a and last b columns (copies).
std::pair<Tensor, Tensor> split_columns(const Tensor& x, int64_t a) {
  const int64_t rows = x.dim(0), b = x.dim(1) - a;
  Tensor first = Tensor::empty({rows, a}, x.dtype(), x.device());
  Tensor second = Tensor::empty({rows, b}, x.dtype(), x.device());
  ops::slice_last_dim(first, x, 0);
  ops::slice_last_dim(second, x, a);
  return {first, second};
}

Tensor columns(const Tensor& x, int64_t start, int64_t width) {
  Tensor out = Tensor::empty({x.dim(0), width}, x.dtype(), x.device());
  ops::slice_last_dim(out, x, start);
  return out;
}

Tensor concat(const std::vector<Tensor>& parts) {
  int64_t width = 0;
  std::vector<Tensor> nonempty;
  for (const Tensor& p : parts) {
    if (p.dim(1) == 0) continue;
    width += p.dim(1);
    nonempty.push_back(p);
  }
  Tensor out = Tensor::empty({parts[0].dim(0), width}, parts[0].dtype(), parts[0].device());
  ops::concat_last_dim(out, nonempty);
  return out;
}

}  // namespace

MlaProjections::MlaProjections(const std::string& name, const TransformerConfig& cfg,
                               const TensorParallelContext& tp)
    : linear_kv_down_proj(name + ".linear_kv_down_proj", cfg.hidden_size,
                          cfg.mla.kv_lora_rank + cfg.mla.qk_pos_emb_head_dim, false,
                          cfg.init_method_std),
      linear_kv_up_proj(name + ".linear_kv_up_proj", cfg.mla.kv_lora_rank,
                        cfg.num_attention_heads * (cfg.mla.qk_head_dim + cfg.mla.v_head_dim),
                        cfg.init_method_std, *tp.group, column(tp)),
      cfg_(cfg),
      tp_(tp),
      heads_local_(divide(cfg.num_attention_heads, tp.size(),
                          "--num-attention-heads by --tensor-model-parallel-size")) {
  const MlaConfig& m = cfg.mla;
  const int64_t q_width = cfg.num_attention_heads * m.q_head_dim();
  if (m.q_lora_rank > 0) {
    linear_q_down_proj.emplace(name + ".linear_q_down_proj", cfg.hidden_size, m.q_lora_rank, false,
                               cfg.init_method_std);
    linear_q_down_proj->weight.sequence_parallel = tp.sp();
    if (cfg.qk_layernorm) {
      q_layernorm.emplace(name + ".q_layernorm", m.q_lora_rank, cfg.normalization, cfg.norm_epsilon,
                          cfg.layernorm_zero_centered_gamma);
      q_layernorm->mark_sequence_parallel(tp.sp());
    }
    linear_q_up_proj.emplace(name + ".linear_q_up_proj", m.q_lora_rank, q_width,
                             cfg.init_method_std, *tp.group, column(tp));
  } else {
    linear_q_proj.emplace(name + ".linear_q_proj", cfg.hidden_size, q_width, cfg.init_method_std,
                          *tp.group, column(tp));
  }
  linear_kv_down_proj.weight.sequence_parallel = tp.sp();
  if (cfg.qk_layernorm) {
    kv_layernorm.emplace(name + ".kv_layernorm", m.kv_lora_rank, cfg.normalization,
                         cfg.norm_epsilon, cfg.layernorm_zero_centered_gamma);
    kv_layernorm->mark_sequence_parallel(tp.sp());
  }
}

void MlaProjections::collect(std::vector<Param*>& out) {
  if (linear_q_down_proj) linear_q_down_proj->collect(out);
  if (q_layernorm) q_layernorm->collect(out);
  if (linear_q_up_proj) linear_q_up_proj->collect(out);
  if (linear_q_proj) linear_q_proj->collect(out);
  linear_kv_down_proj.collect(out);
  if (kv_layernorm) kv_layernorm->collect(out);
  linear_kv_up_proj.collect(out);
}

std::vector<Fp8GemmScaling*> MlaProjections::enable_fp8(const Fp8Config& cfg) {
  // The replicated down projections' scaling state is the same on every TP rank (their amaxes
  // are reduced over TP): it carries the TP coordinates, so that one rank saves it.
  std::vector<Fp8GemmScaling*> out;
  if (linear_q_down_proj) {
    out.push_back(linear_q_down_proj->enable_fp8(cfg, tp_.rank(), tp_.size()));
  }
  if (linear_q_up_proj) out.push_back(linear_q_up_proj->enable_fp8(cfg));
  if (linear_q_proj) out.push_back(linear_q_proj->enable_fp8(cfg));
  out.push_back(linear_kv_down_proj.enable_fp8(cfg, tp_.rank(), tp_.size()));
  out.push_back(linear_kv_up_proj.enable_fp8(cfg));
  return out;
}

Tensor MlaProjections::forward(const Tensor& x, Ctx& ctx) const {
  const MlaConfig& m = cfg_.mla;
  const int64_t s_local = x.dim(0), b = x.dim(1), h = cfg_.hidden_size;
  const int64_t pe = m.qk_pos_emb_head_dim;
  ctx.s = s_local * (tp_.sp() ? tp_.size() : 1);
  ctx.b = b;
  const Tensor x2 = x.view({s_local * b, h});
  ctx.q_latent = linear_q_down_proj
                     ? linear_q_down_proj->forward(x2, ctx.q_down).view({s_local, b, m.q_lora_rank})
                     : x;
  // The latent and the shared rotary key.
  auto [c, k_pe] = split_columns(linear_kv_down_proj.forward(x2, ctx.kv_down), m.kv_lora_rank);
  ctx.kv_latent = c.view({s_local, b, m.kv_lora_rank});
  if (tp_.sp()) {
    k_pe = gather_from_sequence_parallel_region_forward(k_pe.view({s_local, b, pe}), *tp_.group);
  }
  ctx.k_pe = k_pe.view({ctx.s * b, pe});
  return up(ctx);
}

void MlaProjections::drop_input(Ctx& ctx) const {
  ctx.q_down.x = Tensor();
  ctx.kv_down.x = Tensor();
  if (linear_q_proj) {
    ctx.q_up.linear.x = Tensor();
    ctx.q_latent = Tensor();
  }
}

void MlaProjections::keep_input(const Tensor& x, Ctx& ctx) const {
  const Tensor x2 = x.view({x.numel() / cfg_.hidden_size, cfg_.hidden_size});
  if (linear_q_down_proj) linear_q_down_proj->keep_input(x2, ctx.q_down);
  linear_kv_down_proj.keep_input(x2, ctx.kv_down);
  if (linear_q_proj) {
    ctx.q_latent = x;
    linear_q_proj->keep_input(x, ctx.q_up);
  }
}

void MlaProjections::drop_up(Ctx& ctx) const {
  ctx.q_norm = Norm::Ctx{};
  ctx.kv_norm = Norm::Ctx{};
  ctx.q_up = ColumnParallelLinear::Ctx{};
  ctx.kv_up = ColumnParallelLinear::Ctx{};
}

Tensor MlaProjections::up(Ctx& ctx) const {
  const MlaConfig& m = cfg_.mla;
  const int64_t s = ctx.s, b = ctx.b, np = heads_local_;
  const int64_t rows = s * b * np, width = cfg_.head_dim();
  const int64_t pe = m.qk_pos_emb_head_dim, nope = m.qk_head_dim, dv = m.v_head_dim;
  // Queries: [s, b, np * (nope + pe)], per head [q_nope | q_pe].
  Tensor q;
  if (linear_q_down_proj) {
    Tensor qc = ctx.q_latent;
    if (q_layernorm)
      qc = q_layernorm->forward(qc, ctx.q_norm, linear_q_up_proj->gemm_input_dtype());
    q = linear_q_up_proj->forward(qc, ctx.q_up);
  } else {
    q = linear_q_proj->forward(ctx.q_latent, ctx.q_up);
  }
  q = q.view({rows, m.q_head_dim()});
  Tensor latent = ctx.kv_latent;
  if (kv_layernorm) {
    latent = kv_layernorm->forward(latent, ctx.kv_norm, linear_kv_up_proj.gemm_input_dtype());
  }
  const Tensor kv = linear_kv_up_proj.forward(latent, ctx.kv_up).view({rows, nope + dv});
  // The rotary key once per local head: [s b, np pe] as [rows, pe].
  const Tensor k_pe_heads =
      concat(std::vector<Tensor>(static_cast<size_t>(np), ctx.k_pe)).view({rows, pe});

  const auto zeros = [&](int64_t n) { return Tensor::zeros({rows, n}, q.dtype(), q.device()); };
  const Tensor packed = concat({columns(q, nope, pe), columns(q, 0, nope), zeros(width - nope - pe),
                                k_pe_heads, columns(kv, 0, nope), zeros(width - nope - pe),
                                columns(kv, nope, dv), zeros(width - dv)});
  return packed.view({s, b, np, 3, width});
}

Tensor MlaProjections::backward(const Tensor& dqkv, Ctx& ctx) const {
  const MlaConfig& m = cfg_.mla;
  const int64_t s = ctx.s, b = ctx.b, np = heads_local_, h = cfg_.hidden_size;
  const int64_t s_local = s / (tp_.sp() ? tp_.size() : 1);
  const int64_t rows = s * b * np, width = cfg_.head_dim();
  const int64_t pe = m.qk_pos_emb_head_dim, nope = m.qk_head_dim, dv = m.v_head_dim;
  const Tensor d = dqkv.view({rows, 3 * width});

  // linear_kv_up_proj and the latent's norm.
  const Tensor dkv = concat({columns(d, width + pe, nope), columns(d, 2 * width, dv)});
  Tensor dlatent = linear_kv_up_proj.backward(dkv.view({s, b, np * (nope + dv)}), ctx.kv_up);
  if (kv_layernorm) dlatent = kv_layernorm->backward(dlatent, ctx.kv_norm);

  // The rotary key's gradient: summed over the local heads, then over TP (reduce-scattered back to
  // this rank's positions under sequence parallelism).
  const Tensor dk_heads = columns(d, width, pe).view({s * b, np * pe});
  Tensor dk_pe = columns(dk_heads, 0, pe);
  for (int64_t head = 1; head < np; ++head)
    ops::add_inplace(dk_pe, columns(dk_heads, head * pe, pe));
  if (tp_.sp()) {
    dk_pe = gather_from_sequence_parallel_region_backward(dk_pe.view({s, b, pe}), *tp_.group)
                .view({s_local * b, pe});
  } else {
    dk_pe = all_reduce_in_place(dk_pe, *tp_.group);
  }
  Tensor dx = linear_kv_down_proj.backward(
      concat({dlatent.view({s_local * b, m.kv_lora_rank}), dk_pe}), ctx.kv_down);

  // The queries.
  const Tensor dq =
      concat({columns(d, pe, nope), columns(d, 0, pe)}).view({s, b, np * m.q_head_dim()});
  if (linear_q_down_proj) {
    Tensor dqc = linear_q_up_proj->backward(dq, ctx.q_up);
    if (q_layernorm) dqc = q_layernorm->backward(dqc, ctx.q_norm);
    ops::add_inplace(
        dx, linear_q_down_proj->backward(dqc.view({s_local * b, m.q_lora_rank}), ctx.q_down));
  } else {
    ops::add_inplace(dx, linear_q_proj->backward(dq, ctx.q_up).view({s_local * b, h}));
  }
  ctx = Ctx{};
  return dx.view({s_local, b, h});
}

}  // namespace megatron
