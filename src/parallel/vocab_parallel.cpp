// Vocabulary-parallel embedding and cross entropy: local kernels around at most two collectives.
//
// The cross-entropy kernels mirror tensor/cpu/cross_entropy.cpp term for term (the same vexp of
// the same x - max, partial sums of 1024 terms added in double, lse = max + log(sum)), so they
// differ from the single-process result only in how the exp-sum is grouped: per rank, then over
// ranks. The rank sums travel as doubles, so that grouping adds no rounding of its own.
#include "parallel/vocab_parallel.h"

#include <optional>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "parallel/mappings.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/op_profile.h"

namespace megatron {
namespace {

// Token ids as i64 or i32, read without a per-element dtype branch in the hot loops.
struct Ids {
  const int64_t* i64 = nullptr;
  const int32_t* i32 = nullptr;
  int64_t operator[](int64_t i) const { return i64 ? i64[i] : i32[i]; }
};

Ids ids_of(const Tensor& ids, const char* op) {
  MEGATRON_CHECK(ids.defined() && (ids.dtype() == DType::kI64 || ids.dtype() == DType::kI32), op,
                 ": ids must be an i64 (or i32) tensor, got ",
                 ids.defined() ? ids.str() : std::string("an undefined tensor"));
  Ids out;
  if (ids.dtype() == DType::kI64) {
    out.i64 = ids.data<int64_t>();
  } else {
    out.i32 = ids.data<int32_t>();
  }
  return out;
}

// Every id in [0, limit); limit < 0 checks only the lower bound (the backward does not know Vp).
void check_id_range(const Ids& ids, int64_t n, int64_t limit, const char* op) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    MEGATRON_CHECK(id >= 0 && (limit < 0 || id < limit), op, ": token id ", id, " at position ", i,
                   " is outside the padded vocabulary [0, ",
                   limit < 0 ? std::string("Vp") : std::to_string(limit),
                   "); ids must be token ids of the tokenizer the embedding was built for");
  }
}

void check_vocab_start(int64_t vocab_start, int64_t shard_rows, const ProcessGroup& tp,
                       const char* op) {
  MEGATRON_CHECK(vocab_start == tp.rank() * shard_rows, op, ": expected vocab_start ",
                 tp.rank() * shard_rows, " (tp rank ", tp.rank(), " x ", shard_rows,
                 " rows per rank), got ", vocab_start,
                 "; pass vocab_range(Vp, tp.rank(), tp.size()).start");
}

// Without the group: a block start is a non-negative multiple of the block size.
void check_block_start(int64_t vocab_start, int64_t shard_rows, const char* op) {
  MEGATRON_CHECK(shard_rows > 0 && vocab_start >= 0 && vocab_start % shard_rows == 0, op,
                 ": vocab_start ", vocab_start, " is not the start of a block of ", shard_rows,
                 " vocabulary entries; pass vocab_range(Vp, tp.rank(), tp.size()).start");
}

void check_targets(const Tensor& targets, int64_t n, int64_t vocab_size, const char* op) {
  MEGATRON_CHECK(targets.defined() && targets.dtype() == DType::kI64 && targets.numel() == n, op,
                 ": targets must be i64 with one id per logits row (", n, "), got ",
                 targets.defined() ? targets.str() : std::string("an undefined tensor"));
  const int64_t* t = targets.data<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    MEGATRON_CHECK(t[r] >= 0 && t[r] < vocab_size, op, ": target id ", t[r], " at row ", r,
                   " is outside the vocabulary [0, ", vocab_size, ")");
  }
}

void check_rows_tensor(const Tensor& t, int64_t n, DType dtype, const char* what) {
  MEGATRON_CHECK(t.defined() && t.dtype() == dtype, what, ": expected dtype ", dtype_name(dtype),
                 " (the logits' dtype), got ",
                 t.defined() ? t.str() : std::string("an undefined tensor"));
  check_shape(t, {n}, what);
}

// Number of valid (non-padding) columns in the block starting at vocab_start.
int64_t valid_columns(int64_t vocab_start, int64_t block, int64_t vocab_size) {
  return std::clamp<int64_t>(vocab_size - vocab_start, 0, block);
}

template <typename TOut, typename TTable>
TOut widen(TTable x) {
  if constexpr (std::is_same_v<TTable, bf16>) {
    return static_cast<TOut>(bf16_to_f32(x));
  } else if constexpr (std::is_same_v<TTable, f16>) {
    return static_cast<TOut>(f16_to_f32(x));
  } else {
    return static_cast<TOut>(x);
  }
}

// out[i, :] = this rank's row of ids[i] (widened to TOut), or zeros when another rank holds it.
template <typename TOut, typename TTable>
void masked_lookup(TOut* out, const Ids& ids, int64_t n, const TTable* table, int64_t rows,
                   int64_t h, int64_t vocab_start) {
  const OpTimer op_timer(OpCategory::kNormElementwise);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    TOut* dst = out + i * h;
    const int64_t local = ids[i] - vocab_start;
    if (local < 0 || local >= rows) {
      std::fill(dst, dst + h, TOut(0));
      continue;
    }
    const TTable* src = table + local * h;
    for (int64_t j = 0; j < h; ++j) dst[j] = widen<TOut>(src[j]);
  }
}

}  // namespace

VocabRange vocab_range(int64_t padded_vocab_size, int rank, int size) {
  const int64_t per = divide(padded_vocab_size, size,
                             "vocab_range: the padded vocabulary size by "
                             "--tensor-model-parallel-size (pad it with "
                             "--make-vocab-size-divisible-by)");
  MEGATRON_CHECK(rank >= 0 && rank < size, "vocab_range: rank ", rank, " outside [0, ", size, ")");
  return {rank * per, (rank + 1) * per};
}

void vocab_parallel_embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table_shard,
                                      int64_t vocab_start, ProcessGroup& tp) {
  const char* op = "vocab_parallel_embedding_forward";
  const Ids id = ids_of(ids, op);
  MEGATRON_CHECK(table_shard.defined() && table_shard.ndim() == 2, op,
                 ": table_shard must be [Vp/tp, h], got ",
                 table_shard.defined() ? table_shard.str() : std::string("an undefined tensor"));
  const int64_t n = ids.numel(), rows = table_shard.dim(0), h = table_shard.dim(1);
  const DType want_out = table_shard.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  MEGATRON_CHECK(table_shard.dtype() == DType::kF32 || table_shard.dtype() == DType::kF64 ||
                     is_half(table_shard.dtype()),
                 op, ": table_shard must be f32, f64, bf16 or f16, got ", table_shard.str());
  MEGATRON_CHECK(out.defined() && out.dtype() == want_out && out.numel() == n * h &&
                     (out.ndim() == 0 || out.dim(-1) == h),
                 op, ": expected out ", dtype_name(want_out), " with ", n, " x ", h,
                 " elements (ids x hidden) for table_shard ", table_shard.str(), ", got ",
                 out.defined() ? out.str() : std::string("an undefined tensor"));
  check_vocab_start(vocab_start, rows, tp, op);
  check_id_range(id, n, rows * tp.size(), op);

  switch (table_shard.dtype()) {
    case DType::kF32:
      masked_lookup(out.data<float>(), id, n, table_shard.data<float>(), rows, h, vocab_start);
      break;
    case DType::kF64:
      masked_lookup(out.data<double>(), id, n, table_shard.data<double>(), rows, h, vocab_start);
      break;
    case DType::kF16:
      masked_lookup(out.data<float>(), id, n, table_shard.data<f16>(), rows, h, vocab_start);
      break;
    default:  // bf16, checked above
      masked_lookup(out.data<float>(), id, n, table_shard.data<bf16>(), rows, h, vocab_start);
      break;
  }
  // One nonzero term per element: the sum is the row itself, exactly (up to the sign of a zero).
  if (tp.size() > 1) tp.all_reduce(out, ReduceOp::kSum);
}

void vocab_parallel_embedding_backward(Tensor& dtable_shard, const Tensor& dout, const Tensor& ids,
                                       int64_t vocab_start) {
  const char* op = "vocab_parallel_embedding_backward";
  const OpTimer op_timer(OpCategory::kNormElementwise);
  const Ids id = ids_of(ids, op);
  MEGATRON_CHECK(dtable_shard.defined() && dtable_shard.ndim() == 2, op,
                 ": dtable_shard must be [Vp/tp, h], got ",
                 dtable_shard.defined() ? dtable_shard.str() : std::string("an undefined tensor"));
  const int64_t n = ids.numel(), rows = dtable_shard.dim(0), h = dtable_shard.dim(1);
  MEGATRON_CHECK(dout.defined() && dout.dtype() == dtable_shard.dtype() && dout.numel() == n * h,
                 op, ": expected dout ", dtype_name(dtable_shard.dtype()), " with ", n, " x ", h,
                 " elements (ids x hidden), got ",
                 dout.defined() ? dout.str() : std::string("an undefined tensor"));
  check_block_start(vocab_start, rows, op);
  check_id_range(id, n, -1, op);
  cpu::dispatch_float(dtable_shard, op, [&]<typename T>() {
    T* dt = dtable_shard.data<T>();
    const T* g = dout.data<T>();
    constexpr int64_t kChunk = 64;
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < h; j0 += kChunk) {
      const int64_t j1 = std::min(h, j0 + kChunk);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t local = id[i] - vocab_start;
        if (local < 0 || local >= rows) continue;
        T* row = dt + local * h;
        const T* grow = g + i * h;
        for (int64_t j = j0; j < j1; ++j) row[j] += grow[j];
      }
    }
  });
}

void vocab_parallel_cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits_shard,
                                          const Tensor& targets, int64_t vocab_start,
                                          int64_t vocab_size, ProcessGroup& tp) {
  const char* op = "vocab_parallel_cross_entropy_forward";
  MEGATRON_CHECK(logits_shard.defined() && logits_shard.ndim() >= 1, op,
                 ": logits_shard must be [..., Vp/tp], got ",
                 logits_shard.defined() ? logits_shard.str() : std::string("an undefined tensor"));
  const int64_t n = cpu::rows_of(logits_shard), block = logits_shard.dim(-1);
  const int64_t vp = block * tp.size();
  MEGATRON_CHECK(vocab_size > 0 && vocab_size <= vp, op, ": vocab size ", vocab_size,
                 " must be in (0, ", vp, "], the padded vocabulary (", block, " columns x tp ",
                 tp.size(), ")");
  check_vocab_start(vocab_start, block, tp, op);
  check_targets(targets, n, vocab_size, op);
  check_rows_tensor(loss, n, logits_shard.dtype(), "vocab_parallel_cross_entropy_forward loss");
  check_rows_tensor(lse, n, logits_shard.dtype(), "vocab_parallel_cross_entropy_forward lse");

  cpu::dispatch_float(logits_shard, op, [&]<typename T>() {
    // A local, not a captured reference, so the inner loops do not reload it per element.
    const int64_t v = valid_columns(vocab_start, block, vocab_size);
    const T* lg = logits_shard.data<T>();
    const int64_t* t = targets.data<int64_t>();
    // 1. Row max over the valid columns of every rank. An all-padding block contributes -inf,
    //    the identity of max; rank 0 always holds valid columns, so the result is finite.
    Tensor max_t = Tensor::empty({n}, logits_shard.dtype());
    T* mx = max_t.data<T>();
    {
      // The op profile counts the local passes; the all-reduces are communication.
      const OpTimer op_timer(OpCategory::kCrossEntropy);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < n; ++r) {
        const T* row = lg + r * block;
        T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < v; ++j) m = std::max(m, row[j]);
        mx[r] = m;
      }
    }
    if (tp.size() > 1) tp.all_reduce(max_t, ReduceOp::kMax);

    // 2. [exp-sums | target logits] [2n], summed over ranks in one collective. exp is taken only
    //    after the global max is known, so an all-padding block sums nothing (no -inf - -inf).
    Tensor sums = Tensor::empty({2 * n}, DType::kF64);
    double* se = sums.data<double>();
    double* xt = se + n;
    std::optional<OpTimer> op_timer(std::in_place, OpCategory::kCrossEntropy);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
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
      const int64_t local = t[r] - vocab_start;
      xt[r] = local >= 0 && local < v ? static_cast<double>(row[local]) : 0.0;
    }
    op_timer.reset();
    if (tp.size() > 1) tp.all_reduce(sums, ReduceOp::kSum);

    // 3. Every rank now holds the same m, sums and target logits: same lse and loss everywhere.
    T *lo = loss.data<T>(), *ls = lse.data<T>();
    for (int64_t r = 0; r < n; ++r) {
      ls[r] = mx[r] + static_cast<T>(std::log(se[r]));
      lo[r] = ls[r] - static_cast<T>(xt[r]);
    }
  });
}

void vocab_parallel_cross_entropy_backward(Tensor& dlogits_shard, const Tensor& dloss,
                                           const Tensor& logits_shard, const Tensor& lse,
                                           const Tensor& targets, int64_t vocab_start,
                                           int64_t vocab_size) {
  const char* op = "vocab_parallel_cross_entropy_backward";
  MEGATRON_CHECK(logits_shard.defined() && logits_shard.ndim() >= 1, op,
                 ": logits_shard must be [..., Vp/tp], got ",
                 logits_shard.defined() ? logits_shard.str() : std::string("an undefined tensor"));
  const int64_t n = cpu::rows_of(logits_shard), block = logits_shard.dim(-1);
  MEGATRON_CHECK(vocab_size > 0, op, ": vocab size must be positive, got ", vocab_size);
  check_block_start(vocab_start, block, op);
  check_targets(targets, n, vocab_size, op);
  MEGATRON_CHECK(dlogits_shard.defined() && dlogits_shard.dtype() == logits_shard.dtype(), op,
                 ": dlogits_shard must have the logits' dtype ", dtype_name(logits_shard.dtype()),
                 ", got ",
                 dlogits_shard.defined() ? dlogits_shard.str() : std::string("undefined"));
  check_shape(dlogits_shard, logits_shard.shape(), "vocab_parallel_cross_entropy_backward dlogits");
  check_rows_tensor(dloss, n, logits_shard.dtype(), "vocab_parallel_cross_entropy_backward dloss");
  check_rows_tensor(lse, n, logits_shard.dtype(), "vocab_parallel_cross_entropy_backward lse");

  const OpTimer op_timer(OpCategory::kCrossEntropy);
  cpu::dispatch_float(logits_shard, op, [&]<typename T>() {
    const int64_t v = valid_columns(vocab_start, block, vocab_size);  // a local, as above
    const T *lg = logits_shard.data<T>(), *dl = dloss.data<T>(), *ls = lse.data<T>();
    const int64_t* t = targets.data<int64_t>();
    T* d = dlogits_shard.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      // In place is safe: element j is read before it is written, and nothing else is read.
      const T* row = lg + r * block;
      T* drow = d + r * block;
      const T z = ls[r], g = dl[r];
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) drow[j] = g * cpu::vexp(row[j] - z);
      for (int64_t j = v; j < block; ++j) drow[j] = 0;
      const int64_t local = t[r] - vocab_start;
      if (local >= 0 && local < v) drow[local] -= g;
    }
  });
}

}  // namespace megatron
