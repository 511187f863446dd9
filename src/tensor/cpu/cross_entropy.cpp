// Fused softmax cross-entropy over the vocabulary, without a probability tensor, whole or over
// one block of a vocabulary split over ranks.
//
// Forward keeps only the per-row log-sum-exp; backward recomputes softmax from it, in place over
// the logits if the caller wishes. Columns >= vocab_size are vocabulary padding (Megatron pads
// the embedding to a multiple of --make-vocab-size-divisible-by): they are never real tokens, so
// they are excluded from every softmax here and receive zero gradient. The whole-vocabulary ops
// are the block ops with one block (start 0), so a tensor-parallel run and a single process
// compute each row's terms with the same kernels.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/half_store.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/ops.h"

namespace megatron::cpu {
namespace {

void check_targets(const Tensor& targets, int64_t rows, int64_t vocab_size, const char* op) {
  MEGATRON_CHECK(targets.defined() && targets.dtype() == DType::kI64 && targets.numel() == rows, op,
                 ": targets must be i64 with one id per logits row (", rows, "), got ",
                 targets.defined() ? targets.str() : std::string("an undefined tensor"));
  const int64_t* t = targets.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    MEGATRON_CHECK(t[r] >= 0 && t[r] < vocab_size, op, ": target id ", t[r], " at row ", r,
                   " is outside the vocabulary [0, ", vocab_size, ")");
  }
}

void check_ce(const Tensor& logits, const Tensor& targets, int64_t vocab_size, const char* op) {
  MEGATRON_CHECK(logits.ndim() >= 1 && vocab_size > 0 && vocab_size <= logits.dim(-1), op,
                 ": vocab size ", vocab_size, " must be in (0, ", logits.dim(-1), "]");
  check_targets(targets, cpu::rows_of(logits), vocab_size, op);
}

void check_block(const Tensor& logits, int64_t valid, const char* op) {
  MEGATRON_CHECK(logits.defined() && logits.ndim() >= 1 && valid >= 0 && valid <= logits.dim(-1),
                 op, ": ", valid, " valid columns for logits ",
                 logits.defined() ? logits.str() : std::string("(undefined)"));
}

void check_rows(const Tensor& t, int64_t rows, DType dtype, const char* what) {
  MEGATRON_CHECK(t.defined() && t.dtype() == dtype, what, ": expected dtype ", dtype_name(dtype),
                 ", got ", t.defined() ? t.str() : std::string("an undefined tensor"));
  check_shape(t, {rows}, what);
}

// Row max over the first v of `block` columns: -inf (the identity of max) when v is 0.
template <typename T>
void row_max_kernel(T* mx, const T* lg, int64_t rows, int64_t block, int64_t v) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = lg + r * block;
    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < v; ++j) m = std::max(m, row[j]);
    mx[r] = m;
  }
}

// se[r] = sum_j exp(row[j] - mx[r]) (partial sums of 1024 terms in T, added in double), xt[r] =
// the target's logit when this block holds it, else 0.
template <typename T>
void row_sums_kernel(double* se, double* xt, const T* lg, const T* mx, const int64_t* t,
                     int64_t rows, int64_t block, int64_t start, int64_t v) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = lg + r * block;
    const T m = mx[r];
    double sum = 0;
    for (int64_t j0 = 0; j0 < v; j0 += 1024) {
      const int64_t j1 = std::min(v, j0 + 1024);
      T part = 0;
#pragma omp simd reduction(+ : part)
      for (int64_t j = j0; j < j1; ++j) part += cpu::vexp(row[j] - m);
      sum += static_cast<double>(part);
    }
    se[r] = sum;
    const int64_t local = t[r] - start;
    xt[r] = local >= 0 && local < v ? static_cast<double>(row[local]) : 0.0;
  }
}

template <typename T>
void finish_kernel(T* lo, T* ls, const T* mx, const double* se, const double* xt, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    ls[r] = mx[r] + static_cast<T>(std::log(se[r]));
    lo[r] = ls[r] - static_cast<T>(xt[r]);
  }
}

template <typename T>
void backward_kernel(T* d, const T* lg, const T* dl, const T* ls, const int64_t* t, int64_t rows,
                     int64_t block, int64_t start, int64_t v) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    // In place is safe: element j is read before it is written, and nothing else is read.
    const T* row = lg + r * block;
    T* drow = d + r * block;
    const T z = ls[r], g = dl[r];
#pragma omp simd
    for (int64_t j = 0; j < v; ++j) drow[j] = g * cpu::vexp(row[j] - z);
    for (int64_t j = v; j < block; ++j) drow[j] = 0;
    const int64_t local = t[r] - start;
    if (local >= 0 && local < v) drow[local] -= g;
  }
}

// The same for f32 logits, rounding into a 16-bit dlogits (what the output layer's bf16 GEMMs
// take) without an f32 [rows, block] tensor: each chunk of a row is computed in f32 as above, then
// rounded, so the values are those of the kernel above converted.
template <typename Half>
void backward_rounding_kernel(Half* d, const float* lg, const float* dl, const float* ls,
                              const int64_t* t, int64_t rows, int64_t block, int64_t start,
                              int64_t v) {
  constexpr int64_t kChunk = 1024;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = lg + r * block;
    StoredAs<Half>* drow = stored_ptr(d + r * block);
    const float z = ls[r], g = dl[r];
    const int64_t local = t[r] - start;
    float buf[kChunk];
    for (int64_t j0 = 0; j0 < block; j0 += kChunk) {
      const int64_t w = std::min(kChunk, block - j0), live = std::clamp<int64_t>(v - j0, 0, w);
#pragma omp simd
      for (int64_t j = 0; j < live; ++j) buf[j] = g * cpu::vexp(row[j0 + j] - z);
      for (int64_t j = live; j < w; ++j) buf[j] = 0;
      if (local >= j0 && local < j0 + live) buf[local - j0] -= g;
      for (int64_t j = 0; j < w; ++j) drow[j0 + j] = stored_value<Half>(buf[j]);
    }
  }
}

// loss and lse of every row over the first v columns (one block, start 0).
void whole_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                   int64_t v) {
  const int64_t rows = cpu::rows_of(logits);
  Tensor mx = Tensor::empty({rows}, logits.dtype());
  Tensor sums = Tensor::empty({2 * rows}, DType::kF64);
  cross_entropy_shard_max(mx, logits, v);
  cross_entropy_shard_sums(sums, logits, mx, targets, 0, v);
  cross_entropy_shard_finish(loss, lse, mx, sums);
}

}  // namespace

void cross_entropy_shard_max(Tensor& row_max, const Tensor& logits_shard, int64_t valid) {
  check_block(logits_shard, valid, "cross_entropy_shard_max");
  const int64_t rows = cpu::rows_of(logits_shard), block = logits_shard.dim(-1);
  check_rows(row_max, rows, logits_shard.dtype(), "cross_entropy_shard_max row_max");
  cpu::dispatch_float(logits_shard, "cross_entropy_shard_max", [&]<typename T>() {
    row_max_kernel(row_max.data<T>(), logits_shard.data<T>(), rows, block, valid);
  });
}

void cross_entropy_shard_sums(Tensor& sums, const Tensor& logits_shard, const Tensor& row_max,
                              const Tensor& targets, int64_t vocab_start, int64_t valid) {
  check_block(logits_shard, valid, "cross_entropy_shard_sums");
  const int64_t rows = cpu::rows_of(logits_shard), block = logits_shard.dim(-1);
  check_rows(row_max, rows, logits_shard.dtype(), "cross_entropy_shard_sums row_max");
  check_rows(sums, 2 * rows, DType::kF64, "cross_entropy_shard_sums sums");
  MEGATRON_CHECK(targets.defined() && targets.dtype() == DType::kI64 && targets.numel() == rows,
                 "cross_entropy_shard_sums: targets must be i64 with one id per row");
  cpu::dispatch_float(logits_shard, "cross_entropy_shard_sums", [&]<typename T>() {
    double* se = sums.data<double>();
    row_sums_kernel(se, se + rows, logits_shard.data<T>(), row_max.data<T>(),
                    targets.data<int64_t>(), rows, block, vocab_start, valid);
  });
}

void cross_entropy_shard_finish(Tensor& loss, Tensor& lse, const Tensor& row_max,
                                const Tensor& sums) {
  const int64_t rows = row_max.numel();
  check_rows(sums, 2 * rows, DType::kF64, "cross_entropy_shard_finish sums");
  check_rows(loss, rows, row_max.dtype(), "cross_entropy loss");
  check_rows(lse, rows, row_max.dtype(), "cross_entropy lse");
  cpu::dispatch_float(row_max, "cross_entropy_shard_finish", [&]<typename T>() {
    const double* se = sums.data<double>();
    finish_kernel(loss.data<T>(), lse.data<T>(), row_max.data<T>(), se, se + rows, rows);
  });
}

void cross_entropy_shard_backward(Tensor& dlogits_shard, const Tensor& dloss,
                                  const Tensor& logits_shard, const Tensor& lse,
                                  const Tensor& targets, int64_t vocab_start, int64_t valid) {
  check_block(logits_shard, valid, "cross_entropy_shard_backward");
  const int64_t rows = cpu::rows_of(logits_shard), block = logits_shard.dim(-1);
  MEGATRON_CHECK(dlogits_shard.defined() &&
                     (dlogits_shard.dtype() == logits_shard.dtype() ||
                      (logits_shard.dtype() == DType::kF32 && is_half(dlogits_shard.dtype()))),
                 "cross_entropy backward: dlogits must have the logits' dtype ",
                 dtype_name(logits_shard.dtype()), " (or bf16/f16 for f32 logits), got ",
                 dlogits_shard.str());
  check_shape(dlogits_shard, logits_shard.shape(), "cross_entropy backward dlogits");
  check_rows(dloss, rows, logits_shard.dtype(), "cross_entropy backward dloss");
  check_rows(lse, rows, logits_shard.dtype(), "cross_entropy backward lse");
  MEGATRON_CHECK(targets.defined() && targets.dtype() == DType::kI64 && targets.numel() == rows,
                 "cross_entropy backward: targets must be i64 with one id per row");
  if (dlogits_shard.dtype() == DType::kBF16) {
    backward_rounding_kernel(dlogits_shard.data<bf16>(), logits_shard.data<float>(),
                             dloss.data<float>(), lse.data<float>(), targets.data<int64_t>(), rows,
                             block, vocab_start, valid);
    return;
  }
  if (dlogits_shard.dtype() == DType::kF16) {
    backward_rounding_kernel(dlogits_shard.data<f16>(), logits_shard.data<float>(),
                             dloss.data<float>(), lse.data<float>(), targets.data<int64_t>(), rows,
                             block, vocab_start, valid);
    return;
  }
  cpu::dispatch_float(logits_shard, "cross_entropy_shard_backward", [&]<typename T>() {
    backward_kernel(dlogits_shard.data<T>(), logits_shard.data<T>(), dloss.data<T>(), lse.data<T>(),
                    targets.data<int64_t>(), rows, block, vocab_start, valid);
  });
}

void cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size) {
  check_ce(logits, targets, vocab_size, "cross_entropy_forward");
  whole_forward(loss, lse, logits, targets, vocab_size);
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size) {
  check_ce(logits, targets, vocab_size, "cross_entropy_backward");
  cross_entropy_shard_backward(dlogits, dloss, logits, lse, targets, 0, vocab_size);
}

void log_softmax_gather(Tensor& logprob, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_size) {
  check_ce(logits, targets, vocab_size, "log_softmax_gather");
  const int64_t rows = cpu::rows_of(logits);
  check_shape(logprob, {rows}, "log_softmax_gather logprob");
  // log p(target) = x_t - lse = -(lse - x_t), exactly: IEEE subtraction is sign-symmetric.
  Tensor lse = Tensor::empty({rows}, logits.dtype());
  whole_forward(logprob, lse, logits, targets, vocab_size);
  scale_inplace(logprob, -1.0);
}

MaskedSum masked_sum(const Tensor& loss, const Tensor& mask) {
  MEGATRON_CHECK(mask.dtype() == DType::kF32 && mask.numel() == loss.numel(),
                 "masked_sum: the mask must be f32 with one entry per loss, got loss ", loss.str(),
                 " and mask ", mask.str());
  MaskedSum out;
  const float* mp = mask.data<float>();
  // In element order in double, one thread: the sum is the same whatever the thread count.
  cpu::dispatch_float(loss, "masked_sum", [&]<typename T>() {
    const T* lp = loss.data<T>();
    for (int64_t i = 0; i < loss.numel(); ++i) {
      out.sum += static_cast<double>(lp[i]) * mp[i];
      out.count += mp[i];
    }
  });
  return out;
}

}  // namespace megatron::cpu
