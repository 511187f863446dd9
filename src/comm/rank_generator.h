// RankGenerator: Megatron's rank math for hybrid parallelism, as pure functions.
//
// The world is a grid of tp x cp x ep x dp x pp ranks laid out in the order "tp-cp-ep-dp-pp":
// the first axis varies fastest, so global_rank = tp_rank + tp * (cp_rank + cp * (... )). A group
// of a "token" (e.g. "dp", or "tp-pp" for model parallel) is the set of ranks that share every
// coordinate NOT named by the token; inside a group ranks are ordered by the named coordinates,
// first axis fastest. This reproduces Megatron-LM's `RankGenerator.get_ranks` and
// `generate_masked_orthogonal_rank_groups` group for group and rank for rank, including the order
// of the groups, so a layout means the same ranks here as there.
//
// Worked example (Megatron's parallel_state.py docstring): 16 ranks, tp 2, pp 4, dp 2:
//   tp groups: [0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]
//   dp groups: [0,2] [1,3] [4,6] [5,7] [8,10] [9,11] [12,14] [13,15]
//   pp groups: [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]
//
// This file creates no communicators and knows nothing about MPI: ParallelState turns these lists
// into process groups.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace megatron {

using RankGroups = std::vector<std::vector<int>>;

// Megatron's generate_masked_orthogonal_rank_groups: the grid has axes of `parallel_size`
// (first fastest); groups span the axes where mask[i] is true. Returns world / group_size
// groups, each ordered by the masked coordinates.
RankGroups masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                         const std::vector<bool>& mask);

// Sizes of the five parallel axes. Designated initialisers read well:
// RankGenerator({.tp = 2, .dp = 2, .pp = 4}).
struct ParallelGrid {
  int tp = 1;  // tensor model parallel
  int cp = 1;  // context parallel
  int ep = 1;  // expert model parallel (only in the expert grid, where cp must be 1)
  int dp = 1;  // data parallel
  int pp = 1;  // pipeline model parallel
};

// The order Megatron uses by default (tp fastest, pp slowest).
inline constexpr std::string_view kDefaultRankOrder = "tp-cp-ep-dp-pp";

class RankGenerator {
 public:
  // `order` names axes separated by '-'. As in Megatron, axes of size 1 may be left out (they are
  // appended), an axis of size > 1 must appear, and ep and cp cannot both exceed 1 (the dense grid
  // carries cp, the expert grid ep). Throws InvalidArgument otherwise.
  explicit RankGenerator(const ParallelGrid& grid, std::string_view order = kDefaultRankOrder);

  int world_size() const { return world_size_; }
  // The full order after appending the omitted size-1 axes, e.g. "tp-dp-pp-cp-ep".
  const std::string& order() const { return order_; }

  // Groups spanning the axes named in `token` ("tp", "dp", "tp-pp", "dp-cp", ...; the order of
  // names inside the token does not matter). Throws InvalidArgument on an unknown axis name.
  RankGroups get_ranks(std::string_view token) const;

  // This rank's coordinate along `axis` ("tp", "dp", ...).
  int coordinate(int rank, std::string_view axis) const;

 private:
  std::vector<std::string> axes_;  // in order, first fastest
  std::vector<int> sizes_;         // size of each axis in axes_
  std::string order_;
  int world_size_ = 1;
};

// Megatron's default_embedding_ranks: the ranks of one pipeline group holding the word
// embeddings, its first and last stage ([first] alone when pp is 1).
std::vector<int> embedding_ranks(const std::vector<int>& pipeline_ranks);

// embedding_ranks of every pipeline group, in the order of `pipeline_groups`.
RankGroups embedding_rank_groups(const RankGroups& pipeline_groups);

}  // namespace megatron
