// Grouped GEMM: the GEMMs of all groups (an MoE layer's local experts) as one parallel loop over
// output blocks, each block one single-threaded oneDNN GEMM on strided views.
//
// Why not a GEMM call per group: each call is its own parallel region, so every thread waits at
// its end for the slowest, and a group's GEMM of a few hundred rows split over all threads leaves
// each a sliver with the fixed costs of a whole call. Here the work items are fixed-size blocks
// of every group's output (kBlockRows x kBlockCols), handed out dynamically, so threads stay busy
// until the last block of the last group, whatever the group sizes.
//
// Determinism: a block's result depends only on its shape, never on which thread runs it or how
// many there are (each worker sets its OpenMP thread count to 1 before calling oneDNN, so every
// primitive is planned and run single-threaded), and blocks never overlap. The results are the
// same bits for any thread count; they may differ in the last bits from ops::matmul on the same
// rows, whose multi-threaded primitive orders its sums by its own blocking.
//
// 16-bit inputs: oneDNN's bf16 kernels (AMX above all) run several times slower when the rows of
// a GEMM (or the reduction length) are not a multiple of 32 (measured on 2 Xeon cores, [M, 256]
// x [256, 1024] in bf16: M 512 at 2346 GFLOP/s, 530 at 319). Only a group's last block can have
// such a count. Its whole multiple of 32 runs in place and the rest on a copy padded with zero
// rows to 32 (forward: the block's last rows; weight gradient: the last rows of the reduction, as
// a second GEMM adding to the first), so routing's uneven group sizes cost a copy of at most 31
// rows per group, not a slow kernel.
//
// f64 (the finite-difference tests) runs a plain matmul per group.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/gemm.h"

namespace megatron::cpu {
namespace {

// Block sizes: large enough that a block's arithmetic (2 x 128 x 512 x k FLOPs, 33 MFLOP at
// k 256) dwarfs the few microseconds one oneDNN call costs, small enough that a layer's blocks
// outnumber the threads several times over and a block's B (k x 512) stays in L2.
constexpr int64_t kBlockRows = 128, kBlockCols = 512;
// Rows (and reduction lengths) of 16-bit GEMMs are padded to a multiple of this.
constexpr int64_t kHalfRows = 32;

// One output block of one group: rows [r0, r0 + m), columns [c0, c0 + n) of group g's output.
struct Block {
  size_t g;
  int64_t r0, m, c0, n;
};

// The blocks of a groups' [rows[g], cols] outputs.
std::vector<Block> blocks(const std::vector<int64_t>& rows, int64_t cols) {
  std::vector<Block> out;
  for (size_t g = 0; g < rows.size(); ++g)
    for (int64_t r = 0; r < rows[g]; r += kBlockRows)
      for (int64_t c = 0; c < cols; c += kBlockCols)
        out.push_back({g, r, std::min(kBlockRows, rows[g] - r), c, std::min(kBlockCols, cols - c)});
  return out;
}

// fn(block) for every block, in one parallel loop of single-threaded GEMMs.
template <typename Fn>
void run_blocks(const std::vector<Block>& work, Fn&& fn) {
  const auto count = static_cast<int64_t>(work.size());
#pragma omp parallel if (count > 1)
  {
    // This thread's oneDNN calls plan for, and run on, this thread alone (the setting belongs
    // to this region's task and ends with it).
    omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) fn(work[static_cast<size_t>(i)]);
  }
}

// Starting row of each group; checks that the sizes are valid and sum to `total`.
std::vector<int64_t> offsets(const std::vector<int64_t>& sizes, int64_t total, const char* op) {
  std::vector<int64_t> at(sizes.size() + 1, 0);
  for (size_t g = 0; g < sizes.size(); ++g) {
    MEGATRON_CHECK(sizes[g] >= 0, op, ": group ", g, " has ", sizes[g], " rows");
    at[g + 1] = at[g] + sizes[g];
  }
  MEGATRON_CHECK(at.back() == total, op, ": group sizes sum to ", at.back(), ", the input has ",
                 total, " rows");
  return at;
}

const char* bytes(const Tensor& t, int64_t elements) {
  return static_cast<const char*>(t.raw()) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}

// A thread's scratch for padded copies, reused from call to call.
struct Scratch {
  std::vector<char> a, b;
  std::vector<float> c;
};
Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

// rows x cols elements of `esize` bytes, row stride ld (elements), into buf as rows_padded x
// cols, contiguous, the padding rows zero.
const char* padded_copy(std::vector<char>* buf, const char* src, int64_t rows, int64_t cols,
                        int64_t ld, int64_t rows_padded, size_t esize) {
  const size_t row = static_cast<size_t>(cols) * esize;
  buf->assign(static_cast<size_t>(rows_padded) * row, 0);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(buf->data() + static_cast<size_t>(r) * row,
                src + static_cast<size_t>(r * ld) * esize, row);
  return buf->data();
}

// C rows [0, m) of a GEMM on A rows [0, m) (stride lda), with the rows padded to mp: through
// scratch copies of A and of C.
void gemm_padded_rows(const GemmShape& g, int64_t mp, const char* a, const void* b, float* c) {
  Scratch& s = scratch();
  const size_t esize = dtype_size(g.dtype);
  const char* ap = padded_copy(&s.a, a, g.m, g.k, g.lda, mp, esize);
  s.c.assign(static_cast<size_t>(mp * g.n), 0.0f);
  if (g.accumulate)
    for (int64_t r = 0; r < g.m; ++r)
      std::memcpy(s.c.data() + r * g.n, c + r * g.ldc, static_cast<size_t>(g.n) * sizeof(float));
  GemmShape p = g;
  p.m = mp;
  p.lda = g.k;
  p.ldc = g.n;
  gemm(p, ap, b, s.c.data());
  for (int64_t r = 0; r < g.m; ++r)
    std::memcpy(c + r * g.ldc, s.c.data() + r * g.n, static_cast<size_t>(g.n) * sizeof(float));
}

// C (+)= A^T B with A stored [k, m] (stride lda) and B [k, n] (stride ldb): the first k - k % 32
// rows of the reduction in place, the rest as a zero-padded copy of 32 rows added to it.
void gemm_at_padded_k(const GemmShape& g, const char* a, const char* b, float* c) {
  const int64_t k0 = g.k / kHalfRows * kHalfRows;
  const size_t esize = dtype_size(g.dtype);
  if (k0 > 0) {
    GemmShape head = g;
    head.k = k0;
    gemm(head, a, b, c);
  }
  Scratch& s = scratch();
  const char* at = padded_copy(&s.a, a + static_cast<size_t>(k0 * g.lda) * esize, g.k - k0, g.m,
                               g.lda, kHalfRows, esize);
  const char* bt = padded_copy(&s.b, b + static_cast<size_t>(k0 * g.ldb) * esize, g.k - k0, g.n,
                               g.ldb, kHalfRows, esize);
  GemmShape tail = g;
  tail.k = kHalfRows;
  tail.lda = g.m;
  tail.ldb = g.n;
  tail.accumulate = g.accumulate || k0 > 0;
  gemm(tail, at, bt, c);
}

void check_fast_dtypes(const Tensor& a, const Tensor& out, const char* op) {
  MEGATRON_CHECK(a.dtype() == DType::kF32 || is_half(a.dtype()), op,
                 ": inputs must be f32, bf16, f16 or f64, got ", dtype_name(a.dtype()));
  MEGATRON_CHECK(out.dtype() == DType::kF32, op, ": output must be f32, got ",
                 dtype_name(out.dtype()));
}

}  // namespace

void grouped_matmul(Tensor& out, const Tensor& a, const std::vector<Tensor>& b, bool trans_b,
                    const std::vector<int64_t>& sizes, float beta) {
  const char* op = "grouped_matmul";
  MEGATRON_CHECK(b.size() == sizes.size(), op, ": ", b.size(), " matrices for ", sizes.size(),
                 " groups");
  MEGATRON_CHECK(beta == 0.0f || beta == 1.0f, op, ": beta must be 0 or 1, got ", beta);
  const int64_t N = rows_of(a), k = a.dim(-1);
  const std::vector<int64_t> at = offsets(sizes, N, op);
  MEGATRON_CHECK(!b.empty(), op, ": no groups");
  const int64_t n = trans_b ? rows_of(b[0]) : b[0].dim(-1);
  for (size_t g = 0; g < b.size(); ++g) {
    check_same_dtype(a, b[g], op);
    const int64_t kb = trans_b ? b[g].dim(-1) : rows_of(b[g]);
    const int64_t nb = trans_b ? rows_of(b[g]) : b[g].dim(-1);
    MEGATRON_CHECK(kb == k && nb == n, op, ": group ", g, "'s matrix ", b[g].str(),
                   trans_b ? "^T" : "", " is not [", k, ", ", n, "]");
  }
  MEGATRON_CHECK(rows_of(out) == N && out.dim(-1) == n, op, ": out ", out.str(), " is not [", N,
                 ", ", n, "]");
  if (a.dtype() == DType::kF64) {
    const Tensor a2 = a.view({N, k});
    Tensor o2 = out.view({N, n});
    for (size_t g = 0; g < b.size(); ++g) {
      Tensor o = o2.slice0(at[g], at[g + 1]);
      matmul(o, a2.slice0(at[g], at[g + 1]), false, b[g], trans_b, beta);
    }
    return;
  }
  check_fast_dtypes(a, out, op);
  if (n == 0) return;
  float* c = out.data<float>();
  if (k == 0) {
    if (beta == 0.0f) out.zero();
    return;
  }
  run_blocks(blocks(sizes, n), [&](const Block& w) {
    const int64_t row = at[w.g] + w.r0;
    // Columns c0.. of op(b): rows of a stored [n, k], columns of a stored [k, n].
    const char* bp = bytes(b[w.g], trans_b ? w.c0 * k : w.c0);
    GemmShape g{w.m, w.n, k, false, trans_b, k, trans_b ? k : n, n, a.dtype(), beta != 0.0f};
    const int64_t tail = is_half(a.dtype()) ? w.m % kHalfRows : 0, head = w.m - tail;
    if (head > 0) {
      g.m = head;
      gemm(g, bytes(a, row * k), bp, c + row * n + w.c0);
    }
    if (tail > 0) {
      g.m = tail;
      gemm_padded_rows(g, kHalfRows, bytes(a, (row + head) * k), bp, c + (row + head) * n + w.c0);
    }
  });
}

void grouped_matmul_at(std::vector<Tensor>& out, const Tensor& a, const Tensor& c,
                       const std::vector<int64_t>& sizes, float beta) {
  const char* op = "grouped_matmul_at";
  MEGATRON_CHECK(out.size() == sizes.size(), op, ": ", out.size(), " outputs for ", sizes.size(),
                 " groups");
  MEGATRON_CHECK(beta == 0.0f || beta == 1.0f, op, ": beta must be 0 or 1, got ", beta);
  const int64_t N = rows_of(a), ka = a.dim(-1), kc = c.dim(-1);
  check_same_dtype(a, c, op);
  MEGATRON_CHECK(rows_of(c) == N, op, ": a ", a.str(), " and c ", c.str(), " differ in rows");
  const std::vector<int64_t> at = offsets(sizes, N, op);
  for (size_t g = 0; g < out.size(); ++g)
    MEGATRON_CHECK(rows_of(out[g]) == ka && out[g].dim(-1) == kc, op, ": out[", g, "] ",
                   out[g].str(), " is not [", ka, ", ", kc, "]");
  if (a.dtype() == DType::kF64) {
    const Tensor a2 = a.view({N, ka}), c2 = c.view({N, kc});
    for (size_t g = 0; g < out.size(); ++g)
      matmul(out[g], a2.slice0(at[g], at[g + 1]), true, c2.slice0(at[g], at[g + 1]), false, beta);
    return;
  }
  for (const Tensor& o : out) check_fast_dtypes(a, o, op);
  // A group without rows contributes nothing: its output is zeroed (beta 0) or left.
  std::vector<int64_t> rows(out.size(), 0);
  for (size_t g = 0; g < out.size(); ++g) {
    if (sizes[g] > 0) {
      rows[g] = ka;
    } else if (beta == 0.0f) {
      out[g].zero();
    }
  }
  run_blocks(blocks(rows, kc), [&](const Block& w) {
    // out[g] rows r0.. are columns r0.. of a's rows of group g (A = a_g^T, stored [rows, ka]).
    const int64_t first = at[w.g];
    const GemmShape g{w.m, w.n, sizes[w.g], true, false, ka, kc, kc, a.dtype(), beta != 0.0f};
    const char* ap = bytes(a, first * ka + w.r0);
    const char* cp = bytes(c, first * kc + w.c0);
    float* dst = out[w.g].data<float>() + w.r0 * kc + w.c0;
    if (is_half(a.dtype()) && g.k % kHalfRows != 0) {
      gemm_at_padded_k(g, ap, cp, dst);
    } else {
      gemm(g, ap, cp, dst);
    }
  });
}

}  // namespace megatron::cpu
