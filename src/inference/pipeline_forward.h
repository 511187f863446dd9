// One inference forward through a pipeline of model chunks, stage after stage: the first stage
// embeds the tokens, every other receives its predecessor's tensors (ModelChunk::infer_specs) and
// the last returns the logits. The plain-MPI form of Megatron's ForwardStep for generation and
// zero-shot evaluation (no micro-batch pipelining: one batch is in flight).
#pragma once

#include "comm/process_group.h"
#include "models/model_chunk.h"
#include "transformer/kv_cache.h"

namespace megatron::inference {

// tokens [b, s] i64 (read on the first stage; every rank passes its copy). Returns on the last
// stage the f32 logits [s b, Vp] (row t b + i: position t of sequence i; [b, Vp] of the last
// position with last_only) over the whole padded vocabulary, an undefined tensor elsewhere.
// cache: the positions continue it (null: a whole sequence from position 0). Collective over pp
// (and the chunk's own groups).
Tensor pipeline_logits(const ModelChunk& chunk, ProcessGroup& pp, const Tensor& tokens,
                       KvCache* cache, bool last_only);

}  // namespace megatron::inference
