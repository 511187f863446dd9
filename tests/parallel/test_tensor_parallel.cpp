// Tensor- and sequence-parallel mappings and linear layers under a real MPI job (CTest runs this
// binary under mpiexec with 2 and 4 processes); every test runs for each TP size dividing the
// world (so TP 1, the no-op case, too), the TP groups laid out by ParallelState.
//
// Mappings are checked against closed forms on values that are small integers (every sum exact
// in any order), bit for bit. The layers are checked against our single-process Linear on the
// full weights, computed locally on every rank, in Megatron's MLP pattern ColumnParallelLinear ->
// GELU -> RowParallelLinear, with and without sequence parallelism:
//   - exact where no rank sums another rank's partial results and no GEMM is involved: initial
//     weights and the row layer's bias gradient without sequence parallelism (dy is replicated);
//   - within a tolerance where there is a cross-rank sum: the MLP output and input gradient (the
//     row layer's partial products, the column layer's partial dx) and, under sequence
//     parallelism, the row bias gradient summed over TP. Each such element is a sum of K <= 64
//     f32 terms grouped differently (p partial sums, then a sum over ranks); two orders differ by
//     at most about 2 K u sum|terms| (u = 2^-24), i.e. below 1e-5 of sum|terms|, which for these
//     random data is within about 2x of the largest |result|: tolerance 2e-5 * max|reference|;
//   - within the same tolerance for GEMM results without a cross-rank sum (the column layer's
//     output, weight and bias gradients, the row layer's weight gradient): the shard's GEMM is the
//     same math on a smaller matrix, but oneDNN chooses kernels by shape and its AVX2 kernels sum
//     the tail rows of a matrix in another grouping, so bitwise equality holds on some CPUs only.
//
// Every rank runs the same tests in the same order so collectives pair up; checks use EXPECT,
// never an early return. A failure on any rank fails every rank (see main).
#include <gtest/gtest.h>

#include <mpi.h>
#include "testing/mpi_testing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/parallel_state.h"
#include "core/error.h"
#include "core/philox.h"
#include "parallel/linear.h"
#include "parallel/mappings.h"
#include "parallel/param.h"
#include "parallel/tensor_parallel_linear.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;
int g_expected_world = 0;

// TP sizes to test: every divisor of the world size.
std::vector<int> tp_sizes() {
  std::vector<int> out;
  for (int t = 1; t <= g_runtime->world_size(); ++t)
    if (g_runtime->world_size() % t == 0) out.push_back(t);
  return out;
}

Tensor make(const Shape& shape, const std::function<float(int64_t)>& f) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f(i);
  return t;
}

// Small integer values, a function of (rank g, element i): exact in any f32 sum.
float ival(int g, int64_t i) {
  return static_cast<float>((g * 37 + i * 11) % 61 - 30);
}

Tensor random_normal(const Shape& shape, uint64_t stream) {
  return make(shape, [&](int64_t i) {
    return static_cast<float>(Philox::normal(1234, stream, static_cast<uint64_t>(i)));
  });
}

// Columns [c0, c0 + n) of a tensor viewed as [rows, cols].
Tensor cols(const Tensor& t, int64_t c0, int64_t n) {
  const int64_t c = t.dim(-1), rows = t.numel() / c;
  Tensor out = Tensor::empty(Shape{rows, n});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * n, t.data<float>() + r * c + c0, n * sizeof(float));
  return out;
}
// Rows [r0, r0 + n) of dim 0.
Tensor rows(const Tensor& t, int64_t r0, int64_t n) {
  return t.slice0(r0, r0 + n).clone();
}

void expect_exact(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (got.item(i) != want.item(i)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << " (world rank " << g_runtime->rank() << "): " << bad << " of "
                    << got.numel() << " differ, first at " << first << ": got "
                    << (first >= 0 ? got.item(first) : 0.0) << ", want "
                    << (first >= 0 ? want.item(first) : 0.0);
}

// The cross-rank-sum tolerance of the file comment.
void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  double scale = 0, worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::fabs(want.item(i)));
  for (int64_t i = 0; i < want.numel(); ++i)
    worst = std::max(worst, std::fabs(got.item(i) - want.item(i)));
  EXPECT_LE(worst, 2e-5 * scale) << what << " (world rank " << g_runtime->rank() << "): max |diff| "
                                 << worst << ", max |ref| " << scale;
}

// ---- mappings against closed forms ----------------------------------------------------------

TEST(Mappings, ClosedForms) {
  for (int tp : tp_sizes()) {
    ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
    ProcessGroup& g = ps.tp_group();
    const int p = g.size(), r = g.rank();
    const int64_t s = 2 * p, b = 3, h = 4 * p, n = s / p, c = h / p;
    const std::string at = "tp " + std::to_string(tp);
    auto sum_over = [&](int64_t i) {
      float acc = 0;
      for (int j = 0; j < p; ++j) acc += ival(j, i);
      return acc;
    };
    const Shape full{s, b, h};
    Tensor mine = make(full, [&](int64_t i) { return ival(r, i); });    // differs by rank
    Tensor shared = make(full, [&](int64_t i) { return ival(0, i); });  // same on every rank
    Tensor summed = make(full, sum_over);

    // f: identity / all-reduce.
    Tensor t = copy_to_tp_region_forward(shared, g);
    EXPECT_EQ(t.raw(), shared.raw()) << at << ": copy_to forward must not copy";
    expect_exact(copy_to_tp_region_backward(mine.clone(), g), summed, at + " copy_to backward");
    // g: all-reduce / identity.
    expect_exact(reduce_from_tp_region_forward(mine.clone(), g), summed, at + " reduce_from fwd");
    EXPECT_EQ(reduce_from_tp_region_backward(shared, g).raw(), shared.raw()) << at;

    // Last dim: split keeps columns [r*c, (r+1)*c); gather puts rank j's chunk at j*c.
    Tensor my_cols = cols(shared, r * c, c);
    expect_exact(scatter_to_tp_region_forward(shared, g), my_cols, at + " scatter_to fwd");
    expect_exact(gather_from_tp_region_backward(shared, g), my_cols, at + " gather_from bwd");
    Tensor chunk = make(Shape{s, b, c}, [&](int64_t i) { return ival(r, i); });
    Tensor gathered = make(full, [&](int64_t i) {
      const int64_t row = i / h, col = i % h;
      return ival(static_cast<int>(col / c), row * c + col % c);
    });
    expect_exact(gather_from_tp_region_forward(chunk, g), gathered, at + " gather_from fwd");
    expect_exact(scatter_to_tp_region_backward(chunk, g), gathered, at + " scatter_to bwd");
    EXPECT_EQ(gather_from_tp_region_forward(chunk, g).shape(), full) << at;

    // Dim 0: split keeps rows [r*n, (r+1)*n); gather stacks rank j's rows at j*n.
    Tensor my_rows = rows(shared, r * n, n);
    const int64_t per = n * b * h;  // elements per rank's chunk
    Tensor part = make(Shape{n, b, h}, [&](int64_t i) { return ival(r, i); });
    Tensor stacked =
        make(full, [&](int64_t i) { return ival(static_cast<int>(i / per), i % per); });
    Tensor rs = make(Shape{n, b, h}, [&](int64_t i) { return sum_over(r * per + i); });
    expect_exact(scatter_to_sequence_parallel_region_forward(shared, g), my_rows,
                 at + " sp scatter");
    expect_exact(scatter_to_sequence_parallel_region_backward(part, g), stacked,
                 at + " sp scatter bwd");
    expect_exact(gather_from_sequence_parallel_region_forward(part, g), stacked,
                 at + " sp gather fwd");
    expect_exact(gather_from_sequence_parallel_region_backward(mine, g), rs, at + " sp gather bwd");
    expect_exact(gather_from_sequence_parallel_region_backward(shared, g, false), my_rows,
                 at + " sp gather bwd (replicated consumer)");
    expect_exact(reduce_scatter_to_sequence_parallel_region_forward(mine, g), rs,
                 at + " sp reduce-scatter fwd");
    expect_exact(reduce_scatter_to_sequence_parallel_region_backward(part, g), stacked,
                 at + " sp reduce-scatter bwd");
    EXPECT_EQ(gather_from_sequence_parallel_region_forward(part, g).shape(), full) << at;
  }
}

TEST(Mappings, DivideNamesTheFlag) {
  EXPECT_EQ(divide(12, 4, "x"), 3);
  try {
    divide(10, 4, "--ffn-hidden-size by --tensor-model-parallel-size");
    ADD_FAILURE() << "divide(10, 4) did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size"), std::string::npos)
        << e.what();
  }
}

// ---- layers ---------------------------------------------------------------------------------

constexpr int64_t kS = 8, kB = 2, kH = 16, kFfn = 32;
constexpr uint64_t kSeed = 42;

// The reference: the single-process pair on full weights, biases non-zero so the bias paths
// matter.
struct ReferenceMlp {
  Linear fc1{"mlp.linear_fc1", kH, kFfn, true, 0.3};
  Linear fc2{"mlp.linear_fc2", kFfn, kH, true, 0.2};
  std::unique_ptr<ParamSet> params;
  Tensor y, dx, h, a;

  ReferenceMlp() {
    fc1.bias.init = fc2.bias.init = Init::kNormal;
    fc1.bias.init_std = fc2.bias.init_std = 0.1;
    std::vector<Param*> ps;
    fc1.collect(ps);
    fc2.collect(ps);
    params = std::make_unique<ParamSet>(ps, DType::kF32);
    params->initialize(kSeed);
  }
  void run(const Tensor& x, const Tensor& dy) {
    Linear::Ctx c1, c2;
    h = fc1.forward(x, c1);
    a = Tensor::empty(h.shape());
    ops::gelu_forward(a, h, false);
    y = fc2.forward(a, c2);
    Tensor da = fc2.backward(dy, c2);
    Tensor dh = Tensor::empty(h.shape());
    ops::gelu_backward(dh, da, h, false);
    dx = fc1.backward(dh, c1);
  }
};

struct TpMlp {
  ColumnParallelLinear fc1;
  RowParallelLinear fc2;
  std::unique_ptr<ParamSet> params;

  TpMlp(ProcessGroup& g, bool sp)
      : fc1("mlp.linear_fc1", kH, kFfn, 0.3, g, {.sequence_parallel = sp}),
        fc2("mlp.linear_fc2", kFfn, kH, 0.2, g, {.sequence_parallel = sp}) {
    fc1.bias().init = fc2.bias.init = Init::kNormal;
    fc1.bias().init_std = fc2.bias.init_std = 0.1;
    std::vector<Param*> ps;
    fc1.collect(ps);
    fc2.collect(ps);
    params = std::make_unique<ParamSet>(ps, DType::kF32);
    params->initialize(kSeed);  // TP-invariant: each shard gets its slice of the full init
  }
};

TEST(TensorParallelLinear, InitIsTheSliceOfTheFullInit) {
  ReferenceMlp ref;
  for (int tp : tp_sizes()) {
    ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
    ProcessGroup& g = ps.tp_group();
    TpMlp mlp(g, false);
    const int64_t f = kFfn / g.size(), r = g.rank();
    const std::string at = "tp " + std::to_string(tp);
    expect_exact(mlp.fc1.weight().main, rows(ref.fc1.weight.main, r * f, f), at + " fc1 weight");
    expect_exact(mlp.fc1.bias().main, rows(ref.fc1.bias.main, r * f, f), at + " fc1 bias");
    expect_exact(mlp.fc2.weight().main, cols(ref.fc2.weight.main, r * f, f), at + " fc2 weight");
    expect_exact(mlp.fc2.bias.main, ref.fc2.bias.main, at + " fc2 bias");
  }
}

TEST(TensorParallelLinear, MlpMatchesSingleProcess) {
  const Tensor x = random_normal(Shape{kS, kB, kH}, 1);
  const Tensor dy = random_normal(Shape{kS, kB, kH}, 2);
  ReferenceMlp ref;
  ref.run(x, dy);
  for (int tp : tp_sizes()) {
    for (bool sp : {false, true}) {
      ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
      ProcessGroup& g = ps.tp_group();
      const int64_t p = g.size(), r = g.rank(), f = kFfn / p, n = kS / p;
      const std::string at = "tp " + std::to_string(tp) + (sp ? " sp" : "");
      TpMlp mlp(g, sp);
      // Under sequence parallelism each rank holds its s/p tokens of x and of dy.
      Tensor x_in = sp ? rows(x, r * n, n) : x;
      Tensor dy_in = sp ? rows(dy, r * n, n) : dy.clone();
      ColumnParallelLinear::Ctx c1;
      RowParallelLinear::Ctx c2;
      Tensor h = mlp.fc1.forward(x_in, c1);
      EXPECT_EQ(h.shape(), (Shape{kS, kB, f})) << at;
      expect_close(h, cols(ref.h, r * f, f), at + " fc1 output (this rank's columns)");
      Tensor a = Tensor::empty(h.shape());
      ops::gelu_forward(a, h, false);
      Tensor y = mlp.fc2.forward(a, c2);
      EXPECT_EQ(y.shape(), (Shape{sp ? n : kS, kB, kH})) << at;
      expect_close(y, sp ? rows(ref.y.view(Shape{kS, kB, kH}), r * n, n) : ref.y, at + " output");
      Tensor da = mlp.fc2.backward(dy_in, c2);
      Tensor dh = Tensor::empty(h.shape());
      ops::gelu_backward(dh, da, h, false);
      Tensor dx = mlp.fc1.backward(dh, c1);
      EXPECT_EQ(dx.shape(), x_in.shape()) << at;
      expect_close(dx, sp ? rows(ref.dx.view(Shape{kS, kB, kH}), r * n, n) : ref.dx,
                   at + " input grad");
      // No cross-rank sum, but GEMMs of other shapes upstream (see the file comment).
      expect_close(mlp.fc1.weight().main_grad, rows(ref.fc1.weight.main_grad, r * f, f),
                   at + " fc1 weight grad");
      expect_close(mlp.fc1.bias().main_grad, rows(ref.fc1.bias.main_grad, r * f, f),
                   at + " fc1 bias grad");
      expect_close(mlp.fc2.weight().main_grad, cols(ref.fc2.weight.main_grad, r * f, f),
                   at + " fc2 weight grad");
      // The replicated bias: whole dy on every rank without sp; under sp each rank's tokens,
      // summed over TP as finalize_model_grads does.
      EXPECT_EQ(mlp.fc2.bias.sequence_parallel, sp && p > 1) << at;
      if (mlp.fc2.bias.sequence_parallel) g.all_reduce(mlp.fc2.bias.main_grad);
      if (sp && p > 1) {
        expect_close(mlp.fc2.bias.main_grad, ref.fc2.bias.main_grad, at + " fc2 bias grad");
      } else {
        expect_exact(mlp.fc2.bias.main_grad, ref.fc2.bias.main_grad, at + " fc2 bias grad");
      }
    }
  }
}

TEST(TensorParallelLinear, GatherOutputAndScatteredInput) {
  // gather_output and input_is_parallel=false: a whole activation in, a whole one out.
  const Tensor x = random_normal(Shape{kS, kB, kH}, 3);
  Linear full1("l1", kH, kFfn, true, 0.3), full2("l2", kFfn, kH, false, 0.2);
  std::vector<Param*> fp;
  full1.collect(fp);
  full2.collect(fp);
  ParamSet fps(fp, DType::kF32);
  fps.initialize(kSeed);
  Linear::Ctx fc1, fc2;
  Tensor y1 = full1.forward(x, fc1);
  Tensor y2 = full2.forward(y1, fc2);
  Tensor dy2 = random_normal(y2.shape(), 5);
  Tensor dy1 = full2.backward(dy2, fc2);
  for (int tp : tp_sizes()) {
    ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
    ProcessGroup& g = ps.tp_group();
    const std::string at = "tp " + std::to_string(tp);
    ColumnParallelLinear l1("l1", kH, kFfn, 0.3, g, {.gather_output = true});
    RowParallelLinear l2("l2", kFfn, kH, 0.2, g, {.with_bias = false, .input_is_parallel = false});
    std::vector<Param*> pp;
    l1.collect(pp);
    l2.collect(pp);
    ParamSet pps(pp, DType::kF32);
    pps.initialize(kSeed);
    ColumnParallelLinear::Ctx c1;
    RowParallelLinear::Ctx c2;
    Tensor t1 = l1.forward(x, c1);
    EXPECT_EQ(t1.shape(), (Shape{kS, kB, kFfn})) << at;
    expect_close(t1, y1, at + " gathered column output");
    expect_close(l2.forward(t1, c2), y2, at + " row output from a whole input");
    Tensor d1 = l2.backward(dy2, c2);
    EXPECT_EQ(d1.shape(), (Shape{kS, kB, kFfn})) << at;
    expect_close(d1, dy1, at + " row input grad (gathered)");
  }
}

TEST(TensorParallelLinear, BadLayoutsNameTheFlag) {
  for (int tp : tp_sizes()) {
    ParallelState ps(g_runtime->world(), {.tensor_model_parallel_size = tp});
    if (tp == 1) continue;
    ProcessGroup& g = ps.tp_group();
    EXPECT_THROW(ColumnParallelLinear("c", 8, 4 * tp + 1, 0.02, g, {}), InvalidArgument);
    EXPECT_THROW(RowParallelLinear("r", 4 * tp + 1, 8, 0.02, g, {}), InvalidArgument);
    EXPECT_THROW(RowParallelLinear("r", 4 * tp, 8, 0.02, g,
                                   {.input_is_parallel = false, .sequence_parallel = true}),
                 InvalidArgument);
  }
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  megatron::g_expected_world = megatron::testing::expected_world_size(argc, argv);
  megatron::g_runtime = &runtime;
  return megatron::testing::run_all_tests_on_every_rank(runtime, megatron::g_expected_world);
}
