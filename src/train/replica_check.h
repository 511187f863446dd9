// Megatron's --check-weight-hash-across-dp-replicas-interval: every data-parallel replica of a
// parameter must hold the same bits. The replicas train on different data but apply the same
// reduced gradients, so a difference means silent data corruption (a flipped bit in memory or on
// a link) or a reduction that is not deterministic, and the run is no longer the model it claims
// to be.
//
// Each rank hashes (XXH3-64) the compute weights of every parameter it holds and all-gathers the
// hashes over the ranks that hold the same weights: the data x context parallel group for dense
// parameters, the expert data-parallel group for experts (Megatron's data-parallel and
// expert-data-parallel groups). Every rank sees every hash, so all of them reach the same verdict.
// Not for Megatron-FSDP's optim_grads_params, whose ranks hold different shards (refused there,
// as in Megatron).
#pragma once

#include <string>
#include <vector>

#include "comm/process_group.h"
#include "parallel/param.h"

namespace megatron {

// "NAME: ranks 1, 3 of its data-parallel group differ from rank 0" ("rank 1 ... differs"), one
// line per parameter that
// differs somewhere; the same on every rank of both groups; empty when all replicas match.
// Collective over `dense` and `expert`.
std::vector<std::string> replica_weight_mismatches(const std::vector<Param*>& params,
                                                   ProcessGroup& dense, ProcessGroup& expert);

}  // namespace megatron
