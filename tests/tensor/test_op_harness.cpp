// The op-consistency harness (ggml's test-backend-ops is the model): every op of tensor/ops.h,
// over shapes that include one element, odd and tail sizes (past the vector width and the 64-wide
// tiles), run by each implementation ("device") it has, fast f32 and fast f64 kernels today,
// against the fp64 reference (tensor/cpu/reference.h, or the formula written out here for the
// ops too simple to need one), compared by normalised mean squared error; and, in gradient mode,
// each backward against central finite differences of the reference forward.
//
// A new device (CUDA) adds its runs to Device below and every case checks it; a new op adds its
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
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "core/philox.h"
#include "tensor/cpu/reference.h"
#include "tensor/ops.h"
#include "testing/testing.h"

namespace megatron {
namespace {

using testing::random_tensor;

constexpr double kNmseF32 = 1e-9, kNmseF64 = 1e-20, kFdTol = 1e-6;

// The implementations an op runs on: the fast CPU kernels in f32 and in f64.
struct Device {
  const char* name;
  DType dtype;
  double nmse;
};
const Device kDevices[] = {{"cpu f32", DType::kF32, kNmseF32}, {"cpu f64", DType::kF64, kNmseF64}};

double nmse(const Tensor& got, const Tensor& want) {
  Tensor g = got.to(DType::kF64), w = want.to(DType::kF64);
  double num = 0, den = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double d = g.item(i) - w.item(i);
    num += d * d;
    den += w.item(i) * w.item(i);
  }
  return den > 0 ? num / den : num;
}

Tensor f64(const Tensor& t) {
  return t.to(DType::kF64);
}

// A case: inputs made once (f64 values exactly representable in f32); `run(dtype)` runs the op's
// fast kernels on copies in `dtype` and returns its outputs; `reference()` returns the fp64
// reference outputs in the same order.
struct Case {
  std::string op, shape;
  std::function<std::vector<Tensor>(DType)> run;
  std::function<std::vector<Tensor>()> reference;
  bool exact = false;  // copies, lookups and fixed-order sums: bit for bit
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

void register_elementwise() {
  for (const Shape& s : kRowShapes) {
    const Tensor a = random_tensor(s, 1, 2.0, DType::kF64),
                 b = random_tensor(s, 2, 2.0, DType::kF64);
    const Tensor bias = random_tensor({s[1]}, 3, 1.0, DType::kF64);
    add({"add", dims(s),
         [=](DType t) {
           Tensor out = Tensor::empty(s, t), acc = a.to(t);
           ops::add(out, a.to(t), b.to(t));
           ops::add_inplace(acc, b.to(t));
           Tensor x = a.to(t);
           ops::bias_add(x, bias.to(t));
           Tensor db = Tensor::zeros({s[1]}, t);
           ops::bias_backward(db, b.to(t));
           Tensor sc = a.to(t);
           ops::scale_inplace(sc, -0.37);
           return std::vector<Tensor>{out, acc, x, db, sc};
         },
         [=] {
           Tensor sum = Tensor::empty(s, DType::kF64), biased = a.clone(),
                  db = Tensor::zeros({s[1]}, DType::kF64), sc = a.clone();
           for (int64_t i = 0; i < a.numel(); ++i) {
             sum.data<double>()[i] = a.item(i) + b.item(i);
             biased.data<double>()[i] += bias.item(i % s[1]);
             sc.data<double>()[i] *= -0.37;
           }
           for (int64_t i = 0; i < b.numel(); ++i) db.data<double>()[i % s[1]] += b.item(i);
           return std::vector<Tensor>{sum, sum, biased, db, sc};
         }},
        {"add", "add_inplace", "bias_add", "bias_backward", "scale_inplace"});
    for (bool tanh : {false, true}) {
      add({tanh ? "gelu (tanh)" : "gelu", dims(s),
           [=](DType t) {
             Tensor y = Tensor::empty(s, t), dx = Tensor::empty(s, t);
             ops::gelu_forward(y, a.to(t), tanh);
             ops::gelu_backward(dx, b.to(t), a.to(t), tanh);
             return std::vector<Tensor>{y, dx};
           },
           [=] {
             return std::vector<Tensor>{ref::gelu(a, tanh), ref::gelu_backward(b, a, tanh)};
           }},
          {"gelu_forward", "gelu_backward"});
    }
    add({"tanh", dims(s),
         [=](DType t) {
           Tensor y = Tensor::empty(s, t), dx = Tensor::empty(s, t);
           ops::tanh_forward(y, a.to(t));
           // The backward reads the output: the reference's y, so that only the kernel differs.
           ops::tanh_backward(dx, b.to(t), ref::tanh(a).to(t));
           return std::vector<Tensor>{y, dx};
         },
         [=] {
           return std::vector<Tensor>{ref::tanh(a), ref::tanh_backward(b, ref::tanh(a))};
         }},
        {"tanh_forward", "tanh_backward"});
    const Shape half{s[0], std::max<int64_t>(1, s[1] / 2)};
    const Shape both{s[0], 2 * half[1]};
    const Tensor x2 = random_tensor(both, 4, 2.0, DType::kF64);
    const Tensor dy = random_tensor(half, 5, 1.0, DType::kF64);
    add({"swiglu", dims(both),
         [=](DType t) {
           Tensor y = Tensor::empty(half, t), dx = Tensor::empty(both, t);
           ops::swiglu_forward(y, x2.to(t));
           ops::swiglu_backward(dx, dy.to(t), x2.to(t));
           return std::vector<Tensor>{y, dx};
         },
         [=] {
           return std::vector<Tensor>{ref::swiglu(x2), ref::swiglu_backward(dy, x2)};
         }},
        {"swiglu_forward", "swiglu_backward"});
    // Dropout: the kept elements scaled by 1/(1-p), the mask a function of (seed, stream,
    // offset + i); backward applies the same mask.
    add({"dropout", dims(s),
         [=](DType t) {
           Tensor y = Tensor::empty(s, t), dx = Tensor::empty(s, t);
           ops::dropout_forward(y, a.to(t), 0.3f, 11, 4, 1000);
           ops::dropout_backward(dx, b.to(t), 0.3f, 11, 4, 1000);
           return std::vector<Tensor>{y, dx};
         },
         [=] {
           Tensor y = a.clone(), dx = b.clone();
           for (int64_t i = 0; i < a.numel(); ++i) {
             const bool keep = Philox::uniform(11, 4, static_cast<uint64_t>(1000 + i)) >= 0.3f;
             const double k = keep ? 1.0 / (1.0 - static_cast<double>(0.3f)) : 0.0;
             y.data<double>()[i] *= k;
             dx.data<double>()[i] *= k;
           }
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
         [=](DType t) {
           Tensor y = Tensor::empty(s, t), mean = Tensor::empty({s[0]}, t),
                  rstd = Tensor::empty({s[0]}, t);
           ops::layernorm_forward(y, mean, rstd, x.to(t), w.to(t), b.to(t), 1e-5f);
           Tensor dx = Tensor::empty(s, t), dw = Tensor::zeros({s[1]}, t),
                  db = Tensor::zeros({s[1]}, t);
           ops::layernorm_backward(dx, dw, db, dy.to(t), x.to(t), w.to(t), mean, rstd);
           return std::vector<Tensor>{y, dx, dw, db};
         },
         [=] {
           const double eps = static_cast<double>(1e-5f);
           const ref::NormGrads g = ref::layernorm_backward(dy, x, w, eps);
           return std::vector<Tensor>{ref::layernorm(x, w, b, eps), g.dx, g.dweight, g.dbias};
         }},
        {"layernorm_forward", "layernorm_backward"});
    add({"rmsnorm", dims(s),
         [=](DType t) {
           Tensor y = Tensor::empty(s, t), rstd = Tensor::empty({s[0]}, t);
           ops::rmsnorm_forward(y, rstd, x.to(t), w.to(t), 1e-6f);
           Tensor dx = Tensor::empty(s, t), dw = Tensor::zeros({s[1]}, t);
           ops::rmsnorm_backward(dx, dw, dy.to(t), x.to(t), w.to(t), rstd);
           return std::vector<Tensor>{y, dx, dw};
         },
         [=] {
           const double eps = static_cast<double>(1e-6f);
           const ref::NormGrads g = ref::rmsnorm_backward(dy, x, w, eps);
           return std::vector<Tensor>{ref::rmsnorm(x, w, eps), g.dx, g.dweight};
         }},
        {"rmsnorm_forward", "rmsnorm_backward"});
  }
}

void register_matmul() {
  for (auto [m, n, k] : {std::array<int64_t, 3>{1, 1, 1}, {7, 5, 3}, {33, 65, 17}, {64, 130, 70}}) {
    for (int tr = 0; tr < 4; ++tr) {
      const bool ta = tr & 1, tb = tr & 2;
      const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 10, 1.0, DType::kF64);
      const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 11, 1.0, DType::kF64);
      add({std::string("matmul") + (ta ? " A^T" : "") + (tb ? " B^T" : ""), dims(Shape{m, n, k}),
           [=](DType t) {
             Tensor c = Tensor::empty({m, n}, t);
             ops::matmul(c, a.to(t), ta, b.to(t), tb);
             Tensor acc = Tensor::full({m, n}, 0.5, t);
             ops::matmul(acc, a.to(t), ta, b.to(t), tb, 1.0f);
             return std::vector<Tensor>{c, acc};
           },
           [=] {
             Tensor c = ref::matmul(a, ta, b, tb), acc = c.clone();
             for (int64_t i = 0; i < acc.numel(); ++i) acc.data<double>()[i] += 0.5;
             return std::vector<Tensor>{c, acc};
           }},
          {"matmul"});
    }
  }
}

void register_lookups_and_copies() {
  for (auto [vocab, h, n] : {std::array<int64_t, 3>{1, 1, 1}, {13, 7, 9}, {40, 65, 30}}) {
    const Tensor table = random_tensor({vocab, h}, 12, 1.0, DType::kF64);
    const Tensor ids = testing::random_ids({n}, 13, vocab);
    const Tensor dout = random_tensor({n, h}, 14, 1.0, DType::kF64);
    const int64_t start = vocab / 3, rows = std::max<int64_t>(1, vocab / 3);
    add({"embedding", dims(Shape{vocab, h, n}),
         [=](DType t) {
           Tensor out = Tensor::empty({n, h}, t), dt = Tensor::zeros({vocab, h}, t);
           ops::embedding_forward(out, ids, table.to(t));
           ops::embedding_backward(dt, dout.to(t), ids);
           // The block [start, start + rows) of the table: its rows only, zeros elsewhere.
           Tensor shard = table.slice0(start, start + rows).to(t), part = Tensor::empty({n, h}, t);
           ops::embedding_forward_shard(part, ids, shard, start);
           Tensor dshard = Tensor::zeros({rows, h}, t);
           ops::embedding_backward_shard(dshard, dout.to(t), ids, start);
           return std::vector<Tensor>{out, dt, part, dshard};
         },
         [=] {
           Tensor part = ref::embedding(ids, table);
           for (int64_t i = 0; i < n; ++i) {
             const int64_t id = ids.data<int64_t>()[i];
             if (id < start || id >= start + rows)
               for (int64_t j = 0; j < h; ++j) part.data<double>()[i * h + j] = 0;
           }
           Tensor dt = ref::embedding_backward(dout, ids, vocab);
           return std::vector<Tensor>{ref::embedding(ids, table), dt, part,
                                      dt.slice0(start, start + rows).clone()};
         },
         /*exact=*/true},
        {"embedding_forward", "embedding_backward", "embedding_forward_shard",
         "embedding_backward_shard"});
  }
  for (const Shape& s : kRowShapes) {
    const Tensor x = random_tensor(s, 15, 3.0, DType::kF64);
    const int64_t w = std::max<int64_t>(1, s[1] / 3);
    add({"layout copies", dims(s),
         [=](DType t) {
           Tensor tr = Tensor::empty({s[1], s[0]}, t);
           ops::transpose_2d(tr, x.to(t));
           Tensor left = Tensor::empty({s[0], w}, t), right = Tensor::empty({s[0], s[1] - w}, t);
           ops::slice_last_dim(left, x.to(t), 0);
           if (s[1] > w) ops::slice_last_dim(right, x.to(t), w);
           Tensor back = Tensor::empty(s, t);
           ops::concat_last_dim(
               back, s[1] > w ? std::vector<Tensor>{left, right} : std::vector<Tensor>{left});
           return std::vector<Tensor>{tr, back};
         },
         [=] {
           Tensor tr = Tensor::empty({s[1], s[0]}, DType::kF64);
           for (int64_t r = 0; r < s[0]; ++r)
             for (int64_t c = 0; c < s[1]; ++c)
               tr.data<double>()[c * s[0] + r] = x.item(r * s[1] + c);
           return std::vector<Tensor>{tr, x.clone()};
         },
         /*exact=*/true},
        {"transpose_2d", "slice_last_dim", "concat_last_dim"});
    const Tensor mask = random_tensor(s, 16, 1.0, DType::kF64);
    add({"masked_sum, sum_squares", dims(s),
         [=](DType t) {
           Tensor m = mask.to(DType::kF32);
           for (int64_t i = 0; i < m.numel(); ++i) m.data<float>()[i] = m.data<float>()[i] > 0;
           const ops::MaskedSum ms = ops::masked_sum(x.to(t), m);
           return std::vector<Tensor>{Tensor::full({1}, ms.sum, DType::kF64),
                                      Tensor::full({1}, ms.count, DType::kF64),
                                      Tensor::full({1}, ops::sum_squares(x.to(t)), DType::kF64)};
         },
         [=] {
           double sum = 0, count = 0, sq = 0;
           for (int64_t i = 0; i < x.numel(); ++i) {
             const double k = static_cast<float>(mask.item(i)) > 0 ? 1.0 : 0.0;
             sum += x.item(i) * k;
             count += k;
             sq += x.item(i) * x.item(i);
           }
           return std::vector<Tensor>{Tensor::full({1}, sum, DType::kF64),
                                      Tensor::full({1}, count, DType::kF64),
                                      Tensor::full({1}, sq, DType::kF64)};
         }},
        {"masked_sum", "sum_squares"});
  }
}

void register_rope_and_loss() {
  for (auto [s, hn, rot] : {std::array<int64_t, 3>{1, 2, 2}, {5, 12, 8}, {9, 64, 64}}) {
    const Shape shape{s, 2, 2, 3, hn};
    const Tensor x = random_tensor(shape, 17, 1.0, DType::kF64);
    const ops::RopeSpec spec{0, 2, rot, 10000.0f};
    add({"rope", dims(shape),
         [=](DType t) {
           Tensor y = x.to(t), back = x.to(t);
           ops::rope_inplace(y, Tensor(), spec, false);
           ops::rope_inplace(back, Tensor(), spec, true);
           return std::vector<Tensor>{y, back};
         },
         [=] {
           return std::vector<Tensor>{ref::rope(x, Tensor(), spec, false),
                                      ref::rope(x, Tensor(), spec, true)};
         }},
        {"rope_inplace"});
  }
  for (auto [n, vp, vocab] : {std::array<int64_t, 3>{1, 1, 1}, {6, 40, 33}, {3, 1030, 1025}}) {
    const Tensor logits = random_tensor({n, vp}, 18, 4.0, DType::kF64);
    const Tensor targets = testing::random_ids({n}, 19, vocab);
    const Tensor dloss = random_tensor({n}, 20, 1.0, DType::kF64);
    add({"cross entropy", dims(Shape{n, vp, vocab}),
         [=](DType t) {
           Tensor loss = Tensor::empty({n}, t), lse = Tensor::empty({n}, t);
           ops::cross_entropy_forward(loss, lse, logits.to(t), targets, vocab);
           Tensor d = Tensor::empty({n, vp}, t);
           ops::cross_entropy_backward(d, dloss.to(t), logits.to(t), lse, targets, vocab);
           Tensor lp = Tensor::empty({n}, t);
           ops::log_softmax_gather(lp, logits.to(t), targets, vocab);
           // One block: the shard ops with vocab_start 0 are the whole op.
           Tensor mx = Tensor::empty({n}, t), sums = Tensor::empty({2 * n}, DType::kF64);
           ops::cross_entropy_shard_max(mx, logits.to(t), vocab);
           ops::cross_entropy_shard_sums(sums, logits.to(t), mx, targets, 0, vocab);
           Tensor loss2 = Tensor::empty({n}, t), lse2 = Tensor::empty({n}, t);
           ops::cross_entropy_shard_finish(loss2, lse2, mx, sums);
           Tensor d2 = Tensor::empty({n, vp}, t);
           ops::cross_entropy_shard_backward(d2, dloss.to(t), logits.to(t), lse2, targets, 0,
                                             vocab);
           return std::vector<Tensor>{loss, d, lp, loss2, d2};
         },
         [=] {
           Tensor loss = ref::cross_entropy(logits, targets, vocab), lp = loss.clone();
           ops::scale_inplace(lp, -1.0);
           Tensor d = ref::cross_entropy_backward(dloss, logits, targets, vocab);
           return std::vector<Tensor>{loss, d, lp, loss, d};
         }},
        {"cross_entropy_forward", "cross_entropy_backward", "log_softmax_gather",
         "cross_entropy_shard_max", "cross_entropy_shard_sums", "cross_entropy_shard_finish",
         "cross_entropy_shard_backward"});
  }
}

void register_attention_and_optimizer() {
  // sq x skv x heads (groups x per group) x hn, causal or not: tails past the 64-wide tiles.
  for (auto [sq, skv, hn, causal] :
       {std::array<int64_t, 4>{1, 1, 2, 1}, {5, 9, 4, 0}, {65, 65, 16, 1}, {70, 130, 8, 0}}) {
    const Tensor q = random_tensor({sq, 2, 4, hn}, 21, 1.0, DType::kF64);
    const Tensor k = random_tensor({skv, 2, 2, hn}, 22, 1.0, DType::kF64);
    const Tensor v = random_tensor({skv, 2, 2, hn}, 23, 1.0, DType::kF64);
    const Tensor dout = random_tensor({sq, 2, 4, hn}, 24, 1.0, DType::kF64);
    ops::AttentionSpec spec;
    spec.scale = 0.5f;
    spec.causal = causal != 0;
    spec.q_offset = skv - sq > 0 && causal ? skv - sq : 0;
    add({causal ? "attention (causal)" : "attention", dims(Shape{sq, skv, hn}),
         [=](DType t) {
           const Tensor qt = q.to(t), kt = k.to(t), vt = v.to(t);
           Tensor out = Tensor::empty({sq, 2, 4, hn}, t), lse = Tensor::empty({2, 4, sq}, t);
           const auto qv = ops::attention_view(qt, 2), kv = ops::attention_view(kt, 2),
                      vv = ops::attention_view(vt, 2);
           ops::attention_forward(out, lse, qv, kv, vv, spec);
           Tensor dq = Tensor::empty(qt.shape(), t), dk = Tensor::empty(kt.shape(), t),
                  dv = Tensor::empty(vt.shape(), t);
           ops::attention_backward(ops::attention_view(dq, 2), ops::attention_view(dk, 2),
                                   ops::attention_view(dv, 2), Tensor(), dout.to(t), qv, kv, vv,
                                   out, lse, spec);
           // The same keys as two blocks merged: the one-pass result.
           Tensor merged = out.clone(), mlse = lse.clone();
           ops::attention_merge(merged, mlse, Tensor::zeros(out.shape(), t),
                                Tensor::full(lse.shape(), -INFINITY, t));
           std::vector<Tensor> outs{out, dq, dk, dv, merged};
           if (sq == skv) {
             // The same q, k, v packed as Megatron's QKV [s, b, 2 groups, 2 + 2, hn], read in
             // place through packed views.
             Tensor qkv = Tensor::empty({sq, 2, 2, 4, hn}, t);
             const size_t es = dtype_size(t);
             for (int64_t tb = 0; tb < sq * 2; ++tb)
               for (int64_t g = 0; g < 2; ++g)
                 for (int64_t p = 0; p < 4; ++p) {
                   const Tensor& src = p < 2 ? qt : p == 2 ? kt : vt;
                   const int64_t head = p < 2 ? g * 2 + p : g, heads = p < 2 ? 4 : 2;
                   std::memcpy(static_cast<char*>(qkv.raw()) + ((tb * 2 + g) * 4 + p) * hn * es,
                               static_cast<const char*>(src.raw()) + (tb * heads + head) * hn * es,
                               hn * es);
                 }
             Tensor pout = Tensor::empty(out.shape(), t), plse = Tensor::empty(lse.shape(), t);
             ops::attention_forward(pout, plse, ops::packed_qkv_view(qkv, ops::QkvPart::kQuery),
                                    ops::packed_qkv_view(qkv, ops::QkvPart::kKey),
                                    ops::packed_qkv_view(qkv, ops::QkvPart::kValue), spec);
             outs.push_back(pout);
           }
           return outs;
         },
         [=] {
           const ref::AttentionResult r = ref::attention(q, k, v, spec);
           const ref::AttentionGrads g = ref::attention_backward(dout, q, k, v, spec);
           std::vector<Tensor> want{r.out, g.dq, g.dk, g.dv, r.out};
           if (sq == skv) want.push_back(r.out);
           return want;
         }},
        {"attention_forward", "attention_backward", "attention_merge", "attention_view",
         "packed_qkv_view"});
  }
  for (int64_t n : {1, 7, 1001}) {
    const Tensor p = random_tensor({n}, 25, 1.0, DType::kF64),
                 g = random_tensor({n}, 26, 1.0, DType::kF64);
    const ops::AdamWSpec spec{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.7};
    add({"adamw_step", dims(Shape{n}),
         [=](DType t) {
           Tensor pt = p.to(t), m = Tensor::zeros({n}, t), v2 = Tensor::zeros({n}, t);
           ops::adamw_step(pt, m, v2, g.to(t), spec);
           return std::vector<Tensor>{pt, m, v2};
         },
         [=] {
           const ref::AdamState s = ref::adamw(
               {p.clone(), Tensor::zeros({n}, DType::kF64), Tensor::zeros({n}, DType::kF64)}, g,
               spec);
           return std::vector<Tensor>{s.param, s.exp_avg, s.exp_avg_sq};
         }},
        {"adamw_step"});
  }
}

void register_all() {
  if (!cases().empty()) return;
  register_elementwise();
  register_norms();
  register_matmul();
  register_lookups_and_copies();
  register_rope_and_loss();
  register_attention_and_optimizer();
}

TEST(OpsHarness, EveryCaseOnEveryDeviceMatchesTheReference) {
  register_all();
  int checked = 0;
  for (const Case& c : cases()) {
    const std::vector<Tensor> want = c.reference();
    for (const Device& d : kDevices) {
      SCOPED_TRACE(c.op + " " + c.shape + " on " + d.name);
      const std::vector<Tensor> got = c.run(d.dtype);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].numel(), want[i].numel()) << "output " << i;
        if (c.exact && d.dtype == DType::kF64) {
          EXPECT_TRUE(testing::allclose(f64(got[i]), want[i], 0, 0)) << "output " << i;
        } else {
          const double e = nmse(got[i], want[i]);
          EXPECT_LE(e, d.nmse) << "output " << i << ": NMSE " << e;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 200);
}

// Gradient mode: each differentiable op's reference backward against central differences of
// its reference forward, and the fast f64 backward against the same differences.
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
    const Tensor x2 = random_tensor({3, 8}, 34, 2.0, DType::kF64),
                 d2 = random_tensor({3, 4}, 35, 1.0, DType::kF64);
    const Tensor want = fd([](const Tensor& v) { return ref::swiglu(v); }, x2, d2);
    Tensor dx = Tensor::empty(x2.shape(), DType::kF64);
    ops::swiglu_backward(dx, d2, x2);
    EXPECT_TRUE(testing::allclose(dx, want, kFdTol, kFdTol)) << "swiglu";
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
    const ops::RopeSpec spec{0, 2, 6, 10000.0f};
    // The backward of a rotation is the inverse rotation of the output gradient.
    const Tensor want =
        fd([&](const Tensor& v) { return ref::rope(v, Tensor(), spec, false); }, r, dr);
    Tensor d = dr.clone();
    ops::rope_inplace(d, Tensor(), spec, true);
    EXPECT_TRUE(testing::allclose(d, want, kFdTol, kFdTol)) << "rope";
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
