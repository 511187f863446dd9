// Every tensor op of the trainer, as free functions: outputs first, then inputs.
//
// Shapes are checked here at the boundary and the call is dispatched on device (CPU only for now)
// and dtype: f32 runs the fast kernels, f64 runs the same kernels in double (used by the finite-
// difference tests). tensor/cpu/reference.h holds a naive fp64 implementation of each op: the spec
// that the fast kernels are tested against. Unless noted, activations are f32 (or f64) and
// "rows" means all leading dims flattened: a [s, b, h] tensor has s*b rows of h.
//
// Gradient conventions: a backward op *writes* the input gradient (dx = ...) and *accumulates*
// parameter gradients (dweight += ...), so gradient accumulation over micro-batches is free.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace megatron::ops {

// ---- GEMM (oneDNN) ----------------------------------------------------------------------------
// out[M, N] = op(a) @ op(b) + beta * out, op(x) = x or x^T. a and b are both f32, both bf16 or
// both f16 (16-bit products accumulate in f32); out is f32. 2-D views of any contiguous tensor
// (leading dims flattened). beta is 0 (overwrite) or 1 (accumulate). Primitives are cached by
// shape.
void matmul(Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            float beta = 0.0f);
// Whether this CPU runs bf16 (or f16) GEMMs natively (oneDNN needs AVX-512; AVX-512 FP16 or AMX
// for f16). If not, such GEMMs widen their inputs to f32 and run the f32 kernel: the same
// results, without the 16-bit speed-up.
bool native_half_gemm(DType t);
// What decides this build's arithmetic, on one line: the vector extensions the kernels were
// compiled for (-march=native), the compiler, oneDNN's version, the instruction set its kernels
// use on this CPU and the cache sizes it blocks its GEMMs by. Two machines with the same line
// compute the same bits; with another line, sums may be ordered otherwise (vector widths, oneDNN's
// blocking) and the last bits differ.
std::string numerics_fingerprint();

// ---- elementwise ------------------------------------------------------------------------------
void add(Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b
void add_inplace(Tensor& out, const Tensor& a);           // out += a
void bias_add(Tensor& x, const Tensor& bias);             // x[r, :] += bias[:]
void bias_backward(Tensor& dbias, const Tensor& dy);      // dbias += sum_r dy[r, :]
void scale_inplace(Tensor& x, double factor);             // x *= factor

// GELU, exact (erf; Megatron's default) or tanh approximation (--openai-gelu, HF gelu_new).
void gelu_forward(Tensor& out, const Tensor& x, bool tanh_approx);
void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx);

// SwiGLU on x[r, 2f] = [gate | up] (Megatron's chunk order): out[r, f] = silu(gate) * up.
void swiglu_forward(Tensor& out, const Tensor& x);
void swiglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x);

// Dropout with a counter-based mask: element i is kept iff uniform(seed, stream, offset + i) >= p,
// and scaled by 1/(1-p). The mask is recomputed in backward, never stored. `offset` places a shard
// in its full tensor (under sequence parallelism rank r holds elements [r n, (r + 1) n)), so
// every layout draws the same mask for the same element.
void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset = 0);
void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed, uint64_t stream,
                      uint64_t offset = 0);

// ---- normalisation ----------------------------------------------------------------------------
// LayerNorm over the last dim h: out = (x - mean) * rstd * weight + bias; mean, rstd: [rows] f32.
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, float eps);
void layernorm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd);
// RMSNorm: out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).
void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps);
void rmsnorm_backward(Tensor& dx, Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd);

// ---- embedding --------------------------------------------------------------------------------
// out[r, h] = table[ids[r], h]; ids are int32 or int64.
void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table);
// dtable[ids[r], :] += dout[r, :] (deterministic: each row of dtable is summed in token order).
void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& ids);

// ---- rotary position embedding ----------------------------------------------------------------
// x is [s, b, G, P, hn]; heads p in [head_begin, head_end) of every group are rotated in place by
// the angle pos * inv_freq, on their first rot_dim channels, rotate-half convention (HF Llama,
// Megatron rotary_interleaved=False): inv_freq[i] = base^(-2i / rot_dim). positions is [s, b]
// int64, or undefined for pos = s index. inverse = true rotates by -angle (the backward).
struct RopeSpec {
  int64_t head_begin = 0, head_end = 1;
  int64_t rot_dim = 0;
  float base = 10000.0f;
};
void rope_inplace(Tensor& x, const Tensor& positions, const RopeSpec& spec, bool inverse);

// ---- attention --------------------------------------------------------------------------------
// Causal (or full) scaled-dot-product attention reading q, k, v straight from Megatron's packed
// QKV projection: qkv is [s, b, ng, qpg + 2, hn] (per query group: qpg query heads, then one key
// and one value head). out is [s, b, ng * qpg, hn]; lse is [b, ng * qpg, s] (log-sum-exp of each
// score row, the only softmax statistic kept for backward). Tiled with an online softmax: memory
// is linear in s. Attention dropout, if p > 0, uses the counter-based mask of dropout_forward
// with one counter per (b, head, i, j).
struct AttentionSpec {
  int64_t num_query_groups = 1;
  int64_t queries_per_group = 1;
  float scale = 1.0f;  // usually 1/sqrt(hn)
  bool causal = true;
  float dropout = 0.0f;
  uint64_t seed = 0, stream = 0;
  // Under tensor parallelism this rank's heads are heads [head_offset, head_offset + np) of
  // total_heads (0: np, no offset): dropout counters use the global head, so every TP size draws
  // the same masks.
  int64_t head_offset = 0, total_heads = 0;
  // Document boundaries (--reset-attention-mask), or null: [b, s] positions, doc_start[b * s + i]
  // = first position of the document holding token i; query i then sees only keys j in
  // [doc_start, i]. Requires causal.
  const int32_t* doc_start = nullptr;
};
void attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttentionSpec& spec);
// dqkv is written (same layout as qkv).
void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const AttentionSpec& spec);

// ---- loss -------------------------------------------------------------------------------------
// Fused softmax cross-entropy over the vocabulary. logits [n, Vp] f32 (Vp = padded vocab);
// columns >= vocab_size are padding and are excluded from the softmax. loss[n] = lse - logit
// of target, lse[n] kept for backward. No probability tensor is materialised.
void cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size);
// dlogits[r, v] = dloss[r] * (softmax(r, v) - [v == target]); may alias logits (in place).
// Padding columns get 0.
void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size);
// log-softmax of the target under the same masking: logprob[n] (scoring).
void log_softmax_gather(Tensor& logprob, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_size);

// ---- optimizer --------------------------------------------------------------------------------
// One AdamW step over flat f32 buffers (decoupled weight decay, bias-corrected moments):
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
// g is grad * grad_scale, the factor rounded to the parameter dtype and the product rounded, as
// an in-place scaling of the gradient (scale_inplace) would: gradient clipping fused into the
// update (one pass fewer over the gradients).
struct AdamWSpec {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  int64_t step = 1;         // 1-based, for the bias correction
  double grad_scale = 1.0;  // the clipping coefficient
};
void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWSpec& spec);
// sum of squares of every element, accumulated in double.
double sum_squares(const Tensor& x);

}  // namespace megatron::ops
