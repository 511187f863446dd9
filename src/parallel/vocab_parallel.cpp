// Vocabulary-parallel embedding and cross entropy: the block ops of tensor/ops.h around at most
// two collectives, and the argument checks every rank makes before the first of them.
//
// The cross-entropy block ops are the single-process op's own kernels (ops::cross_entropy_forward
// is the one-block case), so a split vocabulary differs from one process only in how the exp-sum
// is grouped: per rank, then over ranks. The rank sums travel as doubles, so that grouping adds no
// rounding of its own.
#include "parallel/vocab_parallel.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "parallel/mappings.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

// Token ids as i64 or i32 (a host copy where the model runs on a GPU), read without a per-element
// dtype branch in the hot loops.
struct Ids {
  Tensor host;  // keeps the values read below alive
  const int64_t* i64 = nullptr;
  const int32_t* i32 = nullptr;
  int64_t operator[](int64_t i) const { return i64 ? i64[i] : i32[i]; }
};

Ids ids_of(const Tensor& ids, const char* op) {
  MEGATRON_CHECK(ids.defined() && (ids.dtype() == DType::kI64 || ids.dtype() == DType::kI32), op,
                 ": ids must be an i64 (or i32) tensor, got ",
                 ids.defined() ? ids.str() : std::string("an undefined tensor"));
  Ids out;
  out.host = to_host(ids);
  if (ids.dtype() == DType::kI64) {
    out.i64 = out.host.data<int64_t>();
  } else {
    out.i32 = out.host.data<int32_t>();
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
  const Tensor host = to_host(targets);
  const int64_t* t = host.data<int64_t>();
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

  ops::embedding_forward_shard(out, ids, table_shard, vocab_start);
  // One nonzero term per element: the sum is the row itself, exactly (up to the sign of a zero).
  if (tp.size() > 1) tp.all_reduce(out, ReduceOp::kSum);
}

void vocab_parallel_embedding_backward(Tensor& dtable_shard, const Tensor& dout, const Tensor& ids,
                                       int64_t vocab_start) {
  const char* op = "vocab_parallel_embedding_backward";
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
  ops::embedding_backward_shard(dtable_shard, dout, ids, vocab_start);
}

void vocab_parallel_cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits_shard,
                                          const Tensor& targets, int64_t vocab_start,
                                          int64_t vocab_size, ProcessGroup& tp) {
  const char* op = "vocab_parallel_cross_entropy_forward";
  MEGATRON_CHECK(logits_shard.defined() && logits_shard.ndim() >= 1, op,
                 ": logits_shard must be [..., Vp/tp], got ",
                 logits_shard.defined() ? logits_shard.str() : std::string("an undefined tensor"));
  const int64_t block = logits_shard.dim(-1), n = block > 0 ? logits_shard.numel() / block : 0;
  const int64_t vp = block * tp.size();
  MEGATRON_CHECK(vocab_size > 0 && vocab_size <= vp, op, ": vocab size ", vocab_size,
                 " must be in (0, ", vp, "], the padded vocabulary (", block, " columns x tp ",
                 tp.size(), ")");
  check_vocab_start(vocab_start, block, tp, op);
  check_targets(targets, n, vocab_size, op);
  check_rows_tensor(loss, n, logits_shard.dtype(), "vocab_parallel_cross_entropy_forward loss");
  check_rows_tensor(lse, n, logits_shard.dtype(), "vocab_parallel_cross_entropy_forward lse");

  const int64_t v = valid_columns(vocab_start, block, vocab_size);
  // 1. Row max over the valid columns of every rank. An all-padding block contributes -inf, the
  //    identity of max; rank 0 always holds valid columns, so the result is finite.
  Tensor row_max = Tensor::empty({n}, logits_shard.dtype(), logits_shard.device());
  ops::cross_entropy_shard_max(row_max, logits_shard, v);
  if (tp.size() > 1) tp.all_reduce(row_max, ReduceOp::kMax);
  // 2. [exp-sums | target logits] [2n], summed over ranks in one collective. exp is taken only
  //    after the global max is known, so an all-padding block sums nothing (no -inf - -inf).
  Tensor sums = Tensor::empty({2 * n}, DType::kF64, logits_shard.device());
  ops::cross_entropy_shard_sums(sums, logits_shard, row_max, targets, vocab_start, v);
  if (tp.size() > 1) tp.all_reduce(sums, ReduceOp::kSum);
  // 3. Every rank now holds the same max, sums and target logits: same lse and loss everywhere.
  ops::cross_entropy_shard_finish(loss, lse, row_max, sums);
}

void vocab_parallel_cross_entropy_backward(Tensor& dlogits_shard, const Tensor& dloss,
                                           const Tensor& logits_shard, const Tensor& lse,
                                           const Tensor& targets, int64_t vocab_start,
                                           int64_t vocab_size) {
  const char* op = "vocab_parallel_cross_entropy_backward";
  MEGATRON_CHECK(logits_shard.defined() && logits_shard.ndim() >= 1, op,
                 ": logits_shard must be [..., Vp/tp], got ",
                 logits_shard.defined() ? logits_shard.str() : std::string("an undefined tensor"));
  const int64_t block = logits_shard.dim(-1), n = block > 0 ? logits_shard.numel() / block : 0;
  MEGATRON_CHECK(vocab_size > 0, op, ": vocab size must be positive, got ", vocab_size);
  check_block_start(vocab_start, block, op);
  check_targets(targets, n, vocab_size, op);
  MEGATRON_CHECK(dlogits_shard.defined() &&
                     (dlogits_shard.dtype() == logits_shard.dtype() ||
                      (logits_shard.dtype() == DType::kF32 && is_half(dlogits_shard.dtype()))),
                 op, ": dlogits_shard must have the logits' dtype ",
                 dtype_name(logits_shard.dtype()), " (or bf16/f16 for f32 logits), got ",
                 dlogits_shard.defined() ? dlogits_shard.str() : std::string("undefined"));
  check_shape(dlogits_shard, logits_shard.shape(), "vocab_parallel_cross_entropy_backward dlogits");
  check_rows_tensor(dloss, n, logits_shard.dtype(), "vocab_parallel_cross_entropy_backward dloss");
  check_rows_tensor(lse, n, logits_shard.dtype(), "vocab_parallel_cross_entropy_backward lse");

  ops::cross_entropy_shard_backward(dlogits_shard, dloss, logits_shard, lse, targets, vocab_start,
                                    valid_columns(vocab_start, block, vocab_size));
}

}  // namespace megatron
