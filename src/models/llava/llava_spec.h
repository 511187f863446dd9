// LLaVA's spec (`megatron pretrain_vlm`, --model llava): LlavaChunk stages (the vision encoder and
// projector on the first), GPT's masked LM loss, image-text batches, FLOPs and activations of the
// language model plus the vision encoder, and the Hugging Face LlavaForConditionalGeneration
// mapping.
#pragma once

#include "models/model_spec.h"

namespace megatron {

const ModelSpec& llava_spec();

}  // namespace megatron
