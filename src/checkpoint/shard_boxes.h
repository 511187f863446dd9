// Shard boxes: where the elements a rank holds sit in the full (global) tensors.
//
// A checkpoint stores every tensor by its global shape; each rank writes the boxes it owns and
// reads the boxes it needs, so any tensor/pipeline/data-parallel layout loads any checkpoint. A
// Piece is a run of a rank's local row-major elements that is exactly one box of the global
// tensor: contiguous in local memory, so it is written and read without gathering copies.
//
// A Param's shard (see Param::tp_partition_dim / tp_partition_stride) is one box per stride block
// (two for SwiGLU's [gate_r | up_r]); a flat range of it (the distributed optimizer's share)
// further splits at row boundaries into at most a partial row, whole rows and a partial row.
// Tensors of one or two dimensions only (every parameter we have); others are an internal error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/param.h"

namespace megatron::checkpoint {

// A box of a tensor: per dimension, where it starts and how long it is.
struct Box {
  std::vector<int64_t> offset, extent;
  int64_t numel() const;
  bool operator==(const Box& o) const { return offset == o.offset && extent == o.extent; }
};

// Elements [local_begin, local_begin + global.numel()) of the local tensor, in row-major order,
// are the box `global` of the full tensor, in its row-major order.
struct Piece {
  int64_t local_begin = 0;
  Box global;
};

// The pieces of elements [begin, begin + numel) of p's local tensor (p.shape), in local order.
// The whole shard is shard_pieces(p, 0, p.shape.numel()).
std::vector<Piece> shard_pieces(const Param& p, int64_t begin, int64_t numel);

// The intersection of two boxes of the same rank; empty (numel() == 0) when they do not meet.
Box intersect(const Box& a, const Box& b);

// Copies the sub-box `region` (global coordinates, inside both) from `src`, a dense row-major
// array holding box `src_box`, into `dst`, a dense row-major array holding box `dst_box`. Four-byte
// elements.
void copy_region(const float* src, const Box& src_box, float* dst, const Box& dst_box,
                 const Box& region);

// "3,0": the box offset, as written into shard keys.
std::string offset_text(const Box& b);

}  // namespace megatron::checkpoint
