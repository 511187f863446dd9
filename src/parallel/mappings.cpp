// The conjugate pairs as compositions of five building blocks over ProcessGroup's collectives.
#include "parallel/mappings.h"

#include <cstring>
#include <vector>

#include "core/error.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

// Shape of x with dimension `d` replaced by n.
Shape with_dim(const Shape& s, int d, int64_t n) {
  Shape out = s;
  out[d] = n;
  return out;
}

void check_has_dims(const Tensor& x, const char* op) {
  MEGATRON_CHECK(x.defined() && x.ndim() >= 1, op, ": needs a tensor with at least one dim, got ",
                 x.defined() ? x.str() : std::string("an undefined tensor"));
}

}  // namespace

int64_t divide(int64_t numerator, int64_t denominator, const std::string& what) {
  MEGATRON_CHECK(denominator > 0 && numerator % denominator == 0, what, ": ", numerator,
                 " is not divisible by ", denominator);
  return numerator / denominator;
}

Tensor split_last_dim(const Tensor& x, ProcessGroup& group) {
  check_has_dims(x, "split_last_dim");
  if (group.size() == 1) return x;
  const int64_t h = x.dim(-1);
  const int64_t chunk = divide(h, group.size(), "split along the last dim: its size by the group");
  Tensor out = Tensor::empty(with_dim(x.shape(), -1, chunk), x.dtype(), x.device());
  ops::slice_last_dim(out, x, group.rank() * chunk);
  return out;
}

Tensor gather_last_dim(const Tensor& x, ProcessGroup& group) {
  check_has_dims(x, "gather_last_dim");
  if (group.size() == 1) return x;
  const int64_t p = group.size();
  const int64_t chunk = x.dim(-1);
  const int64_t rows = x.numel() / chunk;
  // The group gathers flat chunks in rank order: [p, rows, chunk]. Re-interleave into
  // [rows, p * chunk], rank j's chunk of row r landing in columns [j*chunk, (j+1)*chunk).
  Tensor stacked = Tensor::empty(Shape{p * x.numel()}, x.dtype(), x.device());
  group.all_gather(stacked, x);
  Tensor out = Tensor::empty(with_dim(x.shape(), -1, p * chunk), x.dtype(), x.device());
  std::vector<Tensor> parts;
  for (int64_t j = 0; j < p; ++j) {
    parts.push_back(stacked.flat_view(j * x.numel(), Shape{rows, chunk}));
  }
  ops::concat_last_dim(out, parts);
  return out;
}

Tensor split_dim0(const Tensor& x, ProcessGroup& group) {
  check_has_dims(x, "split_dim0");
  if (group.size() == 1) return x;
  const int64_t n =
      divide(x.dim(0), group.size(), "split along dim 0 (the sequence): its size by the group");
  return x.slice0(group.rank() * n, (group.rank() + 1) * n).clone();
}

Tensor gather_dim0(const Tensor& x, ProcessGroup& group) {
  check_has_dims(x, "gather_dim0");
  if (group.size() == 1) return x;
  Tensor out =
      Tensor::empty(with_dim(x.shape(), 0, x.dim(0) * group.size()), x.dtype(), x.device());
  group.all_gather(out, x);
  return out;
}

Tensor reduce_scatter_dim0(const Tensor& x, ProcessGroup& group) {
  check_has_dims(x, "reduce_scatter_dim0");
  if (group.size() == 1) return x;
  const int64_t n = divide(x.dim(0), group.size(),
                           "reduce-scatter along dim 0 (the sequence): its size by the group");
  Tensor out = Tensor::empty(with_dim(x.shape(), 0, n), x.dtype(), x.device());
  group.reduce_scatter(out, x);
  return out;
}

Tensor all_reduce_in_place(const Tensor& x, ProcessGroup& group) {
  if (group.size() == 1) return x;
  Tensor t = x;  // a handle on the same storage
  group.all_reduce(t);
  return t;
}

// ---- the pairs ----------------------------------------------------------------------------------

Tensor copy_to_tp_region_forward(const Tensor& x, ProcessGroup&) {
  return x;
}
Tensor copy_to_tp_region_backward(const Tensor& dy, ProcessGroup& tp) {
  return all_reduce_in_place(dy, tp);
}

Tensor reduce_from_tp_region_forward(const Tensor& x, ProcessGroup& tp) {
  return all_reduce_in_place(x, tp);
}
Tensor reduce_from_tp_region_backward(const Tensor& dy, ProcessGroup&) {
  return dy;
}

Tensor scatter_to_tp_region_forward(const Tensor& x, ProcessGroup& tp) {
  return split_last_dim(x, tp);
}
Tensor scatter_to_tp_region_backward(const Tensor& dy, ProcessGroup& tp) {
  return gather_last_dim(dy, tp);
}

Tensor gather_from_tp_region_forward(const Tensor& x, ProcessGroup& tp) {
  return gather_last_dim(x, tp);
}
Tensor gather_from_tp_region_backward(const Tensor& dy, ProcessGroup& tp) {
  return split_last_dim(dy, tp);
}

Tensor scatter_to_sequence_parallel_region_forward(const Tensor& x, ProcessGroup& tp) {
  return split_dim0(x, tp);
}
Tensor scatter_to_sequence_parallel_region_backward(const Tensor& dy, ProcessGroup& tp) {
  return gather_dim0(dy, tp);
}

Tensor gather_from_sequence_parallel_region_forward(const Tensor& x, ProcessGroup& tp) {
  return gather_dim0(x, tp);
}
Tensor gather_from_sequence_parallel_region_backward(const Tensor& dy, ProcessGroup& tp,
                                                     bool tp_output_grad) {
  return tp_output_grad ? reduce_scatter_dim0(dy, tp) : split_dim0(dy, tp);
}

Tensor reduce_scatter_to_sequence_parallel_region_forward(const Tensor& x, ProcessGroup& tp) {
  return reduce_scatter_dim0(x, tp);
}
Tensor reduce_scatter_to_sequence_parallel_region_backward(const Tensor& dy, ProcessGroup& tp) {
  return gather_dim0(dy, tp);
}

}  // namespace megatron
