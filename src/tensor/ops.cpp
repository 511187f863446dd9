// The op dispatch: every op of ops.h checks that its tensors share one device, opens the op
// profile's timer for its category, and calls that device's implementation (tensor/cpu/ for
// Device::kCPU, tensor/reference/ for Device::kReference, tensor/cuda/ for Device::kCUDA). A new
// device adds its namespace to MEGATRON_DISPATCH and implements every op there; the op harness
// (tests/tensor/ test_op_harness.cpp) then runs each case on it against the reference.
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "core/logging.h"
#include "tensor/cpu/cpu_ops.h"
#include "tensor/op_profile.h"
#include "tensor/reference/reference_ops.h"

#if MEGATRON_HAVE_CUDA
#include "tensor/cuda/cuda_context.h"
#include "tensor/cuda/cuda_ops.h"
namespace megatron::ops {
namespace {
// A GPU op returns before its kernels finish: while the op profile is on, it waits for them, so
// that the time lands in the op's category (and profiled steps run without overlap).
struct ProfiledWait {
  ~ProfiledWait() {
    if (op_profiling()) cuda::synchronize();
  }
};
}  // namespace
}  // namespace megatron::ops
#define MEGATRON_CUDA_CASE(call) \
  case Device::kCUDA: {          \
    const ProfiledWait wait;     \
    return cuda::call;           \
  }
#else
// A build without the CUDA device has no CUDA tensors either (allocation refuses them).
#define MEGATRON_CUDA_CASE(call) \
  case Device::kCUDA:            \
    break;
#endif

namespace megatron::ops {
namespace {

// The device of the defined tensors among `tensors` (and `more`); they must agree.
Device device_of(const char* op, std::initializer_list<const Tensor*> tensors,
                 const std::vector<Tensor>& more = {}) {
  bool found = false;
  Device device = Device::kCPU;
  auto see = [&](const Tensor& t) {
    if (!t.defined()) return;
    if (!found) {
      device = t.device();
      found = true;
      return;
    }
    MEGATRON_CHECK(t.device() == device, op, ": tensors on different devices (",
                   device_name(device), " and ", device_name(t.device()), ")");
  };
  for (const Tensor* t : tensors) see(*t);
  for (const Tensor& t : more) see(t);
  return device;
}

}  // namespace

// Calls namespace <device>::call for the device.
#define MEGATRON_DISPATCH(device, call) \
  switch (device) {                     \
    case Device::kCPU:                  \
      return cpu::call;                 \
    case Device::kReference:            \
      return reference::call;           \
      MEGATRON_CUDA_CASE(call)          \
  }                                     \
  MEGATRON_CHECK(false, "no implementation on device ", device_name(device))

namespace {
// A 16-bit output of an op on f32 inputs (a 16-bit GEMM's input): the CPU kernels round as they
// write; elsewhere the op runs in the input's dtype and the result is converted.
// Returns whether it did: run(wide) computes into an f32 tensor of in's shape, out gets it rounded.
template <typename Run>
bool rounded_elsewhere(Tensor& out, const Tensor& in, Run run) {
  if (!out.defined() || !in.defined() || out.dtype() == in.dtype() || in.dtype() != DType::kF32 ||
      !is_half(out.dtype()) || in.device() == Device::kCPU)
    return false;
  Tensor wide = Tensor::empty(in.shape(), in.dtype(), in.device());
  run(wide);
  out.copy_from(wide);
  return true;
}
}  // namespace

AttentionView attention_view(const Tensor& t, int64_t groups) {
  MEGATRON_CHECK(t.ndim() == 4, "attention_view: expected [s, b, heads, hn], got ", t.str());
  MEGATRON_CHECK(groups > 0 && t.dim(2) % groups == 0, "attention_view: ", t.dim(2),
                 " heads do not split into ", groups, " groups");
  const int64_t per_group = t.dim(2) / groups, hn = t.dim(3);
  return AttentionView{t,
                       0,
                       t.dim(0),
                       t.dim(1),
                       groups,
                       per_group,
                       hn,
                       t.dim(1) * t.dim(2) * hn,
                       t.dim(2) * hn,
                       per_group * hn,
                       hn};
}

AttentionView packed_qkv_view(const Tensor& qkv, QkvPart part) {
  MEGATRON_CHECK(qkv.ndim() == 5 && qkv.dim(3) >= 3,
                 "packed_qkv_view: expected [s, b, ng, qpg + 2, hn], got ", qkv.str());
  const int64_t ng = qkv.dim(2), P = qkv.dim(3), qpg = P - 2, hn = qkv.dim(4);
  AttentionView v{qkv,         0,      qkv.dim(0), qkv.dim(1), ng, 1, hn, qkv.dim(1) * ng * P * hn,
                  ng * P * hn, P * hn, hn};
  if (part == QkvPart::kQuery) v.per_group = qpg;
  if (part == QkvPart::kKey) v.offset = qpg * hn;
  if (part == QkvPart::kValue) v.offset = (qpg + 1) * hn;
  return v;
}

void matmul(Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float beta) {
  OpTimer timer(OpCategory::kGemm, __func__);
  if (timer.active() && a.ndim() >= 2 && b.ndim() >= 2) {
    const int64_t m = trans_a ? a.dim(-1) : a.numel() / a.dim(-1);
    const int64_t k = trans_a ? a.numel() / a.dim(-1) : a.dim(-1);
    const int64_t n = trans_b ? b.numel() / b.dim(-1) : b.dim(-1);
    timer.set_gemm_shape(
        strprintf("%ldx%ldx%ld %c%c %s%s", static_cast<long>(m), static_cast<long>(n),
                  static_cast<long>(k), trans_a ? 'T' : 'N', trans_b ? 'T' : 'N',
                  dtype_name(a.dtype()), beta != 0.0f ? " +=" : ""),
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  }
  MEGATRON_DISPATCH(device_of("matmul", {&out, &a, &b}), matmul(out, a, trans_a, b, trans_b, beta));
}

void grouped_matmul(Tensor& out, const Tensor& a, const std::vector<Tensor>& b, bool trans_b,
                    const std::vector<int64_t>& sizes, float beta) {
  const OpTimer timer(OpCategory::kGemm, __func__);
  MEGATRON_DISPATCH(device_of("grouped_matmul", {&out, &a}, b),
                    grouped_matmul(out, a, b, trans_b, sizes, beta));
}

void grouped_matmul_at(std::vector<Tensor>& out, const Tensor& a, const Tensor& c,
                       const std::vector<int64_t>& sizes, float beta) {
  const OpTimer timer(OpCategory::kGemm, __func__);
  MEGATRON_DISPATCH(device_of("grouped_matmul_at", {&a, &c}, out),
                    grouped_matmul_at(out, a, c, sizes, beta));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("add", {&out, &a, &b}), add(out, a, b));
}

void add_inplace(Tensor& out, const Tensor& a) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("add_inplace", {&out, &a}), add_inplace(out, a));
}

void mul(Tensor& out, const Tensor& a, const Tensor& b) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("mul", {&out, &a, &b}), mul(out, a, b));
}

void scale_rows(Tensor& x, const Tensor& scale) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("scale_rows", {&x, &scale}), scale_rows(x, scale));
}

void row_dots(Tensor& out, const Tensor& a, const Tensor& b) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("row_dots", {&out, &a, &b}), row_dots(out, a, b));
}

void bias_add(Tensor& x, const Tensor& bias) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("bias_add", {&x, &bias}), bias_add(x, bias));
}

void bias_gelu_forward(Tensor& out, Tensor& y, const Tensor& bias, bool tanh_approx) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  if (device_of("bias_gelu_forward", {&out, &y, &bias}) == Device::kCPU) {
    cpu::bias_gelu_forward(out, y, bias, tanh_approx);
    return;
  }
  // Elsewhere, the ops it fuses.
  bias_add(y, bias);
  Tensor act = out.dtype() == y.dtype() ? out : Tensor::empty(y.shape(), y.dtype(), y.device());
  gelu_forward(act, y, tanh_approx);
  if (act.raw() != out.raw()) out.copy_from(act);
}

void bias_backward(Tensor& dbias, const Tensor& dy) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("bias_backward", {&dbias, &dy}), bias_backward(dbias, dy));
}

void scale_inplace(Tensor& x, double factor) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("scale_inplace", {&x}), scale_inplace(x, factor));
}

void gelu_forward(Tensor& out, const Tensor& x, bool tanh_approx) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("gelu_forward", {&out, &x}), gelu_forward(out, x, tanh_approx));
}

void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("gelu_backward", {&dx, &dout, &x}),
                    gelu_backward(dx, dout, x, tanh_approx));
}

void tanh_forward(Tensor& out, const Tensor& x) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("tanh_forward", {&out, &x}), tanh_forward(out, x));
}

void tanh_backward(Tensor& dx, const Tensor& dout, const Tensor& y) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("tanh_backward", {&dx, &dout, &y}), tanh_backward(dx, dout, y));
}

void squared_relu_forward(Tensor& out, const Tensor& x) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("squared_relu_forward", {&out, &x}), squared_relu_forward(out, x));
}

void squared_relu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("squared_relu_backward", {&dx, &dout, &x}),
                    squared_relu_backward(dx, dout, x));
}

void quick_gelu_forward(Tensor& out, const Tensor& x) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("quick_gelu_forward", {&out, &x}), quick_gelu_forward(out, x));
}

void quick_gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("quick_gelu_backward", {&dx, &dout, &x}),
                    quick_gelu_backward(dx, dout, x));
}

void swiglu_forward(Tensor& out, const Tensor& x) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("swiglu_forward", {&out, &x}), swiglu_forward(out, x));
}

void swiglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("swiglu_backward", {&dx, &dout, &x}), swiglu_backward(dx, dout, x));
}

void quick_geglu_forward(Tensor& out, const Tensor& x, double offset, double clamp) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_CHECK(x.ndim() >= 1 && x.dim(-1) % 2 == 0 && out.numel() * 2 == x.numel() &&
                     out.dtype() == x.dtype(),
                 "quick_geglu_forward: input ", x.str(), " must be [rows, 2f] for output ",
                 out.str());
  MEGATRON_DISPATCH(device_of("quick_geglu_forward", {&out, &x}),
                    quick_geglu_forward(out, x, offset, clamp));
}

void quick_geglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, double offset,
                          double clamp) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_CHECK(x.ndim() >= 1 && x.dim(-1) % 2 == 0 && dout.numel() * 2 == x.numel() &&
                     dx.numel() == x.numel() && dx.dtype() == x.dtype() &&
                     dout.dtype() == x.dtype(),
                 "quick_geglu_backward: shapes ", dx.str(), ", ", dout.str(), ", ", x.str());
  MEGATRON_DISPATCH(device_of("quick_geglu_backward", {&dx, &dout, &x}),
                    quick_geglu_backward(dx, dout, x, offset, clamp));
}

void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("dropout_forward", {&out, &x}),
                    dropout_forward(out, x, p, seed, stream, offset));
}

void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed, uint64_t stream,
                      uint64_t offset) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("dropout_backward", {&dx, &dout}),
                    dropout_backward(dx, dout, p, seed, stream, offset));
}

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, float eps) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  if (rounded_elsewhere(
          out, x, [&](Tensor& wide) { layernorm_forward(wide, mean, rstd, x, weight, bias, eps); }))
    return;
  MEGATRON_DISPATCH(device_of("layernorm_forward", {&out, &mean, &rstd, &x, &weight, &bias}),
                    layernorm_forward(out, mean, rstd, x, weight, bias, eps));
}

void layernorm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(
      device_of("layernorm_backward", {&dx, &dweight, &dbias, &dout, &x, &weight, &mean, &rstd}),
      layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd));
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  if (rounded_elsewhere(out, x, [&](Tensor& wide) { rmsnorm_forward(wide, rstd, x, weight, eps); }))
    return;
  MEGATRON_DISPATCH(device_of("rmsnorm_forward", {&out, &rstd, &x, &weight}),
                    rmsnorm_forward(out, rstd, x, weight, eps));
}

void rmsnorm_backward(Tensor& dx, Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("rmsnorm_backward", {&dx, &dweight, &dout, &x, &weight, &rstd}),
                    rmsnorm_backward(dx, dweight, dout, x, weight, rstd));
}

void embedding_forward(Tensor& out, const Tensor& ids, const Tensor& table) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("embedding_forward", {&out, &ids, &table}),
                    embedding_forward(out, ids, table));
}

void embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("embedding_backward", {&dtable, &dout, &ids}),
                    embedding_backward(dtable, dout, ids));
}

void embedding_forward_shard(Tensor& out, const Tensor& ids, const Tensor& table_shard,
                             int64_t vocab_start) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("embedding_forward_shard", {&out, &ids, &table_shard}),
                    embedding_forward_shard(out, ids, table_shard, vocab_start));
}

void embedding_backward_shard(Tensor& dtable_shard, const Tensor& dout, const Tensor& ids,
                              int64_t vocab_start) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("embedding_backward_shard", {&dtable_shard, &dout, &ids}),
                    embedding_backward_shard(dtable_shard, dout, ids, vocab_start));
}

double YarnRamp::at(int64_t j) const {
  return std::clamp((static_cast<double>(j) - low) / (high - low), 0.0, 1.0);
}

YarnRamp yarn_ramp(const RopeSpec& spec) {
  // The pair index whose wavelength fits `rotations` turns into the original context.
  const auto dim_of = [&](double rotations) {
    return static_cast<double>(spec.rot_dim) *
           std::log(spec.yarn_original_max_positions / (rotations * 2 * M_PI)) /
           (2 * std::log(static_cast<double>(spec.base)));
  };
  YarnRamp r;
  const double low = dim_of(spec.yarn_beta_fast), high = dim_of(spec.yarn_beta_slow);
  r.low = std::max(spec.yarn_round_to_int ? std::floor(low) : low, 0.0);
  r.high = std::min(spec.yarn_round_to_int ? std::ceil(high) : high,
                    static_cast<double>(spec.rot_dim - 1));
  if (r.low == r.high) r.high += 0.001;
  return r;
}

std::vector<double> rope_inv_freqs(const RopeSpec& spec) {
  const int64_t half = spec.rot_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) {
    inv_freq[j] =
        std::pow(static_cast<double>(spec.base), -2.0 * j / static_cast<double>(spec.rot_dim));
  }
  if (spec.scaling_factor > 0) {
    // Llama 3.1: wavelengths above the original context's are slowed by the factor, those below
    // a quarter of it kept, the band between interpolated.
    constexpr double kContext = 8192, kLow = 1, kHigh = 4;
    for (double& f : inv_freq) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > kContext / kLow) {
        f /= spec.scaling_factor;
      } else if (wavelen >= kContext / kHigh) {
        const double smooth = (kContext / wavelen - kLow) / (kHigh - kLow);
        f = (1 - smooth) * f / spec.scaling_factor + smooth * f;
      }
    }
  }
  if (spec.yarn_factor > 0) {
    const YarnRamp ramp = yarn_ramp(spec);
    for (int64_t j = 0; j < half; ++j) {
      const double r = ramp.at(j);
      inv_freq[j] = inv_freq[j] / spec.yarn_factor * r + inv_freq[j] * (1 - r);
    }
  }
  return inv_freq;
}

void rope_inplace(Tensor& x, const Tensor& positions, const RopeSpec& spec, bool inverse) {
  MEGATRON_CHECK(spec.yarn_factor <= 0 || spec.scaling_factor <= 0,
                 "rope_inplace: YaRN and Llama 3.1 scaling are exclusive");
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("rope_inplace", {&x, &positions}),
                    rope_inplace(x, positions, spec, inverse));
}

void attention_forward(Tensor& out, Tensor& lse, const AttentionView& q, const AttentionView& k,
                       const AttentionView& v, const AttentionSpec& spec) {
  const OpTimer timer(OpCategory::kAttention, __func__);
  MEGATRON_DISPATCH(
      device_of("attention_forward", {&out, &lse, &q.tensor, &k.tensor, &v.tensor, &spec.doc_start,
                                      &spec.key_valid, &spec.bias, &spec.max_logit}),
      attention_forward(out, lse, q, k, v, spec));
}

void attention_backward(const AttentionView& dq, const AttentionView& dk, const AttentionView& dv,
                        const Tensor& dbias, const Tensor& dout, const AttentionView& q,
                        const AttentionView& k, const AttentionView& v, const Tensor& out,
                        const Tensor& lse, const AttentionSpec& spec) {
  const OpTimer timer(OpCategory::kAttention, __func__);
  MEGATRON_DISPATCH(
      device_of("attention_backward",
                {&dq.tensor, &dk.tensor, &dv.tensor, &dbias, &dout, &q.tensor, &k.tensor, &v.tensor,
                 &out, &lse, &spec.doc_start, &spec.key_valid, &spec.bias}),
      attention_backward(dq, dk, dv, dbias, dout, q, k, v, out, lse, spec));
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const OpTimer timer(OpCategory::kAttention, __func__);
  MEGATRON_DISPATCH(device_of("attention_merge", {&out, &lse, &out_b, &lse_b}),
                    attention_merge(out, lse, out_b, lse_b));
}

namespace {
void check_sink_args(const char* op, const Tensor& out, const Tensor& lse, const Tensor& sink) {
  MEGATRON_CHECK(out.ndim() == 4, op, ": out must be [sq, b, np, hn], got ", out.str());
  check_shape(lse, {out.dim(1), out.dim(2), out.dim(0)}, "attention sink lse");
  check_shape(sink, {out.dim(2)}, "attention sink");
  MEGATRON_CHECK(lse.dtype() == out.dtype() && sink.dtype() == out.dtype(), op,
                 ": out, lse and sink must share a dtype, got ", out.str(), ", ", lse.str(), ", ",
                 sink.str());
}
}  // namespace

void attention_sink_forward(Tensor& out, Tensor& lse, const Tensor& sink) {
  const OpTimer timer(OpCategory::kAttention, __func__);
  check_sink_args(__func__, out, lse, sink);
  MEGATRON_DISPATCH(device_of("attention_sink_forward", {&out, &lse, &sink}),
                    attention_sink_forward(out, lse, sink));
}

void attention_sink_backward(Tensor& dsink, const Tensor& dout, const Tensor& out,
                             const Tensor& lse, const Tensor& sink) {
  const OpTimer timer(OpCategory::kAttention, __func__);
  check_sink_args(__func__, out, lse, sink);
  check_shape(dout, out.shape(), "attention sink dout");
  check_shape(dsink, sink.shape(), "attention sink dsink");
  MEGATRON_CHECK(dout.dtype() == out.dtype() && dsink.dtype() == out.dtype(), __func__,
                 ": dout and dsink must have out's dtype");
  MEGATRON_DISPATCH(device_of("attention_sink_backward", {&dsink, &dout, &out, &lse, &sink}),
                    attention_sink_backward(dsink, dout, out, lse, sink));
}

void cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                           int64_t vocab_size) {
  const OpTimer timer(OpCategory::kCrossEntropy, __func__);
  MEGATRON_DISPATCH(device_of("cross_entropy_forward", {&loss, &lse, &logits, &targets}),
                    cross_entropy_forward(loss, lse, logits, targets, vocab_size));
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size) {
  const OpTimer timer(OpCategory::kCrossEntropy, __func__);
  if (rounded_elsewhere(dlogits, logits, [&](Tensor& wide) {
        cross_entropy_backward(wide, dloss, logits, lse, targets, vocab_size);
      }))
    return;
  MEGATRON_DISPATCH(
      device_of("cross_entropy_backward", {&dlogits, &dloss, &logits, &lse, &targets}),
      cross_entropy_backward(dlogits, dloss, logits, lse, targets, vocab_size));
}

void log_softmax_gather(Tensor& logprob, const Tensor& logits, const Tensor& targets,
                        int64_t vocab_size) {
  const OpTimer timer(OpCategory::kCrossEntropy, __func__);
  MEGATRON_DISPATCH(device_of("log_softmax_gather", {&logprob, &logits, &targets}),
                    log_softmax_gather(logprob, logits, targets, vocab_size));
}

void cross_entropy_shard_max(Tensor& row_max, const Tensor& logits_shard, int64_t valid) {
  const OpTimer timer(OpCategory::kCrossEntropy, __func__);
  MEGATRON_DISPATCH(device_of("cross_entropy_shard_max", {&row_max, &logits_shard}),
                    cross_entropy_shard_max(row_max, logits_shard, valid));
}

void cross_entropy_shard_sums(Tensor& sums, const Tensor& logits_shard, const Tensor& row_max,
                              const Tensor& targets, int64_t vocab_start, int64_t valid) {
  const OpTimer timer(OpCategory::kCrossEntropy, __func__);
  MEGATRON_DISPATCH(
      device_of("cross_entropy_shard_sums", {&sums, &logits_shard, &row_max, &targets}),
      cross_entropy_shard_sums(sums, logits_shard, row_max, targets, vocab_start, valid));
}

void cross_entropy_shard_finish(Tensor& loss, Tensor& lse, const Tensor& row_max,
                                const Tensor& sums) {
  const OpTimer timer(OpCategory::kCrossEntropy, __func__);
  MEGATRON_DISPATCH(device_of("cross_entropy_shard_finish", {&loss, &lse, &row_max, &sums}),
                    cross_entropy_shard_finish(loss, lse, row_max, sums));
}

void cross_entropy_shard_backward(Tensor& dlogits_shard, const Tensor& dloss,
                                  const Tensor& logits_shard, const Tensor& lse,
                                  const Tensor& targets, int64_t vocab_start, int64_t valid) {
  const OpTimer timer(OpCategory::kCrossEntropy, __func__);
  if (rounded_elsewhere(dlogits_shard, logits_shard, [&](Tensor& wide) {
        cross_entropy_shard_backward(wide, dloss, logits_shard, lse, targets, vocab_start, valid);
      }))
    return;
  MEGATRON_DISPATCH(device_of("cross_entropy_shard_backward",
                              {&dlogits_shard, &dloss, &logits_shard, &lse, &targets}),
                    cross_entropy_shard_backward(dlogits_shard, dloss, logits_shard, lse, targets,
                                                 vocab_start, valid));
}

MaskedSum masked_sum(const Tensor& loss, const Tensor& mask) {
  const OpTimer timer(OpCategory::kCrossEntropy, __func__);
  MEGATRON_DISPATCH(device_of("masked_sum", {&loss, &mask}), masked_sum(loss, mask));
}

void transpose_2d(Tensor& out, const Tensor& x) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("transpose_2d", {&out, &x}), transpose_2d(out, x));
}

void gather_rows(Tensor& out, const Tensor& x, const Tensor& index) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("gather_rows", {&out, &x, &index}), gather_rows(out, x, index));
}

void scatter_add_rows(Tensor& out, const Tensor& x, const Tensor& index) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("scatter_add_rows", {&out, &x, &index}),
                    scatter_add_rows(out, x, index));
}

void slice_last_dim(Tensor& out, const Tensor& x, int64_t start) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("slice_last_dim", {&out, &x}), slice_last_dim(out, x, start));
}

void concat_last_dim(Tensor& out, const std::vector<Tensor>& parts) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("concat_last_dim", {&out}, parts), concat_last_dim(out, parts));
}

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                const AdamWSpec& spec, Tensor* rounded) {
  const OpTimer timer(OpCategory::kOptimizer, __func__);
  if (rounded) {
    MEGATRON_CHECK(is_half(rounded->dtype()) && rounded->numel() == param.numel(),
                   "adamw_step: rounded must be bf16 or f16 with param's ", param.numel(),
                   " elements, got ", rounded->str());
  }
  const Device device = device_of("adamw_step", {&param, &exp_avg, &exp_avg_sq, &grad});
  const bool m16 = exp_avg.dtype() == DType::kBF16, v16 = exp_avg_sq.dtype() == DType::kBF16;
  if ((m16 || v16) && device != Device::kCPU) {
    // bf16 moments elsewhere: the f32 step on widened copies, rounded back (the CPU kernel does
    // the same in one pass; convert rounds as it does).
    MEGATRON_CHECK(param.dtype() == DType::kF32, "adamw_step: bf16 moments need f32 weights, got ",
                   param.str());
    Tensor m = m16 ? exp_avg.to(DType::kF32) : exp_avg;
    Tensor v = v16 ? exp_avg_sq.to(DType::kF32) : exp_avg_sq;
    [&] { MEGATRON_DISPATCH(device, adamw_step(param, m, v, grad, spec, rounded)); }();
    if (m16) exp_avg.copy_from(m);
    if (v16) exp_avg_sq.copy_from(v);
    return;
  }
  MEGATRON_DISPATCH(device, adamw_step(param, exp_avg, exp_avg_sq, grad, spec, rounded));
}

void sgd_step(Tensor& param, Tensor& momentum_buffer, const Tensor& grad, const SgdSpec& spec,
              Tensor* rounded) {
  const OpTimer timer(OpCategory::kOptimizer, __func__);
  if (rounded) {
    MEGATRON_CHECK(is_half(rounded->dtype()) && rounded->numel() == param.numel(),
                   "sgd_step: rounded must be bf16 or f16 with param's ", param.numel(),
                   " elements, got ", rounded->str());
  }
  MEGATRON_CHECK(spec.momentum >= 0, "sgd_step: momentum must be >= 0, got ", spec.momentum);
  const bool buffer = spec.momentum != 0;
  if (buffer) {
    MEGATRON_CHECK(
        momentum_buffer.numel() == param.numel() && momentum_buffer.dtype() == param.dtype(),
        "sgd_step: the momentum buffer ", momentum_buffer.str(),
        " must have the weights' dtype and size ", param.str());
  }
  const Device device = buffer ? device_of("sgd_step", {&param, &momentum_buffer, &grad})
                               : device_of("sgd_step", {&param, &grad});
  MEGATRON_DISPATCH(device, sgd_step(param, momentum_buffer, grad, spec, rounded));
}

void lion_step(Tensor& param, Tensor& exp_avg, const Tensor& grad, const LionSpec& spec,
               Tensor* rounded) {
  const OpTimer timer(OpCategory::kOptimizer, __func__);
  if (rounded) {
    MEGATRON_CHECK(is_half(rounded->dtype()) && rounded->numel() == param.numel(),
                   "lion_step: rounded must be bf16 or f16 with param's ", param.numel(),
                   " elements, got ", rounded->str());
  }
  MEGATRON_CHECK(exp_avg.numel() == param.numel() && exp_avg.dtype() == param.dtype(),
                 "lion_step: exp_avg ", exp_avg.str(), " must have the weights' dtype and size ",
                 param.str());
  MEGATRON_DISPATCH(device_of("lion_step", {&param, &exp_avg, &grad}),
                    lion_step(param, exp_avg, grad, spec, rounded));
}

namespace {
// fp16 and E4M3 codes: the moments stored with a scale.
bool is_scaled_moment(DType t) {
  return t == DType::kF16 || t == DType::kU8;
}
}  // namespace

MomentScaling moment_scaling(double absmax, DType stored) {
  MEGATRON_CHECK(stored == DType::kF16 || stored == DType::kU8,
                 "moment_scaling: scaled moments are f16 or u8 (E4M3 codes), got ",
                 dtype_name(stored));
  const auto a = static_cast<float>(absmax);
  if (!(a > 0)) return {};
  // fp32 arithmetic, as FusedAdam's scale tensors compute it.
  if (stored == DType::kF16) {
    const float scale = a / (65504.0f / 2.0f);
    return {1.0f / scale, scale};
  }
  const float q = 1.0f / (a / 448.0f);
  return {q, 1.0f / q};
}

void adamw_step_scaled(Tensor& param, StoredMoment exp_avg, StoredMoment exp_avg_sq,
                       const Tensor& grad, const AdamWSpec& spec, Tensor* rounded) {
  const OpTimer timer(OpCategory::kOptimizer, __func__);
  MEGATRON_CHECK(exp_avg.stored && exp_avg_sq.stored, "adamw_step_scaled: moments missing");
  for (const StoredMoment& m : {exp_avg, exp_avg_sq}) {
    const DType t = m.stored->dtype();
    MEGATRON_CHECK(t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kU8,
                   "adamw_step_scaled: a moment must be f32, bf16, f16 or u8, got ",
                   m.stored->str());
    MEGATRON_CHECK(!is_scaled_moment(t) || m.read_scale,
                   "adamw_step_scaled: an f16 or u8 moment needs its read scale");
  }
  const Device device =
      device_of("adamw_step_scaled", {&param, exp_avg.stored, exp_avg_sq.stored, &grad});
  if (device == Device::kCPU && param.dtype() == DType::kF32) {
    cpu::adamw_step_scaled(param, exp_avg, exp_avg_sq, grad, spec, rounded);
    return;
  }
  // Elsewhere (and for f64 weights): widened to the weights' dtype (and unscaled), stepped,
  // stored back.
  auto widen = [&](const StoredMoment& m) {
    if (m.stored->dtype() == param.dtype()) return *m.stored;
    Tensor out = Tensor::empty(m.stored->shape(), param.dtype(), m.stored->device());
    unscale_moment(out, m);
    return out;
  };
  Tensor m = widen(exp_avg), v = widen(exp_avg_sq);
  adamw_step(param, m, v, grad, spec, rounded);
  if (m.raw() != exp_avg.stored->raw()) store_moment(exp_avg, m);
  if (v.raw() != exp_avg_sq.stored->raw()) store_moment(exp_avg_sq, v);
}

void unscale_moment(Tensor& out, const StoredMoment& m) {
  if (m.stored->dtype() == DType::kU8) {
    fp8_decode(out, *m.stored, Fp8Format::kE4M3);
  } else {
    out.copy_from(*m.stored);
  }
  if (is_scaled_moment(m.stored->dtype())) scale_inplace(out, *m.read_scale);
}

void store_moment(StoredMoment m, Tensor& values) {
  if (!is_scaled_moment(m.stored->dtype())) {
    m.stored->copy_from(values);
    return;
  }
  const MomentScaling s = moment_scaling(abs_max(values), m.stored->dtype());
  if (m.stored->dtype() == DType::kU8) {
    fp8_encode(*m.stored, values, s.store, Fp8Format::kE4M3);
  } else {
    scale_inplace(values, s.store);
    m.stored->copy_from(values);
  }
  *m.read_scale = s.read;
}

double sum_squares(const Tensor& x) {
  const OpTimer timer(OpCategory::kOptimizer, __func__);
  MEGATRON_DISPATCH(device_of("sum_squares", {&x}), sum_squares(x));
}

double abs_max(const Tensor& x) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_DISPATCH(device_of("abs_max", {&x}), abs_max(x));
}

void fp8_quantize(Tensor& out, const Tensor& x, float scale, Fp8Format format) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  const DType want = x.dtype() == DType::kF64 ? DType::kF64 : DType::kBF16;
  MEGATRON_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16 || x.dtype() == DType::kF64,
                 "fp8_quantize: x must be f32, bf16 or f64, got ", x.str());
  MEGATRON_CHECK(out.dtype() == want && out.numel() == x.numel(), "fp8_quantize: out must be ",
                 dtype_name(want), " with x's ", x.numel(), " elements, got ", out.str());
  MEGATRON_DISPATCH(device_of("fp8_quantize", {&out, &x}), fp8_quantize(out, x, scale, format));
}

void fp8_block_quantize(Tensor& out, const Tensor& x, int64_t block_rows, int64_t block_cols,
                        Fp8BlockRule rule, Fp8Format format) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  const DType want = x.dtype() == DType::kF64 ? DType::kF64 : DType::kBF16;
  MEGATRON_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16 || x.dtype() == DType::kF64,
                 "fp8_block_quantize: x must be f32, bf16 or f64, got ", x.str());
  MEGATRON_CHECK(out.dtype() == want && out.numel() == x.numel(),
                 "fp8_block_quantize: out must be ", dtype_name(want), " with x's ", x.numel(),
                 " elements, got ", out.str());
  MEGATRON_CHECK(block_rows >= 1 && block_cols >= 1 && x.ndim() >= 1 && x.dim(-1) >= 1,
                 "fp8_block_quantize: blocks of ", block_rows, " x ", block_cols, " of ", x.str());
  MEGATRON_DISPATCH(device_of("fp8_block_quantize", {&out, &x}),
                    fp8_block_quantize(out, x, block_rows, block_cols, rule, format));
}

void fp8_encode(Tensor& codes, const Tensor& x, float scale, Fp8Format format) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16 || x.dtype() == DType::kF64,
                 "fp8_encode: x must be f32, bf16 or f64, got ", x.str());
  MEGATRON_CHECK(codes.dtype() == DType::kU8 && codes.numel() == x.numel(),
                 "fp8_encode: codes must be u8 with x's ", x.numel(), " elements, got ",
                 codes.str());
  MEGATRON_DISPATCH(device_of("fp8_encode", {&codes, &x}), fp8_encode(codes, x, scale, format));
}

void fp8_decode(Tensor& out, const Tensor& codes, Fp8Format format) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_CHECK(
      out.dtype() == DType::kF32 || out.dtype() == DType::kBF16 || out.dtype() == DType::kF64,
      "fp8_decode: out must be f32, bf16 or f64, got ", out.str());
  MEGATRON_CHECK(codes.dtype() == DType::kU8 && codes.numel() == out.numel(),
                 "fp8_decode: codes must be u8 with out's ", out.numel(), " elements, got ",
                 codes.str());
  MEGATRON_DISPATCH(device_of("fp8_decode", {&out, &codes}), fp8_decode(out, codes, format));
}

namespace {
// A tile description's sanity, and the number of tiles a run of n elements reaches into.
int64_t tiles_reached(const char* op, const Fp8Tiles& t, int64_t n) {
  MEGATRON_CHECK(t.offset >= 0 && t.cols >= 1 && t.block_rows >= 1 && t.block_cols >= 1, op,
                 ": bad tiles (offset ", t.offset, ", cols ", t.cols, ", blocks ", t.block_rows,
                 " x ", t.block_cols, ")");
  if (n == 0) return 0;
  const int64_t last_row = (t.offset + n - 1) / t.cols;
  return (last_row / t.block_rows + 1) * ((t.cols + t.block_cols - 1) / t.block_cols);
}
}  // namespace

void fp8_tile_abs_max(Tensor& amax, const Tensor& x, const Fp8Tiles& tiles) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16 || x.dtype() == DType::kF64,
                 "fp8_tile_abs_max: x must be f32, bf16 or f64, got ", x.str());
  MEGATRON_CHECK(amax.dtype() == DType::kF32 &&
                     amax.numel() >= tiles_reached("fp8_tile_abs_max", tiles, x.numel()),
                 "fp8_tile_abs_max: amax must be f32 with a slot per tile, got ", amax.str());
  MEGATRON_DISPATCH(device_of("fp8_tile_abs_max", {&amax, &x}), fp8_tile_abs_max(amax, x, tiles));
}

void fp8_tile_encode(Tensor& codes, const Tensor& x, const Fp8Tiles& tiles, const Tensor& scales,
                     Fp8Format format) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16 || x.dtype() == DType::kF64,
                 "fp8_tile_encode: x must be f32, bf16 or f64, got ", x.str());
  MEGATRON_CHECK(codes.dtype() == DType::kU8 && codes.numel() == x.numel(),
                 "fp8_tile_encode: codes must be u8 with x's ", x.numel(), " elements, got ",
                 codes.str());
  MEGATRON_CHECK(scales.dtype() == DType::kF32 &&
                     scales.numel() >= tiles_reached("fp8_tile_encode", tiles, x.numel()),
                 "fp8_tile_encode: scales must be f32 with a slot per tile, got ", scales.str());
  MEGATRON_DISPATCH(device_of("fp8_tile_encode", {&codes, &x, &scales}),
                    fp8_tile_encode(codes, x, tiles, scales, format));
}

void fp8_tile_decode(Tensor& out, const Tensor& codes, const Fp8Tiles& tiles,
                     const Tensor& scale_inv, Fp8Format format) {
  const OpTimer timer(OpCategory::kNormElementwise, __func__);
  MEGATRON_CHECK(
      out.dtype() == DType::kF32 || out.dtype() == DType::kBF16 || out.dtype() == DType::kF64,
      "fp8_tile_decode: out must be f32, bf16 or f64, got ", out.str());
  MEGATRON_CHECK(codes.dtype() == DType::kU8 && codes.numel() == out.numel(),
                 "fp8_tile_decode: codes must be u8 with out's ", out.numel(), " elements, got ",
                 codes.str());
  MEGATRON_CHECK(scale_inv.dtype() == DType::kF32 &&
                     scale_inv.numel() >= tiles_reached("fp8_tile_decode", tiles, out.numel()),
                 "fp8_tile_decode: scale_inv must be f32 with a slot per tile, got ",
                 scale_inv.str());
  MEGATRON_DISPATCH(device_of("fp8_tile_decode", {&out, &codes, &scale_inv}),
                    fp8_tile_decode(out, codes, tiles, scale_inv, format));
}

int64_t count_zeros(const Tensor& x) {
  const OpTimer timer(OpCategory::kOptimizer, __func__);
  MEGATRON_DISPATCH(device_of("count_zeros", {&x}), count_zeros(x));
}
}  // namespace megatron::ops
