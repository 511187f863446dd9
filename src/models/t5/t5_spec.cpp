// T5's spec: see the header.
#include "models/t5/t5_spec.h"

#include "core/error.h"
#include "models/common/hf_tensors.h"
#include "models/gpt/gpt_chunk.h"  // GPTLoss
#include "models/gpt/gpt_flops.h"
#include "models/t5/t5_chunk.h"
#include "models/t5/t5_data.h"
#include "models/t5/t5_hf.h"

namespace megatron {

double t5_flops_per_iteration(const TransformerConfig& cfg, int64_t global_batch_size) {
  TransformerConfig enc = cfg;
  enc.padded_vocab_size = 0;  // no logits on the encoder
  const TransformerConfig dec = t5_decoder_config(cfg);
  const double B = static_cast<double>(global_batch_size);
  const double sd = static_cast<double>(dec.seq_length), se = static_cast<double>(cfg.seq_length);
  const double h = static_cast<double>(cfg.hidden_size);
  const double q = static_cast<double>(cfg.num_attention_heads * cfg.head_dim());
  // Per decoder layer: the query and output projections over the decoder's positions, the key
  // and value projections over the encoder's, scores and weighted values over both.
  const double cross = 6.0 * B * (2.0 * sd * h * q + 2.0 * se * h * q + 2.0 * sd * se * q);
  return model_flops_per_iteration(enc, global_batch_size) +
         model_flops_per_iteration(dec, global_batch_size) +
         static_cast<double>(dec.num_layers) * cross;
}

namespace {

const T5Model& t5(const ModelChunk& chunk) {
  const auto* c = dynamic_cast<const T5Chunk*>(&chunk);
  MEGATRON_ASSERT(c != nullptr, "a T5 spec function was given another model's chunk");
  return c->model();
}

HfMapping hf_mapping() {
  HfMapping h;
  h.read_config = [](const std::string& dir) { return read_t5_hf_config(dir).config; };
  h.load = [](const std::string& dir, ModelChunk& whole, ParamSet& params) {
    load_t5_hf_weights(dir, read_t5_hf_config(dir), const_cast<T5Model&>(t5(whole)), params);
  };
  h.save = [](const std::string& dir, const ModelChunk& whole, const std::string& source_dir,
              std::optional<DType> dtype) {
    const T5Model& m = t5(whole);
    T5HfInfo info =
        source_dir.empty() ? t5_hf_info_from_config(m.config()) : read_t5_hf_config(source_dir);
    if (dtype) {
      info.dtype = *dtype;
      info.raw["torch_dtype"] = torch_dtype_name(*dtype);
    }
    save_t5_hf(dir, info, m);
  };
  h.check_exportable = check_t5_exportable;
  return h;
}

ModelSpec make_t5_spec() {
  ModelSpec s;
  s.name = "t5";
  s.entry_point = "pretrain_t5";
  s.summary = "T5 encoder-decoder with span-corruption pretraining (Megatron's pretrain_t5.py)";
  s.build_chunks = build_t5_chunks;
  s.make_loss = [](const TransformerConfig&) -> std::unique_ptr<LossFn> {
    return std::make_unique<GPTLoss>();
  };
  s.batch_field = t5_batch_field;
  s.batch_maker = t5_batch_maker;
  s.build_datasets = t5_datasets;
  s.flops_per_iteration = t5_flops_per_iteration;
  s.activation_bytes = t5_activation_bytes;
  s.hf = hf_mapping();
  s.token_losses = [](const ModelChunk&, const Tensor&, const Tensor&) -> Tensor {
    MEGATRON_CHECK(false,
                   "T5 is an encoder-decoder model: `megatron score` and `megatron generate` take "
                   "(encoder input, decoder target) pairs, which they do not read yet");
    return Tensor();
  };
  return s;
}

}  // namespace

const ModelSpec& t5_spec() {
  static const ModelSpec spec = make_t5_spec();
  return spec;
}

}  // namespace megatron
