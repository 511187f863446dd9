// Best rate of a repeated square oneDNN GEMM: the measured peak MFU is reported against.
#include "train/gemm_peak.h"

#include <algorithm>

#include "core/timer.h"
#include "tensor/ops.h"

namespace megatron {

double measure_gemm_gflops(DType dtype, int64_t n, double seconds) {
  Tensor a = Tensor::full({n, n}, 0.5, dtype), b = Tensor::full({n, n}, 0.25, dtype);
  Tensor c = Tensor::zeros({n, n});
  ops::matmul(c, a, false, b, true);  // warm-up: creates and caches the primitive
  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  double best = 0;
  Timer total;
  do {
    Timer t;
    ops::matmul(c, a, false, b, true);
    best = std::max(best, flops / t.elapsed() / 1e9);
  } while (total.elapsed() < seconds);
  return best;
}

}  // namespace megatron
