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

// How an MoE layer's experts are split (Megatron's expert grid, "tp-ep-dp-pp" with expert TP):
// EP ranks hold disjoint experts, ETP ranks split each expert's features, and the dispatcher
// exchanges tokens over their product group. Null groups: the dense TP group for all three
// roles' defaults (EP 1, ETP = TP), see TensorParallelContext::with_default_experts.
struct ExpertParallelContext {
  ProcessGroup* tp_ep = nullptr;  // ETP x EP: the dispatcher's group
  ProcessGroup* etp = nullptr;    // expert tensor parallel
  ProcessGroup* ep = nullptr;     // expert model parallel (null: EP 1)
  int ep_rank = 0, ep_size = 1;
};

struct TensorParallelContext {
  ProcessGroup* group = nullptr;      // never null inside a model; outlives the layers
  bool sequence_parallel = false;     // only meaningful with group->size() > 1
  ContextParallelContext cp = {};     // this rank's chunks of the sequence; none by default
  ExpertParallelContext expert = {};  // MoE layers' expert split; default: EP 1, ETP = TP
  // FP8 delayed scaling's amax reduction group (TP x DP x CP of this stage); null: none.
  ProcessGroup* amax = nullptr;

  int size() const { return group->size(); }
  int rank() const { return group->rank(); }
  bool sp() const { return sequence_parallel && size() > 1; }
  // The expert groups, with the dense TP group where none was given (EP 1, ETP = TP).
  TensorParallelContext with_default_experts() const {
    TensorParallelContext t = *this;
    if (!t.expert.tp_ep) t.expert.tp_ep = group;
    if (!t.expert.etp) t.expert.etp = group;
    return t;
  }
};

}  // namespace megatron
