// CLIP ViT forward and backward: the patch GEMM, class token and positions, ln_pre and the
// bidirectional pre-norm layers of transformer/.
#include "models/vision/clip_vit.h"

#include "core/error.h"
#include "models/common/language_embedding.h"  // gather_rows
#include "tensor/ops.h"

namespace megatron {

namespace {

// The ViT's dropout streams sit after every language-model layer's (CLIP has no dropout; the
// offset keeps a ViT given dropout from sharing masks with the decoder's layers).
constexpr int64_t kVisionStreamOffset = int64_t{1} << 20;

template <typename T>
void unfold(const T* img, T* out, int64_t n, int64_t h, int64_t w, int64_t p) {
  const int64_t gh = h / p, gw = w / p, k = 3 * p * p;
  for (int64_t gy = 0; gy < gh; ++gy)
    for (int64_t gx = 0; gx < gw; ++gx)
      for (int64_t i = 0; i < n; ++i) {
        T* row = out + ((gy * gw + gx) * n + i) * k;
        for (int64_t c = 0; c < 3; ++c)
          for (int64_t y = 0; y < p; ++y) {
            const T* src = img + ((i * 3 + c) * h + gy * p + y) * w + gx * p;
            for (int64_t x = 0; x < p; ++x) row[(c * p + y) * p + x] = src[x];
          }
      }
}

}  // namespace

TransformerConfig vision_transformer_config(const TransformerConfig& lm) {
  const VisionConfig& v = lm.vision;
  MEGATRON_CHECK(v.model_type == "clip", "--vision-model-type: unknown '", v.model_type,
                 "'; choose clip");
  MEGATRON_CHECK(v.patch_dim > 0 && v.img_h > 0 && v.img_w > 0,
                 "--patch-dim, --img-h and --img-w must be positive");
  MEGATRON_CHECK(v.img_h % v.patch_dim == 0 && v.img_w % v.patch_dim == 0, "--img-h (", v.img_h,
                 ") and --img-w (", v.img_w, ") must be multiples of --patch-dim (", v.patch_dim,
                 "): the ViT cuts images into whole patches");
  MEGATRON_CHECK(v.num_layers > 0,
                 "the vision encoder needs layers: --encoder-num-layers (or "
                 "--num-layers, which sets both the encoder's and the decoder's)");
  TransformerConfig c = lm;
  c.vision = VisionConfig{};
  c.num_layers = v.num_layers;
  c.hidden_size = v.hidden_size > 0 ? v.hidden_size : lm.hidden_size;
  c.num_attention_heads =
      v.num_attention_heads > 0 ? v.num_attention_heads : lm.num_attention_heads;
  c.ffn_hidden_size = v.ffn_hidden_size > 0 ? v.ffn_hidden_size : 4 * c.hidden_size;
  c.kv_channels = 0;
  c.num_query_groups = 0;
  c.seq_length = c.max_position_embeddings = v.seq_length();
  // CLIP's layers (examples/multimodal/config.py, vision model type clip).
  c.normalization = Normalization::kLayerNorm;
  c.norm_epsilon = v.norm_epsilon;
  c.layernorm_zero_centered_gamma = false;
  c.post_layernorm = false;
  c.swiglu = c.gated_gelu = c.openai_gelu = c.squared_relu = c.qk_layernorm = false;
  c.quick_gelu = true;
  c.quick_geglu = false;  // nor the language model's gpt-oss pieces
  c.glu_linear_offset = c.activation_clamp = 0;
  c.window_attention = false;
  c.window_layers.clear();
  c.softmax_type = SoftmaxType::kVanilla;
  c.add_bias_linear = true;
  c.add_qkv_bias = true;
  c.position_embedding = PositionEmbedding::kNone;  // the ViT adds its own learned table
  c.softmax_scale = 0;
  c.hidden_dropout = c.attention_dropout = 0;
  c.moe = MoeConfig{};
  c.mla = MlaConfig{};  // the vision tower's attention is CLIP's whatever the language model's
  c.mtp_num_layers = 0;
  c.fp8 = Fp8Config{};
  c.recompute_granularity = RecomputeGranularity::kNone;  // Megatron: --recompute-vision, apart
  c.recompute_method = RecomputeMethod::kNone;
  c.recompute_num_layers = 0;
  c.finalize();
  return c;
}

Tensor unfold_patches(const Tensor& images, int64_t patch_dim) {
  MEGATRON_CHECK(images.ndim() == 4 && images.dim(1) == 3,
                 "the vision encoder takes [n, 3, H, W] images, got ", images.str());
  const int64_t n = images.dim(0), h = images.dim(2), w = images.dim(3), p = patch_dim;
  const Tensor host = to_host(images);
  Tensor out = Tensor::empty({(h / p) * (w / p) * n, 3 * p * p}, images.dtype());
  if (images.dtype() == DType::kF64) {
    unfold(host.data<double>(), out.data<double>(), n, h, w, p);
  } else {
    MEGATRON_CHECK(images.dtype() == DType::kF32, "images must be f32, got ", images.str());
    unfold(host.data<float>(), out.data<float>(), n, h, w, p);
  }
  return on_device(out, images.device());
}

ClipVisionModel::ClipVisionModel(const TransformerConfig& lm, const TensorParallelContext& tp)
    : cfg_(vision_transformer_config(lm)),
      conv1("vision_model.conv1", 3 * lm.vision.patch_dim * lm.vision.patch_dim, cfg_.hidden_size,
            /*with_bias=*/false, cfg_.init_method_std),
      ln_pre("vision_model.ln_pre", cfg_),
      tp_(TensorParallelContext{tp.group, /*sequence_parallel=*/false, {}, {}, nullptr}),
      patch_dim_(lm.vision.patch_dim) {
  conv1.weight.megatron_ndim = 4;  // Megatron's Conv2d [h_v, 3, p, p]: not a matrix for Muon
  class_token.name = "vision_model.class_token";
  class_token.shape = {cfg_.hidden_size};  // Megatron's [1, 1, h_v] (one class token)
  class_token.init_std = 1.0;
  position_embeddings.name = "vision_model.position_embeddings.weight";
  position_embeddings.shape = {cfg_.seq_length, cfg_.hidden_size};
  position_embeddings.init_std = 1.0;
  LayerOptions options;
  options.stream_offset = kVisionStreamOffset;
  decoder = std::make_unique<TransformerBlock>("vision_model.decoder", cfg_, tp_, 0,
                                               cfg_.num_layers, /*with_final_norm=*/false, options);
  std::vector<Param*> ps;
  collect(ps);
  for (Param* p : ps) {
    p->tp_rank = tp_.rank();
    p->tp_size = tp_.size();
  }
}

void ClipVisionModel::collect(std::vector<Param*>& out) {
  conv1.collect(out);
  out.push_back(&class_token);
  out.push_back(&position_embeddings);
  ln_pre.collect(out);
  decoder->collect(out);
}

std::vector<const Param*> ClipVisionModel::stem() const {
  std::vector<const Param*> ps{&conv1.weight, &class_token, &position_embeddings, &ln_pre.weight};
  if (!ln_pre.bias.name.empty()) ps.push_back(&ln_pre.bias);
  return ps;
}

Tensor ClipVisionModel::forward(const Tensor& images, Ctx& ctx, const ForwardMode& mode) const {
  const int64_t patch = patch_dim_;
  const int64_t seq = cfg_.seq_length, h = cfg_.hidden_size;
  MEGATRON_CHECK(images.ndim() == 4 && images.dim(1) == 3 &&
                     (images.dim(2) / patch) * (images.dim(3) / patch) + 1 == seq &&
                     images.dim(2) % patch == 0 && images.dim(3) % patch == 0,
                 "the vision encoder takes [n, 3, --img-h, --img-w] images of ", seq - 1,
                 " patches of ", patch, "x", patch, ", got ", images.str());
  const int64_t n = images.dim(0), patches = seq - 1;
  ctx.n = n;
  const DType act = conv1.weight.value.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const ForwardMode::Use use(mode, stem());
  Tensor rows = unfold_patches(images, patch);
  if (rows.dtype() != act) rows = rows.to(act);
  const Tensor embedded = conv1.forward(rows, ctx.conv1);  // [patches n, h]

  Tensor class_ids = Tensor::zeros({1, n}, DType::kI64);
  Tensor position_ids = Tensor::empty({seq, n}, DType::kI64);
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t i = 0; i < n; ++i) position_ids.data<int64_t>()[t * n + i] = t;
  ctx.class_ids = on_device(class_ids, images.device());
  ctx.position_ids = on_device(position_ids, images.device());

  Tensor x = Tensor::empty({seq, n, h}, act, images.device());
  x.slice0(0, 1).copy_from(gather_rows(ctx.class_ids, class_token.value.view({1, h}), act));
  x.slice0(1, seq).copy_from(embedded.view({patches, n, h}));
  Tensor flat = x.view({seq * n, h});
  ops::add_inplace(flat, gather_rows(ctx.position_ids, position_embeddings.value, act));
  x = ln_pre.forward(x, ctx.ln_pre);
  TokenLayout layout;
  layout.causal = false;  // every patch sees every other (Megatron's TE ViT spec: no mask)
  return decoder->forward(x, layout, ctx.decoder, mode);
}

void ClipVisionModel::backward(const Tensor& dy, Ctx& ctx, const ParamsDone& done) const {
  const int64_t seq = cfg_.seq_length, h = cfg_.hidden_size, n = ctx.n;
  Tensor dx = decoder->backward(dy, ctx.decoder, done);
  done.begin(stem());
  dx = ln_pre.backward(dx, ctx.ln_pre);
  if (position_embeddings.main_grad.defined()) {  // (undefined: frozen, no gradient storage)
    Tensor dpos = position_embeddings.main_grad;
    ops::embedding_backward(dpos, dx.view({seq * n, h}), ctx.position_ids);
  }
  if (class_token.main_grad.defined()) {
    Tensor dclass = class_token.main_grad.view({1, h});
    ops::embedding_backward(dclass, dx.slice0(0, 1).view({n, h}), ctx.class_ids);
  }
  conv1.backward(dx.slice0(1, seq).view({(seq - 1) * n, h}), ctx.conv1);  // no image gradient
  if (done) done(stem());
  ctx = Ctx{};
}

}  // namespace megatron
