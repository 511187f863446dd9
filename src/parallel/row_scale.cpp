#include "parallel/row_scale.h"

#include "core/error.h"
#include "tensor/ops.h"

namespace megatron {

void scale_rows_of(Tensor w, const RowScale& s, int64_t begin) {
  const Param& p = *s.param;
  const int64_t rows = p.shape[0], cols = p.shape.numel() / rows, n = w.numel();
  MEGATRON_CHECK(static_cast<int64_t>(s.factors.size()) == rows, "row scales of ", p.name, ": ",
                 s.factors.size(), " factors for ", rows, " rows");
  MEGATRON_CHECK(w.dtype() == DType::kF32 && begin >= 0 && begin + n <= p.shape.numel(),
                 "row scales of ", p.name, ": elements [", begin, ", ", begin + n,
                 ") of f32 main weights expected");
  if (n == 0) return;
  // The factors element by element (a small host tensor: only the clipped projections of a step
  // come here), multiplied on the weights' device.
  Tensor f = Tensor::empty({n}, DType::kF32);
  float* fd = f.data<float>();
  for (int64_t e = 0; e < n; ++e) fd[e] = s.factors[static_cast<size_t>((begin + e) / cols)];
  Tensor flat = w.view({n});
  ops::mul(flat, flat, f.to(w.device()));
}

void scale_main_rows(ParamSet& params, const std::vector<RowScale>& scales) {
  if (scales.empty()) return;
  MEGATRON_CHECK(!params.main_sharded(),
                 "scale_main_rows: the main weights are sharded (the distributed optimizer "
                 "scales its shards itself)");
  for (const RowScale& s : scales) {
    if (s.param->frozen) continue;
    scale_rows_of(s.param->main, s, 0);
    const int64_t at = params.offset_of(*s.param);
    params.sync_compute_from_main(at, at + s.param->shape.numel());
  }
}

}  // namespace megatron
