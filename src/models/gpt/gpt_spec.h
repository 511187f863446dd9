// GPT's ModelSpec (GPT-2 and Llama styles, every parallel layout): `--model gpt`,
// `megatron pretrain_gpt`.
#pragma once

#include "models/gpt/gpt_model.h"
#include "models/model_spec.h"

namespace megatron {

const ModelSpec& gpt_spec();

// The GPTModel of a GPT spec's chunk (GPT's, or a spec built on its chunks: hybrid Mamba).
const GPTModel& gpt_model_of(const ModelChunk& chunk);

// The GPTModel stage of chunk `l` of a placement (shared with models built on GPT: LLaVA).
GPTStage gpt_stage(const ChunkPlacement& p, const ChunkLayers& l);

}  // namespace megatron
