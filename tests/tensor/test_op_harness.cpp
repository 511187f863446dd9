// The op-consistency harness (ggml's test-backend-ops is the model): every op of tensor/ops.h,
// over shapes that include one element, odd and tail sizes (past the vector width and the 64-wide
// tiles), run through ops.h on every device and dtype it has (the CPU device in f32 and in f64
// today) and on the reference device (tensor/reference/: the naive fp64 formulas), compared by
// normalised mean squared error; and, in gradient mode, backwards against central finite
// differences. Each case is written once, as ops.h calls on a Place (a device and a dtype); the
// reference device's results are the expected ones.
//
// Each device adds its places to places() and every case checks it (the CUDA device's where a GPU
// is visible: OpsHarness.CudaDevice says so, or is skipped saying why not); a new op adds its
// cases, and OpsHarness.CoversEveryOpInOpsH fails until it has them (it reads ops.h).
//
// Error measure and thresholds (the reason for each number): NMSE = sum (got - want)^2 /
// sum want^2. Fast f32 kernels round each operation to 24 bits (relative 6e-8) and reductions
// grow that with their length: NMSE below 1e-9 (a relative error of about 3e-5) holds for every
// case here; a wrong term gives NMSE of 1e-4 or more. Fast f64 against the reference differs by
// summation order only: 1e-20. Exact ops (copies, lookups, sums in a fixed order) must agree
// bit for bit. Finite differences with step 1e-6 in fp64 are accurate to about 1e-8 on these
// smooth functions: 1e-6 absolute and relative (testing::allclose).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tensor/ops.h"
#include "tensor/reference/reference.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using testing::random_tensor;

constexpr double kNmseF32 = 1e-9, kNmseF64 = 1e-20, kFdTol = 1e-6;

// Where a case runs: a device, the dtype its floating tensors take there, and the NMSE allowed
// against the reference.
struct Place {
  const char* name;
  Device device;
  DType dtype;
  double nmse;

  // An input moved here: floating tensors converted to dtype, ids and masks keep theirs.
  Tensor operator()(const Tensor& t) const {
    const bool floating = t.dtype() == DType::kF64 || t.dtype() == DType::kF32;
    return (floating ? t.to(dtype) : t).to(device);
  }
  Tensor empty(const Shape& s) const { return Tensor::empty(s, dtype, device); }
  Tensor zeros(const Shape& s) const { return Tensor::zeros(s, dtype, device); }
  Tensor full(const Shape& s, double v) const { return Tensor::full(s, v, dtype, device); }
};
const Place kReference{"reference", Device::kReference, DType::kF64, 0};
// The CUDA device's f32 kernels round like the CPU's (no TF32 in its GEMMs), and its f64 kernels
// differ from the reference by summation order only: the same thresholds.
std::vector<Place> places() {
  std::vector<Place> all = {{"cpu f32", Device::kCPU, DType::kF32, kNmseF32},
                            {"cpu f64", Device::kCPU, DType::kF64, kNmseF64}};
  if (device_available(Device::kCUDA)) {
    all.push_back({"cuda f32", Device::kCUDA, DType::kF32, kNmseF32});
    all.push_back({"cuda f64", Device::kCUDA, DType::kF64, kNmseF64});
  }
  return all;
}

double nmse(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = got.item(i) - want.item(i);
    num += d * d;
    den += want.item(i) * want.item(i);
  }
  return den > 0 ? num / den : num;
}

Tensor host_f64(const Tensor& t) {
  return t.to(Device::kCPU).to(DType::kF64);
}

// A case: inputs made once (f64 values exactly representable in f32); `run(place)` runs the op on
// copies at `place` and returns its outputs. `same`: pairs of outputs that compute one thing two
// ways (a merge of two key blocks and one pass, the sharded loss with one shard and the whole):
// they must agree at every place, the reference included.
struct Case {
  std::string op, shape;
  std::function<std::vector<Tensor>(const Place&)> run;
  bool exact = false;  // copies, lookups and fixed-order sums: bit for bit
  std::vector<std::pair<size_t, size_t>> same = {};
};

std::vector<Case>& cases() {
  static std::vector<Case> all;
  return all;
}
std::set<std::string>& covered() {
  static std::set<std::string> ops;
  return ops;
}
void add(Case c, std::initializer_list<const char*> ops) {
  for (const char* o : ops) covered().insert(o);
  cases().push_back(std::move(c));
}

std::string dims(const Shape& s) {
  return s.str();
}

// Row shapes [rows, cols]: one element, odd, and past the vector width and the 64-wide tiles.
const std::vector<Shape> kRowShapes = {{1, 1}, {3, 7}, {5, 64}, {2, 65}, {4, 130}};

// Block-scaled FP8 (--fp8-recipe mxfp8 / blockwise) in the five block shapes the recipes use,
// both rules and formats, over shapes with partial blocks at both edges. The values' magnitudes
// change by powers of two every 16 rows and columns, so neighbouring blocks take different scales
// (and some blocks sit near E4M3's subnormals before scaling). Exact: one amax per block and one
// rounding of an exact product per value.
void register_fp8_blocks() {
  for (const Shape& s :
       std::vector<Shape>{{1, 1}, {3, 7}, {5, 64}, {2, 65}, {40, 70}, {130, 260}}) {
    Tensor a = random_tensor(s, 11, 2.0, DType::kF64);
    for (int64_t r = 0; r < s[0]; ++r)
      for (int64_t c = 0; c < s[1]; ++c)
        a.data<double>()[r * s[1] + c] *=
            std::ldexp(1.0, static_cast<int>(((r / 16) * 5 + (c / 16) * 3) % 24) - 12);
    add({"fp8_block_quantize", dims(s),
         [=](const Place& p) {
           std::vector<Tensor> outs;
           const DType q = p.dtype == DType::kF64 ? DType::kF64 : DType::kBF16;
           for (Fp8BlockRule rule : {Fp8BlockRule::kMxfp8, Fp8BlockRule::kBlockwise})
             for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
               for (auto [br, bc] : std::vector<std::pair<int64_t, int64_t>>{
                        {1, 32}, {32, 1}, {1, 128}, {128, 1}, {128, 128}}) {
                 Tensor out = Tensor::empty(s, q, p.device);
                 ops::fp8_block_quantize(out, p(a), br, bc, rule, f);
                 outs.push_back(out);
               }
           return outs;
         },
         true},
        {"fp8_block_quantize"});
    // Tiled primary weights: the matrix as two runs (a shard boundary inside a tile and a row),
    // both runs' maxima into one amax per tile, power-of-two scales from it (the blockwise rule),
    // each run encoded, the whole decoded. Exact: maxima, one rounding each, power-of-two factors.
    for (auto [br, bc] : std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {16, 16}, {128, 128}}) {
      add({"fp8_tile_abs_max, fp8_tile_encode, fp8_tile_decode",
           dims(s) + " tiles " + std::to_string(br) + "x" + std::to_string(bc),
           [=](const Place& p) {
             const int64_t n = s[0] * s[1], split = n / 3;
             const int64_t across = (s[1] + bc - 1) / bc, n_tiles = (s[0] + br - 1) / br * across;
             const Tensor x = p(a);
             const Tensor head = x.flat_view(0, {split}), tail = x.flat_view(split, {n - split});
             const ops::Fp8Tiles t0{0, s[1], br, bc}, t1{split, s[1], br, bc};
             Tensor amax = Tensor::zeros({n_tiles}, DType::kF32, p.device);
             ops::fp8_tile_abs_max(amax, head, t0);
             ops::fp8_tile_abs_max(amax, tail, t1);
             const Tensor host = amax.to(Device::kCPU);
             Tensor scales = Tensor::empty({n_tiles}, DType::kF32),
                    inv = Tensor::empty({n_tiles}, DType::kF32);
             for (int64_t i = 0; i < n_tiles; ++i) {
               const Fp8BlockScale b = fp8_block_scale(host.data<float>()[i],
                                                       Fp8BlockRule::kBlockwise, Fp8Format::kE4M3);
               scales.data<float>()[i] = b.scale;
               inv.data<float>()[i] = b.scale_inv;
             }
             Tensor codes = Tensor::empty({n}, DType::kU8, p.device);
             Tensor c0 = codes.flat_view(0, {split}), c1 = codes.flat_view(split, {n - split});
             const Tensor sd = scales.to(p.device), id = inv.to(p.device);
             ops::fp8_tile_encode(c0, head, t0, sd, Fp8Format::kE4M3);
             ops::fp8_tile_encode(c1, tail, t1, sd, Fp8Format::kE4M3);
             Tensor out = p.empty({n});
             ops::fp8_tile_decode(out, codes, t0, id, Fp8Format::kE4M3);
             return std::vector<Tensor>{amax.to(DType::kF64), out};
           },
           true},
          {"fp8_tile_abs_max", "fp8_tile_encode", "fp8_tile_decode"});
    }
  }
}

void register_elementwise() {
  for (const Shape& s : kRowShapes) {
    const Tensor a = random_tensor(s, 1, 2.0, DType::kF64),
                 b = random_tensor(s, 2, 2.0, DType::kF64);
    const Tensor bias = random_tensor({s[1]}, 3, 1.0, DType::kF64);
    add({"add",
         dims(s),
         [=](const Place& p) {
           Tensor out = p.empty(s), acc = p(a);
           ops::add(out, p(a), p(b));
           ops::add_inplace(acc, p(b));
           Tensor x = p(a);
           ops::bias_add(x, p(bias));
           Tensor db = p.zeros({s[1]});
           ops::bias_backward(db, p(b));
           Tensor sc = p(a);
           ops::scale_inplace(sc, -0.37);
           return std::vector<Tensor>{out, acc, x, db, sc};
         },
         false,
         {{0, 1}}},
        {"add", "add_inplace", "bias_add", "bias_backward", "scale_inplace"});
    // FP8: the scales put the values (|x| up to about 4) across each format's whole range: into
    // the subnormals (1e-3 for E4M3, 2e-5 for E5M2), around 1, and past the largest finite value
    // (saturation: 300 x 4 > 448, 3e4 x 4 > 57344). Exact: one rounding of an exact product.
    add({"fp8_quantize, abs_max", dims(s),
         [=](const Place& p) {
           std::vector<Tensor> outs;
           const DType q = p.dtype == DType::kF64 ? DType::kF64 : DType::kBF16;
           for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
             for (float scale : {1e-3f, 2e-5f, 1.0f, 300.0f, 3e4f}) {
               Tensor out = Tensor::empty(s, q, p.device);
               ops::fp8_quantize(out, p(a), scale, f);
               outs.push_back(out);
             }
           }
           outs.push_back(Tensor::full({1}, ops::abs_max(p(a)), DType::kF64, p.device));
           return outs;
         },
         true},
        {"fp8_quantize", "abs_max"});
    // FP8 primary weights: the same values as one-byte codes and back (the reference through the
    // codec, the kernels through bit arithmetic and a table); exact, NaN and -0 included.
    add({"fp8_encode, fp8_decode", dims(s),
         [=](const Place& p) {
           std::vector<Tensor> outs;
           for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
             for (float scale : {1e-3f, 2e-5f, 1.0f, 300.0f, 3e4f}) {
               Tensor codes = Tensor::empty(s, DType::kU8, p.device);
               ops::fp8_encode(codes, p(a), scale, f);
               Tensor out = p.empty(s);
               ops::fp8_decode(out, codes, f);
               outs.push_back(out);
             }
           }
           return outs;
         },
         true},
        {"fp8_encode", "fp8_decode"});
    // Block-scaled FP8 is registered once (register_fp8_blocks), over shapes of its own.
    for (bool tanh : {false, true}) {
      add({tanh ? "gelu (tanh)" : "gelu", dims(s),
           [=](const Place& p) {
             Tensor y = p.empty(s), dx = p.empty(s);
             ops::gelu_forward(y, p(a), tanh);
             ops::gelu_backward(dx, p(b), p(a), tanh);
             return std::vector<Tensor>{y, dx};
           }},
          {"gelu_forward", "gelu_backward"});
      // Fused with fc1's bias: on the CPU its own kernel, elsewhere the ops above composed.
      add({tanh ? "bias + gelu (tanh)" : "bias + gelu", dims(s),
           [=](const Place& p) {
             Tensor y = p.empty(s), pre = p(a);
             ops::bias_gelu_forward(y, pre, p(bias), tanh);
             return std::vector<Tensor>{y, pre};
           }},
          {"bias_gelu_forward"});
    }
    add({"tanh", dims(s),
         [=](const Place& p) {
           Tensor y = p.empty(s), dx = p.empty(s);
           ops::tanh_forward(y, p(a));
           // The backward reads the output: the reference's y, so that only the kernel differs.
           ops::tanh_backward(dx, p(b), p(ref::tanh(a)));
           return std::vector<Tensor>{y, dx};
         }},
        {"tanh_forward", "tanh_backward"});
    add({"squared relu", dims(s),
         [=](const Place& p) {
           Tensor y = p.empty(s), dx = p.empty(s);
           ops::squared_relu_forward(y, p(a));
           ops::squared_relu_backward(dx, p(b), p(a));
           return std::vector<Tensor>{y, dx};
         }},
        {"squared_relu_forward", "squared_relu_backward"});
    add({"quick gelu", dims(s),
         [=](const Place& p) {
           Tensor y = p.empty(s), dx = p.empty(s);
           ops::quick_gelu_forward(y, p(a));
           ops::quick_gelu_backward(dx, p(b), p(a));
           return std::vector<Tensor>{y, dx};
         }},
        {"quick_gelu_forward", "quick_gelu_backward"});
    const Shape half{s[0], std::max<int64_t>(1, s[1] / 2)};
    const Shape both{s[0], 2 * half[1]};
    const Tensor x2 = random_tensor(both, 4, 2.0, DType::kF64);
    const Tensor dy = random_tensor(half, 5, 1.0, DType::kF64);
    add({"swiglu", dims(both),
         [=](const Place& p) {
           Tensor y = p.empty(half), dx = p.empty(both);
           ops::swiglu_forward(y, p(x2));
           ops::swiglu_backward(dx, p(dy), p(x2));
           return std::vector<Tensor>{y, dx};
         }},
        {"swiglu_forward", "swiglu_backward"});
    // gpt-oss's clamped quick GeGLU (inputs of std 2 put about half the gates and ups past the
    // clamp 1.5) and the plain one with an offset.
    for (const double clamp : {0.0, 1.5}) {
      add({clamp > 0 ? "quick geglu (clamped)" : "quick geglu", dims(both),
           [=](const Place& p) {
             Tensor y = p.empty(half), dx = p.empty(both);
             ops::quick_geglu_forward(y, p(x2), 1.0, clamp);
             ops::quick_geglu_backward(dx, p(dy), p(x2), 1.0, clamp);
             return std::vector<Tensor>{y, dx};
           }},
          {"quick_geglu_forward", "quick_geglu_backward"});
    }
    // Dropout: the kept elements scaled by 1/(1-p), the mask a function of (seed, stream,
    // offset + i); backward applies the same mask.
    add({"dropout", dims(s),
         [=](const Place& p) {
           Tensor y = p.empty(s), dx = p.empty(s);
           ops::dropout_forward(y, p(a), 0.3f, 11, 4, 1000);
           ops::dropout_backward(dx, p(b), 0.3f, 11, 4, 1000);
           return std::vector<Tensor>{y, dx};
         }},
        {"dropout_forward", "dropout_backward"});
  }
}

void register_norms() {
  // A norm over one element is degenerate (x rstd = +-1 up to eps, so dx is the difference of two
  // nearly equal numbers, below f32's resolution): rows of at least 3 here.
  for (const Shape& s : {Shape{1, 3}, Shape{3, 7}, Shape{5, 64}, Shape{2, 65}, Shape{4, 130}}) {
    const Tensor x = random_tensor(s, 6, 2.0, DType::kF64),
                 dy = random_tensor(s, 7, 1.0, DType::kF64);
    const Tensor w = random_tensor({s[1]}, 8, 1.0, DType::kF64),
                 b = random_tensor({s[1]}, 9, 1.0, DType::kF64);
    add({"layernorm", dims(s),
         [=](const Place& p) {
           Tensor y = p.empty(s), mean = p.empty({s[0]}), rstd = p.empty({s[0]});
           ops::layernorm_forward(y, mean, rstd, p(x), p(w), p(b), 1e-5f);
           Tensor dx = p.empty(s), dw = p.zeros({s[1]}), db = p.zeros({s[1]});
           ops::layernorm_backward(dx, dw, db, p(dy), p(x), p(w), mean, rstd);
           return std::vector<Tensor>{y, mean, rstd, dx, dw, db};
         }},
        {"layernorm_forward", "layernorm_backward"});
    add({"rmsnorm", dims(s),
         [=](const Place& p) {
           Tensor y = p.empty(s), rstd = p.empty({s[0]});
           ops::rmsnorm_forward(y, rstd, p(x), p(w), 1e-6f);
           Tensor dx = p.empty(s), dw = p.zeros({s[1]});
           ops::rmsnorm_backward(dx, dw, p(dy), p(x), p(w), rstd);
           return std::vector<Tensor>{y, rstd, dx, dw};
         }},
        {"rmsnorm_forward", "rmsnorm_backward"});
  }
}

void register_matmul() {
  // Few rows (the skinny kernel of decoding: m up to 8, n past and off its 4-row blocks, k past and
  // off its vector width) and ordinary GEMMs.
  for (auto [m, n, k] : {std::array<int64_t, 3>{1, 1, 1},
                         {7, 5, 3},
                         {3, 37, 41},
                         {8, 9, 100},
                         {33, 65, 17},
                         {64, 130, 70}}) {
    for (int tr = 0; tr < 4; ++tr) {
      const bool ta = tr & 1, tb = tr & 2;
      const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 10, 1.0, DType::kF64);
      const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 11, 1.0, DType::kF64);
      add({std::string("matmul") + (ta ? " A^T" : "") + (tb ? " B^T" : ""), dims(Shape{m, n, k}),
           [=](const Place& p) {
             Tensor c = p.empty({m, n});
             ops::matmul(c, p(a), ta, p(b), tb);
             Tensor acc = p.full({m, n}, 0.5);
             ops::matmul(acc, p(a), ta, p(b), tb, 1.0f);
             return std::vector<Tensor>{c, acc};
           }},
          {"matmul"});
    }
  }
}

// Groups of no, one, odd and several blocks' rows (the CPU device's blocks are 128 x 512), with
// n and k_c past one block's columns; beta 0 and 1.
void register_grouped_matmul() {
  struct Shape3 {
    std::vector<int64_t> sizes;
    int64_t k, n;
  };
  for (const Shape3& s : {Shape3{{0, 1, 3}, 5, 7}, Shape3{{130, 0, 7, 260}, 17, 530}}) {
    int64_t N = 0;
    for (int64_t r : s.sizes) N += r;
    const auto G = static_cast<int64_t>(s.sizes.size());
    const std::string shape = dims(Shape{N, s.n, s.k}) + " in " + std::to_string(G) + " groups";
    const Tensor a = random_tensor({N, s.k}, 12, 1.0, DType::kF64);
    const Tensor c = random_tensor({N, s.n}, 13, 1.0, DType::kF64);
    for (bool tb : {false, true}) {
      std::vector<Tensor> b;
      for (int64_t g = 0; g < G; ++g)
        b.push_back(random_tensor(tb ? Shape{s.n, s.k} : Shape{s.k, s.n},
                                  static_cast<uint64_t>(14 + g), 1.0, DType::kF64));
      add({std::string("grouped_matmul") + (tb ? " B^T" : ""), shape,
           [=](const Place& p) {
             std::vector<Tensor> pb;
             for (const Tensor& t : b) pb.push_back(p(t));
             Tensor y = p.empty({N, s.n}), acc = p.full({N, s.n}, 0.5);
             ops::grouped_matmul(y, p(a), pb, tb, s.sizes);
             ops::grouped_matmul(acc, p(a), pb, tb, s.sizes, 1.0f);
             return std::vector<Tensor>{y, acc};
           }},
          {"grouped_matmul"});
    }
    add({"grouped_matmul_at", shape,
         [=](const Place& p) {
           std::vector<Tensor> w, acc;
           for (int64_t g = 0; g < G; ++g) {
             w.push_back(p.full({s.k, s.n}, 7.0));  // overwritten, also for a group of no rows
             acc.push_back(p.full({s.k, s.n}, 0.5));
           }
           ops::grouped_matmul_at(w, p(a), p(c), s.sizes);
           ops::grouped_matmul_at(acc, p(a), p(c), s.sizes, 1.0f);
           w.insert(w.end(), acc.begin(), acc.end());
           return w;
         }},
        {"grouped_matmul_at"});
  }
}

void register_lookups_and_copies() {
  for (auto [vocab, h, n] : {std::array<int64_t, 3>{1, 1, 1}, {13, 7, 9}, {40, 65, 30}}) {
    const Tensor table = random_tensor({vocab, h}, 12, 1.0, DType::kF64);
    const Tensor ids = testing::random_ids({n}, 13, vocab);
    const Tensor dout = random_tensor({n, h}, 14, 1.0, DType::kF64);
    const int64_t start = vocab / 3, rows = std::max<int64_t>(1, vocab / 3);
    add({"embedding", dims(Shape{vocab, h, n}),
         [=](const Place& p) {
           Tensor out = p.empty({n, h}), dt = p.zeros({vocab, h});
           ops::embedding_forward(out, p(ids), p(table));
           ops::embedding_backward(dt, p(dout), p(ids));
           // The block [start, start + rows) of the table: its rows only, zeros elsewhere.
           Tensor shard = p(table.slice0(start, start + rows).clone()), part = p.empty({n, h});
           ops::embedding_forward_shard(part, p(ids), shard, start);
           Tensor dshard = p.zeros({rows, h});
           ops::embedding_backward_shard(dshard, p(dout), p(ids), start);
           return std::vector<Tensor>{out, dt, part, dshard};
         },
         /*exact=*/true},
        {"embedding_forward", "embedding_backward", "embedding_forward_shard",
         "embedding_backward_shard"});
  }
  for (const Shape& s : kRowShapes) {
    const Tensor x = random_tensor(s, 15, 3.0, DType::kF64);
    const int64_t w = std::max<int64_t>(1, s[1] / 3);
    add({"layout copies",
         dims(s),
         [=](const Place& p) {
           Tensor tr = p.empty({s[1], s[0]});
           ops::transpose_2d(tr, p(x));
           Tensor left = p.empty({s[0], w}), right = p.empty({s[0], s[1] - w});
           ops::slice_last_dim(left, p(x), 0);
           if (s[1] > w) ops::slice_last_dim(right, p(x), w);
           Tensor back = p.empty(s);
           ops::concat_last_dim(
               back, s[1] > w ? std::vector<Tensor>{left, right} : std::vector<Tensor>{left});
           return std::vector<Tensor>{tr, back, p(x)};
         },
         /*exact=*/true,
         {{1, 2}}},
        {"transpose_2d", "slice_last_dim", "concat_last_dim"});
    // Per-row scalars and row permutations (an MoE layer's probabilities, dispatch and combine):
    // the index repeats rows and skips others, as a routing map does.
    const Tensor row_scale = random_tensor({s[0]}, 17, 1.0, DType::kF64);
    Tensor index = Tensor::empty({2 * s[0] + 1}, DType::kI64);
    for (int64_t r = 0; r < index.numel(); ++r) index.data<int64_t>()[r] = (r * 7 + 3) % s[0];
    add({"row scalars and permutations", dims(s),
         [=](const Place& p) {
           Tensor prod = p.empty(s);
           ops::mul(prod, p(x), p(x));
           Tensor sc = p(x);
           ops::scale_rows(sc, p(row_scale));
           Tensor dots = p.empty({s[0]});
           ops::row_dots(dots, p(x), sc);
           Tensor gathered = p.empty({index.numel(), s[1]});
           ops::gather_rows(gathered, p(x), p(index));
           Tensor scattered = p(x);
           ops::scatter_add_rows(scattered, gathered, p(index));
           return std::vector<Tensor>{prod, sc, dots, gathered, scattered};
         },
         false},
        {"mul", "scale_rows", "row_dots", "gather_rows", "scatter_add_rows"});
    // The mask is f32 at every place (ops.h: masked_sum's mask is f32).
    Tensor mask = random_tensor(s, 16, 1.0, DType::kF32);
    for (int64_t i = 0; i < mask.numel(); ++i) mask.data<float>()[i] = mask.data<float>()[i] > 0;
    // count_zeros on the mask, about half of whose elements are 0.
    add({"masked_sum, sum_squares, count_zeros", dims(s),
         [=](const Place& p) {
           const ops::MaskedSum ms = ops::masked_sum(p(x), mask.to(p.device));
           auto scalar = [&](double v) { return Tensor::full({1}, v, DType::kF64, p.device); };
           return std::vector<Tensor>{
               scalar(ms.sum), scalar(ms.count), scalar(ops::sum_squares(p(x))),
               scalar(static_cast<double>(ops::count_zeros(p(mask.to(DType::kF64)))))};
         }},
        {"masked_sum", "sum_squares", "count_zeros"});
  }
}

ops::RopeSpec yarn_spec(int64_t rot) {
  ops::RopeSpec spec{0, 2, rot, 10000.0f, true, 0, 1.0};
  spec.yarn_factor = 40;
  spec.mscale = 1.07;
  return spec;
}

void register_rope_and_loss() {
  for (auto [s, hn, rot] : {std::array<int64_t, 3>{1, 2, 2}, {5, 12, 8}, {9, 64, 64}}) {
    const Shape shape{s, 2, 2, 3, hn};
    const Tensor x = random_tensor(shape, 17, 1.0, DType::kF64);
    // Plain; interleaved with the sequence-length interpolation; Llama 3.1 scaling at a base of
    // 500000, whose 32 frequencies at rot 64 fall in all three bands of the rule (kept,
    // interpolated, slowed), at positions up to 9 x 600.
    for (const auto& [name, spec] :
         {std::pair{"rope", ops::RopeSpec{0, 2, rot, 10000.0f}},
          std::pair{"rope interleaved, positions / 4",
                    ops::RopeSpec{0, 2, rot, 10000.0f, true, 0, 0.25}},
          std::pair{"rope llama3.1 x8", ops::RopeSpec{0, 2, rot, 500000.0f, false, 8.0, 600.0}},
          // YaRN (multi-latent attention): factor 40 at DeepSeek-V3's original context, whose
          // correction range falls inside the pairs for rot 8 and 64, cos and sin scaled.
          std::pair{"rope yarn x40, mscale", yarn_spec(rot)}}) {
      add({name, dims(shape),
           [=](const Place& p) {
             Tensor y = p(x), back = p(x);
             ops::rope_inplace(y, Tensor(), spec, false);
             ops::rope_inplace(back, Tensor(), spec, true);
             return std::vector<Tensor>{y, back};
           }},
          {"rope_inplace"});
    }
  }
  for (auto [n, vp, vocab] : {std::array<int64_t, 3>{1, 1, 1}, {6, 40, 33}, {3, 1030, 1025}}) {
    const Tensor logits = random_tensor({n, vp}, 18, 4.0, DType::kF64);
    const Tensor targets = testing::random_ids({n}, 19, vocab);
    const Tensor dloss = random_tensor({n}, 20, 1.0, DType::kF64);
    add({"cross entropy",
         dims(Shape{n, vp, vocab}),
         [=](const Place& p) {
           Tensor loss = p.empty({n}), lse = p.empty({n});
           ops::cross_entropy_forward(loss, lse, p(logits), p(targets), vocab);
           Tensor d = p.empty({n, vp});
           ops::cross_entropy_backward(d, p(dloss), p(logits), lse, p(targets), vocab);
           Tensor lp = p.empty({n});
           ops::log_softmax_gather(lp, p(logits), p(targets), vocab);
           ops::scale_inplace(lp, -1.0);
           // One block: the shard ops with vocab_start 0 are the whole op.
           Tensor mx = p.empty({n}), sums = Tensor::empty({2 * n}, DType::kF64, p.device);
           ops::cross_entropy_shard_max(mx, p(logits), vocab);
           ops::cross_entropy_shard_sums(sums, p(logits), mx, p(targets), 0, vocab);
           Tensor loss2 = p.empty({n}), lse2 = p.empty({n});
           ops::cross_entropy_shard_finish(loss2, lse2, mx, sums);
           Tensor d2 = p.empty({n, vp});
           ops::cross_entropy_shard_backward(d2, p(dloss), p(logits), lse2, p(targets), 0, vocab);
           return std::vector<Tensor>{loss, lse, d, lp, loss2, lse2, d2};
         },
         false,
         {{0, 3}, {0, 4}, {1, 5}, {2, 6}}},
        {"cross_entropy_forward", "cross_entropy_backward", "log_softmax_gather",
         "cross_entropy_shard_max", "cross_entropy_shard_sums", "cross_entropy_shard_finish",
         "cross_entropy_shard_backward"});
  }
}

// Megatron's packed QKV [s, b, 2 groups, 2 + 2, hn] holding q [s, b, 4, hn] and k, v [s, b, 2,
// hn]: per group its two query heads, then its key and its value head.
Tensor pack_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t s = q.dim(0), hn = q.dim(3);
  Tensor qkv = Tensor::empty({s, 2, 2, 4, hn}, DType::kF64);
  for (int64_t tb = 0; tb < s * 2; ++tb)
    for (int64_t g = 0; g < 2; ++g)
      for (int64_t part = 0; part < 4; ++part) {
        const Tensor& src = part < 2 ? q : part == 2 ? k : v;
        const int64_t head = part < 2 ? g * 2 + part : g, heads = part < 2 ? 4 : 2;
        std::memcpy(qkv.data<double>() + ((tb * 2 + g) * 4 + part) * hn,
                    src.data<double>() + (tb * heads + head) * hn, hn * sizeof(double));
      }
  return qkv;
}

void register_attention_and_optimizer() {
  // sq x skv x heads (groups x per group) x hn, causal or not: tails past the 64-wide tiles.
  for (auto [sq, skv, hn, causal] :
       {std::array<int64_t, 4>{1, 1, 2, 1}, {5, 9, 4, 0}, {65, 65, 16, 1}, {70, 130, 8, 0}}) {
    const Tensor q = random_tensor({sq, 2, 4, hn}, 21, 1.0, DType::kF64);
    const Tensor k = random_tensor({skv, 2, 2, hn}, 22, 1.0, DType::kF64);
    const Tensor v = random_tensor({skv, 2, 2, hn}, 23, 1.0, DType::kF64);
    const Tensor dout = random_tensor({sq, 2, 4, hn}, 24, 1.0, DType::kF64);
    const Tensor qkv = sq == skv ? pack_qkv(q, k, v) : Tensor();
    ops::AttentionSpec spec;
    spec.scale = 0.5f;
    spec.causal = causal != 0;
    spec.q_offset = skv - sq > 0 && causal ? skv - sq : 0;
    // Outputs: out, lse, dq, dk, dv; the keys in two blocks merged (out, lse) and their
    // backwards (dq summed, dk and dv side by side); each head's largest score (max_logit) of
    // the whole call and raised by the two blocks; the packed-QKV forward when sq == skv.
    std::vector<std::pair<size_t, size_t>> same = {{0, 5}, {1, 6}, {2, 7},
                                                   {3, 8}, {4, 9}, {10, 11}};
    if (sq == skv) same.emplace_back(0, 12);
    add({causal ? "attention (causal)" : "attention", dims(Shape{sq, skv, hn}),
         [=](const Place& p) {
           const Tensor qt = p(q), kt = p(k), vt = p(v), dt = p(dout);
           Tensor out = p.empty({sq, 2, 4, hn}), lse = p.empty({2, 4, sq});
           const auto qv = ops::attention_view(qt, 2);
           // max_logit is f32 on every device but the reference (f64).
           const DType stat = p.device == Device::kReference ? DType::kF64 : DType::kF32;
           const double none = -std::numeric_limits<double>::infinity();
           ops::AttentionSpec whole = spec;
           whole.max_logit = Tensor::full({4}, none, stat, p.device);
           ops::attention_forward(out, lse, qv, ops::attention_view(kt, 2),
                                  ops::attention_view(vt, 2), whole);
           Tensor dq = p.empty(qt.shape()), dk = p.empty(kt.shape()), dv = p.empty(vt.shape());
           ops::attention_backward(ops::attention_view(dq, 2), ops::attention_view(dk, 2),
                                   ops::attention_view(dv, 2), Tensor(), dt, qv,
                                   ops::attention_view(kt, 2), ops::attention_view(vt, 2), out, lse,
                                   spec);
           // Keys [0, half) and [half, skv) as two blocks (at their global positions), merged
           // through their log-sum-exps; each block's backward with the merged out and lse.
           const int64_t half = (skv + 1) / 2;
           Tensor merged = p.empty(out.shape()), mlse = p.empty(lse.shape());
           Tensor out_b = p.empty(out.shape()), lse_b = p.empty(lse.shape());
           ops::AttentionSpec first = spec, second = spec;
           second.kv_offset = half;
           const Tensor block_max = Tensor::full({4}, none, stat, p.device);
           first.max_logit = second.max_logit = block_max;
           const Tensor k1 = kt.slice0(0, half), v1 = vt.slice0(0, half);
           const Tensor k2 = kt.slice0(half, skv), v2 = vt.slice0(half, skv);
           ops::attention_forward(merged, mlse, qv, ops::attention_view(k1, 2),
                                  ops::attention_view(v1, 2), first);
           if (skv > half) {
             ops::attention_forward(out_b, lse_b, qv, ops::attention_view(k2, 2),
                                    ops::attention_view(v2, 2), second);
             ops::attention_merge(merged, mlse, out_b, lse_b);
           }
           Tensor bdq = p.empty(qt.shape()), bdk = p.empty(kt.shape()), bdv = p.empty(vt.shape());
           Tensor dk1 = bdk.slice0(0, half), dv1 = bdv.slice0(0, half);
           ops::attention_backward(ops::attention_view(bdq, 2), ops::attention_view(dk1, 2),
                                   ops::attention_view(dv1, 2), Tensor(), dt, qv,
                                   ops::attention_view(k1, 2), ops::attention_view(v1, 2), merged,
                                   mlse, first);
           if (skv > half) {
             Tensor dq2 = p.empty(qt.shape());
             Tensor dk2 = bdk.slice0(half, skv), dv2 = bdv.slice0(half, skv);
             ops::attention_backward(ops::attention_view(dq2, 2), ops::attention_view(dk2, 2),
                                     ops::attention_view(dv2, 2), Tensor(), dt, qv,
                                     ops::attention_view(k2, 2), ops::attention_view(v2, 2), merged,
                                     mlse, second);
             ops::add_inplace(bdq, dq2);
           }
           // The statistic is f32 on every device, the reference's rounded to f32 alike (an
           // f64 kernel's score and the reference's round to the same f32).
           auto stat_of = [&](const Tensor& m) {
             return p.device == Device::kReference ? m.to(DType::kF32).to(DType::kF64) : m;
           };
           std::vector<Tensor> outs{out,
                                    lse,
                                    dq,
                                    dk,
                                    dv,
                                    merged,
                                    mlse,
                                    bdq,
                                    bdk,
                                    bdv,
                                    stat_of(whole.max_logit),
                                    stat_of(block_max)};
           if (sq == skv) {
             // The same q, k, v read in place from Megatron's packed QKV.
             const Tensor packed = p(qkv);
             Tensor pout = p.empty(out.shape()), plse = p.empty(lse.shape());
             ops::attention_forward(pout, plse, ops::packed_qkv_view(packed, ops::QkvPart::kQuery),
                                    ops::packed_qkv_view(packed, ops::QkvPart::kKey),
                                    ops::packed_qkv_view(packed, ops::QkvPart::kValue), spec);
             outs.push_back(pout);
           }
           return outs;
         },
         false, same},
        {"attention_forward", "attention_backward", "attention_merge", "attention_view",
         "packed_qkv_view"});
  }
  // gpt-oss's layers: a sliding window (across a tile boundary) with sinks, forward and backward.
  for (int64_t s : {1, 70}) {
    const Tensor q = random_tensor({s, 2, 4, 16}, 41, 1.0, DType::kF64);
    const Tensor k = random_tensor({s, 2, 2, 16}, 42, 1.0, DType::kF64);
    const Tensor v = random_tensor({s, 2, 2, 16}, 43, 1.0, DType::kF64);
    const Tensor dout = random_tensor({s, 2, 4, 16}, 44, 1.0, DType::kF64);
    const Tensor sink = random_tensor({4}, 45, 2.0, DType::kF64);
    ops::AttentionSpec spec;
    spec.scale = 0.25f;
    spec.window = 5;
    add({"attention (window, sinks)", dims(Shape{s, 16}),
         [=](const Place& p) {
           Tensor out = p.empty({s, 2, 4, 16}), lse = p.empty({2, 4, s});
           const Tensor qt = p(q), kt = p(k), vt = p(v), st = p(sink);
           const auto qv = ops::attention_view(qt, 2), kv = ops::attention_view(kt, 2),
                      vv = ops::attention_view(vt, 2);
           ops::attention_forward(out, lse, qv, kv, vv, spec);
           ops::attention_sink_forward(out, lse, st);
           Tensor dq = p.empty(qt.shape()), dk = p.empty(kt.shape()), dv = p.empty(vt.shape());
           ops::attention_backward(ops::attention_view(dq, 2), ops::attention_view(dk, 2),
                                   ops::attention_view(dv, 2), Tensor(), p(dout), qv, kv, vv, out,
                                   lse, spec);
           Tensor dsink = p.empty({4});
           ops::attention_sink_backward(dsink, p(dout), out, lse, st);
           return std::vector<Tensor>{out, lse, dq, dk, dv, dsink};
         }},
        {"attention_sink_forward", "attention_sink_backward"});
  }
  for (int64_t n : {1, 7, 1001}) {
    const Tensor param = random_tensor({n}, 25, 1.0, DType::kF64),
                 g = random_tensor({n}, 26, 1.0, DType::kF64);
    const ops::AdamWSpec spec{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.7};
    add({"adamw_step", dims(Shape{n}),
         [=](const Place& p) {
           Tensor pt = p(param), m = p.zeros({n}), v2 = p.zeros({n});
           ops::adamw_step(pt, m, v2, p(g), spec);
           return std::vector<Tensor>{pt, m, v2};
         }},
        {"adamw_step"});
    // SGD: the buffer's first step (a copy), a second one (momentum), and no buffer.
    const Tensor g2 = random_tensor({n}, 27, 1.0, DType::kF64);
    add({"sgd_step", dims(Shape{n}),
         [=](const Place& p) {
           Tensor pt = p(param), buf = p.zeros({n}), none;
           ops::SgdSpec sgd{1e-2f, 0.9f, 0.1f, true, 0.7};
           ops::sgd_step(pt, buf, p(g), sgd);
           sgd.first = false;
           ops::sgd_step(pt, buf, p(g2), sgd);
           Tensor plain = p(param);
           ops::sgd_step(plain, none, p(g), ops::SgdSpec{1e-2f, 0.0f, 0.1f, true, 1.0});
           return std::vector<Tensor>{pt, buf, plain};
         }},
        {"sgd_step"});
    // Lion: two steps, betas on both sides of torch's lerp switch at 0.5, the clipping factor.
    add({"lion_step", dims(Shape{n}),
         [=](const Place& p) {
           Tensor pt = p(param), m = p.zeros({n});
           // lerp weights (1 - beta) below 0.5, then at and above it.
           ops::lion_step(pt, m, p(g), ops::LionSpec{1e-2f, 0.1f, 0.01f, -1e-3f, 0.7});
           ops::lion_step(pt, m, p(g2), ops::LionSpec{1e-2f, 0.7f, 0.5f, -1e-3f, 1.0});
           return std::vector<Tensor>{pt, m};
         }},
        {"lion_step"});
    // The precision-aware optimizer's scaled moments (fp16 and E4M3 codes from zero): the CPU's
    // two-pass kernel in f32, the composed ops elsewhere. Gradients from a few dyadic values and
    // beta 0.5, so that every scaled moment lies well inside a rounding interval of its format
    // (f32 and f64 round it alike); the moments are compared read back.
    const double kGrads[] = {1.0, -0.5, 0.25, -0.75, 1.5};
    Tensor gd = Tensor::empty({n}, DType::kF64);
    for (int64_t i = 0; i < n; ++i) gd.data<double>()[i] = kGrads[i % 5];
    const ops::AdamWSpec half_betas{1e-2f, 0.5f, 0.5f, 1e-8f, 0.1f, 1, 1.0};
    add({"adamw_step_scaled", dims(Shape{n}),
         [=](const Place& p) {
           std::vector<Tensor> outs;
           for (DType stored : {DType::kF16, DType::kU8}) {
             Tensor pt = p(param), m = Tensor::zeros({n}, stored, p.device),
                    v = Tensor::zeros({n}, stored, p.device);
             float ms = 1, vs = 1;
             ops::adamw_step_scaled(pt, {&m, &ms}, {&v, &vs}, p(gd), half_betas);
             outs.push_back(pt);
             for (ops::StoredMoment read : {ops::StoredMoment{&m, &ms}, {&v, &vs}}) {
               Tensor wide = p.empty({n});
               ops::unscale_moment(wide, read);
               outs.push_back(wide);
             }
           }
           return outs;
         }},
        {"adamw_step_scaled", "unscale_moment"});
    // Stored and read back: fp16 and E4M3 with new scales, bf16 rounded.
    add({"store_moment, unscale_moment", dims(Shape{n}),
         [=](const Place& p) {
           std::vector<Tensor> outs;
           for (DType stored : {DType::kF16, DType::kU8, DType::kBF16}) {
             Tensor t = Tensor::zeros({n}, stored, p.device), values = p(gd);
             float scale = 1;
             ops::store_moment({&t, &scale}, values);
             Tensor back = p.empty({n});
             ops::unscale_moment(back, {&t, &scale});
             outs.push_back(back);
           }
           return outs;
         }},
        {"store_moment", "unscale_moment"});
  }
}

void register_all() {
  if (!cases().empty()) return;
  register_elementwise();
  register_fp8_blocks();
  register_norms();
  register_matmul();
  register_grouped_matmul();
  register_lookups_and_copies();
  register_rope_and_loss();
  register_attention_and_optimizer();
}

TEST(OpsHarness, EveryCaseOnEveryDeviceMatchesTheReference) {
  register_all();
  int checked = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.op + " " + c.shape);
    std::vector<Tensor> want = c.run(kReference);
    for (Tensor& w : want) {
      ASSERT_EQ(w.device(), Device::kReference);
      w = host_f64(w);
    }
    for (auto [i, j] : c.same) {
      EXPECT_LE(nmse(want[j], want[i]), kNmseF64) << "reference: outputs " << i << ", " << j;
    }
    for (const Place& place : places()) {
      SCOPED_TRACE(place.name);
      std::vector<Tensor> got = c.run(place);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].numel(), want[i].numel()) << "output " << i;
        got[i] = host_f64(got[i]);
        if (c.exact && place.dtype == DType::kF64) {
          EXPECT_TRUE(testing::allclose(got[i], want[i], 0, 0)) << "output " << i;
        } else {
          const double e = nmse(got[i], want[i]);
          EXPECT_LE(e, place.nmse) << "output " << i << ": NMSE " << e;
        }
        ++checked;
      }
      for (auto [i, j] : c.same) {
        EXPECT_LE(nmse(got[j], got[i]), place.nmse) << "outputs " << i << ", " << j;
      }
    }
  }
  EXPECT_GT(checked, device_available(Device::kCUDA) ? 600 : 300);
}

// The CUDA device's places above run only where a GPU is visible; elsewhere this test is reported
// as skipped with the reason, so that a run without one never passes for one that checked it.
TEST(OpsHarness, CudaDevice) {
  std::string why;
  if (!device_available(Device::kCUDA, &why)) {
    GTEST_SKIP() << "the CUDA device is not checked here: " << why;
  }
  int cuda_places = 0;
  for (const Place& p : places()) cuda_places += p.device == Device::kCUDA;
  EXPECT_EQ(cuda_places, 2);
}

// A tensor on the reference device, and one back on the host.
Tensor on_ref(const Tensor& t) {
  return t.to(Device::kReference);
}

// Gradient mode: each differentiable op's reference backward against central differences of
// its reference forward, and the fast f64 backward (and the reference device's norm backwards,
// which have their own formulas) against the same differences.
TEST(OpsHarness, BackwardsMatchFiniteDifferences) {
  const Tensor x = random_tensor({3, 7}, 30, 2.0, DType::kF64),
               dy = random_tensor({3, 7}, 31, 1.0, DType::kF64);
  const Tensor w = random_tensor({7}, 32, 1.0, DType::kF64),
               b = random_tensor({7}, 33, 1.0, DType::kF64);
  auto fd = [&](const std::function<Tensor(const Tensor&)>& f, const Tensor& at, const Tensor& d) {
    return testing::fd_grad(f, at, d);
  };
  for (bool tanh : {false, true}) {
    const Tensor want = fd([&](const Tensor& v) { return ref::gelu(v, tanh); }, x, dy);
    EXPECT_TRUE(testing::allclose(ref::gelu_backward(dy, x, tanh), want, kFdTol, kFdTol));
    Tensor dx = Tensor::empty(x.shape(), DType::kF64);
    ops::gelu_backward(dx, dy, x, tanh);
    EXPECT_TRUE(testing::allclose(dx, want, kFdTol, kFdTol)) << "gelu " << tanh;
  }
  {
    const Tensor want = fd([](const Tensor& v) { return ref::tanh(v); }, x, dy);
    EXPECT_TRUE(testing::allclose(ref::tanh_backward(dy, ref::tanh(x)), want, kFdTol, kFdTol));
    Tensor dx = Tensor::empty(x.shape(), DType::kF64);
    ops::tanh_backward(dx, dy, ref::tanh(x));
    EXPECT_TRUE(testing::allclose(dx, want, kFdTol, kFdTol)) << "tanh";
  }
  {
    // Away from the kink at 0 (no element of x lies within the FD step of it).
    const Tensor want = fd([](const Tensor& v) { return ref::squared_relu(v); }, x, dy);
    EXPECT_TRUE(testing::allclose(ref::squared_relu_backward(dy, x), want, kFdTol, kFdTol));
    Tensor dx = Tensor::empty(x.shape(), DType::kF64);
    ops::squared_relu_backward(dx, dy, x);
    EXPECT_TRUE(testing::allclose(dx, want, kFdTol, kFdTol)) << "squared relu";
  }
  {
    const Tensor want = fd([](const Tensor& v) { return ref::quick_gelu(v); }, x, dy);
    EXPECT_TRUE(testing::allclose(ref::quick_gelu_backward(dy, x), want, kFdTol, kFdTol));
    Tensor dx = Tensor::empty(x.shape(), DType::kF64);
    ops::quick_gelu_backward(dx, dy, x);
    EXPECT_TRUE(testing::allclose(dx, want, kFdTol, kFdTol)) << "quick gelu";
  }
  {
    const Tensor x2 = random_tensor({3, 8}, 34, 2.0, DType::kF64),
                 d2 = random_tensor({3, 4}, 35, 1.0, DType::kF64);
    const Tensor want = fd([](const Tensor& v) { return ref::swiglu(v); }, x2, d2);
    Tensor dx = Tensor::empty(x2.shape(), DType::kF64);
    ops::swiglu_backward(dx, d2, x2);
    EXPECT_TRUE(testing::allclose(dx, want, kFdTol, kFdTol)) << "swiglu";
    // Clamped quick GeGLU: no element of x2 lies within the step of the clamp (1.5).
    for (const double clamp : {0.0, 1.5}) {
      const Tensor wq =
          fd([&](const Tensor& v) { return ref::quick_geglu(v, 1.0, clamp); }, x2, d2);
      EXPECT_TRUE(
          testing::allclose(ref::quick_geglu_backward(d2, x2, 1.0, clamp), wq, kFdTol, kFdTol));
      Tensor dq = Tensor::empty(x2.shape(), DType::kF64);
      ops::quick_geglu_backward(dq, d2, x2, 1.0, clamp);
      EXPECT_TRUE(testing::allclose(dq, wq, kFdTol, kFdTol)) << "quick geglu " << clamp;
    }
  }
  {
    const double eps = 1e-5;
    const Tensor want = fd([&](const Tensor& v) { return ref::layernorm(v, w, b, eps); }, x, dy);
    EXPECT_TRUE(testing::allclose(ref::layernorm_backward(dy, x, w, eps).dx, want, kFdTol, kFdTol));
    const Tensor want_w = fd([&](const Tensor& v) { return ref::layernorm(x, v, b, eps); }, w, dy);
    EXPECT_TRUE(
        testing::allclose(ref::layernorm_backward(dy, x, w, eps).dweight, want_w, kFdTol, kFdTol));
    const Tensor want_r = fd([&](const Tensor& v) { return ref::rmsnorm(v, w, eps); }, x, dy);
    EXPECT_TRUE(testing::allclose(ref::rmsnorm_backward(dy, x, w, eps).dx, want_r, kFdTol, kFdTol));
    // The reference device's backwards, which work from forward's mean and rstd.
    Tensor y = on_ref(x.clone()), mean = on_ref(Tensor::empty({3}, DType::kF64)),
           rstd = on_ref(Tensor::empty({3}, DType::kF64));
    ops::layernorm_forward(y, mean, rstd, on_ref(x), on_ref(w), on_ref(b), 1e-5f);
    Tensor dx = on_ref(x.clone()), dw = on_ref(Tensor::zeros({7}, DType::kF64)),
           db = on_ref(Tensor::zeros({7}, DType::kF64));
    ops::layernorm_backward(dx, dw, db, on_ref(dy), on_ref(x), on_ref(w), mean, rstd);
    const double feps = static_cast<double>(1e-5f);
    EXPECT_TRUE(testing::allclose(
        dx.to(Device::kCPU),
        fd([&](const Tensor& v) { return ref::layernorm(v, w, b, feps); }, x, dy), kFdTol, kFdTol))
        << "reference device layernorm dx";
    EXPECT_TRUE(testing::allclose(
        dw.to(Device::kCPU),
        fd([&](const Tensor& v) { return ref::layernorm(x, v, b, feps); }, w, dy), kFdTol, kFdTol))
        << "reference device layernorm dweight";
    ops::rmsnorm_forward(y, rstd, on_ref(x), on_ref(w), 1e-5f);
    Tensor dwr = on_ref(Tensor::zeros({7}, DType::kF64));
    ops::rmsnorm_backward(dx, dwr, on_ref(dy), on_ref(x), on_ref(w), rstd);
    EXPECT_TRUE(testing::allclose(
        dx.to(Device::kCPU), fd([&](const Tensor& v) { return ref::rmsnorm(v, w, feps); }, x, dy),
        kFdTol, kFdTol))
        << "reference device rmsnorm dx";
    EXPECT_TRUE(testing::allclose(
        dwr.to(Device::kCPU), fd([&](const Tensor& v) { return ref::rmsnorm(x, v, feps); }, w, dy),
        kFdTol, kFdTol))
        << "reference device rmsnorm dweight";
  }
  {
    const Tensor targets = testing::random_ids({3}, 36, 6);
    const Tensor dl = random_tensor({3}, 37, 1.0, DType::kF64);
    const Tensor want =
        fd([&](const Tensor& v) { return ref::cross_entropy(v, targets, 6); }, x, dl);
    Tensor loss = Tensor::empty({3}, DType::kF64), lse = Tensor::empty({3}, DType::kF64),
           d = Tensor::empty(x.shape(), DType::kF64);
    ops::cross_entropy_forward(loss, lse, x, targets, 6);
    ops::cross_entropy_backward(d, dl, x, lse, targets, 6);
    EXPECT_TRUE(testing::allclose(d, want, kFdTol, kFdTol)) << "cross entropy";
  }
  {
    const Tensor r = random_tensor({2, 1, 1, 2, 6}, 38, 1.0, DType::kF64),
                 dr = random_tensor(r.shape(), 39, 1.0, DType::kF64);
    // The backward of a rotation is the inverse rotation of the output gradient (for every
    // pairing and frequency rule).
    for (const ops::RopeSpec& spec :
         {ops::RopeSpec{0, 2, 6, 10000.0f}, ops::RopeSpec{0, 2, 6, 10000.0f, true, 8.0, 0.5},
          yarn_spec(6)}) {
      const Tensor want =
          fd([&](const Tensor& v) { return ref::rope(v, Tensor(), spec, false); }, r, dr);
      Tensor d = dr.clone();
      ops::rope_inplace(d, Tensor(), spec, true);
      EXPECT_TRUE(testing::allclose(d, want, kFdTol, kFdTol)) << "rope";
    }
  }
}

// Every function ops.h declares has cases above (or is a query, not a kernel).
TEST(OpsHarness, CoversEveryOpInOpsH) {
  register_all();
  std::ifstream in(std::string(MEGATRON_SOURCE_DIR) + "/src/tensor/ops.h");
  ASSERT_TRUE(in.good()) << "cannot read src/tensor/ops.h";
  const std::regex decl(
      R"(^(?:void|Tensor|bool|double|MaskedSum|std::string|AttentionView) (\w+)\()");
  const std::set<std::string> queries = {"native_half_gemm", "numerics_fingerprint"};
  std::string line;
  int declared = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, decl)) continue;
    ++declared;
    const std::string name = m[1];
    EXPECT_TRUE(covered().count(name) || queries.count(name))
        << "ops::" << name << " has no case in the op harness";
  }
  EXPECT_GT(declared, 35);
}

}  // namespace
}  // namespace megatron
