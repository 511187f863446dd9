// TensorParallelContext: what a transformer layer needs to know about how its work is split: the
// TP group it splits its heads and features over, whether its activations outside the attention
// and MLP are split along the sequence (--sequence-parallel), and the context-parallel group
// that holds the rest of the sequence (--context-parallel-size; parallel/context_parallel.h). A
// size-1 group (no tensor parallelism) and no CP group make every layer the plain
// single-process layer.
#pragma once

#include "comm/process_group.h"
#include "parallel/context_parallel.h"

namespace megatron {

struct TensorParallelContext {
  ProcessGroup* group = nullptr;   // never null inside a model; outlives the layers
  bool sequence_parallel = false;  // only meaningful with group->size() > 1
  ContextParallelContext cp = {};  // this rank's chunks of the sequence; none by default

  int size() const { return group->size(); }
  int rank() const { return group->rank(); }
  bool sp() const { return sequence_parallel && size() > 1; }
};

}  // namespace megatron
