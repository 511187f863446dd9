// Embedding lookup and its scatter-add backward.
//
// The backward is parallel over hidden-dim chunks, each thread walking all tokens in order: no
// atomics, and the sum for a repeated token is always taken in token order (deterministic).
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/ops.h"

namespace megatron::cpu {

namespace {
int64_t id_at(const Tensor& ids, int64_t i) {
  return ids.dtype() == DType::kI64 ? ids.data<int64_t>()[i] : ids.data<int32_t>()[i];
}
void check_ids(const Tensor& ids, int64_t vocab, const char* op) {
  MEGATRON_CHECK(ids.dtype() == DType::kI64 || ids.dtype() == DType::kI32, op,
                 ": ids must be i32 or i64, got ", dtype_name(ids.dtype()));
  for (int64_t i = 0; i < ids.numel(); ++i) {
    int64_t id = id_at(ids, i);
    MEGATRON_CHECK(id >= 0 && id < vocab, op, ": token id ", id, " at position ", i,
                   " is outside the vocabulary [0, ", vocab, ")");
  }
}
}  // namespace

void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) {
  int64_t n = ids.numel(), h = table.dim(1);
  MEGATRON_CHECK(table.ndim() == 2 && out.numel() == n * h, "embedding_forward: table ",
                 table.str(), ", ids ", ids.str(), ", out ", out.str());
  cpu::check_same_dtype(out, table, "embedding_forward");
  check_ids(ids, table.dim(0), "embedding_forward");
  size_t row_bytes = static_cast<size_t>(h) * dtype_size(table.dtype());
  const char* src = static_cast<const char*>(table.raw());
  char* dst = static_cast<char*>(out.raw());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * row_bytes, src + id_at(ids, i) * row_bytes, row_bytes);
  }
}

void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  check_ids(ids, dtable.dim(0), "embedding_backward");
  embedding_backward_shard(dtable, dout, ids, 0);
}

void embedding_backward_shard(Tensor& dtable_shard, const Tensor& dout, const Tensor& ids,
                              int64_t vocab_start) {
  MEGATRON_CHECK(ids.dtype() == DType::kI64 || ids.dtype() == DType::kI32,
                 "embedding_backward: ids must be i32 or i64, got ", dtype_name(ids.dtype()));
  const int64_t n = ids.numel(), rows = dtable_shard.dim(0), h = dtable_shard.dim(1);
  MEGATRON_CHECK(
      dtable_shard.ndim() == 2 && dout.numel() == n * h && dout.dtype() == dtable_shard.dtype(),
      "embedding_backward: dtable ", dtable_shard.str(), ", ids ", ids.str(), ", dout ",
      dout.str());
  cpu::dispatch_float(dtable_shard, "embedding_backward", [&]<typename T>() {
    T* dt = dtable_shard.data<T>();
    const T* g = dout.data<T>();
    constexpr int64_t kChunk = 64;
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < h; j0 += kChunk) {
      const int64_t j1 = std::min(h, j0 + kChunk);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t local = id_at(ids, i) - vocab_start;
        if (local < 0 || local >= rows) continue;  // another rank's block
        T* row = dt + local * h;
        const T* grow = g + i * h;
        for (int64_t j = j0; j < j1; ++j) row[j] += grow[j];
      }
    }
  });
}

namespace {
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

// out[i, :] = this block's row of ids[i] (widened to TOut), or zeros when another block holds it.
template <typename TOut, typename TTable>
void masked_lookup(TOut* out, const Tensor& ids, const TTable* table, int64_t rows, int64_t h,
                   int64_t vocab_start) {
  const int64_t n = ids.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    TOut* dst = out + i * h;
    const int64_t local = id_at(ids, i) - vocab_start;
    if (local < 0 || local >= rows) {
      std::fill(dst, dst + h, TOut(0));
      continue;
    }
    const TTable* src = table + local * h;
    for (int64_t j = 0; j < h; ++j) dst[j] = widen<TOut>(src[j]);
  }
}
}  // namespace

void embedding_forward_shard(Tensor& out, const Tensor& ids, const Tensor& table_shard,
                             int64_t vocab_start) {
  MEGATRON_CHECK(ids.dtype() == DType::kI64 || ids.dtype() == DType::kI32,
                 "embedding_forward_shard: ids must be i32 or i64, got ", dtype_name(ids.dtype()));
  MEGATRON_CHECK(table_shard.ndim() == 2, "embedding_forward_shard: table ", table_shard.str());
  const int64_t rows = table_shard.dim(0), h = table_shard.dim(1);
  const DType want = table_shard.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  MEGATRON_CHECK(out.dtype() == want && out.numel() == ids.numel() * h,
                 "embedding_forward_shard: out ", out.str(), " for ids ", ids.str(), " and table ",
                 table_shard.str());
  switch (table_shard.dtype()) {
    case DType::kF32:
      masked_lookup(out.data<float>(), ids, table_shard.data<float>(), rows, h, vocab_start);
      break;
    case DType::kF64:
      masked_lookup(out.data<double>(), ids, table_shard.data<double>(), rows, h, vocab_start);
      break;
    case DType::kF16:
      masked_lookup(out.data<float>(), ids, table_shard.data<f16>(), rows, h, vocab_start);
      break;
    case DType::kBF16:
      masked_lookup(out.data<float>(), ids, table_shard.data<bf16>(), rows, h, vocab_start);
      break;
    default:
      MEGATRON_CHECK(false, "embedding_forward_shard: table must be f32, f64, bf16 or f16, got ",
                     table_shard.str());
  }
}

}  // namespace megatron::cpu
