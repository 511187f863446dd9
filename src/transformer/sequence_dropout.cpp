// Sequence dropout: runs of consecutive global rows, one dropout op each.
#include "transformer/sequence_dropout.h"

#include "tensor/ops.h"

namespace megatron {
namespace {

template <typename Fn>
void for_each_run(const Tensor& x, const TensorParallelContext& tp, bool sp_split, Fn&& fn) {
  const int64_t rows = x.dim(0), row_elems = rows == 0 ? 0 : x.numel() / rows;
  const bool split = sp_split && tp.sp();
  const int64_t local = rows * (split ? tp.size() : 1), first = split ? tp.rank() * rows : 0;
  auto global = [&](int64_t t) {
    return tp.cp.enabled() ? tp.cp.global_row(first + t, local) : first + t;
  };
  for (int64_t t0 = 0; t0 < rows;) {
    int64_t t1 = t0 + 1;
    while (t1 < rows && global(t1) == global(t0) + (t1 - t0)) ++t1;
    fn(t0, t1, static_cast<uint64_t>(global(t0) * row_elems));
    t0 = t1;
  }
}

}  // namespace

void sequence_dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                              const TensorParallelContext& tp, bool sp_split) {
  for_each_run(x, tp, sp_split, [&](int64_t t0, int64_t t1, uint64_t offset) {
    Tensor o = out.slice0(t0, t1);
    ops::dropout_forward(o, x.slice0(t0, t1), p, seed, stream, offset);
  });
}

void sequence_dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed,
                               uint64_t stream, const TensorParallelContext& tp, bool sp_split) {
  for_each_run(dout, tp, sp_split, [&](int64_t t0, int64_t t1, uint64_t offset) {
    Tensor d = dx.slice0(t0, t1);
    ops::dropout_backward(d, dout.slice0(t0, t1), p, seed, stream, offset);
  });
}

}  // namespace megatron
