// TensorParallelContext: what a transformer layer needs to know about tensor parallelism: the TP
// group it splits its heads and features over, and whether its activations outside the
// attention and MLP are split along the sequence (--sequence-parallel). A size-1 group (no
// tensor parallelism) makes every layer the plain single-process layer.
#pragma once

#include "comm/process_group.h"

namespace megatron {

struct TensorParallelContext {
  ProcessGroup* group = nullptr;   // never null inside a model; outlives the layers
  bool sequence_parallel = false;  // only meaningful with group->size() > 1

  int size() const { return group->size(); }
  int rank() const { return group->rank(); }
  bool sp() const { return sequence_parallel && size() > 1; }
};

}  // namespace megatron
