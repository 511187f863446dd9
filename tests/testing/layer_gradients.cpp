// check_layer_gradients: central differences of sum(dy * f(x; w)) against backward.
#include "testing/layer_gradients.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>

#include "tensor/ops.h"
#include "testing/testing.h"

namespace megatron::testing {
namespace {
double loss_of(const Tensor& y, const Tensor& dy) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += y.item(i) * dy.item(i);
  return s;
}
}  // namespace

void check_layer_gradients(LayerUnderTest layer, const Tensor& x_in, uint64_t seed) {
  // A few hundred forwards of a few hundred elements each: every OpenMP region would cost a
  // barrier and no speed, and where two such tests share two cores (ctest -j2) each barrier
  // waits for a descheduled thread: minutes instead of a second on a busy machine.
  struct OneThread {
    int before = omp_get_max_threads();
    OneThread() { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(before); }
  } one_thread;
  ParamSet params(layer.params, DType::kF64);
  params.initialize(seed);
  for (Param* p : params.params()) {
    if (p->init != Init::kNormal) {
      ops::add_inplace(p->main, random_tensor(p->shape, stable_hash(p->name), 0.3, DType::kF64));
    }
  }
  params.sync_compute_from_main();
  Tensor x = x_in.clone();
  const Tensor y = layer.forward(x);
  const Tensor dy = random_tensor(y.shape(), seed + 2, 1.0, DType::kF64);
  params.zero_grads();
  const Tensor dx = layer.backward(dy);

  const double h = 1e-6;
  auto check = [&](double* w, int64_t n, const Tensor& got, const std::string& what) {
    const int64_t step = std::max<int64_t>(1, n / 40);
    for (int64_t i = 0; i < n; i += step) {
      const double orig = w[i];
      w[i] = orig + h;
      params.sync_compute_from_main();
      const double lp = loss_of(layer.forward(x), dy);
      w[i] = orig - h;
      params.sync_compute_from_main();
      const double lm = loss_of(layer.forward(x), dy);
      w[i] = orig;
      params.sync_compute_from_main();
      const double fd = (lp - lm) / (2 * h);
      ASSERT_NEAR(got.item(i), fd, 1e-7 + 1e-5 * std::fabs(fd)) << what << " element " << i;
    }
  };
  if (x.dtype() == DType::kF64) {
    ASSERT_TRUE(dx.defined()) << "backward returned no input gradient";
    check(x.data<double>(), x.numel(), dx, "dx");
  }
  ASSERT_FALSE(params.params().empty());
  for (Param* p : params.params())
    check(p->main.data<double>(), p->main.numel(), p->main_grad, p->name);
}

}  // namespace megatron::testing
