// Muon (optim/muon.h) against PyTorch and across tensor-parallel layouts, under a real MPI job
// (np 2 and 4: the tensor-parallel group is the world).
//
//   - PyTorch oracle (tests/reference/muon_oracle.py, Megatron's TensorParallelMuon restated): 3
//     steps of five flag combinations (f32 and bf16 iterations; quintic, polar_express with its
//     last set repeated, aol cycled, simple; every scale mode; Nesterov; QKV split on and off;
//     momentum, extra scale, clipping factor) over matrices wider and taller than square, a fused
//     QKV, and the parameters Muon leaves to AdamW (a bias, the embeddings, a 3-D conv weight
//     stored 2-D): weights, momentum buffers and Adam moments.
//   - Tensor parallelism: each rank holds a shard (rows, columns, SwiGLU's stride-2 rows, a QKV
//     split by query groups, an expert over its own group, a square column split); duplicated and
//     distributed give the
//     one-process update of the whole matrix, blockwise the shard's own with the shard's scale.
// Tolerances: the f32 iterations agree with PyTorch to 5e-5 of the weights' change (the same
// products summed in another order; measured 1e-6 for five quintic steps, 1.3e-5 for ten
// polar_express ones, whose first coefficients (8.2, -22.9, 16.5) amplify the rounding). The bf16
// iterations round every product to bf16 as a GPU's bf16 GEMM does (the oracle emulates that:
// torch's CPU bf16 addmm rounds differently on small shapes); measured 5.5e-6 here, but another
// CPU's summation order may round a product to the other bf16 neighbour, and one such flip in
// the first Newton-Schulz step moves the result by up to 2.3e-3 (measured in PyTorch, flipping
// one element of X by an ulp: 1e-3 at the third step, 1e-4 at the last), so 3e-3 allows one;
// the oracle's bf16 and f32 results of the same flags lie 4.6e-3 apart, beyond it (checked
// below), so an f32 iteration in place of the bf16 one fails. TP:
// distributed sums the same products in another order (f32 1e-5; bf16 0.05 of the update's O(1)
// elements, a few flipped roundings); duplicated gathers the exact matrix (bit-equal, but for
// stride blocks, whose rows come permuted: 1e-5).
#include <gtest/gtest.h>

#include <mpi.h>
#include "testing/mpi_testing.h"

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/safetensors.h"
#include "comm/mpi_runtime.h"
#include "core/philox.h"
#include "optim/muon.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

MpiRuntime* g_runtime = nullptr;
std::string g_oracle_dir;

ProcessGroup& world() {
  return *g_runtime->world();
}

// The oracle's parameters and variants (muon_oracle.py lists the same).
struct OracleParam {
  const char* name;
  Shape shape;
  const char* kind;
};
const std::vector<OracleParam> kParams = {
    {"tall", {48, 16}, "muon"}, {"wide", {16, 40}, "muon"},  {"square", {24, 24}, "muon"},
    {"qkv", {32, 24}, "qkv"},   {"bias", {16}, "adam_nowd"}, {"embedding", {20, 16}, "adam"},
    {"conv", {12, 4}, "adam"}};
const double kGradScale[] = {1.0, 0.7, 0.5};
constexpr double kLr = 0.02, kWd = 0.1;

struct Variant {
  const char* name;
  MuonConfig cfg;
  bool scalar_lion = false;  // --muon-scalar-optimizer lion
};

std::vector<Variant> variants() {
  auto make = [](bool bf16, const char* coeff, int64_t steps, MuonScaleMode scale, bool nesterov,
                 bool split, double extra, double momentum) {
    MuonConfig c;
    c.bf16_iteration = bf16;
    c.coefficient_type = coeff;
    c.num_ns_steps = steps;
    c.scale_mode = scale;
    c.nesterov = nesterov;
    c.split_qkv = split;
    c.extra_scale_factor = extra;
    c.momentum = momentum;
    return c;
  };
  return {
      {"high_quintic", make(false, "quintic", 5, MuonScaleMode::kSpectral, false, true, 1.0, 0.9)},
      {"medium_nesterov", make(true, "quintic", 5, MuonScaleMode::kSpectral, true, true, 1.0, 0.9)},
      {"high_nesterov", make(false, "quintic", 5, MuonScaleMode::kSpectral, true, true, 1.0, 0.9)},
      {"high_polar_unit_nosplit",
       make(false, "polar_express", 10, MuonScaleMode::kUnitRmsNorm, false, false, 0.5, 0.95)},
      {"medium_aol_shape",
       make(true, "aol", 6, MuonScaleMode::kShapeScaling, true, true, 1.0, 0.9)},
      {"high_simple", make(false, "simple", 3, MuonScaleMode::kSpectral, true, true, 2.0, 0.5)},
      {"high_scalar_lion",
       make(false, "quintic", 5, MuonScaleMode::kSpectral, false, true, 1.0, 0.9), true}};
}

// |a - b| / |b - init| over all elements (the error relative to the weights' change).
double relative_change_error(const Tensor& a, const Tensor& b, const Tensor& init) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num += std::pow(a.item(i) - b.item(i), 2);
    den += std::pow(b.item(i) - init.item(i), 2);
  }
  return std::sqrt(num / den);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.item(i) - b.item(i)));
  return m;
}

// The oracle's parameters with their attributes (a bias without decay, the embeddings, a 3-D conv
// weight stored 2-D, a fused QKV): pointers into `params`, which must outlive them.
std::vector<Param*> oracle_params(std::vector<Param>& params) {
  params.assign(kParams.size(), Param{});
  std::vector<Param*> ptrs;
  for (size_t i = 0; i < kParams.size(); ++i) {
    Param& p = params[i];
    p.name = kParams[i].name;
    p.shape = kParams[i].shape;
    const std::string kind = kParams[i].kind;
    p.no_weight_decay = kind == "adam_nowd";
    p.is_embedding_or_output = p.name == "embedding";
    if (p.name == "conv") p.megatron_ndim = 3;
    if (kind == "qkv") p.qkv_split = {8, 4, 4};
    ptrs.push_back(&p);
  }
  return ptrs;
}

TEST(MuonOracle, StepsMatchPyTorch) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass --oracle-dir=DIR (muon_oracle.py --out DIR)";
  auto f = safetensors::File::open(g_oracle_dir + "/muon.safetensors");
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    std::vector<Param> params;
    std::vector<Param*> ptrs = oracle_params(params);
    ParamSet ps(ptrs, DType::kF32);
    for (Param* p : ptrs) ps.set_main(*p, f.read("init." + p->name));
    ps.sync_compute_from_main();
    AdamWConfig adam{0.9, 0.95, 1e-8, kWd};
    adam.rule = UpdateRule::kMuon;
    adam.muon_scalar_lion = v.scalar_lion;
    Muon muon(ps, adam, v.cfg, world(), world());
    for (int step = 0; step < 3; ++step) {
      for (Param* p : ptrs)
        p->main_grad.copy_from(f.read("grad." + std::to_string(step) + "." + p->name));
      muon.step(StepRates{kLr, kLr, kWd}, kGradScale[step]);
    }
    const std::string pre = std::string(v.name) + ".";
    for (Param* p : ptrs) {
      SCOPED_TRACE(p->name);
      const Tensor init = f.read("init." + p->name);
      const Tensor want = f.read(pre + "w." + p->name);
      const int64_t n = p->shape.numel();
      const Tensor m = muon.exp_avg().flat_view(muon.state_offset(*p, 0), {n});
      if (is_muon_matrix(*p)) {
        const double err = relative_change_error(p->main.view({n}), want.view({n}), init);
        EXPECT_LT(err, v.cfg.bf16_iteration ? 3e-3 : 5e-5);
        // The momentum buffer is elementwise f32 arithmetic: rounding only; no second state.
        EXPECT_EQ(muon.state_offset(*p, 1), -1);
        EXPECT_LT(max_abs_diff(m, f.read(pre + "m." + p->name).view({n})), 1e-6);
      } else if (v.scalar_lion) {
        // Lion's step: the same f32 formula (ops::lion_step is emerging_optimizers' Lion).
        EXPECT_LT(max_abs_diff(p->main.view({n}), want.view({n})), 1e-6);
        EXPECT_LT(max_abs_diff(m, f.read(pre + "m." + p->name).view({n})), 1e-6);
        EXPECT_EQ(muon.state_offset(*p, 1), -1);  // one moment
      } else {
        // AdamW's step: the same f32 formula (ops::adamw_step is torch's AdamW).
        EXPECT_LT(max_abs_diff(p->main.view({n}), want.view({n})), 1e-6);
        EXPECT_LT(max_abs_diff(m, f.read(pre + "m." + p->name).view({n})), 1e-6);
        const Tensor vv = muon.exp_avg_sq().flat_view(muon.state_offset(*p, 1), {n});
        EXPECT_LT(max_abs_diff(vv, f.read(pre + "v." + p->name).view({n})), 1e-6);
      }
    }
  }
  // The bf16 iteration is not the f32 one: the same flags in both precisions lie further apart
  // than the bf16 tolerance above.
  const Tensor init = f.read("init.tall");
  const double apart =
      relative_change_error(f.read("medium_nesterov.w.tall"), f.read("high_nesterov.w.tall"), init);
  EXPECT_GT(apart, 3e-3) << "bf16 and f32 iterations too close to tell apart";
}

// The layer-wise distribution (--use-distributed-optimizer with Muon): the world as the
// data-parallel group, every rank the same gradients; the owners' updates broadcast give the
// plain optimizer's weights bit for bit, each rank holding only its owned parameters' state.
TEST(MuonLayerWise, SameWeightsStateDividedOverTheRanks) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass --oracle-dir=DIR (muon_oracle.py --out DIR)";
  auto f = safetensors::File::open(g_oracle_dir + "/muon.safetensors");
  ProcessGroup& g = world();
  std::vector<Param> a, b;
  std::vector<Param*> pa = oracle_params(a), pb = oracle_params(b);
  ParamSet sa(pa, DType::kF32), sb(pb, DType::kF32);
  for (size_t i = 0; i < pa.size(); ++i) {
    sa.set_main(*pa[i], f.read("init." + pa[i]->name));
    sb.set_main(*pb[i], f.read("init." + pb[i]->name));
  }
  AdamWConfig adam{0.9, 0.95, 1e-8, kWd};
  adam.rule = UpdateRule::kMuon;
  MuonConfig cfg;
  cfg.nesterov = true;
  Muon plain(sa, adam, cfg, g, g);
  Muon layer_wise(sb, adam, cfg, g, g, LayerWiseGroups{&g, &g});
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < pa.size(); ++i) {
      const Tensor grad = f.read("grad." + std::to_string(step) + "." + pa[i]->name);
      pa[i]->main_grad.copy_from(grad);
      pb[i]->main_grad.copy_from(grad);
    }
    plain.step(StepRates{kLr, kLr, kWd}, kGradScale[step]);
    layer_wise.step(StepRates{kLr, kLr, kWd}, kGradScale[step]);
  }
  int owned = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    SCOPED_TRACE(pa[i]->name);
    EXPECT_EQ(max_abs_diff(pa[i]->main, pb[i]->main), 0.0);
    if (!layer_wise.owns(*pb[i])) continue;
    ++owned;
    // The owner's state is the plain optimizer's.
    const int64_t n = pa[i]->shape.numel();
    EXPECT_EQ(max_abs_diff(plain.exp_avg().flat_view(plain.state_offset(*pa[i], 0), {n}),
                           layer_wise.exp_avg().flat_view(layer_wise.state_offset(*pb[i], 0), {n})),
              0.0);
  }
  // Every parameter has exactly one owner, and with more than one rank no rank holds all.
  Tensor counts = Tensor::full({2}, 0.0, DType::kF64);
  counts.data<double>()[0] = owned;
  counts.data<double>()[1] = static_cast<double>(layer_wise.exp_avg().numel());
  g.all_reduce(counts);
  EXPECT_EQ(counts.item(0), static_cast<double>(pa.size()));
  EXPECT_EQ(counts.item(1), static_cast<double>(plain.exp_avg().numel()));
  if (g.size() > 1) {
    EXPECT_LT(owned, static_cast<int>(pa.size()));
  }
}

// --optimizer lion as Megatron builds it: Lion with Adam's betas for the matrices, AdamW for the
// rest (class Muon with rule kLion), against the oracle with two pairs of betas.
TEST(LionOracle, StepsMatchPyTorch) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass --oracle-dir=DIR (muon_oracle.py --out DIR)";
  auto f = safetensors::File::open(g_oracle_dir + "/muon.safetensors");
  for (const auto& [name, b1, b2] :
       {std::tuple{"lion", 0.9, 0.99}, {"lion_small_betas", 0.3, 0.4}}) {
    SCOPED_TRACE(name);
    std::vector<Param> params;
    std::vector<Param*> ptrs = oracle_params(params);
    ParamSet ps(ptrs, DType::kF32);
    for (Param* p : ptrs) ps.set_main(*p, f.read("init." + p->name));
    AdamWConfig cfg{b1, b2, 1e-8, kWd};
    cfg.rule = UpdateRule::kLion;
    Muon lion(ps, cfg, MuonConfig{}, world(), world());
    for (int step = 0; step < 3; ++step) {
      for (Param* p : ptrs)
        p->main_grad.copy_from(f.read("grad." + std::to_string(step) + "." + p->name));
      lion.step(StepRates{kLr, kLr, kWd}, kGradScale[step]);
    }
    for (Param* p : ptrs) {
      SCOPED_TRACE(p->name);
      const int64_t n = p->shape.numel();
      const std::string pre = std::string(name) + ".";
      // The same f32 operations in the same order (torch's lerp and add_ as fused multiply-adds);
      // 1e-6 for another CPU's vector kernels. A sign flipped by an update
      // within rounding of 0 would move a weight by 2 lr = 0.04.
      EXPECT_LT(max_abs_diff(p->main.view({n}), f.read(pre + "w." + p->name).view({n})), 1e-6);
      EXPECT_LT(max_abs_diff(lion.exp_avg().flat_view(lion.state_offset(*p, 0), {n}),
                             f.read(pre + "m." + p->name).view({n})),
                1e-6);
      // Lion's matrices keep one moment, the others Adam's two.
      EXPECT_EQ(lion.state_offset(*p, 1) >= 0, !is_muon_matrix(*p));
      if (!is_muon_matrix(*p)) {
        EXPECT_LT(max_abs_diff(lion.exp_avg_sq().flat_view(lion.state_offset(*p, 1), {n}),
                               f.read(pre + "v." + p->name).view({n})),
                  1e-6);
      }
    }
  }
}

// A deterministic full matrix, the same on every rank.
Tensor full_matrix(int64_t rows, int64_t cols, uint64_t stream) {
  Tensor t = Tensor::empty({rows, cols}, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>(2.0 * Philox::uniform(5, stream, i) - 1.0);
  return t;
}

// Rows [r0, r1) of x, or with columns: columns [c0, c1).
Tensor rows_of(const Tensor& x, int64_t r0, int64_t r1) {
  return x.slice0(r0, r1).clone();
}
Tensor cols_of(const Tensor& x, int64_t c0, int64_t c1) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  Tensor out = Tensor::empty({rows, c1 - c0}, DType::kF32);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c)
      out.data<float>()[r * (c1 - c0) + c - c0] = x.data<float>()[r * cols + c];
  return out;
}

// The shard of rank r of a row-split matrix made of `blocks` equal blocks of rows (stride):
// every block's r-th slice, in block order.
Tensor strided_rows(const Tensor& x, int blocks, int r, int world) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  const int64_t block = rows / blocks, slice = block / world;
  Tensor out = Tensor::empty({slice * blocks, cols}, DType::kF32);
  for (int b = 0; b < blocks; ++b)
    out.slice0(b * slice, (b + 1) * slice)
        .copy_from(x.slice0(b * block + r * slice, b * block + (r + 1) * slice));
  return out;
}

// A QKV with 2 query groups per rank: the rank's groups are consecutive row blocks.
TEST(MuonTensorParallel, DuplicatedAndDistributedEqualOneProcessBlockwiseIsTheShard) {
  ProcessGroup& g = world();
  const int W = g.size(), r = g.rank();
  struct Case {
    const char* name;
    int dim;  // the partition dim
    int stride;
    bool qkv;
    bool expert;
    int64_t rows, cols;
  };
  const std::vector<Case> cases = {{"row split (column-parallel)", 0, 1, false, false, 16 * W, 24},
                                   {"column split (row-parallel)", 1, 1, false, false, 20, 12 * W},
                                   {"square column split", 1, 1, false, false, 12 * W, 12 * W},
                                   {"stride 2 (SwiGLU fc1)", 0, 2, false, false, 16 * W, 20},
                                   {"QKV by query groups", 0, 1, true, false, 2 * W * 16, 24},
                                   {"expert over its own group", 1, 1, false, true, 24, 8 * W}};
  for (bool bf16 : {false, true}) {
    for (MuonTpMode mode :
         {MuonTpMode::kDuplicated, MuonTpMode::kDistributed, MuonTpMode::kBlockwise}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(std::string(c.name) + (bf16 ? ", bf16" : ", f32") + ", mode " +
                     std::to_string(static_cast<int>(mode)));
        MuonConfig cfg;
        cfg.bf16_iteration = bf16;
        cfg.tp_mode = mode;
        const Tensor full = full_matrix(c.rows, c.cols, 11 + c.rows + c.cols);
        const Tensor mine = c.dim == 1     ? cols_of(full, r * c.cols / W, (r + 1) * c.cols / W)
                            : c.stride > 1 ? strided_rows(full, c.stride, r, W)
                                           : rows_of(full, r * c.rows / W, (r + 1) * c.rows / W);
        auto make = [&](bool split) {
          Param p;
          p.name = c.name;
          p.shape = split ? mine.shape() : full.shape();
          if (split) {
            p.tp_partition_dim = c.dim;
            p.tp_partition_stride = c.stride;
            p.tp_size = W;
            p.tp_rank = r;
          }
          p.expert_parallel = c.expert;
          if (c.qkv) p.qkv_split = {8, 4, 4};
          return p;
        };
        Param shard = make(true), whole = make(false);
        std::vector<Param*> ptrs = {&shard, &whole};
        ParamSet ps(ptrs, DType::kF32);
        AdamWConfig adam;
        adam.rule = UpdateRule::kMuon;
        // The expert case goes over the other group argument (the same ranks here).
        Muon muon(ps, adam, cfg, g, g);
        const Tensor got = muon.orthogonalize(shard, mine);
        const Tensor one = muon.orthogonalize(whole, full);
        const Tensor want = c.dim == 1     ? cols_of(one, r * c.cols / W, (r + 1) * c.cols / W)
                            : c.stride > 1 ? strided_rows(one, c.stride, r, W)
                                           : rows_of(one, r * c.rows / W, (r + 1) * c.rows / W);
        if (mode == MuonTpMode::kBlockwise) {
          // The shard alone: the same as a one-process Param of the shard's shape.
          Param alone = make(false);
          alone.shape = mine.shape();
          EXPECT_EQ(max_abs_diff(got, muon.orthogonalize(alone, mine)), 0.0);
          if (W > 1) {
            EXPECT_GT(max_abs_diff(got, want), 0.05);  // not the whole matrix's update
          }
          continue;
        }
        // Duplicated gathers the exact matrix (rows, or columns through the transposes) and
        // iterates in the one-process orientation: the same bits, but for stride blocks.
        const bool exact = mode == MuonTpMode::kDuplicated && c.stride == 1;
        const double tol = exact ? 0.0 : bf16 ? 0.05 : 1e-5;
        // The update's elements are O(1) (an orthogonal matrix times sqrt of its size, about
        // 1 / sqrt(size) each, times the scale); bf16's bound is a few bf16 ulps of that carried
        // through five steps.
        EXPECT_LE(max_abs_diff(got, want), tol);
      }
    }
  }
}

TEST(MuonCoefficients, TypesScheduleAndScales) {
  // quintic cycles its five sets, polar_express repeats its last, unknown types are empty.
  const auto q = muon_coefficients("quintic", 7);
  EXPECT_EQ(q[5], q[0]);
  EXPECT_EQ(q[6], q[1]);
  const auto pe = muon_coefficients("polar_express", 10);
  EXPECT_EQ(pe[9], pe[7]);
  EXPECT_NE(pe[7], pe[6]);
  EXPECT_TRUE(muon_coefficients("custom", 5).empty());
  EXPECT_DOUBLE_EQ(muon_scale(MuonScaleMode::kSpectral, 16, 64), 8.0);
  EXPECT_DOUBLE_EQ(muon_scale(MuonScaleMode::kUnitRmsNorm, 16, 64), 0.5);
  EXPECT_DOUBLE_EQ(muon_scale(MuonScaleMode::kShapeScaling, 16, 64), 1.0);
  EXPECT_DOUBLE_EQ(muon_scale(MuonScaleMode::kShapeScaling, 64, 16), 2.0);
  // Five quintic steps bring every singular value of a full-rank matrix near 1 (what Muon is
  // for; PyTorch puts them in [0.978, 1.025] for a 32 x 8 Gaussian), so X^T X is near the
  // identity: its eigenvalues in [0.95, 1.06] bound every entry's distance from I by 0.06.
  const Tensor x = full_matrix(32, 8, 3);
  const Tensor o = newton_schulz(x, muon_coefficients("quintic", 5), true, false);
  Tensor gram = Tensor::empty({8, 8}, DType::kF32);
  ops::matmul(gram, o, true, o, false);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) EXPECT_NEAR(gram.item(i * 8 + j), i == j ? 1.0 : 0.0, 0.1);
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--oracle-dir=", 0) == 0) megatron::g_oracle_dir = a.substr(13);
  }
  ::testing::InitGoogleTest(&argc, argv);
  megatron::g_runtime = &runtime;
  return megatron::testing::run_all_tests_on_every_rank(
      runtime, megatron::testing::expected_world_size(argc, argv));
}
