// Bias + GELU fused, the forward of Megatron's bias-GELU fusion: fc1 runs without its bias and
// this op adds it inside the activation, one pass instead of bias_add then gelu_forward, writing
// the activation in the dtype fc2's GEMM takes (bf16 in bf16 runs: no separate rounding pass).
// The biased pre-activation is written back over fc1's output for the backward (gelu_backward and
// bias_backward on it, as without the fusion).
//
// Same bits as the unfused ops: the GELU is gelu.h's expression, y + bias the same f32 addition,
// and the 16-bit activation is rounded from the f32 one as convert() rounds it.
#include <type_traits>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/gelu.h"
#include "tensor/cpu/half_store.h"
#include "tensor/tensor.h"

namespace megatron::cpu {
namespace {

void check_args(const Tensor& out, const Tensor& y, const Tensor& bias, const char* op) {
  check_numel(out, y, op);
  MEGATRON_CHECK(bias.ndim() == 1 && y.ndim() >= 1 && y.dim(-1) == bias.dim(0), op, ": bias ",
                 bias.str(), " does not match the last dim of ", y.str());
  check_same_dtype(y, bias, op);
}

}  // namespace

void bias_gelu_forward(Tensor& out, Tensor& y, const Tensor& bias, bool tanh_approx) {
  check_args(out, y, bias, "bias_gelu_forward");
  dispatch_float(y, "bias_gelu_forward", [&]<typename T>() {
    dispatch_out<T>(out, "bias_gelu_forward", [&]<typename O>() {
      T* in = y.data<T>();
      const T* b = bias.data<T>();
      StoredAs<O>* o = stored_ptr(out.data<O>());
      const int64_t rows = rows_of(y), c = bias.dim(0);
      auto run = [&]<bool Tanh>() {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
          T* yr = in + r * c;
          StoredAs<O>* orow = o + r * c;
#pragma omp simd
          for (int64_t j = 0; j < c; ++j) {
            const T pre = yr[j] + b[j];
            yr[j] = pre;
            orow[j] = stored_value<O>(gelu_of<Tanh>(pre));
          }
        }
      };
      if (tanh_approx) {
        run.template operator()<true>();
      } else {
        run.template operator()<false>();
      }
    });
  });
}

}  // namespace megatron::cpu
