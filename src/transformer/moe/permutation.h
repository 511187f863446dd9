// The row moves of an MoE layer's dispatch and combine, as tensors: an index of rows, the rows it
// selects, and their scatter-add back (ops::gather_rows / ops::scatter_add_rows allocating their
// outputs). Shared by the allgather path (MoELayer) and the alltoall plan (AllToAllPlan).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/ops.h"

namespace megatron::moe {

// rows as an [n] i64 tensor.
inline Tensor index_tensor(const std::vector<int64_t>& rows) {
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size())}, DType::kI64);
  std::copy(rows.begin(), rows.end(), t.data<int64_t>());
  return t;
}

// out[r] = in[rows[r]].
inline Tensor gather_rows(const Tensor& in, const Tensor& rows) {
  Tensor out = Tensor::empty({rows.numel(), in.dim(-1)}, in.dtype(), in.device());
  ops::gather_rows(out, in, rows);
  return out;
}

// out[rows[r]] += in[r], out a zero [n, c].
inline Tensor scatter_add_rows(const Tensor& in, const Tensor& rows, int64_t n) {
  Tensor out = Tensor::zeros({n, in.dim(-1)}, in.dtype(), in.device());
  ops::scatter_add_rows(out, in, rows);
  return out;
}

}  // namespace megatron::moe
