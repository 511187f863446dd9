// GPT's ModelSpec (GPT-2 and Llama styles, every parallel layout): `--model gpt`,
// `megatron pretrain_gpt`.
#pragma once

#include "models/model_spec.h"

namespace megatron {

const ModelSpec& gpt_spec();

}  // namespace megatron
