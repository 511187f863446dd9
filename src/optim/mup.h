// Maximal Update Parameterization's parameter classes for the optimizer (--use-mup; Megatron core
// 0.19's get_mup_config_overrides): which parameters take the width-scaled rate.
//
// With width multiplier m, Adam (and Lion, Muon's Adam part) runs the hidden matrices at lr / m
// (Adam: eps / m too); SGD runs the vectors and the embeddings at lr m. Megatron's classes: a
// parameter of the embeddings (word, position, token type) or the output layer is embedding
// class; a vector has at most one dimension (in Megatron's shapes, Param::megatron_ndim); the
// rest is hidden (Mamba's 3-D convolution, the router, the shared experts' gate included). Under
// Muon the matrices it orthogonalises keep the base rate (Megatron leaves the layer-wise
// optimizer's parameters out of the overrides).
#pragma once

#include <string>
#include <vector>

#include "parallel/param.h"

namespace megatron {

// Sets Param::mup_class of every parameter for `optimizer` (adam, sgd, muon, lion, ...).
void assign_mup_classes(const std::vector<Param*>& params, const std::string& optimizer);

}  // namespace megatron
