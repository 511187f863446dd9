// tests/testing/fp8_blocks.h.
#include "testing/fp8_blocks.h"

#include <algorithm>
#include <cmath>

namespace megatron::testing {

Tensor block_quantised(const Tensor& x, int64_t br, int64_t bc, bool mxfp8, Fp8Format f) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Tensor out = Tensor::empty(x.shape(), DType::kF64);
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
      double amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          amax = std::max(amax,
                          std::fabs(static_cast<double>(static_cast<float>(x.item(r * cols + c)))));
      double scale = 1;
      if (amax > 0) {
        if (mxfp8) {
          while (amax * scale > fp8_max(f)) scale /= 2;
          while (amax * scale * 2 <= fp8_max(f)) scale *= 2;
        } else {
          const double quotient = static_cast<float>(fp8_max(f) / static_cast<float>(amax));
          while (scale > quotient) scale /= 2;
          while (scale * 2 <= quotient) scale *= 2;
        }
      }
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const float v = static_cast<float>(static_cast<float>(x.item(r * cols + c)) * scale);
          out.data<double>()[r * cols + c] = fp8_decode(fp8_encode(v, f), f) / scale;
        }
    }
  return out;
}

}  // namespace megatron::testing
