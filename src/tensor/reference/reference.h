// Naive fp64 reference implementations of the ops in tensor/ops.h: the specification that the
// fast kernels (and later the CUDA kernels) are tested against, and what the reference device
// (reference_ops.h) computes with. Written for clarity, not speed:
// single-threaded, no tiling, the formula as printed. All floating tensors are f64; the output
// arguments are allocated by the callee. Backward functions return fresh gradients (not
// accumulated).
#pragma once

#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace megatron::ref {

Tensor matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b);  // [m, n]

Tensor gelu(const Tensor& x, bool tanh_approx);
Tensor gelu_backward(const Tensor& dout, const Tensor& x, bool tanh_approx);
Tensor tanh(const Tensor& x);
Tensor tanh_backward(const Tensor& dout, const Tensor& y);  // from the output y
Tensor squared_relu(const Tensor& x);
Tensor squared_relu_backward(const Tensor& dout, const Tensor& x);
Tensor quick_gelu(const Tensor& x);
Tensor quick_gelu_backward(const Tensor& dout, const Tensor& x);
Tensor swiglu(const Tensor& x);
Tensor swiglu_backward(const Tensor& dout, const Tensor& x);
Tensor quick_geglu(const Tensor& x, double offset, double clamp);
Tensor quick_geglu_backward(const Tensor& dout, const Tensor& x, double offset, double clamp);

struct NormGrads {
  Tensor dx, dweight, dbias;
};
Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
NormGrads layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, double eps);
Tensor rmsnorm(const Tensor& x, const Tensor& weight, double eps);
NormGrads rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, double eps);

Tensor embedding(const Tensor& ids, const Tensor& table);
Tensor embedding_backward(const Tensor& dout, const Tensor& ids, int64_t vocab);

// Returns a rotated copy of x ([s, b, G, P, hn]).
Tensor rope(const Tensor& x, const Tensor& positions, const ops::RopeSpec& spec, bool inverse);

// Softmax attention with an explicit score matrix, every masking rule of ops::AttentionSpec
// applied as written there. q [sq, b, np, hn], k and v [skv, b, ng, hn], contiguous; out [sq, b,
// np, hn], lse [b, np, sq] (-inf and a zero output for a row that sees no key), max_score [np]:
// the largest scaled (and biased) score of each head over its visible pairs (-inf: none).
struct AttentionResult {
  Tensor out, lse, max_score;
};
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const ops::AttentionSpec& spec);
// dq, dk, dv, and dbias when spec.bias is defined (summed over the batch for a shared bias).
// With out and lse given (forward's results over a larger key set of which k, v are one block),
// the probabilities are normalised by that lse and the softmax's row term is dout . out: this
// block's share of the gradient. Undefined: the attention over k, v alone.
struct AttentionGrads {
  Tensor dq, dk, dv, dbias;
};
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const ops::AttentionSpec& spec,
                                  const Tensor& out = Tensor(), const Tensor& lse = Tensor());

// Per-row loss (log-sum-exp over the first vocab_size columns minus the target logit).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_size);
Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              int64_t vocab_size);

// One AdamW step on copies; returns {param, exp_avg, exp_avg_sq}.
struct AdamState {
  Tensor param, exp_avg, exp_avg_sq;
};
AdamState adamw(const AdamState& s, const Tensor& grad, const ops::AdamWSpec& spec);

}  // namespace megatron::ref
