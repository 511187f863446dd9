// The CUDA device's kernel launchers: plain C++17 over raw device pointers, so that the .cu files
// compile with any toolkit's nvcc and never see the C++20 headers of the rest of the project.
// tensor/cuda/cuda_ops.cpp checks shapes and dtypes on Tensors and calls these; every launcher runs
// on the device's one stream (the legacy default stream: host copies order after the kernels, so
// a read back to the host sees every kernel launched before it).
//
// Floating kernels are templates instantiated for T = float and double (the f64 instances are the
// ones the op harness compares with the fp64 reference bit for bit where the op is exact).
// Element counts and indices are int64_t. A launch error throws (cuda_fail).
#pragma once

#include <cstddef>
#include <cstdint>

namespace megatron::cuda {

// Throws megatron::InternalError "<what>: <message>" (defined in cuda_runtime.cpp, C++ side).
[[noreturn]] void cuda_fail(const char* what, const char* message);
// Throws if the last launch failed.
void check_launch(const char* what);

// ---- memory and conversions (dtype codes are megatron::DType's values) ----------------------
void convert(void* dst, int dst_dtype, const void* src, int src_dtype, int64_t n);
void fill(void* dst, int dtype, double value, int64_t n);
// Copies element-size-generic blocks: out[r, :w] = x[r, start:start + w] of rows of h elements.
void copy_columns(void* out, int64_t out_row, int64_t out_col, const void* x, int64_t x_row,
                  int64_t x_col, int64_t rows, int64_t width, size_t elem);
void transpose(void* out, const void* x, int64_t rows, int64_t cols, size_t elem);
// out[r, :] = x[index[r], :] (index int32 when index_i32, else int64).
void gather_rows(void* out, const void* x, const void* index, bool index_i32, int64_t n,
                 int64_t cols, size_t elem);

// ---- elementwise (T = float or double) ------------------------------------------------------
template <typename T>
void add(T* out, const T* a, const T* b, int64_t n);
template <typename T>
void add_inplace(T* out, const T* a, int64_t n);
template <typename T>
void mul(T* out, const T* a, const T* b, int64_t n);
template <typename T>
void scale(T* x, double factor, int64_t n);
template <typename T>
void bias_add(T* x, const T* bias, int64_t rows, int64_t cols);
// out[c] += sum over rows of x[r, c], rows summed in a fixed order (deterministic).
template <typename T>
void column_sums_accumulate(T* out, const T* x, int64_t rows, int64_t cols);
template <typename T>
void scale_rows(T* x, const T* scale, int64_t rows, int64_t cols);
template <typename T>
void row_dots(T* out, const T* a, const T* b, int64_t rows, int64_t cols);
enum class Activation { kGelu, kGeluTanh, kTanh, kSquaredRelu, kQuickGelu };
template <typename T>
void activation_forward(T* out, const T* x, int64_t n, Activation act);
// dx = dout * f'(x); for kTanh `x` is the forward's output y.
template <typename T>
void activation_backward(T* dx, const T* dout, const T* x, int64_t n, Activation act);
template <typename T>
void swiglu_forward(T* out, const T* x, int64_t rows, int64_t f);
template <typename T>
void swiglu_backward(T* dx, const T* dout, const T* x, int64_t rows, int64_t f);
template <typename T>
void quick_geglu_forward(T* out, const T* x, int64_t rows, int64_t f, double offset, double clamp);
template <typename T>
void quick_geglu_backward(T* dx, const T* dout, const T* x, int64_t rows, int64_t f, double offset,
                          double clamp);
template <typename T>
void dropout(T* out, const T* x, int64_t n, float p, uint64_t seed, uint64_t stream,
             uint64_t offset);

// ---- reductions returning to the host ------------------------------------------------------
template <typename T>
double sum_squares(const T* x, int64_t n);
template <typename T>
int64_t count_zeros(const T* x, int64_t n);
// (sum loss * mask, sum mask) in element order in double.
template <typename T>
void masked_sum(const T* loss, const float* mask, int64_t n, double* sum, double* count);

// ---- normalisation --------------------------------------------------------------------------
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t rows,
                       int64_t h, float eps);
// dx written; dw, db accumulated (db may be null for RMSNorm). mean null: RMSNorm.
template <typename T>
void norm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                   const T* rstd, int64_t rows, int64_t h);
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int64_t rows, int64_t h, float eps);

// ---- FP8 (fp8.cu) ----------------------------------------------------------------------------
// max |x| (NaN ignored) of x in dtype code x_dtype (f32, f64 or bf16).
double abs_max(const void* x, int x_dtype, int64_t n);
// out = fp8 value of f32(x) * scale (E4M3 or E5M2, saturating), bf16 bits, or f64 for f64 x.
void fp8_quantize(void* out, const void* x, int x_dtype, int64_t n, float scale, bool e4m3);
// Block-scaled FP8 values (tensor/ops.h fp8_block_quantize) of x [rows, cols]: one thread per
// block; mxfp8: TE's E8M0 rule, else power-of-two blockwise scales (core/fp8.h).
void fp8_block_quantize(void* out, const void* x, int x_dtype, int64_t rows, int64_t cols,
                        int64_t block_rows, int64_t block_cols, bool mxfp8, bool e4m3);
// FP8 codes (one byte each) of fp8_quantize's values, and the values (f32, bf16 or f64) of codes.
void fp8_encode(void* codes, const void* x, int x_dtype, int64_t n, float scale, bool e4m3);
void fp8_decode(void* out, int out_dtype, const void* codes, int64_t n, bool e4m3);
// The tiled forms (tensor/ops.h fp8_tile_*): element i of the run is element offset + i of a
// row-major matrix with `cols` columns, in tiles of br x bc; amax / scales / scale_inv f32 on the
// device (n_tiles: amax's slots).
void fp8_tile_abs_max(float* amax, int64_t n_tiles, const void* x, int x_dtype, int64_t n,
                      int64_t offset, int64_t cols, int64_t br, int64_t bc);
void fp8_tile_encode(void* codes, const void* x, int x_dtype, int64_t n, int64_t offset,
                     int64_t cols, int64_t br, int64_t bc, const float* scales, bool e4m3);
void fp8_tile_decode(void* out, int out_dtype, const void* codes, int64_t n, int64_t offset,
                     int64_t cols, int64_t br, int64_t bc, const float* scale_inv, bool e4m3);

// ---- embedding, row permutations --------------------------------------------------------------
// out[r, :] = table[ids[r] - start, :] for ids in [start, start + block), else 0. table_dtype is
// a DType code (f32, f64, bf16, f16); out is T.
template <typename T>
void embedding_forward(T* out, const void* ids, bool ids_i32, int64_t n, const void* table,
                       int table_dtype, int64_t start, int64_t block, int64_t h);
// out[r, :] = table[ids[r], :] in the table's own element type (elem bytes: 2, 4 or 8); rows of
// ids outside [0, rows) are zeros, as in the vocabulary-block form.
void embedding_rows(void* out, const void* ids, bool ids_i32, int64_t n, const void* table,
                    size_t elem, int64_t rows, int64_t h);
// dtable[ids[r] - start, :] += dout[r, :] in token order (one thread per column: deterministic).
template <typename T>
void embedding_backward(T* dtable, const T* dout, const void* ids, bool ids_i32, int64_t n,
                        int64_t start, int64_t block, int64_t h);

// ---- rotary embedding ----------------------------------------------------------------------
struct RopeArgs {
  int64_t s, b, groups, per_group, hn;
  int64_t head_begin, head_end, rot_dim;
  double base, scaling_factor, position_scale;
  double yarn_factor, yarn_low, yarn_high, mscale;  // YaRN (ops::yarn_ramp); factor 0: off
  bool interleaved, inverse;
  const int64_t* positions;  // [s, b] or null
};
template <typename T>
void rope(T* x, const RopeArgs& a);

// ---- cross entropy --------------------------------------------------------------------------
// Over rows of `cols` logits, the first `valid` columns real, targets global ids (int64) offset by
// vocab_start: row_max, then sums[r] = sum exp(x - max), sums[n + r] = target logit or 0.
template <typename T>
void ce_row_max(T* row_max, const T* logits, int64_t n, int64_t cols, int64_t valid);
template <typename T>
void ce_sums(double* sums, const T* logits, const T* row_max, const int64_t* targets, int64_t n,
             int64_t cols, int64_t vocab_start, int64_t valid);
template <typename T>
void ce_finish(T* loss, T* lse, const T* row_max, const double* sums, int64_t n);
// dlogits = dloss (exp(x - lse) - onehot) on valid columns, 0 on padding; may alias logits.
template <typename T>
void ce_backward(T* dlogits, const T* dloss, const T* logits, const T* lse, const int64_t* targets,
                 int64_t n, int64_t cols, int64_t vocab_start, int64_t valid);

// ---- attention ------------------------------------------------------------------------------
struct AttnView {
  int64_t offset, s, b, groups, per_group, hn;
  int64_t stride_s, stride_b, stride_g, stride_p;
};
struct AttnArgs {
  AttnView q, k, v;
  AttnView dq, dk, dv;  // where backward writes the gradients (offsets and strides of their own)
  int64_t np, ng;       // query heads, key/value heads
  float scale;
  bool causal;
  int64_t q_offset, kv_offset;
  const int32_t* doc_start;  // [b, sq] or null
  const int32_t* key_valid;  // [b, skv] or null
  int64_t window;            // sliding window (keys at most this far back); -1: none
  int64_t bias_batches;      // 0: no bias, 1 shared, b per sequence
  float dropout;
  uint64_t seed, stream;
  int64_t head_offset, total_heads, q_positions, kv_positions;
  // AttentionSpec::precision is bf16 or f16: q, k, v, the probabilities and dS may be rounded to
  // bf16 for the tensor cores (flash_attention_applies says where they are used).
  bool matrix_units;
  float* max_logit;  // [np], raised to each head's largest visible score; null: not kept
};
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const T* bias,
                       const AttnArgs& a);
// dbias_scratch: [b, np, sq, skv] when bias is defined (reduced into dbias by the caller), else
// null. delta: [b, np, sq] scratch. dq, dk, dv are written through a.dq, a.dk, a.dv.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, T* dbias_scratch, T* delta, const T* dout, const T* q,
                        const T* k, const T* v, const T* out, const T* lse, const T* bias,
                        const AttnArgs& a);
template <typename T>
void attention_merge(T* out, T* lse, const T* out_b, const T* lse_b, int64_t sq, int64_t b,
                     int64_t np, int64_t hn);
template <typename T>
void attention_sink_forward(T* out, T* lse, const T* sink, int64_t sq, int64_t b, int64_t np,
                            int64_t hn);
template <typename T>
void attention_sink_backward(T* dsink, const T* dout, const T* out, const T* lse, const T* sink,
                             int64_t sq, int64_t b, int64_t np, int64_t hn);

// Flash attention on the tensor cores (flash_attention.cu): f32 tensors, products of bf16-rounded
// operands (q, k, v, dout, the probabilities and dS) accumulated in f32, the softmax statistics and
// the accumulators in f32. It applies where a.matrix_units is set, the head dimension is 64 or
// 128, there is no bias, the GPU is sm_80 or later, q, k, v (and dout) are 16-byte aligned at
// each row and, for backward, the gradient views 8-byte aligned; elsewhere attention_forward and
// attention_backward run the CUDA-core kernels, which call these.
bool flash_attention_applies(const AttnArgs& a, bool has_bias, const float* q, const float* k,
                             const float* v, const float* dq = nullptr, const float* dk = nullptr,
                             const float* dv = nullptr, const float* dout = nullptr);
void flash_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const AttnArgs& a);
// delta: [b, np, sq], dout . out per row (attention_backward computes it first).
void flash_attention_backward(float* dq, float* dk, float* dv, const float* delta,
                              const float* dout, const float* q, const float* k, const float* v,
                              const float* lse, const AttnArgs& a);

// ---- optimizer ------------------------------------------------------------------------------
struct AdamArgs {
  double lr, beta1, beta2, eps, weight_decay, grad_scale, inv_bc1, inv_sqrt_bc2;
};
template <typename T>
void adamw(T* p, T* m, T* v, const T* g, int64_t n, const AdamArgs& a);
struct SgdArgs {
  double lr, momentum, weight_decay, grad_scale;
  bool first;
};
// buf: nullptr when momentum is 0 (no buffer).
template <typename T>
void sgd(T* p, T* buf, const T* g, int64_t n, const SgdArgs& a);
struct LionArgs {
  double lr, weight1, weight2, decay, grad_scale;
};
template <typename T>
void lion(T* p, T* m, const T* g, int64_t n, const LionArgs& a);

}  // namespace megatron::cuda

namespace megatron::cuda {
// A device buffer of at least `bytes` for a kernel's scratch space, one per slot (0..3) and host
// thread, grown when asked for more and kept: the kernels of one stream run in order, so the next
// launch that takes the slot finds the previous one done with it.
void* workspace(size_t bytes, int slot);
// Copies device memory to the host (synchronous: waits for the kernels before it).
void copy_to_host(void* dst, const void* src, size_t bytes);
}  // namespace megatron::cuda
