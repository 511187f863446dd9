// The CUDA device's ops on Tensors: the checks of each op's contract (shapes, dtypes), then the
// launcher of tensor/cuda/kernels.h for the dtype (f32 or f64). The GEMMs are in gemm.cpp.
#include <cmath>
#include <utility>

#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_dispatch.h"

namespace megatron::cuda {
namespace {

int64_t rows_of(const Tensor& t) {
  return t.ndim() == 0 ? 1 : t.numel() / t.dim(-1);
}

// Calls fn.template operator()<T>() with T = float or double from the dtype of `t` (a GPU
// tensor).
template <typename Fn>
void dispatch_float(const Tensor& t, const char* op, Fn&& fn) {
  dispatch_float_on(Device::kCUDA, t, op, std::forward<Fn>(fn));
}

void same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  MEGATRON_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch, ", a.str(), " vs ", b.str());
}
void same_numel(const Tensor& a, const Tensor& b, const char* op) {
  MEGATRON_CHECK(a.numel() == b.numel(), op, ": size mismatch, ", a.str(), " vs ", b.str());
}
bool ids_i32(const Tensor& ids, const char* op) {
  MEGATRON_CHECK(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64, op,
                 ": ids must be i32 or i64, got ", ids.str());
  return ids.dtype() == DType::kI32;
}
void targets_i64(const Tensor& t, int64_t n, const char* op) {
  MEGATRON_CHECK(t.dtype() == DType::kI64 && t.numel() == n, op,
                 ": targets must be i64 with one per row, got ", t.str());
}

template <typename T>
T* P(const Tensor& t) {
  return t.data<T>();
}
template <typename T>
T* P_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

void unary(Tensor& out, const Tensor& x, Activation act, const char* op) {
  same_numel(out, x, op);
  same_dtype(out, x, op);
  dispatch_float(x, op,
                 [&]<typename T>() { activation_forward(P<T>(out), P<T>(x), x.numel(), act); });
}
void unary_backward(Tensor& dx, const Tensor& dout, const Tensor& x, Activation act,
                    const char* op) {
  same_numel(dx, x, op);
  same_numel(dout, x, op);
  dispatch_float(x, op, [&]<typename T>() {
    activation_backward(P<T>(dx), P<T>(dout), P<T>(x), x.numel(), act);
  });
}

AttnView attn_view(const AttentionView& v) {
  return AttnView{v.offset, v.s,        v.b,        v.groups,   v.per_group,
                  v.hn,     v.stride_s, v.stride_b, v.stride_g, v.stride_p};
}

AttnArgs attn_args(const AttentionView& q, const AttentionView& k, const AttentionView& v,
                   const AttentionSpec& spec, const char* op) {
  MEGATRON_CHECK(q.hn == k.hn && k.hn == v.hn && q.b == k.b && k.b == v.b && k.s == v.s &&
                     k.heads() == v.heads() && k.heads() > 0 && q.heads() % k.heads() == 0,
                 op, ": q, k, v do not fit together (hn ", q.hn, "/", k.hn, "/", v.hn, ", heads ",
                 q.heads(), "/", k.heads(), "/", v.heads(), ")");
  MEGATRON_CHECK(q.hn <= 256, op, ": the CUDA kernels take head dimensions up to 256, got ", q.hn);
  AttnArgs a{};
  a.q = attn_view(q);
  a.k = attn_view(k);
  a.v = attn_view(v);
  a.np = q.heads();
  a.ng = k.heads();
  a.scale = spec.scale;
  a.causal = spec.causal;
  a.q_offset = spec.q_offset;
  a.kv_offset = spec.kv_offset;
  a.window = spec.window;
  if (spec.doc_start.defined()) {
    MEGATRON_CHECK(spec.doc_start.dtype() == DType::kI32 && spec.doc_start.numel() == q.b * q.s, op,
                   ": doc_start must be i32 [b, sq], got ", spec.doc_start.str());
    a.doc_start = spec.doc_start.data<int32_t>();
  }
  if (spec.key_valid.defined()) {
    MEGATRON_CHECK(spec.key_valid.dtype() == DType::kI32 && spec.key_valid.numel() == k.b * k.s, op,
                   ": key_valid must be i32 [b, skv], got ", spec.key_valid.str());
    a.key_valid = spec.key_valid.data<int32_t>();
  }
  if (spec.bias.defined()) {
    const int64_t B = spec.bias.dim(0);
    MEGATRON_CHECK((B == 1 || B == q.b) && spec.bias.numel() == B * a.np * q.s * k.s, op,
                   ": bias must be [1 or b, np, sq, skv], got ", spec.bias.str());
    a.bias_batches = B;
  }
  a.dropout = spec.dropout;
  a.seed = spec.seed;
  a.stream = spec.stream;
  a.head_offset = spec.head_offset;
  a.total_heads = spec.total_heads;
  a.q_positions = spec.q_positions;
  a.kv_positions = spec.kv_positions;
  a.matrix_units = is_half(spec.precision);
  if (spec.max_logit.defined()) {
    MEGATRON_CHECK(spec.max_logit.dtype() == DType::kF32 && spec.max_logit.numel() == a.np, op,
                   ": max_logit must be f32 [np], got ", spec.max_logit.str());
    a.max_logit = spec.max_logit.data<float>();
  }
  return a;
}

}  // namespace

void grouped_matmul(Tensor& out, const Tensor& a, const std::vector<Tensor>& b, bool trans_b,
                    const std::vector<int64_t>& sizes, float beta) {
  MEGATRON_CHECK(b.size() == sizes.size(), "grouped_matmul: ", b.size(), " matrices for ",
                 sizes.size(), " groups");
  const Tensor a2 = a.view({rows_of(a), a.dim(-1)});
  Tensor o2 = out.view({rows_of(out), out.dim(-1)});
  int64_t at = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    MEGATRON_CHECK(sizes[g] >= 0 && at + sizes[g] <= rows_of(a), "grouped_matmul: group sizes ",
                   "exceed the ", rows_of(a), " rows of a");
    Tensor o = o2.slice0(at, at + sizes[g]);
    if (sizes[g] > 0) matmul(o, a2.slice0(at, at + sizes[g]), false, b[g], trans_b, beta);
    at += sizes[g];
  }
  MEGATRON_CHECK(at == rows_of(a), "grouped_matmul: group sizes sum to ", at, ", a has ",
                 rows_of(a), " rows");
}

void grouped_matmul_at(std::vector<Tensor>& out, const Tensor& a, const Tensor& c,
                       const std::vector<int64_t>& sizes, float beta) {
  MEGATRON_CHECK(out.size() == sizes.size(), "grouped_matmul_at: ", out.size(), " outputs for ",
                 sizes.size(), " groups");
  const Tensor a2 = a.view({rows_of(a), a.dim(-1)}), c2 = c.view({rows_of(c), c.dim(-1)});
  int64_t at = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    MEGATRON_CHECK(sizes[g] >= 0 && at + sizes[g] <= rows_of(a), "grouped_matmul_at: group ",
                   "sizes exceed the ", rows_of(a), " rows of a");
    // A group of no rows: its product is zero (K = 0), which matmul writes or adds.
    matmul(out[g], a2.slice0(at, at + sizes[g]), true, c2.slice0(at, at + sizes[g]), false, beta);
    at += sizes[g];
  }
  MEGATRON_CHECK(at == rows_of(a) && at == rows_of(c), "grouped_matmul_at: group sizes sum to ", at,
                 ", a has ", rows_of(a), " rows, c ", rows_of(c));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  same_numel(out, a, "add");
  same_numel(out, b, "add");
  dispatch_float(out, "add",
                 [&]<typename T>() { cuda::add(P<T>(out), P<T>(a), P<T>(b), out.numel()); });
}

void add_inplace(Tensor& out, const Tensor& a) {
  same_numel(out, a, "add_inplace");
  dispatch_float(out, "add_inplace",
                 [&]<typename T>() { cuda::add_inplace(P<T>(out), P<T>(a), out.numel()); });
}

void mul(Tensor& out, const Tensor& a, const Tensor& b) {
  same_numel(out, a, "mul");
  same_numel(out, b, "mul");
  dispatch_float(out, "mul",
                 [&]<typename T>() { cuda::mul(P<T>(out), P<T>(a), P<T>(b), out.numel()); });
}

void scale_rows(Tensor& x, const Tensor& scale) {
  MEGATRON_CHECK(scale.numel() == rows_of(x), "scale_rows: ", scale.str(), " for ", x.str());
  dispatch_float(x, "scale_rows", [&]<typename T>() {
    cuda::scale_rows(P<T>(x), P<T>(scale), rows_of(x), x.ndim() ? x.dim(-1) : 1);
  });
}

void row_dots(Tensor& out, const Tensor& a, const Tensor& b) {
  same_numel(a, b, "row_dots");
  MEGATRON_CHECK(out.numel() == rows_of(a), "row_dots: ", out.str(), " for ", a.str());
  dispatch_float(a, "row_dots", [&]<typename T>() {
    cuda::row_dots(P<T>(out), P<T>(a), P<T>(b), rows_of(a), a.ndim() ? a.dim(-1) : 1);
  });
}

void bias_add(Tensor& x, const Tensor& bias) {
  MEGATRON_CHECK(bias.numel() == x.dim(-1), "bias_add: ", bias.str(), " for ", x.str());
  dispatch_float(x, "bias_add",
                 [&]<typename T>() { cuda::bias_add(P<T>(x), P<T>(bias), rows_of(x), x.dim(-1)); });
}

void bias_backward(Tensor& dbias, const Tensor& dy) {
  MEGATRON_CHECK(dbias.numel() == dy.dim(-1), "bias_backward: ", dbias.str(), " for ", dy.str());
  dispatch_float(dy, "bias_backward", [&]<typename T>() {
    column_sums_accumulate(P<T>(dbias), P<T>(dy), rows_of(dy), dy.dim(-1));
  });
}

void scale_inplace(Tensor& x, double factor) {
  dispatch_float(x, "scale_inplace",
                 [&]<typename T>() { cuda::scale(P<T>(x), factor, x.numel()); });
}

void gelu_forward(Tensor& out, const Tensor& x, bool tanh_approx) {
  unary(out, x, tanh_approx ? Activation::kGeluTanh : Activation::kGelu, "gelu_forward");
}
void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx) {
  unary_backward(dx, dout, x, tanh_approx ? Activation::kGeluTanh : Activation::kGelu,
                 "gelu_backward");
}
void tanh_forward(Tensor& out, const Tensor& x) {
  unary(out, x, Activation::kTanh, "tanh_forward");
}
void tanh_backward(Tensor& dx, const Tensor& dout, const Tensor& y) {
  unary_backward(dx, dout, y, Activation::kTanh, "tanh_backward");
}
void squared_relu_forward(Tensor& out, const Tensor& x) {
  unary(out, x, Activation::kSquaredRelu, "squared_relu_forward");
}
void squared_relu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  unary_backward(dx, dout, x, Activation::kSquaredRelu, "squared_relu_backward");
}
void quick_gelu_forward(Tensor& out, const Tensor& x) {
  unary(out, x, Activation::kQuickGelu, "quick_gelu_forward");
}
void quick_gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  unary_backward(dx, dout, x, Activation::kQuickGelu, "quick_gelu_backward");
}

void swiglu_forward(Tensor& out, const Tensor& x) {
  const int64_t f = x.dim(-1) / 2;
  MEGATRON_CHECK(x.dim(-1) % 2 == 0 && out.numel() == rows_of(x) * f, "swiglu_forward: ", out.str(),
                 " from ", x.str());
  dispatch_float(x, "swiglu_forward",
                 [&]<typename T>() { cuda::swiglu_forward(P<T>(out), P<T>(x), rows_of(x), f); });
}

void swiglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  const int64_t f = x.dim(-1) / 2;
  MEGATRON_CHECK(dx.numel() == x.numel() && dout.numel() == rows_of(x) * f,
                 "swiglu_backward: ", dout.str(), " for ", x.str());
  dispatch_float(x, "swiglu_backward", [&]<typename T>() {
    cuda::swiglu_backward(P<T>(dx), P<T>(dout), P<T>(x), rows_of(x), f);
  });
}

void quick_geglu_forward(Tensor& out, const Tensor& x, double offset, double clamp) {
  dispatch_float(x, "quick_geglu_forward", [&]<typename T>() {
    cuda::quick_geglu_forward(P<T>(out), P<T>(x), rows_of(x), x.dim(-1) / 2, offset, clamp);
  });
}

void quick_geglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, double offset,
                          double clamp) {
  dispatch_float(x, "quick_geglu_backward", [&]<typename T>() {
    cuda::quick_geglu_backward(P<T>(dx), P<T>(dout), P<T>(x), rows_of(x), x.dim(-1) / 2, offset,
                               clamp);
  });
}

void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset) {
  same_numel(out, x, "dropout_forward");
  dispatch_float(x, "dropout_forward", [&]<typename T>() {
    cuda::dropout(P<T>(out), P<T>(x), x.numel(), p, seed, stream, offset);
  });
}

void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed, uint64_t stream,
                      uint64_t offset) {
  dropout_forward(dx, dout, p, seed, stream, offset);  // the same mask and scale
}

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, float eps) {
  const int64_t n = rows_of(x), h = x.dim(-1);
  MEGATRON_CHECK(weight.numel() == h && bias.numel() == h && mean.numel() == n &&
                     rstd.numel() == n && out.numel() == x.numel(),
                 "layernorm_forward: shapes do not fit ", x.str());
  dispatch_float(x, "layernorm_forward", [&]<typename T>() {
    cuda::layernorm_forward(P<T>(out), P<T>(mean), P<T>(rstd), P<T>(x), P<T>(weight), P<T>(bias), n,
                            h, eps);
  });
}

void layernorm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  const int64_t n = rows_of(x), h = x.dim(-1);
  MEGATRON_CHECK(dweight.numel() == h && dbias.numel() == h && dx.numel() == x.numel(),
                 "layernorm_backward: shapes do not fit ", x.str());
  dispatch_float(x, "layernorm_backward", [&]<typename T>() {
    cuda::norm_backward(P<T>(dx), P<T>(dweight), P<T>(dbias), P<T>(dout), P<T>(x), P<T>(weight),
                        static_cast<const T*>(P<T>(mean)), P<T>(rstd), n, h);
  });
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) {
  const int64_t n = rows_of(x), h = x.dim(-1);
  MEGATRON_CHECK(weight.numel() == h && rstd.numel() == n && out.numel() == x.numel(),
                 "rmsnorm_forward: shapes do not fit ", x.str());
  dispatch_float(x, "rmsnorm_forward", [&]<typename T>() {
    cuda::rmsnorm_forward(P<T>(out), P<T>(rstd), P<T>(x), P<T>(weight), n, h, eps);
  });
}

void rmsnorm_backward(Tensor& dx, Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd) {
  const int64_t n = rows_of(x), h = x.dim(-1);
  MEGATRON_CHECK(dweight.numel() == h && dx.numel() == x.numel(),
                 "rmsnorm_backward: shapes do not fit ", x.str());
  dispatch_float(x, "rmsnorm_backward", [&]<typename T>() {
    cuda::norm_backward(P<T>(dx), P<T>(dweight), static_cast<T*>(nullptr), P<T>(dout), P<T>(x),
                        P<T>(weight), static_cast<const T*>(nullptr), P<T>(rstd), n, h);
  });
}

void embedding_forward_shard(Tensor& out, const Tensor& ids, const Tensor& table_shard,
                             int64_t vocab_start) {
  const bool i32 = ids_i32(ids, "embedding_forward");
  const int64_t n = ids.numel(), block = table_shard.dim(0), h = table_shard.dim(1);
  MEGATRON_CHECK(out.numel() == n * h, "embedding_forward: out ", out.str(), " for ", n,
                 " ids of width ", h);
  MEGATRON_CHECK(table_shard.dtype() != DType::kI32 && table_shard.dtype() != DType::kI64,
                 "embedding_forward: the table must be floating, got ", table_shard.str());
  MEGATRON_CHECK(out.dtype() == (table_shard.dtype() == DType::kF64 ? DType::kF64 : DType::kF32),
                 "embedding_forward: out ", out.str(), " for a table ", table_shard.str());
  dispatch_float(out, "embedding_forward", [&]<typename T>() {
    cuda::embedding_forward(P<T>(out), ids.raw(), i32, n, table_shard.raw(),
                            static_cast<int>(table_shard.dtype()), vocab_start, block, h);
  });
}

void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) {
  // A row gather in the table's own dtype (a bf16 table gives bf16 rows, as on the CPU; ids
  // outside the table give zero rows instead of the CPU's error, which would need a read back);
  // the shard form above is the one that widens.
  const bool i32 = ids_i32(ids, "embedding_forward");
  MEGATRON_CHECK(table.ndim() == 2 && out.dtype() == table.dtype() &&
                     out.numel() == ids.numel() * table.dim(1),
                 "embedding_forward: out ", out.str(), " for ids ", ids.str(), " and table ",
                 table.str());
  cuda::embedding_rows(out.raw(), ids.raw(), i32, ids.numel(), table.raw(),
                       dtype_size(table.dtype()), table.dim(0), table.dim(1));
}

void embedding_backward_shard(Tensor& dtable_shard, const Tensor& dout, const Tensor& ids,
                              int64_t vocab_start) {
  const bool i32 = ids_i32(ids, "embedding_backward");
  const int64_t n = ids.numel(), block = dtable_shard.dim(0), h = dtable_shard.dim(1);
  MEGATRON_CHECK(dout.numel() == n * h, "embedding_backward: dout ", dout.str(), " for ", n,
                 " ids of width ", h);
  dispatch_float(dtable_shard, "embedding_backward", [&]<typename T>() {
    cuda::embedding_backward(P<T>(dtable_shard), P<T>(dout), ids.raw(), i32, n, vocab_start, block,
                             h);
  });
}

void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  embedding_backward_shard(dtable, dout, ids, 0);
}

void rope_inplace(Tensor& x, const Tensor& positions, const RopeSpec& spec, bool inverse) {
  MEGATRON_CHECK(x.ndim() == 5, "rope_inplace: expected [s, b, G, P, hn], got ", x.str());
  MEGATRON_CHECK(spec.rot_dim % 2 == 0 && spec.rot_dim <= x.dim(4) && 0 <= spec.head_begin &&
                     spec.head_begin <= spec.head_end && spec.head_end <= x.dim(3),
                 "rope_inplace: rot_dim ", spec.rot_dim, ", heads [", spec.head_begin, ", ",
                 spec.head_end, ") do not fit ", x.str());
  if (positions.defined()) {
    MEGATRON_CHECK(positions.dtype() == DType::kI64 && positions.numel() == x.dim(0) * x.dim(1),
                   "rope_inplace: positions must be i64 [s, b], got ", positions.str());
  }
  const ops::YarnRamp ramp = spec.yarn_factor > 0 ? ops::yarn_ramp(spec) : ops::YarnRamp{0, 1};
  const RopeArgs a{x.dim(0),
                   x.dim(1),
                   x.dim(2),
                   x.dim(3),
                   x.dim(4),
                   spec.head_begin,
                   spec.head_end,
                   spec.rot_dim,
                   spec.base,
                   spec.scaling_factor,
                   spec.position_scale,
                   spec.yarn_factor,
                   ramp.low,
                   ramp.high,
                   spec.mscale,
                   spec.interleaved,
                   inverse,
                   positions.defined() ? positions.data<int64_t>() : nullptr};
  dispatch_float(x, "rope_inplace", [&]<typename T>() { cuda::rope(P<T>(x), a); });
}

void attention_forward(Tensor& out, Tensor& lse, const AttentionView& q, const AttentionView& k,
                       const AttentionView& v, const AttentionSpec& spec) {
  const AttnArgs a = attn_args(q, k, v, spec, "attention_forward");
  MEGATRON_CHECK(out.numel() == q.s * q.b * a.np * q.hn && lse.numel() == q.b * a.np * q.s,
                 "attention_forward: out ", out.str(), ", lse ", lse.str(), " do not fit q");
  dispatch_float(out, "attention_forward", [&]<typename T>() {
    cuda::attention_forward(P<T>(out), P<T>(lse), P<T>(q.tensor), P<T>(k.tensor), P<T>(v.tensor),
                            P_or_null<T>(spec.bias), a);
  });
}

void attention_backward(const AttentionView& dq, const AttentionView& dk, const AttentionView& dv,
                        const Tensor& dbias, const Tensor& dout, const AttentionView& q,
                        const AttentionView& k, const AttentionView& v, const Tensor& out,
                        const Tensor& lse, const AttentionSpec& spec) {
  const AttnArgs a = attn_args(q, k, v, spec, "attention_backward");
  MEGATRON_CHECK(dq.s == q.s && dk.s == k.s && dv.s == v.s && dq.hn == q.hn &&
                     dq.heads() == q.heads() && dk.heads() == k.heads(),
                 "attention_backward: gradient views do not match q, k, v");
  // The gradients are written at their views' own offsets and strides.
  AttnArgs ga = a;
  ga.dq = attn_view(dq);
  ga.dk = attn_view(dk);
  ga.dv = attn_view(dv);
  dispatch_float(dout, "attention_backward", [&]<typename T>() {
    Tensor delta = Tensor::empty({q.b, a.np, q.s}, dout.dtype(), Device::kCUDA);
    Tensor scratch;
    if (dbias.defined()) {
      scratch = Tensor::empty({q.b, a.np, q.s, k.s}, dout.dtype(), Device::kCUDA);
    }
    cuda::attention_backward(P<T>(dq.tensor), P<T>(dk.tensor), P<T>(dv.tensor),
                             P_or_null<T>(scratch), P<T>(delta), P<T>(dout), P<T>(q.tensor),
                             P<T>(k.tensor), P<T>(v.tensor), P<T>(out), P<T>(lse),
                             P_or_null<T>(spec.bias), ga);
    if (dbias.defined()) {
      Tensor d = dbias;
      const int64_t per = a.np * q.s * k.s;
      if (dbias.dim(0) == 1) {
        d.zero();
        column_sums_accumulate(P<T>(d), P<T>(scratch), q.b, per);
      } else {
        d.copy_from(scratch);
      }
    }
  });
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  MEGATRON_CHECK(out.ndim() == 4 && out.shape() == out_b.shape() && lse.numel() == lse_b.numel(),
                 "attention_merge: ", out.str(), " and ", out_b.str());
  dispatch_float(out, "attention_merge", [&]<typename T>() {
    cuda::attention_merge(P<T>(out), P<T>(lse), P<T>(out_b), P<T>(lse_b), out.dim(0), out.dim(1),
                          out.dim(2), out.dim(3));
  });
}

void attention_sink_forward(Tensor& out, Tensor& lse, const Tensor& sink) {
  dispatch_float(out, "attention_sink_forward", [&]<typename T>() {
    cuda::attention_sink_forward(P<T>(out), P<T>(lse), P<T>(sink), out.dim(0), out.dim(1),
                                 out.dim(2), out.dim(3));
  });
}

void attention_sink_backward(Tensor& dsink, const Tensor& dout, const Tensor& out,
                             const Tensor& lse, const Tensor& sink) {
  dispatch_float(out, "attention_sink_backward", [&]<typename T>() {
    cuda::attention_sink_backward(P<T>(dsink), P<T>(dout), P<T>(out), P<T>(lse), P<T>(sink),
                                  out.dim(0), out.dim(1), out.dim(2), out.dim(3));
  });
}

void cross_entropy_shard_max(Tensor& row_max, const Tensor& logits_shard, int64_t valid) {
  const int64_t n = rows_of(logits_shard), cols = logits_shard.dim(-1);
  MEGATRON_CHECK(row_max.numel() == n && 0 <= valid && valid <= cols,
                 "cross_entropy_shard_max: ", row_max.str(), " for ", logits_shard.str());
  dispatch_float(logits_shard, "cross_entropy_shard_max", [&]<typename T>() {
    ce_row_max(P<T>(row_max), P<T>(logits_shard), n, cols, valid);
  });
}

void cross_entropy_shard_sums(Tensor& sums, const Tensor& logits_shard, const Tensor& row_max,
                              const Tensor& targets, int64_t vocab_start, int64_t valid) {
  const int64_t n = rows_of(logits_shard), cols = logits_shard.dim(-1);
  targets_i64(targets, n, "cross_entropy_shard_sums");
  MEGATRON_CHECK(sums.dtype() == DType::kF64 && sums.numel() == 2 * n,
                 "cross_entropy_shard_sums: sums must be f64 [2n], got ", sums.str());
  dispatch_float(logits_shard, "cross_entropy_shard_sums", [&]<typename T>() {
    ce_sums(P<double>(sums), P<T>(logits_shard), P<T>(row_max), P<int64_t>(targets), n, cols,
            vocab_start, valid);
  });
}

void cross_entropy_shard_finish(Tensor& loss, Tensor& lse, const Tensor& row_max,
                                const Tensor& sums) {
  const int64_t n = row_max.numel();
  MEGATRON_CHECK(loss.numel() == n && lse.numel() == n && sums.numel() == 2 * n,
                 "cross_entropy_shard_finish: sizes do not fit ", row_max.str());
  dispatch_float(loss, "cross_entropy_shard_finish", [&]<typename T>() {
    ce_finish(P<T>(loss), P<T>(lse), P<T>(row_max), P<double>(sums), n);
  });
}

void cross_entropy_shard_backward(Tensor& dlogits_shard, const Tensor& dloss,
                                  const Tensor& logits_shard, const Tensor& lse,
                                  const Tensor& targets, int64_t vocab_start, int64_t valid) {
  const int64_t n = rows_of(logits_shard), cols = logits_shard.dim(-1);
  targets_i64(targets, n, "cross_entropy_backward");
  same_numel(dlogits_shard, logits_shard, "cross_entropy_backward");
  dispatch_float(logits_shard, "cross_entropy_backward", [&]<typename T>() {
    ce_backward(P<T>(dlogits_shard), P<T>(dloss), P<T>(logits_shard), P<T>(lse),
                P<int64_t>(targets), n, cols, vocab_start, valid);
  });
}

void cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size) {
  const int64_t n = rows_of(logits);
  MEGATRON_CHECK(vocab_size > 0 && vocab_size <= logits.dim(-1), "cross_entropy_forward: vocab ",
                 vocab_size, " for ", logits.str());
  Tensor row_max = Tensor::empty({n}, logits.dtype(), Device::kCUDA);
  Tensor sums = Tensor::empty({2 * n}, DType::kF64, Device::kCUDA);
  cross_entropy_shard_max(row_max, logits, vocab_size);
  cross_entropy_shard_sums(sums, logits, row_max, targets, 0, vocab_size);
  cross_entropy_shard_finish(loss, lse, row_max, sums);
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size) {
  cross_entropy_shard_backward(dlogits, dloss, logits, lse, targets, 0, vocab_size);
}

void log_softmax_gather(Tensor& logprob, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_size) {
  Tensor lse = Tensor::empty(logprob.shape(), logprob.dtype(), Device::kCUDA);
  cross_entropy_forward(logprob, lse, logits, targets, vocab_size);
  scale_inplace(logprob, -1.0);  // log p(target) = -(lse - logit)
}

MaskedSum masked_sum(const Tensor& loss, const Tensor& mask) {
  MEGATRON_CHECK(mask.dtype() == DType::kF32 && mask.numel() == loss.numel(),
                 "masked_sum: the mask must be f32 with one entry per loss, got loss ", loss.str(),
                 " and mask ", mask.str());
  MaskedSum s;
  dispatch_float(loss, "masked_sum", [&]<typename T>() {
    cuda::masked_sum(P<T>(loss), P<float>(mask), loss.numel(), &s.sum, &s.count);
  });
  return s;
}

void transpose_2d(Tensor& out, const Tensor& x) {
  MEGATRON_CHECK(x.ndim() == 2 && out.dtype() == x.dtype() && out.numel() == x.numel(),
                 "transpose_2d: out ", out.str(), " for ", x.str());
  cuda::transpose(out.raw(), x.raw(), x.dim(0), x.dim(1), dtype_size(x.dtype()));
}

void slice_last_dim(Tensor& out, const Tensor& x, int64_t start) {
  const int64_t w = out.dim(-1), h = x.dim(-1), n = rows_of(x);
  MEGATRON_CHECK(out.dtype() == x.dtype() && rows_of(out) == n && start >= 0 && start + w <= h,
                 "slice_last_dim: out ", out.str(), " from ", x.str(), " at ", start);
  copy_columns(out.raw(), w, 0, x.raw(), h, start, n, w, dtype_size(x.dtype()));
}

void concat_last_dim(Tensor& out, const std::vector<Tensor>& parts) {
  const int64_t h = out.dim(-1), n = rows_of(out);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const int64_t w = p.dim(-1);
    MEGATRON_CHECK(p.dtype() == out.dtype() && rows_of(p) == n && at + w <= h,
                   "concat_last_dim: part ", p.str(), " into ", out.str());
    copy_columns(out.raw(), h, at, p.raw(), w, 0, n, w, dtype_size(out.dtype()));
    at += w;
  }
  MEGATRON_CHECK(at == h, "concat_last_dim: parts fill ", at, " of ", h, " columns");
}

void gather_rows(Tensor& out, const Tensor& x, const Tensor& index) {
  const bool i32 = ids_i32(index, "gather_rows");
  const int64_t c = x.dim(-1);
  MEGATRON_CHECK(out.dtype() == x.dtype() && out.numel() == index.numel() * c, "gather_rows: out ",
                 out.str(), " for ", x.str());
  cuda::gather_rows(out.raw(), x.raw(), index.raw(), i32, index.numel(), c, dtype_size(x.dtype()));
}

void scatter_add_rows(Tensor& out, const Tensor& x, const Tensor& index) {
  const bool i32 = ids_i32(index, "scatter_add_rows");
  const int64_t c = out.dim(-1);
  MEGATRON_CHECK(x.numel() == index.numel() * c, "scatter_add_rows: ", x.str(), " for ",
                 index.numel(), " rows of ", out.str());
  dispatch_float(out, "scatter_add_rows", [&]<typename T>() {
    cuda::embedding_backward(P<T>(out), P<T>(x), index.raw(), i32, index.numel(), 0, rows_of(out),
                             c);
  });
}

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWSpec& spec, Tensor* rounded) {
  same_numel(param, grad, "adamw_step");
  same_numel(param, exp_avg, "adamw_step");
  same_numel(param, exp_avg_sq, "adamw_step");
  MEGATRON_CHECK(spec.step >= 1, "adamw_step: step must be >= 1, got ", spec.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(spec.beta1), spec.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(spec.beta2), spec.step);
  const AdamArgs a{spec.lr,           spec.beta1,      spec.beta2, spec.eps,
                   spec.weight_decay, spec.grad_scale, 1.0 / bc1,  1.0 / std::sqrt(bc2)};
  dispatch_float(param, "adamw_step", [&]<typename T>() {
    cuda::adamw(P<T>(param), P<T>(exp_avg), P<T>(exp_avg_sq), P<T>(grad), param.numel(), a);
  });
  // A second, device-side pass: on a GPU the step is bandwidth-bound either way and the
  // conversion kernel is the one every other rounding uses.
  if (rounded) rounded->copy_from(param);
}

void sgd_step(Tensor& param, Tensor& momentum_buffer, const Tensor& grad, const SgdSpec& spec,
              Tensor* rounded) {
  same_numel(param, grad, "sgd_step");
  const bool buffer = spec.momentum != 0;
  if (buffer) same_numel(param, momentum_buffer, "sgd_step");
  const SgdArgs a{spec.lr, spec.momentum, spec.weight_decay, spec.grad_scale, spec.first};
  dispatch_float(param, "sgd_step", [&]<typename T>() {
    cuda::sgd(P<T>(param), buffer ? P<T>(momentum_buffer) : nullptr, P<T>(grad), param.numel(), a);
  });
  if (rounded) rounded->copy_from(param);  // a second pass, as adamw_step's
}

void lion_step(Tensor& param, Tensor& exp_avg, const Tensor& grad, const LionSpec& spec,
               Tensor* rounded) {
  same_numel(param, grad, "lion_step");
  same_numel(param, exp_avg, "lion_step");
  const LionArgs a{spec.lr, spec.weight1, spec.weight2, spec.decay, spec.grad_scale};
  dispatch_float(param, "lion_step", [&]<typename T>() {
    cuda::lion(P<T>(param), P<T>(exp_avg), P<T>(grad), param.numel(), a);
  });
  if (rounded) rounded->copy_from(param);  // a second pass, as adamw_step's
}

double sum_squares(const Tensor& x) {
  double s = 0;
  dispatch_float(x, "sum_squares",
                 [&]<typename T>() { s = cuda::sum_squares(P<T>(x), x.numel()); });
  return s;
}

double abs_max(const Tensor& x) {
  MEGATRON_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16 || x.dtype() == DType::kF64,
                 "abs_max: x must be f32, bf16 or f64, got ", x.str());
  return cuda::abs_max(x.raw(), static_cast<int>(x.dtype()), x.numel());
}

void fp8_quantize(Tensor& out, const Tensor& x, float scale, Fp8Format format) {
  cuda::fp8_quantize(out.raw(), x.raw(), static_cast<int>(x.dtype()), x.numel(), scale,
                     format == Fp8Format::kE4M3);
}

void fp8_block_quantize(Tensor& out, const Tensor& x, int64_t block_rows, int64_t block_cols,
                        Fp8BlockRule rule, Fp8Format format) {
  cuda::fp8_block_quantize(out.raw(), x.raw(), static_cast<int>(x.dtype()), x.numel() / x.dim(-1),
                           x.dim(-1), block_rows, block_cols, rule == Fp8BlockRule::kMxfp8,
                           format == Fp8Format::kE4M3);
}

void fp8_tile_abs_max(Tensor& amax, const Tensor& x, const Fp8Tiles& t) {
  cuda::fp8_tile_abs_max(amax.data<float>(), amax.numel(), x.raw(), static_cast<int>(x.dtype()),
                         x.numel(), t.offset, t.cols, t.block_rows, t.block_cols);
}

void fp8_tile_encode(Tensor& codes, const Tensor& x, const Fp8Tiles& t, const Tensor& scales,
                     Fp8Format format) {
  cuda::fp8_tile_encode(codes.raw(), x.raw(), static_cast<int>(x.dtype()), x.numel(), t.offset,
                        t.cols, t.block_rows, t.block_cols, scales.data<float>(),
                        format == Fp8Format::kE4M3);
}

void fp8_tile_decode(Tensor& out, const Tensor& codes, const Fp8Tiles& t, const Tensor& scale_inv,
                     Fp8Format format) {
  cuda::fp8_tile_decode(out.raw(), static_cast<int>(out.dtype()), codes.raw(), out.numel(),
                        t.offset, t.cols, t.block_rows, t.block_cols, scale_inv.data<float>(),
                        format == Fp8Format::kE4M3);
}

void fp8_encode(Tensor& codes, const Tensor& x, float scale, Fp8Format format) {
  cuda::fp8_encode(codes.raw(), x.raw(), static_cast<int>(x.dtype()), x.numel(), scale,
                   format == Fp8Format::kE4M3);
}

void fp8_decode(Tensor& out, const Tensor& codes, Fp8Format format) {
  cuda::fp8_decode(out.raw(), static_cast<int>(out.dtype()), codes.raw(), out.numel(),
                   format == Fp8Format::kE4M3);
}

int64_t count_zeros(const Tensor& x) {
  int64_t z = 0;
  dispatch_float(x, "count_zeros",
                 [&]<typename T>() { z = cuda::count_zeros(P<T>(x), x.numel()); });
  return z;
}

}  // namespace megatron::cuda
