// Rotary position embedding, applied in place to selected heads of a [s, b, G, P, hn] tensor.
//
// Rotate-half convention (HF Llama, Megatron rotary_interleaved=False): channel j < rot_dim/2 pairs
// with j + rot_dim/2, both rotated by angle pos * inv_freq[j], inv_freq[j] = base^(-2j/rot_dim)
// (Llama 3.1-scaled with --use-rope-scaling, or YaRN's blend: ops::rope_inv_freqs); interleaved:
// channels 2j and 2j + 1. cos and sin carry YaRN's mscale. Angles are computed in double so f32
// results match the fp64 reference to rounding.
#include <cmath>
#include <vector>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/ops.h"

namespace megatron::cpu {

void rope_inplace(Tensor& x, const Tensor& positions, const RopeSpec& spec, bool inverse) {
  MEGATRON_CHECK(x.ndim() == 5, "rope_inplace: expected x as [s, b, G, P, hn], got ", x.str());
  int64_t s = x.dim(0), b = x.dim(1), groups = x.dim(2), per = x.dim(3), hn = x.dim(4);
  int64_t rot = spec.rot_dim;
  MEGATRON_CHECK(rot > 0 && rot <= hn && rot % 2 == 0, "rope_inplace: rotary dim ", rot,
                 " must be even and in (0, ", hn, "]");
  MEGATRON_CHECK(0 <= spec.head_begin && spec.head_begin <= spec.head_end && spec.head_end <= per,
                 "rope_inplace: heads [", spec.head_begin, ", ", spec.head_end,
                 ") out of range for P = ", per);
  if (positions.defined()) check_shape(positions, {s, b}, "rope_inplace positions");
  int64_t half = rot / 2;
  const std::vector<double> inv_freq = rope_inv_freqs(spec);
  // The channel pairs: (j, j + half), or (2j, 2j + 1) interleaved.
  const int64_t step = spec.interleaved ? 2 : 1, partner = spec.interleaved ? 1 : half;
  const int64_t* pos = positions.defined() ? positions.data<int64_t>() : nullptr;
  double sign = inverse ? -1.0 : 1.0;
  cpu::dispatch_float(x, "rope_inplace", [&]<typename T>() {
    T* base_ptr = x.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < s * b; ++t) {
      const double p =
          (pos ? static_cast<double>(pos[t]) : static_cast<double>(t / b)) * spec.position_scale;
      std::vector<T> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
      for (int64_t j = 0; j < half; ++j) {
        double angle = p * inv_freq[j];
        cs[j] = static_cast<T>(spec.mscale * std::cos(angle));
        sn[j] = static_cast<T>(sign * spec.mscale * std::sin(angle));
      }
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t hp = spec.head_begin; hp < spec.head_end; ++hp) {
          T* v = base_ptr + ((t * groups + g) * per + hp) * hn;
          for (int64_t j = 0; j < half; ++j) {
            T* a = v + j * step;
            T x1 = a[0], x2 = a[partner];
            a[0] = x1 * cs[j] - x2 * sn[j];
            a[partner] = x2 * cs[j] + x1 * sn[j];
          }
        }
      }
    }
  });
}

}  // namespace megatron::cpu
