// Finite-difference check of one layer in fp64 (the per-layer tests of tests/transformer and
// tests/models/common).
//
// For a layer y = f(x; w) and a random output gradient dy, the loss L = sum(dy * y): backward's dx
// and every parameter's main_grad are compared with central differences of L. Dropout masks are
// a pure function of (seed, stream, element), so L is a deterministic smooth function and finite
// differences apply with dropout on.
//
// Tolerance: step 1e-6 in fp64 gives ~1e-9 truncation and rounding error on O(1) values; 1e-7
// absolute plus 1e-5 relative leaves margin without hiding a wrong term (those are O(1e-2) or
// more). Up to 40 evenly spaced elements of each tensor are checked, so a layer costs a few
// hundred forwards.
#pragma once

#include <functional>
#include <vector>

#include "parallel/param.h"

namespace megatron::testing {

// The layer under test: its parameters and y = forward(x) with a fresh context each call;
// backward(dy) runs on the context of the last forward and returns dx (undefined when the input
// is not differentiable, e.g. token ids: then only the parameters are checked).
struct LayerUnderTest {
  std::vector<Param*> params;
  std::function<Tensor(const Tensor&)> forward;
  std::function<Tensor(const Tensor&)> backward;
};

// Initialises the parameters from `seed` (norm weights and biases moved away from 1 and 0, so
// that their gradients are generic) and checks dx and every main_grad at input x.
void check_layer_gradients(LayerUnderTest layer, const Tensor& x, uint64_t seed);

}  // namespace megatron::testing
