// Fused softmax cross-entropy over the vocabulary, without a probability tensor.
//
// Forward keeps only the per-row log-sum-exp; backward recomputes softmax from it, in place over
// the logits if the caller wishes. Columns >= vocab_size are vocabulary padding (Megatron pads
// the embedding to a multiple of --make-vocab-size-divisible-by): they are never real tokens, so
// they are excluded from every softmax here and receive zero gradient.
#include <cmath>
#include <limits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/op_profile.h"
#include "tensor/ops.h"

namespace megatron::ops {
namespace {

void check_ce(const Tensor& logits, const Tensor& targets, int64_t vocab_size, const char* op) {
  MEGATRON_CHECK(logits.ndim() >= 1 && vocab_size > 0 && vocab_size <= logits.dim(-1), op,
                 ": vocab size ", vocab_size, " must be in (0, ", logits.dim(-1), "]");
  MEGATRON_CHECK(targets.dtype() == DType::kI64 && targets.numel() == cpu::rows_of(logits), op,
                 ": targets must be i64 with one id per logits row; got ", targets.str(),
                 " for logits ", logits.str());
  const int64_t* t = targets.data<int64_t>();
  for (int64_t r = 0; r < targets.numel(); ++r) {
    MEGATRON_CHECK(t[r] >= 0 && t[r] < vocab_size, op, ": target id ", t[r], " at row ", r,
                   " is outside the vocabulary [0, ", vocab_size, ")");
  }
}

// log(sum_j exp(row[j])) over the first v entries. exp runs in T, vectorised; partial sums of
// 1024 terms are added in double so long vocabularies lose no precision.
template <typename T>
T row_lse(const T* row, int64_t v) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < v; ++j) m = std::max(m, row[j]);
  double sum = 0;
  for (int64_t j0 = 0; j0 < v; j0 += 1024) {
    const int64_t j1 = std::min(v, j0 + 1024);
    T part = 0;
#pragma omp simd reduction(+ : part)
    for (int64_t j = j0; j < j1; ++j) part += cpu::vexp(row[j] - m);
    sum += static_cast<double>(part);
  }
  return m + static_cast<T>(std::log(sum));
}

}  // namespace

void cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size) {
  const OpTimer op_timer(OpCategory::kCrossEntropy);
  check_ce(logits, targets, vocab_size, "cross_entropy_forward");
  int64_t rows = cpu::rows_of(logits), vp = logits.dim(-1);
  check_shape(loss, {rows}, "cross_entropy_forward loss");
  check_shape(lse, {rows}, "cross_entropy_forward lse");
  cpu::dispatch_float(logits, "cross_entropy_forward", [&]<typename T>() {
    const T* lg = logits.data<T>();
    const int64_t* t = targets.data<int64_t>();
    T *lo = loss.data<T>(), *ls = lse.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = lg + r * vp;
      T z = row_lse(row, vocab_size);
      ls[r] = z;
      lo[r] = z - row[t[r]];
    }
  });
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size) {
  const OpTimer op_timer(OpCategory::kCrossEntropy);
  check_ce(logits, targets, vocab_size, "cross_entropy_backward");
  int64_t rows = cpu::rows_of(logits), vp = logits.dim(-1);
  check_shape(dlogits, logits.shape(), "cross_entropy_backward dlogits");
  check_shape(dloss, {rows}, "cross_entropy_backward dloss");
  cpu::dispatch_float(logits, "cross_entropy_backward", [&]<typename T>() {
    const T *lg = logits.data<T>(), *dl = dloss.data<T>(), *ls = lse.data<T>();
    const int64_t* t = targets.data<int64_t>();
    T* d = dlogits.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = lg + r * vp;
      T* drow = d + r * vp;
      const T z = ls[r], g = dl[r];
      const int64_t v =
          vocab_size;  // a local: the captured reference would be reloaded per element
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) drow[j] = g * cpu::vexp(row[j] - z);
      for (int64_t j = v; j < vp; ++j) drow[j] = 0;
      drow[t[r]] -= g;
    }
  });
}

void log_softmax_gather(Tensor& logprob, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_size) {
  const OpTimer op_timer(OpCategory::kCrossEntropy);
  check_ce(logits, targets, vocab_size, "log_softmax_gather");
  int64_t rows = cpu::rows_of(logits), vp = logits.dim(-1);
  check_shape(logprob, {rows}, "log_softmax_gather logprob");
  cpu::dispatch_float(logits, "log_softmax_gather", [&]<typename T>() {
    const T* lg = logits.data<T>();
    const int64_t* t = targets.data<int64_t>();
    T* lp = logprob.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = lg + r * vp;
      lp[r] = row[t[r]] - row_lse(row, vocab_size);
    }
  });
}

}  // namespace megatron::ops
