// Context parallelism (Megatron's --context-parallel-size): every sequence split over a group of
// ranks, so that activation memory per rank falls with the group size.
//
// The split is Megatron's load-balanced one (get_batch_on_this_cp_rank): the sequence of S
// tokens is cut into 2 cp chunks of c = S / (2 cp); rank r holds chunks r and 2 cp - 1 - r, in
// that order, as its local sequence of 2c rows. Under a causal mask chunk r is cheap and chunk
// 2 cp - 1 - r expensive, so every rank does the same work.
//
// Everything but attention is token-local. Attention of the local queries over the keys of the
// whole sequence runs block by block (one local query chunk against one key chunk, each at its
// global positions through AttentionSpec's offsets, so causal and document masks are the
// single-process ones) and the blocks' results merge exactly through their log-sum-exps
// (ops::attention_merge). The key/value chunks reach every rank by one of:
//   p2p        a ring: at step i a rank holds the K, V of rank r - i while the next step's block
//              is already in flight (TE's AttnFuncWithCPAndKVP2P); backward sends the K, V
//              round again with their accumulated dK, dV, which end on their owner;
//   allgather  one all-gather of K and V (the Llama 3 scheme); backward reduce-scatters dK, dV;
//   a2a        all-to-all from sequence-split/all-heads to whole-sequence/heads-split (Ulysses),
//              ordinary attention, all-to-all back; needs the query groups on a TP rank
//              divisible by cp;
//   a2a+p2p    hierarchical (--hierarchical-context-parallel-sizes A P, cp = A P): all-to-all
//              over heads inside each inner group of A adjacent CP ranks, then the ring over the
//              outer group of the P ranks of equal inner index, then all-to-all back; needs the
//              query groups on a TP rank divisible by A.
// p2p and allgather visit the blocks in the same order, so their forwards agree bit for bit.
// Attention dropout draws the single-process masks (counters over the global positions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "tensor/ops.h"

namespace megatron {

enum class CpCommType { kP2P, kAllGather, kA2A, kA2AP2P };
// "p2p", "allgather", "a2a", "a2a+p2p"; the parse throws naming --cp-comm-type for anything else.
const char* cp_comm_type_name(CpCommType t);
CpCommType parse_cp_comm_type(const std::string& s);

struct ContextParallelContext {
  ProcessGroup* group = nullptr;  // null or a group of one: no context parallelism
  CpCommType comm = CpCommType::kP2P;
  // a2a+p2p: this rank's inner group (A adjacent CP ranks) and outer ring (the P CP ranks with
  // its inner index); CP rank r is inner rank r % A of inner group r / A.
  ProcessGroup* inner = nullptr;
  ProcessGroup* outer = nullptr;
  // One comm type per layer (--cp-comm-type with a value per layer); empty: `comm` everywhere.
  std::vector<CpCommType> layer_comm = {};

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool enabled() const { return size() > 1; }
  // The context of layer `layer` (its comm type from layer_comm when given; layers past the list,
  // multi-token prediction's, take its last entry).
  ContextParallelContext for_layer(int64_t layer) const;
  // Global position of row t of this rank's local sequence of `local` rows.
  int64_t global_row(int64_t t, int64_t local) const;
};

// The local part of a [b, S] batch field (any dtype): columns of chunks r and 2 cp - 1 - r, as
// [b, 2c]. S must be divisible by 2 cp.
Tensor cp_local_columns(const Tensor& field, const ContextParallelContext& cp);
// The global positions of the local sequence, [local, b] i64 (RoPE's positions).
Tensor cp_positions(int64_t local, int64_t b, const ContextParallelContext& cp);

// Ulysses' all-to-all, also Mamba's (Megatron's _all_to_all_cp2hp with the load balancing
// undone): x [L, b, G, X], this rank's L rows of every one of G groups of X elements, ->
// [cp L, b, G/cp, X], every rank's rows in sequence order for this rank's groups
// [r G/cp, (r + 1) G/cp). G must be divisible by the CP size.
Tensor cp_rows_to_groups(const Tensor& x, int64_t G, int64_t X, const ContextParallelContext& cp);
// The whole sequence's document starts [b, S] in sequence order from this rank's local [b, 2c]
// ones (collective over the CP group).
Tensor cp_whole_doc_start(const Tensor& local, const ContextParallelContext& cp);
// Its inverse (_all_to_all_hp2cp with the load balancing redone): [cp L, b, G/cp, X] ->
// [L, b, G, X].
Tensor cp_groups_to_rows(const Tensor& full, int64_t G, int64_t X,
                         const ContextParallelContext& cp);

// Attention of the local queries over the whole sequence. qkv: this rank's packed QKV
// [2c, b, ng, qpg + 2, hn] (Megatron's per-group packing, as SelfAttention holds it); out
// [2c, b, ng qpg, hn] and lse [b, ng qpg, 2c] as ops::attention_forward writes them; spec: the
// local spec (scale, causal, dropout, head offset; doc_start [b, 2c] of global positions, or
// undefined). Key padding and an additive bias are not supported under context parallelism.
void cp_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv,
                          const ops::AttentionSpec& spec, const ContextParallelContext& cp);
// dqkv (written, packed like qkv) from dout [2c, b, np, hn] and forward's out and lse.
void cp_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                           const Tensor& lse, const ops::AttentionSpec& spec,
                           const ContextParallelContext& cp);

}  // namespace megatron
