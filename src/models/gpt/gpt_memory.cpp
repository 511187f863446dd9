// GPT's activation bytes per micro-batch and chunk (see gpt_memory.h).
#include "models/gpt/gpt_memory.h"

#include <algorithm>

namespace megatron {

int64_t activation_bytes_per_microbatch(const TransformerConfig& c, const ActivationShape& a) {
  const int64_t s = c.seq_length / a.cp, b = a.micro_batch_size, h = c.hidden_size, t = a.tp;
  const int64_t np = c.num_attention_heads, ng = c.num_query_groups, hn = c.head_dim();
  const int64_t f = c.ffn_hidden_size, sb = s * b;
  const int64_t s_local_b = a.sequence_parallel && t > 1 ? sb / t : sb;  // s' b
  const int64_t e = 4;                                                   // fp32 activations
  const int64_t g = is_half(c.compute_dtype) ? 2 : 4;                    // saved GEMM inputs
  const int64_t stats = (c.normalization == Normalization::kLayerNorm ? 2 : 1) * s_local_b * e;
  const int64_t core = (sb * np * hn + b * np * s) / t * e;  // attention out + lse
  const int64_t layer = 2 * s_local_b * h * e + 2 * stats    // input, x1, norm statistics
                        + 2 * sb * h * g                     // qkv and fc1 GEMM inputs
                        + sb * (np + 2 * ng) * hn / t * e    // qkv after RoPE
                        + core
                        // linear_proj's input: the attention output itself in fp32 runs, a
                        // 16-bit copy otherwise
                        + (g == 4 ? 0 : sb * np * hn / t * g) +
                        sb * (c.swiglu ? 2 * f : f) / t * e  // fc1 output
                        + sb * f / t * g;                    // fc2 input
  const int64_t input = s_local_b * h * e;                   // a recomputed segment's input
  const int64_t L = a.num_layers;
  int64_t bytes = 0;
  switch (c.recompute_granularity) {
    case RecomputeGranularity::kNone:
      bytes = L * layer;
      break;
    case RecomputeGranularity::kSelective:
      bytes = L * (layer - core);
      break;
    case RecomputeGranularity::kFull: {
      const int64_t n = std::max<int64_t>(c.recompute_num_layers, 1);
      bytes = c.recompute_method == RecomputeMethod::kUniform
                  ? (L + n - 1) / n * input
                  : std::min(n, L) * input + std::max<int64_t>(L - n, 0) * layer;
      break;
    }
  }
  if (a.post_process) {
    const int64_t vp_local = c.padded_vocab_size / t;
    // Final norm (input and statistics), output GEMM input, fp32 logits, their lse, targets.
    bytes += s_local_b * h * e + stats + sb * h * g + sb * vp_local * e + sb * e + sb * 8;
  }
  if (a.pre_process) bytes += 2 * sb * 8;  // token and position ids, i64
  return bytes;
}

}  // namespace megatron
