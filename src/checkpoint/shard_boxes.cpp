// Shard boxes: decomposing a local flat range into global boxes, and copying between boxes.
#include "checkpoint/shard_boxes.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace megatron::checkpoint {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

namespace {

// A local run viewed as rows x cols of the local tensor (1-D tensors are [n, 1]).
struct LocalBox {
  int64_t row = 0, col = 0, rows = 0, cols = 0;
};

// Maps a local box that lies inside one block (of the partition dim) to the global box.
Box to_global(const Param& p, const LocalBox& lb, bool one_dim) {
  int64_t row = lb.row, col = lb.col;
  if (p.is_tensor_parallel()) {
    int64_t& at = p.tp_partition_dim == 0 ? row : col;
    at = p.full_partition_position(at);
  }
  if (one_dim) return Box{{row}, {lb.rows}};
  return Box{{row, col}, {lb.rows, lb.cols}};
}

}  // namespace

std::vector<Piece> shard_pieces(const Param& p, int64_t begin, int64_t numel) {
  const int nd = p.shape.ndim();
  MEGATRON_ASSERT(nd == 1 || nd == 2, "checkpoint shards of ", nd, "-dimensional tensors (", p.name,
                  ")");
  const int64_t total = p.shape.numel();
  MEGATRON_ASSERT(begin >= 0 && numel >= 0 && begin + numel <= total, "range [", begin, ", ",
                  begin + numel, ") outside ", p.name, " (", total, " elements)");
  const bool one_dim = nd == 1;
  const int64_t rows = p.shape[0], cols = one_dim ? 1 : p.shape[1];
  // A stride > 1 on the last dim of a matrix would cut rows into pieces that are not contiguous.
  MEGATRON_ASSERT(!p.is_tensor_parallel() || p.tp_partition_dim == 0 ||
                      (p.tp_partition_stride == 1 && p.tp_partition_sections.empty()),
                  "partition stride ", p.tp_partition_stride, " on dim ", p.tp_partition_dim,
                  " of ", p.name);
  // Rows where a new stride block or section starts (partition dim 0 only).
  const bool blocked = p.is_tensor_parallel() && p.tp_partition_dim == 0;
  auto block_end = [&](int64_t r) { return blocked ? p.local_block_end(r) : rows; };

  // Row-wise runs: [partial first row][whole rows][partial last row].
  std::vector<LocalBox> runs;
  int64_t at = begin;
  const int64_t end = begin + numel;
  while (at < end) {
    const int64_t r = at / cols, c = at % cols;
    if (c != 0 || end - at < cols) {
      const int64_t n = std::min(cols - c, end - at);
      runs.push_back({r, c, 1, n});
      at += n;
    } else {
      // Whole rows up to the end of the range or of the stride block, whichever comes first.
      const int64_t last = std::min(end / cols, block_end(r));
      runs.push_back({r, 0, last - r, cols});
      at = last * cols;
    }
  }
  std::vector<Piece> pieces;
  for (const LocalBox& lb : runs) {
    pieces.push_back({lb.row * cols + lb.col, to_global(p, lb, one_dim)});
  }
  return pieces;
}

Box intersect(const Box& a, const Box& b) {
  MEGATRON_ASSERT(a.offset.size() == b.offset.size(), "boxes of different ranks");
  Box r;
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    r.offset.push_back(lo);
    r.extent.push_back(std::max<int64_t>(0, hi - lo));
  }
  return r;
}

void copy_region(const float* src, const Box& src_box, float* dst, const Box& dst_box,
                 const Box& region) {
  const size_t nd = region.offset.size();
  MEGATRON_ASSERT(nd == 1 || nd == 2, "copy_region of ", nd, "-dimensional boxes");
  if (region.numel() == 0) return;
  if (nd == 1) {
    std::memcpy(dst + (region.offset[0] - dst_box.offset[0]),
                src + (region.offset[0] - src_box.offset[0]),
                static_cast<size_t>(region.extent[0]) * sizeof(float));
    return;
  }
  const int64_t src_cols = src_box.extent[1], dst_cols = dst_box.extent[1];
  for (int64_t r = 0; r < region.extent[0]; ++r) {
    const int64_t row = region.offset[0] + r;
    std::memcpy(dst + (row - dst_box.offset[0]) * dst_cols + (region.offset[1] - dst_box.offset[1]),
                src + (row - src_box.offset[0]) * src_cols + (region.offset[1] - src_box.offset[1]),
                static_cast<size_t>(region.extent[1]) * sizeof(float));
  }
}

std::string offset_text(const Box& b) {
  std::string s;
  for (size_t d = 0; d < b.offset.size(); ++d) s += (d ? "," : "") + std::to_string(b.offset[d]);
  return s;
}

}  // namespace megatron::checkpoint
