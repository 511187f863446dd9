// Megatron's masked orthogonal rank groups over the tp-cp-ep-dp-pp grid.
#include "comm/rank_generator.h"

#include <algorithm>

#include "core/error.h"

namespace megatron {

namespace {

// Strides of a mixed-radix number whose first digit is the least significant.
std::vector<int> prefix_product(const std::vector<int>& shape) {
  std::vector<int> stride(shape.size());
  int p = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    stride[i] = p;
    p *= shape[i];
  }
  return stride;
}

std::vector<std::string> split_axes(std::string_view s) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (true) {
    size_t end = s.find('-', begin);
    out.emplace_back(
        s.substr(begin, end == std::string_view::npos ? s.size() - begin : end - begin));
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  return out;
}

}  // namespace

RankGroups masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                         const std::vector<bool>& mask) {
  MEGATRON_CHECK(parallel_size.size() == mask.size(),
                 "masked_orthogonal_rank_groups: ", parallel_size.size(), " sizes but ",
                 mask.size(), " mask entries");
  int64_t product = 1;
  for (int s : parallel_size) {
    MEGATRON_CHECK(s >= 1, "masked_orthogonal_rank_groups: every size must be >= 1, got ", s);
    product *= s;
  }
  MEGATRON_CHECK(product == world_size, "masked_orthogonal_rank_groups: the sizes multiply to ",
                 product, " but the world has ", world_size, " ranks");

  // Split the axes into those the groups span (masked) and those that tell groups apart.
  std::vector<int> global_stride = prefix_product(parallel_size);
  std::vector<int> masked_shape, masked_stride, unmasked_shape, unmasked_stride;
  for (size_t i = 0; i < mask.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(parallel_size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  int group_size = 1;
  for (int s : masked_shape) group_size *= s;
  int num_groups = world_size / group_size;

  // Digit i of `index` in the mixed radix `shape` (first digit least significant), dotted with
  // the global strides of those axes: the rank offset the digits stand for.
  auto offset = [](int index, const std::vector<int>& shape, const std::vector<int>& stride) {
    int r = 0;
    for (size_t i = 0; i < shape.size(); ++i) {
      r += (index % shape[i]) * stride[i];
      index /= shape[i];
    }
    return r;
  };

  RankGroups groups(num_groups, std::vector<int>(group_size));
  for (int g = 0; g < num_groups; ++g) {
    int base = offset(g, unmasked_shape, unmasked_stride);
    for (int k = 0; k < group_size; ++k)
      groups[g][k] = base + offset(k, masked_shape, masked_stride);
  }
  return groups;
}

RankGenerator::RankGenerator(const ParallelGrid& grid, std::string_view order) {
  const std::vector<std::pair<std::string, int>> known = {
      {"tp", grid.tp}, {"cp", grid.cp}, {"ep", grid.ep}, {"dp", grid.dp}, {"pp", grid.pp}};
  for (const auto& [name, size] : known) {
    MEGATRON_CHECK(size >= 1, "RankGenerator: the ", name, " size must be >= 1, got ", size);
  }
  // Megatron keeps cp in the dense grid and ep in the expert grid; one grid never has both.
  MEGATRON_CHECK(grid.ep == 1 || grid.cp == 1, "RankGenerator: ep (", grid.ep, ") and cp (",
                 grid.cp,
                 ") cannot both exceed 1 in one grid: cp belongs to the dense grid, ep "
                 "to the expert grid");

  axes_ = split_axes(order);
  for (const std::string& a : axes_) {
    bool ok = std::any_of(known.begin(), known.end(), [&](const auto& k) { return k.first == a; });
    MEGATRON_CHECK(ok, "RankGenerator: unknown axis '", a, "' in order '", order,
                   "'; axes are tp, cp, ep, dp, pp");
    MEGATRON_CHECK(std::count(axes_.begin(), axes_.end(), a) == 1, "RankGenerator: axis '", a,
                   "' appears twice in order '", order, "'");
  }
  for (const auto& [name, size] : known) {
    if (std::find(axes_.begin(), axes_.end(), name) != axes_.end()) continue;
    MEGATRON_CHECK(size == 1, "RankGenerator: the ", name, " size is ", size, " but the order '",
                   order, "' does not name it");
    axes_.push_back(name);  // a size-1 axis goes anywhere; Megatron appends it
  }
  order_.clear();
  for (const std::string& a : axes_) {
    if (!order_.empty()) order_ += '-';
    order_ += a;
    int size = std::find_if(known.begin(), known.end(), [&](const auto& k) {
                 return k.first == a;
               })->second;
    sizes_.push_back(size);
    world_size_ *= size;
  }
}

RankGroups RankGenerator::get_ranks(std::string_view token) const {
  std::vector<bool> mask(axes_.size(), false);
  for (const std::string& t : split_axes(token)) {
    auto it = std::find(axes_.begin(), axes_.end(), t);
    MEGATRON_CHECK(it != axes_.end(), "RankGenerator: unknown axis '", t, "' in '", token,
                   "'; axes are ", order_);
    mask[it - axes_.begin()] = true;
  }
  return masked_orthogonal_rank_groups(world_size_, sizes_, mask);
}

int RankGenerator::coordinate(int rank, std::string_view axis) const {
  MEGATRON_CHECK(0 <= rank && rank < world_size_, "RankGenerator: rank ", rank,
                 " is outside the world of ", world_size_);
  int stride = 1;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i] == axis) return (rank / stride) % sizes_[i];
    stride *= sizes_[i];
  }
  MEGATRON_CHECK(false, "RankGenerator: unknown axis '", axis, "'; axes are ", order_);
  return 0;
}

std::vector<int> embedding_ranks(const std::vector<int>& pipeline_ranks) {
  MEGATRON_CHECK(!pipeline_ranks.empty(), "embedding_ranks: empty pipeline group");
  if (pipeline_ranks.size() == 1) return {pipeline_ranks.front()};
  return {pipeline_ranks.front(), pipeline_ranks.back()};
}

RankGroups embedding_rank_groups(const RankGroups& pipeline_groups) {
  RankGroups out;
  out.reserve(pipeline_groups.size());
  for (const auto& g : pipeline_groups) out.push_back(embedding_ranks(g));
  return out;
}

}  // namespace megatron
