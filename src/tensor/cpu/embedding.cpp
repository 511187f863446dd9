// Embedding lookup and its scatter-add backward.
//
// The backward is parallel over hidden-dim chunks, each thread walking all tokens in order: no
// atomics, and the sum for a repeated token is always taken in token order (deterministic).
#include <cstring>

#include "tensor/cpu/dispatch.h"
#include "tensor/op_profile.h"
#include "tensor/ops.h"

namespace megatron::ops {

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
  const OpTimer op_timer(OpCategory::kNormElementwise);
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
  const OpTimer op_timer(OpCategory::kNormElementwise);
  int64_t n = ids.numel(), h = dtable.dim(1);
  MEGATRON_CHECK(dtable.ndim() == 2 && dout.numel() == n * h, "embedding_backward: dtable ",
                 dtable.str(), ", ids ", ids.str(), ", dout ", dout.str());
  check_ids(ids, dtable.dim(0), "embedding_backward");
  cpu::dispatch_float(dtable, "embedding_backward", [&]<typename T>() {
    T* dt = dtable.data<T>();
    const T* g = dout.data<T>();
    constexpr int64_t kChunk = 64;
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < h; j0 += kChunk) {
      int64_t j1 = std::min(h, j0 + kChunk);
      for (int64_t i = 0; i < n; ++i) {
        T* row = dt + id_at(ids, i) * h;
        const T* grow = g + i * h;
        for (int64_t j = j0; j < j1; ++j) row[j] += grow[j];
      }
    }
  });
}

}  // namespace megatron::ops
