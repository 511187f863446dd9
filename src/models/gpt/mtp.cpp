// Multi-token prediction's depths: embedding of the rolled tokens, the two norms, the projection,
// a transformer layer, the final norm and the shared head's loss (see mtp.h).
#include "models/gpt/mtp.h"

#include <cstring>

#include "parallel/mappings.h"
#include "tensor/ops.h"

namespace megatron {

Tensor roll_left(const Tensor& x) {
  MEGATRON_CHECK(x.ndim() == 2, "roll_left: expected [b, s], got ", x.str());
  const Tensor host = to_host(x);
  Tensor out = Tensor::zeros(x.shape(), x.dtype());
  const int64_t b = x.dim(0), s = x.dim(1), w = static_cast<int64_t>(dtype_size(x.dtype()));
  const auto* src = static_cast<const char*>(host.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < b; ++i) std::memcpy(dst + i * s * w, src + (i * s + 1) * w, (s - 1) * w);
  return on_device(out, x.device());
}

Tensor roll_left(const Tensor& x, const ContextParallelContext& cp) {
  if (!cp.enabled()) return roll_left(x);
  MEGATRON_CHECK(x.ndim() == 2 && x.dim(1) % 2 == 0,
                 "roll_left: expected a [b, 2c] local part, "
                 "got ",
                 x.str());
  const Tensor host = to_host(x);
  const int64_t b = x.dim(0), s = x.dim(1), c = s / 2, n = cp.size(), r = cp.rank();
  const auto w = static_cast<int64_t>(dtype_size(x.dtype()));
  const auto* src = static_cast<const char*>(host.raw());
  // Every rank's first elements of its two chunks, [n][b][2] after the gather.
  Tensor mine = Tensor::empty({b, 2}, x.dtype());
  auto* m = static_cast<char*>(mine.raw());
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < 2; ++j) std::memcpy(m + (i * 2 + j) * w, src + (i * s + j * c) * w, w);
  Tensor all = Tensor::empty({n * b, 2}, x.dtype());
  cp.group->all_gather(all, mine);
  const auto* firsts = static_cast<const char*>(all.raw());
  // Global chunk g sits on rank g (slot 0) or 2n - 1 - g (slot 1).
  auto first_of = [&](int64_t g, int64_t i) {
    const int64_t q = g < n ? g : 2 * n - 1 - g, slot = g < n ? 0 : 1;
    return firsts + ((q * b + i) * 2 + slot) * w;
  };
  Tensor out = Tensor::zeros(x.shape(), x.dtype());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t g = j == 0 ? r : 2 * n - 1 - r;
      char* row = dst + (i * s + j * c) * w;
      std::memcpy(row, src + (i * s + j * c + 1) * w, (c - 1) * w);
      if (g + 1 < 2 * n) std::memcpy(row + (c - 1) * w, first_of(g + 1, i), w);
    }
  }
  return on_device(out, x.device());
}

Tensor document_ends(const Tensor& doc_start, const ContextParallelContext& cp) {
  MEGATRON_CHECK(doc_start.ndim() == 2 && doc_start.dtype() == DType::kI32,
                 "document_ends: expected [b, s] i32 document starts, got ", doc_start.str());
  const Tensor whole = cp.enabled() ? cp_whole_doc_start(doc_start, cp) : to_host(doc_start);
  const int64_t b = doc_start.dim(0), L = doc_start.dim(1), S = whole.dim(1);
  Tensor ends = Tensor::zeros({b, L}, DType::kI32);
  const int32_t* starts = whole.data<int32_t>();
  int32_t* e = ends.data<int32_t>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < L; ++j) {
      const int64_t t = cp.global_row(j, L);  // j itself without CP
      if (t + 1 < S && starts[i * S + t + 1] == t + 1) e[i * L + j] = 1;
    }
  return ends;
}

Tensor roll_left(const Tensor& x, const ContextParallelContext& cp, const Tensor& ends) {
  if (!ends.defined()) return roll_left(x, cp);
  check_shape(ends, x.shape(), "roll_left ends");
  Tensor out = to_host(roll_left(x, cp));
  const auto w = static_cast<int64_t>(dtype_size(x.dtype()));
  auto* dst = static_cast<char*>(out.raw());
  const int32_t* e = ends.data<int32_t>();
  for (int64_t k = 0; k < x.numel(); ++k)
    if (e[k] != 0) std::memset(dst + k * w, 0, static_cast<size_t>(w));
  return on_device(out, x.device());
}

MultiTokenPrediction::Depth::Depth(const std::string& name, const TransformerConfig& cfg,
                                   int64_t first_layer, const TensorParallelContext& tp)
    : enorm(name + ".enorm", cfg),
      hnorm(name + ".hnorm", cfg),
      eh_proj(name + ".eh_proj", 2 * cfg.hidden_size, cfg.hidden_size, cfg.init_method_std,
              *tp.group, {.with_bias = false, .sequence_parallel = tp.sp()}),
      final_layernorm(name + ".final_layernorm", cfg) {
  const int64_t L = cfg.mtp_layers_per_depth();
  if (cfg.mamba.mtp_layers.empty()) {
    layers.push_back(
        std::make_unique<TransformerLayer>(name + ".transformer_layer", cfg, first_layer, tp));
  } else {
    for (int64_t j = 0; j < L; ++j)
      layers.push_back(std::make_unique<TransformerLayer>(
          name + ".mtp_model_layer.layers." + std::to_string(j), cfg, first_layer + j, tp));
  }
  enorm.mark_sequence_parallel(tp.sp());
  hnorm.mark_sequence_parallel(tp.sp());
  final_layernorm.mark_sequence_parallel(tp.sp());
}

MultiTokenPrediction::MultiTokenPrediction(const TransformerConfig& cfg,
                                           const TensorParallelContext& tp)
    : cfg_(cfg),
      tp_(tp),
      recompute_(cfg.recompute_granularity == RecomputeGranularity::kFull &&
                 cfg.recompute_method == RecomputeMethod::kUniform) {
  for (int64_t k = 0; k < cfg.mtp_blocks(); ++k) {
    layers.push_back(std::make_unique<Depth>("mtp.layers." + std::to_string(k), cfg,
                                             cfg.num_layers + k * cfg.mtp_layers_per_depth(), tp));
    if (!cfg.fp8.enabled()) continue;
    Depth& d = *layers.back();
    d.proj_fp8 = std::make_unique<Fp8Region>();
    d.proj_fp8->add(d.eh_proj.enable_fp8(cfg.fp8));
    d.layer_fp8 = std::make_unique<Fp8Region>();
    for (auto& layer : d.layers)
      for (Fp8GemmScaling* g : layer->enable_fp8()) d.layer_fp8->add(g);
  }
  // --mtp-detach-heads: Megatron tags the MTP parameters grad_norm_group 'mtp' (their own norm
  // and clipping).
  if (cfg.mtp_detach_heads) mark_separate_norm_group();
}

const MultiTokenPrediction::Depth& MultiTokenPrediction::block(int64_t k) const {
  return *layers[static_cast<size_t>(cfg_.mtp_use_repeated_layer ? 0 : k)];
}

ForwardMode MultiTokenPrediction::application_mode(const ForwardMode& mode, int64_t k) const {
  ForwardMode m = mode;
  if (cfg_.mtp_use_repeated_layer) {
    m.stream_layer_offset = k * cfg_.mtp_layers_per_depth();
    m.moe_aux_share = 1.0 / static_cast<double>(depths());
    // FP8: the first application quantises the block's weights, the others reuse that copy
    // (TE's is_first_microbatch turns false after a module's first call).
    m.first_micro_batch = mode.first_micro_batch && k == 0;
  }
  return m;
}

void MultiTokenPrediction::mark_separate_norm_group() {
  std::vector<Param*> ps;
  collect(ps);
  for (Param* p : ps) p->separate_norm = true;
}

std::vector<Fp8Region*> MultiTokenPrediction::fp8_regions() const {
  std::vector<Fp8Region*> out;
  for (const auto& d : layers) {
    for (Fp8Region* r : {d->proj_fp8.get(), d->layer_fp8.get()})
      if (r) out.push_back(r);
  }
  return out;
}

void MultiTokenPrediction::collect(std::vector<Param*>& out) {
  for (auto& d : layers) {
    d->enorm.collect(out);
    d->hnorm.collect(out);
    d->eh_proj.collect(out);
    for (auto& layer : d->layers) layer->collect(out);
    d->final_layernorm.collect(out);
  }
}

Tensor MultiTokenPrediction::region_forward(const Depth& L, Ctx::Depth& c, const Tensor& e,
                                            const Tensor& prev, const TokenLayout& layout,
                                            const ForwardMode& mode, bool recomputing) const {
  // An FP8 region's forward: scales kept for a recomputation, amaxes reduced at its end.
  auto in_region = [&](Fp8Region* r, std::vector<float>& scales, const auto& body) {
    if (!r || recomputing) return body();
    r->begin_forward(mode.training, mode.first_micro_batch);
    if (recompute_ && mode.training) scales = r->forward_scales();
    auto out = body();
    r->end_forward(mode.training, tp_.amax);
    return out;
  };
  const int64_t h = cfg_.hidden_size, rows = prev.numel() / h;
  const Tensor en = L.enorm.forward(e, c.e).view({rows, h});
  const Tensor hn = L.hnorm.forward(prev, c.h).view({rows, h});
  Tensor cat = Tensor::empty({rows, 2 * h}, en.dtype(), en.device());
  ops::concat_last_dim(cat, {en, hn});
  Tensor x = in_region(L.proj_fp8.get(), c.proj_scales, [&] {
    return L.eh_proj.forward(cat.view({prev.dim(0), prev.dim(1), 2 * h}), c.proj);
  });
  x = gather_from_tp_region_forward(x, *tp_.group);  // [s, b, h] on every TP rank
  if (tp_.sp()) x = scatter_to_sequence_parallel_region_forward(x, *tp_.group);
  x = in_region(L.layer_fp8.get(), c.layer_scales, [&] {
    c.layers.assign(L.layers.size(), {});
    for (size_t j = 0; j < L.layers.size(); ++j)
      x = L.layers[j]->forward(x, layout, c.layers[j], mode);
    return x;
  });
  return L.final_layernorm.forward(x, c.f);
}

std::vector<Tensor> MultiTokenPrediction::forward(const Tensor& hidden, const Tensor& tokens,
                                                  const Tensor& labels,
                                                  const LanguageEmbedding& embedding,
                                                  const LMHead& head, const TokenLayout& layout,
                                                  Ctx& ctx, const ForwardMode& mode) const {
  const int64_t D = depths();
  ctx.depths.assign(static_cast<size_t>(D), {});
  ctx.recompute = recompute_ && mode.training;
  if (ctx.recompute) {
    ctx.layout = layout;
    ctx.mode = mode;
  }
  std::vector<Tensor> losses;
  ctx.ends = layout.packed ? document_ends(layout.doc_start, tp_.cp) : Tensor();
  Tensor ids = tokens, targets = labels, prev = hidden;
  for (int64_t k = 0; k < D; ++k) {
    const Depth& L = block(k);
    Ctx::Depth& c = ctx.depths[static_cast<size_t>(k)];
    ids = roll_left(ids, tp_.cp, ctx.ends);
    targets = roll_left(targets, tp_.cp, ctx.ends);
    // The embedding's own dropout stream per depth (the model's input has site -1).
    const Tensor e = embedding.forward(ids, Tensor(), Tensor(), c.embedding, mode, true, -2 - k);
    const Tensor in = prev;
    prev = region_forward(L, c, e, in, layout, application_mode(mode, k), /*recomputing=*/false);
    if (ctx.recompute) {
      // What backward needs is dropped and rebuilt from the region's inputs.
      c.e_in = e;
      c.prev_in = in;
      c.e = c.h = c.f = Norm::Ctx{};
      c.proj = ColumnParallelLinear::Ctx{};
      c.layers.clear();
    }
    losses.push_back(head.loss(prev, targets, c.head));
  }
  return losses;
}

Tensor MultiTokenPrediction::backward(const std::vector<Tensor>& dlosses,
                                      const LanguageEmbedding& embedding, const LMHead& head,
                                      Ctx& ctx) const {
  const int64_t h = cfg_.hidden_size, D = depths();
  MEGATRON_CHECK(static_cast<int64_t>(dlosses.size()) == D, "MultiTokenPrediction: ", D,
                 " depths, ", dlosses.size(), " loss gradients");
  Tensor dprev;  // the gradient of depth k's output from depth k + 1
  for (int64_t k = D - 1; k >= 0; --k) {
    const Depth& L = block(k);
    Ctx::Depth& c = ctx.depths[static_cast<size_t>(k)];
    // --mtp-detach-heads: the output weight is detached too (Megatron's process_mtp_loss).
    Tensor dh = head.loss_backward(dlosses[static_cast<size_t>(k)], c.head, !cfg_.mtp_detach_heads);
    if (dprev.defined()) ops::add_inplace(dh, dprev.view(dh.shape()));
    if (ctx.recompute) {
      // The same forward from the same inputs and mode: the rebuilt Ctx is the dropped one
      // (FP8: with the forward's scales, recording nothing; TE's recompute phase).
      if (L.proj_fp8) {
        L.proj_fp8->begin_recompute(c.proj_scales);
        L.layer_fp8->begin_recompute(c.layer_scales);
      }
      region_forward(L, c, c.e_in, c.prev_in, ctx.layout, application_mode(ctx.mode, k),
                     /*recomputing=*/true);
      if (L.proj_fp8) {
        L.proj_fp8->end_recompute();
        L.layer_fp8->end_recompute();
      }
      c.e_in = c.prev_in = Tensor();
    } else if (L.proj_fp8) {
      L.proj_fp8->begin_backward();
      L.layer_fp8->begin_backward();
    }
    Tensor dx = L.final_layernorm.backward(dh, c.f);
    for (size_t j = L.layers.size(); j-- > 0;) dx = L.layers[j]->backward(dx, c.layers[j]);
    if (L.layer_fp8) L.layer_fp8->end_backward(tp_.amax);
    if (tp_.sp()) dx = scatter_to_sequence_parallel_region_backward(dx, *tp_.group);
    dx = gather_from_tp_region_backward(dx, *tp_.group);
    const Tensor dcat = L.eh_proj.backward(dx, c.proj);
    if (L.proj_fp8) L.proj_fp8->end_backward(tp_.amax);
    const int64_t rows = dcat.numel() / (2 * h);
    const Tensor flat = dcat.view({rows, 2 * h});
    Tensor de = Tensor::empty({rows, h}, flat.dtype(), flat.device());
    Tensor dhn = Tensor::empty({rows, h}, flat.dtype(), flat.device());
    ops::slice_last_dim(de, flat, 0);
    ops::slice_last_dim(dhn, flat, h);
    const Shape shape{dcat.dim(0), dcat.dim(1), h};
    const Tensor demb = L.enorm.backward(de.view(shape), c.e);
    // --mtp-detach-heads: the embeddings' output was detached (enorm still learns).
    if (!cfg_.mtp_detach_heads) embedding.backward(demb, c.embedding);
    dprev = L.hnorm.backward(dhn.view(shape), c.h);
  }
  ctx = Ctx{};
  // --mtp-detach-heads: the decoder's output was detached at the first depth (the depths still
  // pass gradients to one another).
  if (cfg_.mtp_detach_heads) return Tensor::zeros(dprev.shape(), dprev.dtype(), dprev.device());
  return dprev;
}

}  // namespace megatron
