// Multi-token prediction in the Hugging Face oracle tests (tests/reference/hf_oracle.py's
// deepseek-v3-mtp and nemotron-h-mtp): the oracle's objective is lm loss + Megatron's MTP term,
// so the training forward runs the depths and their loss gradients join the main loss's as GPTLoss
// makes them.
#pragma once

#include <cstdint>

#include "models/gpt/gpt_model.h"

namespace megatron::testing {

// The depths run in training forwards only; the oracle's models have no dropout.
inline ForwardMode oracle_mode(const TransformerConfig& c) {
  return c.mtp_num_layers > 0 ? ForwardMode{true, 1, 0} : ForwardMode{};
}

// Depth k's loss gradient [B, S]: its loss mask (all ones) rolled left by k, times
// --mtp-loss-scaling-factor / depths over the mask's count.
inline void set_mtp_gradients(const TransformerConfig& c, int64_t B, int64_t S,
                              GPTModel::Ctx& ctx) {
  ctx.mtp_dlosses.clear();
  for (int64_t k = 1; k <= c.mtp_num_layers; ++k) {
    Tensor d = Tensor::zeros({B, S});
    const double w = c.mtp_loss_scaling_factor / static_cast<double>(c.mtp_num_layers) /
                     static_cast<double>(B * (S - k));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t + k < S; ++t) d.data<float>()[b * S + t] = static_cast<float>(w);
    ctx.mtp_dlosses.push_back(d);
  }
}

}  // namespace megatron::testing
