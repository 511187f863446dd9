// Every tensor op of the trainer, as free functions: outputs first, then inputs.
//
// The device boundary: every kernel is reached through these functions. Each checks that its
// tensors share one device, opens the op profile's timer for its category and runs that device's
// implementation (tensor/ops.cpp): the CPU device's oneDNN/OpenMP kernels (tensor/cpu/), in f32
// or f64 (f64 for the finite-difference tests), or the reference device's naive fp64 formulas
// (tensor/reference/), the specification the op harness checks every device against. Unless
// noted, activations are f32 (or f64) and "rows" means all leading dims flattened: a [s, b, h]
// tensor has s*b rows of h.
//
// Gradient conventions: a backward op *writes* the input gradient (dx = ...) and *accumulates*
// parameter gradients (dweight += ...), so gradient accumulation over micro-batches is free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/fp8.h"
#include "tensor/tensor.h"

namespace megatron::ops {

// ---- GEMM (oneDNN) ----------------------------------------------------------------------------
// out[M, N] = op(a) @ op(b) + beta * out, op(x) = x or x^T. a and b are both f32, both bf16 or
// both f16 (16-bit products accumulate in f32); out is f32. 2-D views of any contiguous tensor
// (leading dims flattened). beta is 0 (overwrite) or 1 (accumulate). Primitives are cached by
// shape.
void matmul(Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
            float beta = 0.0f);
// Grouped GEMM, the experts of an MoE layer as one op (Megatron's --moe-grouped-gemm): the rows
// of a [N, k] come in consecutive groups of sizes[g] rows (summing to N), and group g has its own
// matrix b[g], [k, n] or, with trans_b, [n, k] (a Linear's [out, in] weight):
//   out[rows of g] = a[rows of g] op(b[g]) + beta * out[rows of g]        out: [N, n]
// and the weight gradients, both operands split by the same groups of rows:
//   out[g] = a[rows of g]^T c[rows of g] + beta * out[g]                   out[g]: [k_a, k_c]
// a group of no rows leaves its out[g] as beta makes it (zeroed or untouched). dtypes as matmul.
// The CPU device runs the blocks of every group in one parallel loop (tensor/cpu/
// grouped_matmul.cpp), not a GEMM call per group.
void grouped_matmul(Tensor& out, const Tensor& a, const std::vector<Tensor>& b, bool trans_b,
                    const std::vector<int64_t>& sizes, float beta = 0.0f);
void grouped_matmul_at(std::vector<Tensor>& out, const Tensor& a, const Tensor& c,
                       const std::vector<int64_t>& sizes, float beta = 0.0f);
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
void mul(Tensor& out, const Tensor& a, const Tensor& b);  // out = a * b (out may be a)
// Per-row scalars (the router probabilities of an MoE layer's permuted rows): x[r, :] *= scale[r];
// out[r] = sum_c a[r, c] b[r, c] (accumulated in double). scale and out: [rows], x's dtype.
void scale_rows(Tensor& x, const Tensor& scale);
void row_dots(Tensor& out, const Tensor& a, const Tensor& b);

// GELU, exact (erf; Megatron's default) or tanh approximation (--openai-gelu, HF gelu_new).
void gelu_forward(Tensor& out, const Tensor& x, bool tanh_approx);
void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx);
// Bias + GELU fused, the forward of Megatron's bias-GELU fusion (y: fc1's output without its
// bias): y += bias in place (the pre-activation gelu_backward takes), out = gelu(y), in one pass.
// out may be bf16 or f16 for f32 y (rounded: the next GEMM's input). The values are those of
// bias_add, gelu_forward and a conversion in sequence.
void bias_gelu_forward(Tensor& out, Tensor& y, const Tensor& bias, bool tanh_approx);

// tanh (the pooler's activation). The backward reads the output: dx = dout (1 - y^2).
void tanh_forward(Tensor& out, const Tensor& x);
void tanh_backward(Tensor& dx, const Tensor& dout, const Tensor& y);

// Squared ReLU, relu(x)^2 (--squared-relu): dx = dout 2 relu(x).
void squared_relu_forward(Tensor& out, const Tensor& x);
void squared_relu_backward(Tensor& dx, const Tensor& dout, const Tensor& x);

// Quick GELU, x sigmoid(1.702 x) (OpenAI CLIP's activation, Megatron's quick_gelu, HF
// quick_gelu): dx = dout (s + 1.702 x s (1 - s)), s = sigmoid(1.702 x).
void quick_gelu_forward(Tensor& out, const Tensor& x);
void quick_gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x);

// SwiGLU on x[r, 2f] = [gate | up] (Megatron's chunk order): out[r, f] = silu(gate) * up.
void swiglu_forward(Tensor& out, const Tensor& x);
void swiglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x);

// Quick GeGLU (--quick-geglu, gpt-oss) on x[r, 2f] = [gate | up]: with clamp > 0 the gate is
// clamped to <= clamp and up to [-clamp, clamp] (--activation-func-clamp-value), then
// out[r, f] = quick_gelu(gate) * (up + offset) (--glu-linear-offset). The clamps pass gradient
// where the input lies inside them, bounds included (torch.clamp's).
void quick_geglu_forward(Tensor& out, const Tensor& x, double offset, double clamp);
void quick_geglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, double offset,
                          double clamp);

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
// For f32 x, out of both norms may be bf16 or f16: the f32 values rounded (a 16-bit GEMM's input).
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
// One block of a vocabulary split over ranks (parallel/vocab_parallel.h adds the all-reduce):
// out[r, :] = table_shard[ids[r] - vocab_start, :] for ids in [vocab_start, vocab_start + rows),
// else 0, widened (f32 out for an f32, bf16 or f16 table; f64 for f64). ids: any valid id.
void embedding_forward_shard(Tensor& out, const Tensor& ids, const Tensor& table_shard,
                             int64_t vocab_start);
// dtable_shard[ids[r] - vocab_start, :] += dout[r, :] for the ids in this block (token order);
// the others are skipped.
void embedding_backward_shard(Tensor& dtable_shard, const Tensor& dout, const Tensor& ids,
                              int64_t vocab_start);

// ---- rotary position embedding ----------------------------------------------------------------
// x is [s, b, G, P, hn]; heads p in [head_begin, head_end) of every group are rotated in place by
// the angle pos * inv_freq, on their first rot_dim channels, rotate-half convention (HF Llama,
// Megatron rotary_interleaved=False): inv_freq[i] = base^(-2i / rot_dim). positions is [s, b]
// int64, or undefined for pos = s index. inverse = true rotates by -angle (the backward).
// Channel j of the first rot_dim channels turns by position x inv_freq: pairs (j, j + rot_dim/2)
// with inv_freq[j] = base^(-2j/rot_dim) (rotate-half, HF Llama), or, interleaved
// (--rotary-interleaved), pairs (2j, 2j + 1). scaling_factor > 0: Llama 3.1's frequency scaling
// (--use-rope-scaling: factor, low 1, high 4, original context 8192, as Megatron's _apply_scaling).
// position_scale: positions are multiplied by it (--rotary-seq-len-interpolation-factor F: 1/F).
// YaRN (--rope-type yarn, multi-latent attention): pair j's frequency blends the original
// base^(-2j/rot_dim) (j below the correction range, fast rotations) into it divided by
// yarn_factor (j above it), linearly over the range Megatron's YarnRotaryEmbedding computes from
// beta_fast, beta_slow and the original context; cos and sin are multiplied by `mscale` (YaRN's
// concentration factor), in both directions: the backward (inverse) is the transpose.
struct RopeSpec {
  int64_t head_begin = 0, head_end = 1;
  int64_t rot_dim = 0;
  float base = 10000.0f;
  bool interleaved = false;
  double scaling_factor = 0;  // 0: no Llama 3.1 scaling
  double position_scale = 1.0;
  double yarn_factor = 0;  // 0: no YaRN
  double yarn_original_max_positions = 4096, yarn_beta_fast = 32, yarn_beta_slow = 1;
  // The correction range's ends rounded outwards to whole pairs (Megatron's default; false:
  // --no-yarn-correction-range-round-to-int, Hugging Face's rope_scaling "truncate": false).
  bool yarn_round_to_int = true;
  double mscale = 1.0;
};
void rope_inplace(Tensor& x, const Tensor& positions, const RopeSpec& spec, bool inverse);
// Every pair's inverse frequency under `spec` (Llama 3.1 scaling or YaRN included): what each
// device's rope_inplace turns channel pair j by, per unit of position.
std::vector<double> rope_inv_freqs(const RopeSpec& spec);
// YaRN's ramp over the pairs: 0 up to `low`, 1 from `high` on (Megatron's
// _yarn_find_correction_range, rounded outwards unless yarn_round_to_int is false, and
// _yarn_linear_ramp_mask's guard against
// low == high); the frequency is original x (1 - ramp) + original / factor x ramp.
struct YarnRamp {
  double low = 0, high = 0;
  double at(int64_t j) const;
};
YarnRamp yarn_ramp(const RopeSpec& spec);

// ---- attention --------------------------------------------------------------------------------
// Scaled-dot-product attention over any arrangement of q, k and v:
//   out_i = sum_j P_ij keep_ij v_j,  P_i = softmax_j(scale q_i . k_j + bias_ij) over the keys
//   query i may see (mask below), keep_ij the dropout keep-scale (0 or 1/(1-p)).
// Query head h reads key/value head h / (heads per group) (grouped-query attention). out is
// [sq, b, np, hn]; lse is [b, np, sq], the log-sum-exp of each row of masked scores (the only
// softmax statistic kept for backward, and what merges results over disjoint key sets exactly:
// attention_merge). A row that sees no key gets out = 0 and lse = -inf. Tiled with an online
// softmax: memory is linear in the lengths. Attention dropout, if p > 0, uses the counter-based
// mask of dropout_forward with one counter per (b, global head, global i, global j).

// One of q, k, v (or of their gradients): elements (t, bb, g, p, c) of a [s, b, G, P, hn]
// arrangement at strides inside `tensor`, so that they can be read from, and their gradients
// written into, Megatron's packed QKV projection without copies. Head g * P + p; channels are
// contiguous. For q, G query groups of P heads each; for k and v one head (P = 1) per group.
struct AttentionView {
  Tensor tensor;       // the storage (shared, never copied; written through for gradients)
  int64_t offset = 0;  // of element (0, 0, 0, 0, 0), in elements of tensor
  int64_t s = 0, b = 0, groups = 1, per_group = 1, hn = 0;
  int64_t stride_s = 0, stride_b = 0, stride_g = 0, stride_p = 0;
  int64_t heads() const { return groups * per_group; }
};
// A contiguous [s, b, heads, hn] tensor as `groups` groups of heads / groups heads.
AttentionView attention_view(const Tensor& t, int64_t groups);
// The query, key or value heads of Megatron's packed QKV [s, b, ng, qpg + 2, hn] (per query
// group: qpg query heads, then one key and one value head).
enum class QkvPart { kQuery, kKey, kValue };
AttentionView packed_qkv_view(const Tensor& qkv, QkvPart part);

// Which keys query i (global position q_offset + i) of sequence bb sees: key j (global position
// kv_offset + j) is visible iff
//   (!causal or kv_offset + j <= q_offset + i)  and
//   (doc_start undefined or kv_offset + j >= doc_start[bb, i])  and
//   (key_valid undefined or key_valid[bb, j] != 0)  and
//   (window < 0 or kv_offset + j >= q_offset + i - window).
struct AttentionSpec {
  float scale = 1.0f;  // usually 1/sqrt(hn)
  bool causal = true;
  // Global positions of query row 0 and key row 0: a context-parallel chunk, a decode step
  // whose queries follow a KV cache.
  int64_t q_offset = 0, kv_offset = 0;
  // Document starts (--reset-attention-mask), or undefined: [b, sq] i32, the global position of
  // the first key query i may see.
  Tensor doc_start;
  // Sliding-window attention (--window-size L,0 on this layer): a query sees the keys at most
  // `window` positions before it (and, causally, none after); -1: no window.
  int64_t window = -1;
  // Key padding, or undefined: [b, skv] i32, nonzero for a real key, 0 for padding (BERT's
  // padding mask, batched generation).
  Tensor key_valid;
  // Additive bias on the scaled scores, or undefined: [B, np, sq, skv] of the dtype of q, B = 1
  // (shared over the batch: T5's relative positions, ALiBi) or b.
  Tensor bias;
  float dropout = 0.0f;
  uint64_t seed = 0, stream = 0;
  // Under tensor parallelism this rank's heads are heads [head_offset, head_offset + np) of
  // total_heads (0: np, no offset): dropout counters use the global head, so every TP size draws
  // the same masks.
  int64_t head_offset = 0, total_heads = 0;
  // Extent of the dropout counter grid in query and key positions (0: sq and skv): the whole
  // sequence when q or k are chunks of it, so every chunking draws the same masks.
  int64_t q_positions = 0, kv_positions = 0;
  // The run's 16-bit dtype (bf16 or f16; f32 otherwise): a device with matrix units may round q,
  // k, v, dout and the probabilities to bf16 for them and accumulate in f32, as Megatron's
  // attention does on bf16 activations (the CUDA device, for head dimensions 64 and 128 without
  // a bias: tensor/cuda/flash_attention.cu; the CPU, in bf16 runs on CPUs with AVX-512 BF16 for
  // head dimensions that are multiples of 16: tensor/cpu/tile_gemm_bf16.h). The reference device
  // computes in f64.
  DType precision = DType::kF32;
  // Undefined, or [np] f32 on q's device (f64 on the reference device), raised in place by
  // attention_forward to the largest score scale q_i . k_j + bias_ij that head h gave a key it sees
  // (Transformer Engine's max_logit, the statistic of --qk-clip and --log-max-attention-logit). A
  // max over every row, so that calls over chunks of the queries or keys (context parallelism,
  // micro-batches) simply raise it again. Backward ignores it.
  Tensor max_logit;
};
void attention_forward(Tensor& out, Tensor& lse, const AttentionView& q, const AttentionView& k,
                       const AttentionView& v, const AttentionSpec& spec);
// dq, dk and dv are written (they may be views into one packed gradient, as q, k, v into the
// packed QKV). out and lse are forward's; for keys split into blocks they are the merged results
// over all blocks, and each block's backward then gives its share of dq and its dk, dv. dbias, if
// defined, is written ([B, np, sq, skv], summed over the batch when B = 1).
void attention_backward(const AttentionView& dq, const AttentionView& dk, const AttentionView& dv,
                        const Tensor& dbias, const Tensor& dout, const AttentionView& q,
                        const AttentionView& k, const AttentionView& v, const Tensor& out,
                        const Tensor& lse, const AttentionSpec& spec);
// Results over two disjoint key sets combined, in place: (out, lse) over keys A and (out_b,
// lse_b) over keys B become the result over A and B:
//   lse' = log(exp(lse) + exp(lse_b)),  out' = exp(lse - lse') out + exp(lse_b - lse') out_b.
// out, out_b: [sq, b, np, hn]; lse, lse_b: [b, np, sq]. Rows with lse = -inf saw no key.
void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);
// Attention sinks (--softmax-type off-by-one or learnable; gpt-oss's sinks): each row of head h
// also normalises over one more logit, sink[h], whose value is zero:
//   P_ij = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij)).
// Applied to a finished (out, lse) in place, as a merge with a key set whose one key has score
// sink_h and value 0: lse' = log(exp(lse) + exp(sink_h)), out *= exp(lse - lse'). sink: [np] of
// out's dtype (this rank's heads). attention_backward then takes the merged out and lse as for any
// split of the keys (its dq, dk, dv are those of P above), and the sink's gradient is
//   dsink_h = -sum_{b,i} exp(sink_h - lse'_{b,h,i}) (dout_{i,b,h} . out_{i,b,h}),
// written into dsink [np].
void attention_sink_forward(Tensor& out, Tensor& lse, const Tensor& sink);
void attention_sink_backward(Tensor& dsink, const Tensor& dout, const Tensor& out,
                             const Tensor& lse, const Tensor& sink);

// ---- loss -------------------------------------------------------------------------------------
// Fused softmax cross-entropy over the vocabulary. logits [n, Vp] f32 (Vp = padded vocab);
// columns >= vocab_size are padding and are excluded from the softmax. loss[n] = lse - logit
// of target, lse[n] kept for backward. No probability tensor is materialised.
void cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size);
// dlogits[r, v] = dloss[r] * (softmax(r, v) - [v == target]); may alias logits (in place).
// Padding columns get 0. For f32 logits dlogits may be bf16 or f16: the values rounded (what a
// 16-bit output layer's GEMMs take, without an f32 gradient of the whole vocabulary).
void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size);
// log-softmax of the target under the same masking: logprob[n] (scoring).
void log_softmax_gather(Tensor& logprob, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_size);
// The same over one block of a vocabulary split over ranks (columns [vocab_start, vocab_start +
// block) of the logits, the first `valid` of them real tokens), in the passes the split needs
// between its all-reduces (parallel/vocab_parallel.h); with one block they are the ops above.
//   row_max[n] = max over the block's valid columns (-inf for none)        then all-reduce max
//   sums[2n] f64 = [sum_j exp(x - row_max) | the target's logit, 0 when another block holds it]
//                                                                             then all-reduce sum
//   lse = row_max + log(sums[r]), loss = lse - sums[n + r]
// Exp runs in the logits' dtype, vectorised; partial sums of 1024 terms add in double.
void cross_entropy_shard_max(Tensor& row_max, const Tensor& logits_shard, int64_t valid);
void cross_entropy_shard_sums(Tensor& sums, const Tensor& logits_shard, const Tensor& row_max,
                              const Tensor& targets, int64_t vocab_start, int64_t valid);
void cross_entropy_shard_finish(Tensor& loss, Tensor& lse, const Tensor& row_max,
                                const Tensor& sums);
// dlogits_shard[r, j] = dloss[r] (softmax - [vocab_start + j == target]) on valid columns, 0 on
// padding; may alias logits_shard.
void cross_entropy_shard_backward(Tensor& dlogits_shard, const Tensor& dloss,
                                  const Tensor& logits_shard, const Tensor& lse,
                                  const Tensor& targets, int64_t vocab_start, int64_t valid);
// The per-row loss summed under a mask, in row order in double: (sum_r loss[r] mask[r], sum_r
// mask[r]). loss f32 or f64, mask f32, the same number of elements.
struct MaskedSum {
  double sum = 0, count = 0;
};
MaskedSum masked_sum(const Tensor& loss, const Tensor& mask);

// ---- layout copies ----------------------------------------------------------------------------
// out [cols, rows] = x [rows, cols] transposed, any dtype (the [b, s] <-> [s, b] token layouts).
void transpose_2d(Tensor& out, const Tensor& x);
// out [..., w] = columns [start, start + w) of x [..., h], any dtype.
void slice_last_dim(Tensor& out, const Tensor& x, int64_t start);
// out [..., sum of widths] = the parts [..., w_j] side by side, row by row, any dtype.
void concat_last_dim(Tensor& out, const std::vector<Tensor>& parts);
// Row permutations (an MoE layer's dispatch and combine), index [n] i64 of rows of x / out:
// gather_rows: out[r, :] = x[index[r], :], any dtype; scatter_add_rows: out[index[r], :] += x[r, :]
// for r in order (repeated indices add up deterministically), f32 or f64.
void gather_rows(Tensor& out, const Tensor& x, const Tensor& index);
void scatter_add_rows(Tensor& out, const Tensor& x, const Tensor& index);

// ---- FP8 (parallel/fp8_scaling.h) ------------------------------------------------------------
// The largest magnitude of x (f32, bf16 or f64), NaN ignored as the CUDA fmaxf Transformer
// Engine's amax kernels use ignores it; infinities count. 0 for no elements.
double abs_max(const Tensor& x);
// out[i] = fp8_round(f32(x[i]) * scale) (core/fp8.h: the format's nearest value, saturating), the
// product rounded to f32 first as Transformer Engine's cast kernels compute it. x f32, bf16 or
// f64; out [x's shape] bf16, which holds every FP8 value exactly (f64 when x is f64).
void fp8_quantize(Tensor& out, const Tensor& x, float scale, Fp8Format format);
// Block-scaled FP8 (--fp8-recipe mxfp8 / blockwise): x viewed as [rows, x.dim(-1)], split into
// blocks of block_rows x block_cols (edge blocks partial, their amax over the elements present:
// TE's kernels zero-fill); each block's scale from its amax (NaN ignored, as abs_max) by `rule`
// (core/fp8.h fp8_block_scale), and out = fp8_round(f32(x) * scale) * scale_inv: the values a
// block-scaled FP8 GEMM multiplies, the codes times their block's decoding factor (exact in bf16).
// out [x's shape] bf16 (f64 when x is f64).
void fp8_block_quantize(Tensor& out, const Tensor& x, int64_t block_rows, int64_t block_cols,
                        Fp8BlockRule rule, Fp8Format format);
// FP8 primary weights (--fp8-param-gather) as one byte each: codes[i] = the code of the value
// fp8_quantize gives (codes u8, [x's numel]); and back, out[i] = the value of codes[i] (out f32,
// bf16 or f64: exact in each).
void fp8_encode(Tensor& codes, const Tensor& x, float scale, Fp8Format format);
void fp8_decode(Tensor& out, const Tensor& codes, Fp8Format format);
// Tiled FP8 primary weights (--fp8-param-gather with --fp8-recipe blockwise: a scale per tile of a
// weight, its shards quantised where they lie): a flat run of a row-major [rows, cols] matrix,
// element i of the run being the matrix's element offset + i, and its tiles of block_rows x
// block_cols numbered row-major (tile (r / block_rows) * ceil(cols / block_cols) + c / block_cols).
struct Fp8Tiles {
  int64_t offset = 0, cols = 1, block_rows = 1, block_cols = 1;
};
// amax[t] = max(amax[t], max |x[i]| over the run's elements in tile t) (NaN ignored); amax f32
// [number of tiles]; x f32, bf16 or f64.
void fp8_tile_abs_max(Tensor& amax, const Tensor& x, const Fp8Tiles& tiles);
// codes[i] = the code of fp8_round(f32(x[i]) * scales[tile of i]) (fp8_encode with a scale per
// tile); scales f32 [tiles].
void fp8_tile_encode(Tensor& codes, const Tensor& x, const Fp8Tiles& tiles, const Tensor& scales,
                     Fp8Format format);
// out[i] = the value of codes[i] times scale_inv[tile of i] (f32 products; out f32, bf16 or f64:
// exact for power-of-two factors); scale_inv f32 [tiles].
void fp8_tile_decode(Tensor& out, const Tensor& codes, const Fp8Tiles& tiles,
                     const Tensor& scale_inv, Fp8Format format);

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
// exp_avg and exp_avg_sq may each be bf16 with f32 weights (the precision-aware optimizer's
// bf16 moments): read exactly, updated in f32, stored rounded as convert() rounds.
// rounded (optional): a bf16 or f16 tensor of param's size that receives the updated weights
// rounded as rounded->copy_from(param) would, in the same pass over memory (the 16-bit compute
// copy of mixed-precision runs, refreshed without reading the main weights again).
void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWSpec& spec, Tensor* rounded = nullptr);
// The precision-aware optimizer's scaled Adam moments (Transformer Engine FusedAdam's storage):
// with absmax a of a group's new values, fp16 (f16 storage): scale = a / (65504 / 2), stored =
// f16(value x (1 / scale)), read back as stored x scale; FP8 (u8 E4M3 codes): q = 1 / (a / 448),
// code = E4M3(value x q) (saturating), read back as the code's value x (1 / q). An all-zero group
// (a = 0) stores zeros with multipliers 0.
struct MomentScaling {
  float store = 0, read = 0;  // the multipliers before rounding and after reading
};
MomentScaling moment_scaling(double absmax, DType stored);
// One moment of adamw_step_scaled: its storage (f32, bf16, f16 or u8 E4M3 codes) and, for f16
// and u8, the scale it is read with (MomentScaling::read), replaced by the step's new one.
struct StoredMoment {
  Tensor* stored = nullptr;
  float* read_scale = nullptr;
};
// A moment read back in out's dtype (f32 or f64): converted, or decoded from E4M3 codes, times
// its read scale when it is scaled.
void unscale_moment(Tensor& out, const StoredMoment& m);
// Stores `values` (f32 or f64, m's size) into m: rounded for f32 and bf16 storage; for f16 and
// E4M3, with the scaling of their abs_max (moment_scaling), m's read scale replaced and `values`
// multiplied by the store multiplier in place, as FusedAdam's _apply_scale leaves them.
void store_moment(StoredMoment m, Tensor& values);
// adamw_step with moments in any of those storages: each read (x its read scale), updated in f32
// as adamw_step updates it, and stored back (fp16 and FP8 with the scaling of their new absmax,
// so the CPU makes two passes: the new moments' absmax, then the step). The same bits as widening
// the moments, adamw_step on them, and storing each with moment_scaling of its abs_max.
void adamw_step_scaled(Tensor& param, StoredMoment exp_avg, StoredMoment exp_avg_sq,
                       const Tensor& grad, const AdamWSpec& spec, Tensor* rounded = nullptr);
// One SGD step as Megatron's --optimizer sgd runs it (Apex's / Transformer Engine's FusedSGD,
// which compute torch.optim.SGD's rule with dampening 0, no Nesterov), over flat buffers:
//   d = g + wd * p                      (L2 weight decay, added to the gradient)
//   buf = first ? d : momentum * buf + d (the momentum buffer; none when momentum is 0)
//   p -= lr * (momentum ? buf : d)
// g is grad * grad_scale as in adamw_step. first: the buffer's first step, which copies d (as
// FusedSGD's first_run and torch's fresh momentum_buffer do). momentum_buffer has param's dtype
// and size, or no elements when momentum is 0. rounded: as in adamw_step.
struct SgdSpec {
  float lr = 0, momentum = 0, weight_decay = 0;
  bool first = false;
  double grad_scale = 1.0;
};
void sgd_step(Tensor& param, Tensor& momentum_buffer, const Tensor& grad, const SgdSpec& spec,
              Tensor* rounded = nullptr);
// One Lion step (Chen et al. 2023; emerging_optimizers' Lion, which Megatron's --optimizer lion
// and Muon's --muon-scalar-optimizer lion run), over flat buffers, with torch's roundings:
//   p = p + decay p                        (decoupled weight decay first: decay = -lr wd)
//   u = lerp(m, g, weight1)                (the update's interpolation: weight1 = 1 - beta1)
//   m = lerp(m, g, weight2)                (the one moment, "exp_avg": weight2 = 1 - beta2)
//   p = p - lr sign(u)                     (sign(0) = 0; a NaN u gives a NaN weight)
// lerp(a, b, w) = a + w (b - a) for w < 0.5, else b - (b - a)(1 - w), each a fused multiply-add
// as torch's CPU kernel; p + decay p one too (torch's add_ with alpha). g = grad * grad_scale.
// The weights and the decay are the f32 roundings of values computed in double (what torch
// receives from Python): lion_spec in optim/adamw.h. rounded: as in adamw_step.
struct LionSpec {
  float lr = 0, weight1 = 0.05f, weight2 = 0.02f, decay = 0;
  double grad_scale = 1.0;
};
void lion_step(Tensor& param, Tensor& exp_avg, const Tensor& grad, const LionSpec& spec,
               Tensor* rounded = nullptr);
// sum of squares of every element, accumulated in double.
double sum_squares(const Tensor& x);
// The number of elements equal to zero (Megatron's --log-num-zeros-in-grad).
int64_t count_zeros(const Tensor& x);

}  // namespace megatron::ops
