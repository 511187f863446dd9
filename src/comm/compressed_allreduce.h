// DeepSpeed's 1-bit compressed all-reduce (error-compensated sign compression, the exchange of
// 1-bit Adam's momentum; deepspeed/runtime/comm/nccl.py compressed_allreduce), over a
// ProcessGroup of W ranks. The tensor (n elements, zero-padded to `padded`, a multiple of
// W lcm(W, 8), DeepSpeed's corrected size) is cut into W chunks of c = padded / W; rank j is the
// "server" of chunk j.
//
//   worker:  x = pad(m) + worker_error;  s_w = ||x||_2 / sqrt(padded);  b_i = (x_i >= 0) (zero and
//            NaN count as +);  worker_error = x - s_w (2b - 1);  the signs of chunk j go to rank j
//            (all-to-all) and every s_w to every rank (all-gather).
//   server:  y = sum_i (2 b_i - 1) s_w,i / W + server_error over its chunk;  s_s = ||y||_2 /
//            sqrt(c);  server_error = y - s_s (2 (y >= 0) - 1);  its signs and s_s go to every
//            rank (all-gather).
//   result:  m = concat over servers j of s_s,j (2 b - 1), truncated to n: the same on every rank.
//
// Signs travel packed 32 to an int32 word (DeepSpeed packs 8 to a byte; a chunk's bytes differ by
// at most 3); scales are f32. Per call a rank sends about padded / 4 bytes of signs (1 bit per
// element out and 1 back) and 8 (W - 1) of scales, against 8 (W - 1) / W n bytes for an f32
// all-reduce: ~1/32 of it. Host memory, f32.
#pragma once

#include <cstdint>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace megatron {

// DeepSpeed's corrected_tensor_size: n rounded up to a multiple of W lcm(W, 8).
int64_t compressed_padded_size(int64_t n, int world);

// The error-feedback state of one tensor on one rank: worker [padded], server [padded / W], f32,
// zeros at the start (and after a checkpoint load: DeepSpeed resets them).
struct CompressionErrors {
  Tensor worker, server;
  static CompressionErrors zeros(int64_t n, int world);
};

// m[0, n) (host f32) replaced by the compressed average over `group`, updating `errors`.
// Collective: every rank calls it with the same n. A group of one leaves m as it is.
void compressed_allreduce(float* m, int64_t n, CompressionErrors& errors, ProcessGroup& group);

}  // namespace megatron
