// Layout copies of any dtype: 2-D transposes and last-dimension slices and concatenations, as
// byte moves (no arithmetic, so every dtype is the same kernel).
#include <cstring>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/ops.h"

namespace megatron::cpu {

void transpose_2d(Tensor& out, const Tensor& x) {
  MEGATRON_CHECK(x.ndim() == 2, "transpose_2d: expected a 2-D tensor, got ", x.str());
  const int64_t rows = x.dim(0), cols = x.dim(1);
  check_shape(out, {cols, rows}, "transpose_2d out");
  MEGATRON_CHECK(out.dtype() == x.dtype(), "transpose_2d: out ", out.str(), " for ", x.str());
  const size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(dst + (c * rows + r) * es, src + (r * cols + c) * es, es);
}

namespace {
// index [n] i64, each in [0, rows).
const int64_t* checked_index(const Tensor& index, int64_t n, int64_t rows, const char* op) {
  MEGATRON_CHECK(index.dtype() == DType::kI64 && index.numel() == n, op, ": index ", index.str(),
                 " should be ", n, " i64 row numbers");
  const int64_t* ix = index.data<int64_t>();
  for (int64_t r = 0; r < n; ++r)
    MEGATRON_CHECK(ix[r] >= 0 && ix[r] < rows, op, ": row ", ix[r], " outside [0, ", rows, ")");
  return ix;
}
}  // namespace

void gather_rows(Tensor& out, const Tensor& x, const Tensor& index) {
  const int64_t c = x.ndim() >= 1 ? x.dim(-1) : 1, rows = c > 0 ? x.numel() / c : 0;
  const int64_t n = index.numel();
  MEGATRON_CHECK(out.dtype() == x.dtype() && out.numel() == n * c, "gather_rows: out ", out.str(),
                 " for ", n, " rows of ", x.str());
  const int64_t* ix = checked_index(index, n, rows, "gather_rows");
  const size_t row = static_cast<size_t>(c) * dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(out.raw());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) std::memcpy(dst + r * row, src + ix[r] * row, row);
}

void scatter_add_rows(Tensor& out, const Tensor& x, const Tensor& index) {
  const int64_t c = out.ndim() >= 1 ? out.dim(-1) : 1, rows = c > 0 ? out.numel() / c : 0;
  const int64_t n = index.numel();
  MEGATRON_CHECK(x.numel() == n * c, "scatter_add_rows: ", x.str(), " is not ", n, " rows of ", c);
  cpu::check_same_dtype(out, x, "scatter_add_rows");
  const int64_t* ix = checked_index(index, n, rows, "scatter_add_rows");
  dispatch_float(out, "scatter_add_rows", [&]<typename T>() {
    T* o = out.data<T>();
    const T* v = x.data<T>();
    // In row order (a destination row can receive several): the sums are deterministic.
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < c; ++j) o[ix[r] * c + j] += v[r * c + j];
  });
}

void slice_last_dim(Tensor& out, const Tensor& x, int64_t start) {
  MEGATRON_CHECK(x.ndim() >= 1 && out.ndim() >= 1 && out.dtype() == x.dtype(),
                 "slice_last_dim: out ", out.str(), " from ", x.str());
  const int64_t h = x.dim(-1), w = out.dim(-1), rows = h > 0 ? x.numel() / h : 0;
  MEGATRON_CHECK(start >= 0 && start + w <= h && out.numel() == rows * w,
                 "slice_last_dim: columns [", start, ", ", start + w, ") of ", x.str(), " into ",
                 out.str());
  const size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw()) + start * es;
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * w * es, src + r * h * es, w * es);
}

void concat_last_dim(Tensor& out, const std::vector<Tensor>& parts) {
  MEGATRON_CHECK(out.ndim() >= 1 && !parts.empty(), "concat_last_dim: out ", out.str());
  const int64_t h = out.dim(-1), rows = h > 0 ? out.numel() / h : 0;
  const size_t es = dtype_size(out.dtype());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const int64_t w = p.ndim() >= 1 ? p.dim(-1) : 0;
    MEGATRON_CHECK(p.dtype() == out.dtype() && p.numel() == rows * w && at + w <= h,
                   "concat_last_dim: part ", p.str(), " does not fit ", out.str(), " at column ",
                   at);
    const char* src = static_cast<const char*>(p.raw());
    char* dst = static_cast<char*>(out.raw()) + at * es;
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * h * es, src + r * w * es, w * es);
    at += w;
  }
  MEGATRON_CHECK(at == h, "concat_last_dim: parts cover ", at, " of ", h, " columns");
}

}  // namespace megatron::cpu
