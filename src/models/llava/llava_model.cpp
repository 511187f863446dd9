// LLaVA's stages: the vision path, the splice into the language model's input, and GPT.
#include "models/llava/llava_model.h"

#include "models/llava/image_splice.h"
#include "parallel/mappings.h"
#include "tensor/ops.h"

namespace megatron {

namespace {

// The rows of the stacked table [text [T b]; images [img_seq n]; zero] that make each row
// (position t, sample i) -> t b + i of the decoder input, from Megatron's splice layout.
// seq: the combined length, fixed (training); 0: the batch's longest, with token_end the last
// combined position of every token (inference).
Tensor source_rows(const Tensor& tokens, int64_t img_seq, int64_t n_images, int64_t& seq,
                   int64_t max_seq, std::vector<int64_t>* token_end) {
  const Tensor host = to_host(tokens);
  const int64_t b = host.dim(0), text = host.dim(1);
  SpliceInput in;
  in.batch = b;
  in.text_len = text;
  in.input_ids.assign(host.data<int64_t>(), host.data<int64_t>() + b * text);
  in.num_image_tiles.assign(static_cast<size_t>(n_images), 1);
  in.img_seq_len = img_seq;
  in.language_max_seq_len = seq > 0 ? seq : max_seq;
  in.pad_to_max = seq > 0;
  const SpliceLayout layout = splice_image_tokens(in);
  if (seq > 0) {
    MEGATRON_ASSERT(layout.seq_len == seq, "splice length ", layout.seq_len, " != ", seq);
  } else {
    MEGATRON_CHECK(layout.full_len <= max_seq, "the prompt with its image embeddings takes ",
                   layout.full_len, " positions, more than the model's ", max_seq,
                   " (--max-position-embeddings)");
    seq = layout.seq_len;
  }
  if (token_end) {
    token_end->assign(static_cast<size_t>(b * text), 0);
    for (int64_t i = 0; i < b; ++i) {
      int64_t end = text;  // the sample's own combined length (shorter ones are padded after)
      for (int64_t j = 0; j < text; ++j)
        if (in.input_ids[static_cast<size_t>(i * text + j)] == kImageTokenIndex) end += img_seq - 1;
      for (int64_t j = text - 1; j >= 0; --j) {
        const int64_t pos = layout.text_position[static_cast<size_t>(i * text + j)];
        // An image token's place ends where the next token's begins.
        (*token_end)[static_cast<size_t>(i * text + j)] = pos >= 0 ? pos : end - 1;
        end = pos >= 0 ? pos : end - img_seq;
      }
    }
  }
  const int64_t zero_row = text * b + img_seq * n_images;
  Tensor rows = Tensor::full({seq * b}, static_cast<double>(zero_row), DType::kI64);
  int64_t* r = rows.data<int64_t>();
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < text; ++j) {
      const int64_t pos = layout.text_position[static_cast<size_t>(i * text + j)];
      if (pos >= 0 && pos < seq) r[pos * b + i] = j * b + i;
    }
  // Image embeddings fill the image positions in (sample, position) order, image by image.
  int64_t q = 0;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t pos = 0; pos < layout.full_len; ++pos) {
      if (!layout.image_mask[static_cast<size_t>(i * layout.full_len + pos)]) continue;
      const int64_t image = q / img_seq, e = q % img_seq;
      if (pos < seq) r[pos * b + i] = text * b + e * n_images + image;
      ++q;
    }
  return on_device(rows, tokens.device());
}

}  // namespace

LlavaModel::LlavaModel(const TransformerConfig& cfg, GPTStage stage)
    : language_model(cfg, std::move(stage)) {
  MEGATRON_CHECK(cfg.vision.enabled(), "a LLaVA model needs --vision-model-type");
  const GPTStage& st = language_model.stage();
  MEGATRON_CHECK(!st.cp.enabled(),
                 "LLaVA: --context-parallel-size > 1 is not supported (the "
                 "combined text and image sequence would need Megatron's packed-sequence padding)");
  if (st.pre_process) {
    const TensorParallelContext tp{st.tp.get(), false, {}, {}, nullptr};
    vision_model = std::make_unique<ClipVisionModel>(cfg, tp);
    vision_projection =
        std::make_unique<VisionProjection>(cfg, vision_model->config().hidden_size, tp);
  }
  // Megatron's LLaVAModel.freeze: requires_grad off, here also no gradient storage.
  auto freeze = [](const std::vector<Param*>& ps) {
    for (Param* p : ps) {
      p->frozen = true;
      p->requires_grad = false;
    }
  };
  if (cfg.vision.freeze_language_model) {
    MEGATRON_CHECK(!cfg.moe.enabled(),
                   "--freeze-LM with Mixture-of-Experts layers is not "
                   "supported: the experts' grouped weight gradients cannot be skipped yet");
    freeze(language_model.parameters());
  }
  if (cfg.vision.freeze_vision_model && vision_model) {
    std::vector<Param*> ps;
    vision_model->collect(ps);
    freeze(ps);
  }
}

std::vector<Param*> LlavaModel::parameters() {
  std::vector<Param*> out;
  if (vision_model) vision_model->collect(out);
  if (vision_projection) vision_projection->collect(out);
  for (Param* p : language_model.parameters()) out.push_back(p);
  return out;
}

Tensor LlavaModel::decoder_input(const LlavaInputs& in, Ctx& ctx, const ForwardMode& mode,
                                 bool for_inference) const {
  const TransformerConfig& cfg = config();
  MEGATRON_CHECK(in.tokens.defined() && in.tokens.ndim() == 2,
                 "LLaVA: the first stage needs [b, T] tokens");
  MEGATRON_CHECK(in.images.defined() && in.images.ndim() == 4,
                 "LLaVA: the first stage needs [n, 3, H, W] images");
  const int64_t b = in.tokens.dim(0), text = in.tokens.dim(1), n = in.images.dim(0);
  const int64_t h = cfg.hidden_size;
  int64_t seq = for_inference ? 0 : cfg.seq_length;
  const int64_t img_seq = cfg.vision.num_image_embeddings();
  ctx.source_rows = source_rows(in.tokens, img_seq, n, seq, cfg.max_position_embeddings,
                                for_inference ? &ctx.token_end : nullptr);
  ctx.text_rows = text * b;
  ctx.image_rows = img_seq * n;
  ctx.n_images = n;

  // Text: the image tokens read as id 0 (Megatron's input_ids_text), at the text positions.
  Tensor ids = to_host(in.tokens).clone();
  for (int64_t k = 0; k < ids.numel(); ++k)
    if (ids.data<int64_t>()[k] == kImageTokenIndex) ids.data<int64_t>()[k] = 0;
  ids = on_device(ids, in.tokens.device());
  const LanguageEmbedding& embedding = *language_model.embedding;
  std::vector<const Param*> tables{&embedding.word_embeddings};
  if (!embedding.position_embeddings.name.empty()) tables.push_back(&embedding.position_embeddings);
  Tensor text_emb;
  {
    const ForwardMode::Use use(mode, tables);
    text_emb = embedding.forward(ids, in.positions, Tensor(), ctx.text, mode,
                                 /*sequence_parallel_split=*/false);
  }
  // Images: ViT, class token dropped or kept, projector.
  Tensor vit = vision_model->forward(in.images, ctx.vision, mode);  // [seq_v, n, h_v]
  if (!cfg.vision.class_token) vit = vit.slice0(1, vit.dim(0));
  const Tensor image_emb = vision_projection->forward(vit, ctx.projection, mode);

  Tensor table =
      Tensor::zeros({ctx.text_rows + ctx.image_rows + 1, h}, text_emb.dtype(), text_emb.device());
  table.slice0(0, ctx.text_rows).copy_from(text_emb.view({ctx.text_rows, h}));
  table.slice0(ctx.text_rows, ctx.text_rows + ctx.image_rows)
      .copy_from(image_emb.view({ctx.image_rows, h}));
  Tensor x = Tensor::empty({seq * b, h}, table.dtype(), table.device());
  ops::embedding_forward(x, ctx.source_rows, table);
  x = x.view({seq, b, h});
  const GPTStage& st = stage();
  if (!for_inference && st.sequence_parallel && st.tp->size() > 1)
    x = scatter_to_sequence_parallel_region_forward(x, *st.tp);
  return x;
}

Tensor LlavaModel::infer(const LlavaInputs& in, bool last_only, KvCache* cache,
                         int64_t* positions) const {
  const GPTStage& st = stage();
  MEGATRON_CHECK(st.pre_process && st.post_process,
                 "LLaVA inference runs in one pipeline stage (--pipeline-model-parallel-size 1)");
  ForwardMode mode;  // no dropout
  mode.kv_cache = cache;
  if (!in.images.defined()) {  // text after the image, through the cache: GPT's own step
    MEGATRON_CHECK(cache != nullptr && cache->offset() > 0,
                   "LLaVA: a step without images continues a cached prompt that had one");
    if (positions) *positions = in.tokens.dim(1);
    return language_model.infer_stage(Tensor(), in.tokens, in.positions, mode, last_only);
  }
  Ctx ctx;
  const Tensor x = decoder_input(in, ctx, ForwardMode{}, /*for_inference=*/true);
  if (positions) *positions = x.dim(0);
  const Tensor logits = language_model.infer_stage(Tensor(), Tensor(), Tensor(), mode,
                                                   /*last_only=*/false, x);  // [S b, Vp]
  const int64_t b = in.tokens.dim(0), text = in.tokens.dim(1), vp = logits.dim(1);
  const int64_t rows = last_only ? 1 : text;
  Tensor ids = Tensor::empty({rows * b}, DType::kI64);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < b; ++i) {
      const int64_t j = last_only ? text - 1 : t;
      ids.data<int64_t>()[t * b + i] = ctx.token_end[static_cast<size_t>(i * text + j)] * b + i;
    }
  Tensor out = Tensor::empty({rows * b, vp}, logits.dtype(), logits.device());
  ops::embedding_forward(out, on_device(ids, logits.device()), logits);
  return out;
}

Tensor LlavaModel::forward_stage(const Tensor& hidden_in, const LlavaInputs& in, Ctx& ctx,
                                 const ForwardMode& mode) const {
  GPTInputs lm;
  lm.labels = in.labels;
  if (stage().pre_process) lm.decoder_input = decoder_input(in, ctx, mode);
  return language_model.forward_stage(hidden_in, lm, ctx.lm, mode);
}

void LlavaModel::splice_backward(const Tensor& dx_in, Ctx& ctx, const ParamsDone& done) const {
  const TransformerConfig& cfg = config();
  const GPTStage& st = stage();
  const int64_t h = cfg.hidden_size, seq = cfg.seq_length;
  Tensor dx = st.sequence_parallel && st.tp->size() > 1
                  ? scatter_to_sequence_parallel_region_backward(dx_in, *st.tp)
                  : dx_in;
  const int64_t b = dx.numel() / (seq * h);
  Tensor dtable = Tensor::zeros({ctx.text_rows + ctx.image_rows + 1, h}, dx.dtype(), dx.device());
  ops::embedding_backward(dtable, dx.view({seq * b, h}), ctx.source_rows);

  const Tensor dimage = dtable.slice0(ctx.text_rows, ctx.text_rows + ctx.image_rows)
                            .view({ctx.image_rows / ctx.n_images, ctx.n_images, h});
  Tensor dvit = vision_projection->backward(dimage, ctx.projection, done);
  if (cfg.vision.freeze_vision_model) {
    ctx.vision = {};  // a frozen ViT needs no backward at all
  } else {
    vision_backward(dvit, ctx, done);
  }

  const LanguageEmbedding& embedding = *language_model.embedding;
  std::vector<const Param*> ps{&embedding.word_embeddings};
  if (!embedding.position_embeddings.name.empty()) ps.push_back(&embedding.position_embeddings);
  done.begin(ps);
  embedding.backward(dtable.slice0(0, ctx.text_rows).view({ctx.text_rows / b, b, h}), ctx.text);
  if (done) done(ps);
}

void LlavaModel::vision_backward(Tensor dvit, Ctx& ctx, const ParamsDone& done) const {
  if (!config().vision.class_token) {  // the dropped class token's rows get no gradient
    const int64_t rows = dvit.dim(0) + 1;
    Tensor full = Tensor::zeros({rows, dvit.dim(1), dvit.dim(2)}, dvit.dtype(), dvit.device());
    full.slice0(1, rows).copy_from(dvit);
    dvit = full;
  }
  vision_model->backward(dvit, ctx.vision, done);
}

Tensor LlavaModel::backward_stage(const Tensor& d, Ctx& ctx, const ParamsDone& done) const {
  Tensor dx = language_model.backward_stage(d, ctx.lm, done);
  if (!stage().pre_process) return dx;
  splice_backward(dx, ctx, done);
  ctx = Ctx{};
  return Tensor();
}

}  // namespace megatron
