// The stage-after-stage inference forward (pipeline_forward.h).
#include "inference/pipeline_forward.h"

#include "data/gpt_batch.h"  // the batch field names

namespace megatron::inference {

namespace {
// A tag of its own: no training transfer is in flight while a model runs inference.
constexpr int kPipelineTag = 7;
constexpr const char* kLogits = "logits";
}  // namespace

Tensor pipeline_logits(const ModelChunk& chunk, ProcessGroup& pp, const Tensor& tokens,
                       KvCache* cache, bool last_only) {
  const int64_t b = tokens.dim(0), s = tokens.dim(1);
  const int rank = pp.rank(), stages = pp.size();
  ForwardMode mode;
  mode.kv_cache = cache;
  TensorMap in, batch;
  if (rank == 0) {
    batch.set(kTokens, tokens);
  } else {
    for (const TensorSpec& spec : chunk.infer_specs(b, s)) {
      Tensor t = Tensor::empty(spec.shape, spec.dtype);
      pp.recv(t, rank - 1, kPipelineTag);
      in.set(spec.name, t);
    }
  }
  const TensorMap out = chunk.infer(in, batch, mode, last_only);
  if (rank + 1 < stages) {
    for (const TensorSpec& spec : chunk.infer_specs(b, s)) {
      pp.send(out.at(spec.name), rank + 1, kPipelineTag);
    }
    return Tensor();
  }
  const Tensor& logits = out.at(kLogits);
  return logits.dtype() == DType::kF32 ? logits : logits.to(DType::kF32);
}

}  // namespace megatron::inference
