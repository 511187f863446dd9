// Vocabulary-parallel embedding and cross entropy under a real MPI job (CTest runs this binary
// under mpiexec with 2 and 4 processes), for every TP size dividing the world (TP 1 included),
// against the single-process kernels (ops::embedding_*, ops::cross_entropy_*) on the full table
// or logits, which every rank computes locally from the same seeded data.
//
// Vocabularies are padded so that at TP 4 the last rank's block is partly or wholly padding:
// 37 -> 40 (last block 7 valid of 10), 37 -> 48 (1 valid of 12), 33 -> 48 (none of 12). Padding
// logits are set to 1000, so a padding column that leaked into a softmax would dominate it.
//
// Exact (bit for bit) where no float is summed across ranks: the embedding forward (each output
// element is one row value plus zeros), its backward (each element is summed in token order on
// the one rank holding the row, as the single-process kernel does), and dlogits given the same
// lse (the same per-element formula). Loss and lse are checked with a tolerance, see
// kLossTol below; they are also checked to be bit-identical on every rank of the group.
//
// Every rank runs the same tests in the same order so collectives pair up; checks use EXPECT,
// never an early return. A failure on any rank fails every rank (see main).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/parallel_state.h"
#include "core/error.h"
#include "parallel/vocab_parallel.h"
#include "tensor/ops.h"
#include "testing/mpi_testing.h"
#include "testing/testing.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;

// TP sizes to test: every divisor of the world size.
std::vector<int> tp_sizes() {
  std::vector<int> out;
  for (int t = 1; t <= g_runtime->world_size(); ++t)
    if (g_runtime->world_size() % t == 0) out.push_back(t);
  return out;
}

struct VocabCase {
  int64_t vocab_size, padded;
};
constexpr VocabCase kCases[] = {{37, 40}, {37, 48}, {33, 48}};

constexpr int64_t kHidden = 67;  // odd, and over the backward's 64-column chunk

// Loss and lse tolerance (absolute). Each rank's exp terms equal the single-process ones bit for
// bit (same global max, same vexp); only the grouping of their sum differs (per rank, then over
// ranks in double, vs one sum). A float sum of K <= 48 positive terms in any order has relative
// error <= (K - 1) u, so the two sums differ by <= 2 * 47 * 2^-24 = 5.6e-6 relative, which log
// turns into 5.6e-6 absolute; with |logits| <= 4 (so |lse| < 8) the roundings of lse and loss add
// about 1.5e-6. f64: the same bound with u = 2^-53 is below 1e-14.
double loss_tol(DType dt) {
  return dt == DType::kF64 ? 1e-13 : 1e-5;
}

std::string where(int tp, const VocabCase& c, DType dt) {
  return "tp " + std::to_string(tp) + ", vocab " + std::to_string(c.vocab_size) + " padded to " +
         std::to_string(c.padded) + ", " + dtype_name(dt) + ", world rank " +
         std::to_string(g_runtime->rank());
}

// Columns [c0, c0 + n) of a tensor viewed as [rows, cols], with the leading dims kept.
Tensor columns(const Tensor& t, int64_t c0, int64_t n) {
  const int64_t c = t.dim(-1), rows = t.numel() / c;
  const size_t es = dtype_size(t.dtype());
  Shape s = t.shape();
  s[-1] = n;
  Tensor out = Tensor::empty(s, t.dtype());
  const char* src = static_cast<const char*>(t.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * n * es, src + (r * c + c0) * es, n * es);
  return out;
}

// Full logits [5, 3, Vp] (15 rows, odd), uniform in (-4, 4), padding columns set to 1000.
Tensor full_logits(const VocabCase& c, DType dt) {
  Tensor t = testing::random_tensor({5, 3, c.padded}, 71, 4.0, DType::kF64);
  double* p = t.data<double>();
  for (int64_t r = 0; r < 15; ++r)
    for (int64_t v = c.vocab_size; v < c.padded; ++v) p[r * c.padded + v] = 1000.0;
  return t.to(dt);
}

// Targets [15] in [0, vocab_size), the first and last real token included.
Tensor targets_for(const VocabCase& c) {
  Tensor t = testing::random_ids({15}, 72, c.vocab_size);
  t.data<int64_t>()[0] = 0;
  t.data<int64_t>()[1] = c.vocab_size - 1;
  return t;
}

// Every rank of `g` holds the same bits in t: max over ranks of t and of -t give back t.
void expect_same_on_every_rank(const Tensor& t, ProcessGroup& g, const std::string& what) {
  Tensor hi = t.clone(), neg = t.clone();
  ops::scale_inplace(neg, -1.0);
  g.all_reduce(hi, ReduceOp::kMax);
  g.all_reduce(neg, ReduceOp::kMax);
  ops::scale_inplace(neg, -1.0);
  EXPECT_TRUE(testing::allclose(hi, t, 0, 0)) << what << ": differs across the TP group (max)";
  EXPECT_TRUE(testing::allclose(neg, t, 0, 0)) << what << ": differs across the TP group (min)";
}

// Runs fn, which must throw InvalidArgument with `needle` in its message.
template <typename Fn>
void expect_invalid(Fn&& fn, const std::string& needle, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << what << ": did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << what << ": message \"" << e.what() << "\" does not mention \"" << needle << "\"";
  }
}

// ---- embedding --------------------------------------------------------------------------------

TEST(VocabParallelEmbedding, ForwardEqualsFullLookup) {
  for (int tp : tp_sizes()) {
    ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
    ProcessGroup& g = ps.tp_group();
    for (const VocabCase& c : kCases) {
      for (DType dt : {DType::kF32, DType::kF64, DType::kBF16}) {
        const std::string at = where(tp, c, dt);
        const DType act = dt == DType::kF64 ? DType::kF64 : DType::kF32;
        Tensor table = testing::random_tensor({c.padded, kHidden}, 11, 1.0, dt);
        // [7, 3] ids (21, odd) over the whole padded range: a lookup of a padding row is legal.
        Tensor ids = testing::random_ids({7, 3}, 12, c.padded);
        ids.data<int64_t>()[0] = c.padded - 1;
        Tensor rows = Tensor::empty({21, kHidden}, dt);
        ops::embedding_forward(rows, ids, table);
        Tensor want = rows.to(act);  // bf16 widened, as the model's gather does

        const VocabRange range = vocab_range(c.padded, g.rank(), g.size());
        Tensor shard = table.slice0(range.start, range.end).clone();
        Tensor out = Tensor::full({7, 3, kHidden}, 7.0, act);  // overwritten, not accumulated
        vocab_parallel_embedding_forward(out, ids, shard, range.start, g);
        EXPECT_TRUE(testing::allclose(out, want, 0, 0)) << at;
      }
    }
  }
}

TEST(VocabParallelEmbedding, BackwardEqualsSliceOfFullScatter) {
  for (int tp : tp_sizes()) {
    ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
    ProcessGroup& g = ps.tp_group();
    for (const VocabCase& c : kCases) {
      for (DType dt : {DType::kF32, DType::kF64}) {
        const std::string at = where(tp, c, dt);
        // 63 tokens over <= 48 ids: rows repeat; force repeats in the first and last block.
        Tensor ids = testing::random_ids({63}, 21, c.padded);
        int64_t* id = ids.data<int64_t>();
        id[0] = id[5] = id[9] = 0;
        id[1] = id[6] = c.padded - 1;
        Tensor dout = testing::random_tensor({63, kHidden}, 22, 1.0, dt);
        Tensor init = testing::random_tensor({c.padded, kHidden}, 23, 1.0, dt);  // tests +=
        Tensor full = init.clone();
        ops::embedding_backward(full, dout, ids);

        const VocabRange range = vocab_range(c.padded, g.rank(), g.size());
        Tensor dshard = init.slice0(range.start, range.end).clone();
        vocab_parallel_embedding_backward(dshard, dout, ids, range.start);
        EXPECT_TRUE(testing::allclose(dshard, full.slice0(range.start, range.end), 0, 0)) << at;
      }
    }
  }
}

// ---- cross entropy ----------------------------------------------------------------------------

TEST(VocabParallelCrossEntropy, ForwardMatchesSingleProcess) {
  for (int tp : tp_sizes()) {
    ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
    ProcessGroup& g = ps.tp_group();
    for (const VocabCase& c : kCases) {
      for (DType dt : {DType::kF32, DType::kF64}) {
        const std::string at = where(tp, c, dt);
        Tensor logits = full_logits(c, dt);
        Tensor targets = targets_for(c);
        Tensor want_loss = Tensor::empty({15}, dt), want_lse = Tensor::empty({15}, dt);
        ops::cross_entropy_forward(want_loss, want_lse, logits, targets, c.vocab_size);

        const VocabRange range = vocab_range(c.padded, g.rank(), g.size());
        Tensor shard = columns(logits, range.start, range.end - range.start);
        Tensor loss = Tensor::empty({15}, dt), lse = Tensor::empty({15}, dt);
        vocab_parallel_cross_entropy_forward(loss, lse, shard, targets, range.start, c.vocab_size,
                                             g);
        EXPECT_TRUE(testing::allclose(lse, want_lse, loss_tol(dt), 0)) << at << " lse";
        EXPECT_TRUE(testing::allclose(loss, want_loss, loss_tol(dt), 0)) << at << " loss";
        expect_same_on_every_rank(lse, g, at + " lse");
        expect_same_on_every_rank(loss, g, at + " loss");
      }
    }
  }
}

TEST(VocabParallelCrossEntropy, BackwardSlicesEqualSingleProcess) {
  for (int tp : tp_sizes()) {
    ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
    ProcessGroup& g = ps.tp_group();
    for (const VocabCase& c : kCases) {
      for (DType dt : {DType::kF32, DType::kF64}) {
        const std::string at = where(tp, c, dt);
        Tensor logits = full_logits(c, dt);
        Tensor targets = targets_for(c);
        Tensor dloss = testing::random_tensor({15}, 73, 1.0, dt);
        Tensor loss = Tensor::empty({15}, dt), lse = Tensor::empty({15}, dt);
        ops::cross_entropy_forward(loss, lse, logits, targets, c.vocab_size);
        Tensor dfull = Tensor::empty(logits.shape(), dt);
        ops::cross_entropy_backward(dfull, dloss, logits, lse, targets, c.vocab_size);

        const VocabRange range = vocab_range(c.padded, g.rank(), g.size());
        const int64_t block = range.end - range.start;
        Tensor shard = columns(logits, range.start, block);
        Tensor want = columns(dfull, range.start, block);
        // Given the single-process lse, the same formula per element: exact.
        Tensor d = Tensor::full(shard.shape(), 7.0, dt);
        vocab_parallel_cross_entropy_backward(d, dloss, shard, lse, targets, range.start,
                                              c.vocab_size);
        EXPECT_TRUE(testing::allclose(d, want, 0, 0)) << at << " dlogits";
        // In place over the logits shard: the same bits.
        Tensor inplace = shard.clone();
        vocab_parallel_cross_entropy_backward(inplace, dloss, inplace, lse, targets, range.start,
                                              c.vocab_size);
        EXPECT_TRUE(testing::allclose(inplace, want, 0, 0)) << at << " dlogits in place";

        // With the vocab-parallel lse: softmax = exp(x - lse) moves by at most a factor
        // exp(loss_tol) ~ 1 + loss_tol, and |softmax| <= 1, |dloss| <= 1: loss_tol absolute,
        // doubled for the rounding of exp and of the product.
        Tensor ploss = Tensor::empty({15}, dt), plse = Tensor::empty({15}, dt);
        vocab_parallel_cross_entropy_forward(ploss, plse, shard, targets, range.start, c.vocab_size,
                                             g);
        Tensor dp = Tensor::empty(shard.shape(), dt);
        vocab_parallel_cross_entropy_backward(dp, dloss, shard, plse, targets, range.start,
                                              c.vocab_size);
        EXPECT_TRUE(testing::allclose(dp, want, 2 * loss_tol(dt), 0))
            << at << " dlogits from the parallel lse";
      }
    }
  }
}

// ---- caller errors ----------------------------------------------------------------------------
// Every check runs before the first collective and sees the same (replicated) arguments on every
// rank, so every rank throws and none is left waiting.

TEST(VocabParallel, CallerErrorsNameTheProblem) {
  const VocabCase c{37, 40};
  for (int tp : tp_sizes()) {
    ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
    ProcessGroup& g = ps.tp_group();
    const std::string at = "tp " + std::to_string(tp);
    const VocabRange range = vocab_range(c.padded, g.rank(), g.size());
    const int64_t block = range.end - range.start;
    Tensor shard = testing::random_tensor({block, kHidden}, 31, 1.0, DType::kF32);
    Tensor out = Tensor::empty({3, kHidden});

    Tensor ids = testing::random_ids({3}, 32, c.padded);
    ids.data<int64_t>()[2] = c.padded;  // one past the padded vocabulary
    expect_invalid([&] { vocab_parallel_embedding_forward(out, ids, shard, range.start, g); },
                   "token id 40 at position 2", at + " id == Vp");
    ids.data<int64_t>()[2] = -3;
    expect_invalid([&] { vocab_parallel_embedding_forward(out, ids, shard, range.start, g); },
                   "token id -3", at + " negative id");
    Tensor dshard = Tensor::zeros({block, kHidden});
    expect_invalid([&] { vocab_parallel_embedding_backward(dshard, out, ids, range.start); },
                   "token id -3", at + " negative id in backward");
    ids.data<int64_t>()[2] = 0;
    expect_invalid([&] { vocab_parallel_embedding_forward(out, ids, shard, range.start + 1, g); },
                   "expected vocab_start " + std::to_string(range.start),
                   at + " wrong vocab_start");
    Tensor bad_out = Tensor::empty({3, kHidden + 1});
    expect_invalid([&] { vocab_parallel_embedding_forward(bad_out, ids, shard, range.start, g); },
                   "expected out f32", at + " wrong out shape");

    Tensor logits = testing::random_tensor({3, block}, 33, 1.0, DType::kF32);
    Tensor targets = testing::random_ids({3}, 34, c.vocab_size);
    Tensor loss = Tensor::empty({3}), lse = Tensor::empty({3});
    targets.data<int64_t>()[1] = c.vocab_size;  // a padding column is never a target
    expect_invalid(
        [&] {
          vocab_parallel_cross_entropy_forward(loss, lse, logits, targets, range.start,
                                               c.vocab_size, g);
        },
        "target id 37 at row 1", at + " padding target");
    targets.data<int64_t>()[1] = 0;
    expect_invalid(
        [&] {
          vocab_parallel_cross_entropy_forward(loss, lse, logits, targets, range.start,
                                               c.padded + 1, g);
        },
        "vocab size 41", at + " vocab larger than the padded vocabulary");
    Tensor dloss = Tensor::full({3}, 1.0), dbad = Tensor::empty({3, block + 1});
    expect_invalid(
        [&] {
          vocab_parallel_cross_entropy_backward(dbad, dloss, logits, lse, targets, range.start,
                                                c.vocab_size);
        },
        "dlogits", at + " dlogits shape");
  }
  expect_invalid([] { vocab_range(37, 0, 2); }, "37 is not divisible by 2", "odd vocab at tp 2");
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  megatron::g_runtime = &runtime;
  return megatron::testing::run_all_tests_on_every_rank(
      runtime, megatron::testing::expected_world_size(argc, argv));
}
