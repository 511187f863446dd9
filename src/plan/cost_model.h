// CostModel: the predicted memory and step time of one layout, from the model's shapes, the
// cluster's rates and the layout's degrees. Pure arithmetic; no tensor is allocated.
//
// Time of an iteration on the slowest pipeline stage (Calculon's and SimuMax's structure):
//   per micro-batch and stage, each layer's GEMMs (forward NT, input-gradient NN, weight-gradient
//   TN, at the device's size-dependent efficiency or measured rate), core attention (FLOPs at the
//   fused-attention rate, causal half skipped where the kernel does; unfused scores add their
//   bytes), elementwise work (bytes / memory bandwidth), tensor-parallel collectives (4
//   all-reduces, or with sequence parallelism 4 all-gathers + reduce-scatters forward and 6
//   backward), context-parallel KV exchange (hidden behind the attention it overlaps), expert
//   all-to-alls; recomputation adds a forward (full) or the core attention (selective);
//   pipeline: m micro-batches of the slowest stage plus the bubble (pp - 1) / vpp of a stage's
//   time, and a send/receive per micro-batch and chunk boundary; then the data-parallel gradient
//   reduction (exposed: all of it, or with --overlap-grad-reduce what the last micro-batch's
//   backward does not hide), the optimizer's passes over its shard (bytes / bandwidth) and the
//   cluster's fixed per-iteration overhead. A collective of n ranks moving S bytes takes
//   steps x latency + volume x S / (bandwidth x efficiency): all-reduce 2(n-1)/n S, all-gather and
//   reduce-scatter (n-1)/n S, all-to-all (n-1)/n S, a group inside one node on the node's
//   fabric, one spanning nodes on each device's network link.
//
// Memory of the most loaded rank: parameters by kind (tensor-parallel, expert, replicated,
// embeddings on the first and last stages) times the bytes per parameter of the precision and
// sharding (memory_model.h), activations per micro-batch times the micro-batches the schedule
// keeps in flight (1F1B: pp - rank; interleaved: its warm-up + 1 chunks), the runtime's resident
// bytes and the allocator's fragmentation share.
#pragma once

#include <cstdint>
#include <string>

#include "plan/cluster.h"
#include "plan/layout.h"
#include "transformer/config.h"

namespace megatron::plan {

// How activations are kept, which decides the activation estimate: Megatron's GPU runtime
// (Korthikanti et al.'s per-layer bytes with 16-bit tensors, generalised to GQA, gated MLPs, CP
// and MoE), or this project's CPU runtime (models/gpt/gpt_memory.h, exact for its layers).
enum class ActivationRuntime : uint8_t { kMegatron, kThisProject };

struct Workload {
  TransformerConfig config;  // finalized; compute_dtype, fp8 and recomputation are the layout's
  int64_t global_batch = 1;
  double model_flops = 0;  // Megatron's model FLOPs per iteration (the MFU numerator)
  ActivationRuntime runtime = ActivationRuntime::kMegatron;
  bool grad_reduce_in_bf16 = false;  // --grad-reduce-in-bf16
  // Bytes of the two Adam moments per parameter where the distributed optimizer keeps them: 8
  // in fp32, fewer with --exp-avg-dtype / --exp-avg-sq-dtype (the precision-aware optimizer);
  // SGD's momentum buffer 4, nothing without momentum (--optimizer sgd).
  double moment_bytes = 8.0;
  // The same where the plain optimizer keeps them (unsharded layouts: always fp32).
  double plain_moment_bytes = 8.0;
  // Bytes the optimizer step moves per element of its shard: Adam's 42 (see predict); SGD's
  // 8 fewer per fp32 state it lacks.
  double optimizer_traffic_bytes = 42.0;
  // Megatron's emerging optimizers (--optimizer muon or lion, the plain optimizer): the state
  // bytes of the split weights (dense layers and experts: the matrices, one fp32 state) and of
  // the rest (replicated weights, embeddings: Adam's two, Lion's one), mixed per stage as each
  // rank holds them; the moment_bytes fields are then unused. (MLA's replicated down
  // projections and learned position embeddings are matrices priced as the rest, the 1-D
  // attention sinks and the split weights' biases the other way round.)
  bool emerging = false;
  double matrix_state_bytes = 4.0, other_state_bytes = 8.0;
};

// Parameters on one rank, by how they are split.
struct RankParams {
  double dense = 0;       // tensor-parallel weights (already / tp)
  double expert = 0;      // routed experts (already / (ep x etp))
  double replicated = 0;  // norms, routers, row-parallel biases, position embeddings
  double embedding = 0;   // word embeddings and the untied output layer (already / tp)
  double total() const { return dense + expert + replicated + embedding; }
};

struct Prediction {
  // Seconds per iteration and its parts (exposed time only).
  double step = 0;
  double compute = 0;  // GEMMs, attention, elementwise and recomputation of every micro-batch
  double gemm = 0, attention = 0, elementwise = 0;  // the layers' share of compute, by kind
  double ends = 0;                                  // embedding, output layer and cross entropy
  double tp_comm = 0;                               // tensor-parallel collectives
  double cp_comm = 0;    // context-parallel KV exchange not hidden by attention
  double ep_comm = 0;    // expert all-to-alls
  double pp_comm = 0;    // pipeline sends and receives
  double bubble = 0;     // pipeline fill and drain
  double dp_comm = 0;    // gradient reduction and parameter gathers not hidden
  double optimizer = 0;  // optimizer step and gradient norm
  double overhead = 0;   // the cluster's fixed per-iteration time
  // Bytes on the most loaded rank.
  RankParams params;
  double weight_and_optimizer_bytes = 0;
  double activation_bytes = 0;
  double runtime_bytes = 0;  // the runtime's resident bytes + fragmentation
  double total_bytes = 0;
  int most_loaded_stage = 0;
  // Throughput by the workload's model FLOPs.
  double tflops_per_device = 0;
  double mfu = 0;
  double tokens_per_second = 0;
};

// Parameters held by a rank of pipeline stage `stage` (all its virtual chunks).
RankParams rank_params(const TransformerConfig& cfg, const Layout& l, int64_t stage);

// The micro-batch forwards (chunks, with virtual stages) that pipeline stage `stage` of pp holds
// at once under its schedule with m micro-batches: 1 without pipelining, 1F1B's warm-up + 1,
// interleaved 1F1B's warm-up + 1 chunks.
int in_flight_microbatches(int64_t pp, int64_t vpp, int64_t stage, int64_t m, int64_t group = 0);

// The memory part of the prediction alone (its bytes fields and most_loaded_stage, params):
// arithmetic on the shapes and the device's runtime bytes, no rates.
void predict_memory(const Workload& w, const Layout& layout, const Device& device, Prediction* out);

// The prediction for `layout` (assumed valid: planner.h checks the rules).
Prediction predict(const Workload& w, const Layout& layout, const Cluster& cluster);

}  // namespace megatron::plan
