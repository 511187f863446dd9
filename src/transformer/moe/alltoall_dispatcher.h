// AllToAllPlan: Megatron's alltoall token dispatcher (MoEAlltoAllTokenDispatcher, r0.14) as a
// plan built from one rank's routing map, with the two moves every tensor of the MoE layer takes:
//
//   to_experts:   rows of this rank's (token, expert) assignments [A, c], ordered by global expert
//                 then token ("permutation 1"), all-to-all over EP with uneven splits (each EP
//                 rank gets the rows of its experts), all-gathered over ETP (each ETP rank of an
//                 expert needs all its rows), then sorted from (source, expert) to (expert,
//                 ETP source, EP source) order ("permutation 2"): the experts' input [N, c].
//   from_experts: the reverse: un-sort, reduce-scatter over ETP (summing the row-parallel
//                 partials and returning each ETP rank its rows), all-to-all back: [A, c].
//
// The MoE layer sends the tokens, the probabilities and the gradients through these; the
// split sizes are exchanged once per forward (an all-gather of the per-expert counts over EP and
// one over ETP), as Megatron's preprocess does. Results equal the allgather dispatcher's up to
// the order of the sums. Not here: the routing (TopKRouter) and the experts (GroupedExperts).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace megatron {

class AllToAllPlan {
 public:
  AllToAllPlan() = default;
  // map [T, E] (1 where token t goes to expert e), this rank's E / ep experts from first; ep and
  // etp: the expert-model- and expert-tensor-parallel groups. Collective over both.
  AllToAllPlan(const std::vector<uint8_t>& map, int64_t tokens, int64_t experts, int64_t first,
               int64_t local, ProcessGroup& ep, ProcessGroup& etp);

  // The assignments in send order: token and global expert of row a.
  const std::vector<int64_t>& send_tokens() const { return send_tokens_; }
  const std::vector<int64_t>& send_experts() const { return send_experts_; }
  const Tensor& send_index() const { return send_index_; }  // send_tokens as i64
  // Rows of each local expert in the experts' input.
  const std::vector<int64_t>& counts() const { return counts_; }

  Tensor to_experts(const Tensor& rows) const;    // [A, c] -> [N, c]
  Tensor from_experts(const Tensor& rows) const;  // [N, c] -> [A, c], ETP partials summed

 private:
  ProcessGroup* ep_ = nullptr;
  ProcessGroup* etp_ = nullptr;
  std::vector<int64_t> send_tokens_, send_experts_, counts_;
  Tensor send_index_;
  std::vector<int64_t> input_splits_, output_splits_;  // rows per EP peer, sent and received
  std::vector<int64_t> etp_rows_;                      // rows each ETP rank received over EP
  Tensor perm_;  // [N] i64: row of the ETP-gathered buffer feeding experts' row n
  int64_t gathered_ = 0;
};

}  // namespace megatron
