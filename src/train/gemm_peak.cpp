// Best rate of a repeated oneDNN GEMM: the measured peak MFU is reported against.
#include "train/gemm_peak.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "core/timer.h"
#include "tensor/ops.h"

namespace megatron {

GemmShape parse_gemm_shape(const std::string& text) {
  GemmShape s;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  int64_t* dims[] = {&s.m, &s.n, &s.k};
  bool ok = true;
  for (int i = 0; i < 3 && ok; ++i) {
    const auto [next, ec] = std::from_chars(p, end, *dims[i]);
    ok = ec == std::errc() && *dims[i] > 0;
    p = next;
    if (ok && i < 2) ok = p < end && *p++ == 'x';
  }
  if (ok && p < end) {
    ok =
        end - p == 3 && p[0] == ':' && (p[1] == 'N' || p[1] == 'T') && (p[2] == 'N' || p[2] == 'T');
    if (ok) {
      s.ta = p[1] == 'T';
      s.tb = p[2] == 'T';
    }
  } else if (ok) {
    s.tb = true;  // a linear layer's forward
  }
  MEGATRON_CHECK(ok, "GEMM shape '", text,
                 "': expected MxNxK or MxNxK:XY with positive sizes and X, Y each N or T "
                 "(e.g. 1024x2304x768:NT)");
  return s;
}

std::string gemm_shape_name(const GemmShape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) + ":" +
         (s.ta ? "T" : "N") + (s.tb ? "T" : "N");
}

double measure_gemm_gflops(DType dtype, const GemmShape& s, double seconds, Device device) {
  const Shape as = s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k};
  const Shape bs = s.tb ? Shape{s.n, s.k} : Shape{s.k, s.n};
  Tensor a = Tensor::full(as, 0.5, dtype, device), b = Tensor::full(bs, 0.25, dtype, device);
  Tensor c = Tensor::zeros({s.m, s.n}, DType::kF32, device);
  ops::matmul(c, a, s.ta, b, s.tb);  // warm-up: creates and caches the primitive
  device_synchronize(device);
  const double flops =
      2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  double best = 0;
  Timer total;
  do {
    Timer t;
    ops::matmul(c, a, s.ta, b, s.tb);
    device_synchronize(device);  // a GPU's GEMM returns before it is done
    best = std::max(best, flops / t.elapsed() / 1e9);
  } while (total.elapsed() < seconds);
  return best;
}

double measure_gemm_gflops(DType dtype, int64_t n, double seconds, Device device) {
  return measure_gemm_gflops(dtype, GemmShape{n, n, n, false, true}, seconds, device);
}

}  // namespace megatron
