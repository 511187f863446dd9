// The planner's view of a run's own flags: its layout and workload (`megatron plan --evaluate`
// and the trainer's start-up prediction of its step time and memory), and the line that puts
// the prediction beside what the run measured.
#pragma once

#include <string>

#include "models/model_spec.h"
#include "plan/cost_model.h"
#include "train/arguments.h"

namespace megatron {

// The layout the flags describe on `world` ranks (virtual stages from either VPP flag, expert
// tensor parallelism defaulting to tp, the sharding from the optimizer and FSDP flags).
plan::Layout layout_from_args(const Arguments& a, int64_t world);
// The inverse: the layout's degrees, recomputation (full: uniform, one layer per chunk) and
// sharding written into the flags (a Megatron-FSDP layout as --use-megatron-fsdp with its
// strategy).
void apply_layout_to_args(const plan::Layout& l, Arguments& a);
// The workload of the flags: the model config, global batch, Megatron's model FLOPs.
// Bytes of the optimizer state per parameter in the distributed optimizer's storage (Adam's two
// moments: 8 in fp32, --exp-avg-dtype / --exp-avg-sq-dtype of the precision-aware optimizer;
// SGD's momentum buffer: 4, 0 without momentum).
double moment_bytes_from_args(const Arguments& a);
plan::Workload workload_from_args(const Arguments& a, const TransformerConfig& cfg,
                                  const ModelSpec& spec, plan::ActivationRuntime runtime);

// "planner: step X ms (compute ..., communication ..., bubble ..., data-parallel ...), peak
// memory Y MB per rank (weights and optimizer ..., activations ...)".
std::string prediction_line(const plan::Prediction& p);
// The prediction beside the measured step time (seconds per iteration) and peak resident MB.
std::string prediction_check_line(const plan::Prediction& p, double step_seconds,
                                  double max_resident_mb);

}  // namespace megatron
