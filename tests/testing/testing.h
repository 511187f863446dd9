// Test helpers shared by every test binary.
//
// expect_allclose compares element by element with |got - want| <= atol + rtol * |want| and, on
// failure, reports the max absolute and relative error and the worst index, so a failing
// tolerance says by how much it failed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace megatron::testing {

struct CloseReport {
  bool ok = true;
  double max_abs = 0, max_rel = 0;
  int64_t worst = -1;
  std::string message;
};

CloseReport compare(const Tensor& got, const Tensor& want, double atol, double rtol);

// GoogleTest assertion form: EXPECT_TRUE(allclose(got, want, atol, rtol)).
::testing::AssertionResult allclose(const Tensor& got, const Tensor& want, double atol,
                                    double rtol);

// Normalised mean squared error sum((got - want)^2) / sum(want^2) of two host tensors.
double nmse(const Tensor& got, const Tensor& want);

// Deterministic uniform(-scale, scale) tensor of the given dtype (f32 values rounded to dtype).
Tensor random_tensor(const Shape& shape, uint64_t seed, double scale = 1.0,
                     DType dtype = DType::kF32);

// Random token ids in [0, vocab) as int64.
Tensor random_ids(const Shape& shape, uint64_t seed, int64_t vocab);

// The numerical gradient of L(x) = sum(dout * f(x)) with respect to x (f64), by central
// differences with step 1e-6: accurate to about 1e-8 on smooth functions of O(1) inputs.
Tensor fd_grad(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const Tensor& dout);

// Path of a scratch directory unique to this name and the running test case (created, emptied).
std::string scratch_dir(const std::string& name);

}  // namespace megatron::testing
