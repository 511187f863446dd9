// FP8 scaling state and recipes (parallel/fp8_scaling.h).
#include "parallel/fp8_scaling.h"

#include <algorithm>

#include <cfloat>
#include <cmath>

#include "tensor/ops.h"

namespace megatron {

void delayed_scaling_update(float* history, int64_t len, int64_t stride, float* scale,
                            float fp8_max, int margin, bool amax_compute_max) {
  const float last = history[0];
  float window_max = 0;
  for (int64_t i = 0; i < len; ++i) {
    const float a = i < len - 1 ? history[(i + 1) * stride] : last;
    window_max = std::fmax(window_max, a);
  }
  // The roll: every row moves up by one, the newest goes to the end, row 0 starts afresh.
  for (int64_t i = 0; i + 1 < len; ++i) history[i * stride] = history[(i + 1) * stride];
  history[(len - 1) * stride] = last;
  history[0] = 0;
  const float amax = amax_compute_max ? window_max : last;
  const float scaled_max = fp8_max * std::pow(2.0f, static_cast<float>(-margin));
  if (std::isfinite(amax) && amax > 0) {
    float s = scaled_max / amax;
    if (std::isinf(s)) s = FLT_MAX;
    *scale = s;
  }
}

float current_scaling_scale(double amax_d, float fp8_max, float value_for_inf) {
  const float amax = static_cast<float>(amax_d);
  if (std::isinf(amax) || amax == 0.0f || std::isnan(amax)) return 1.0f;
  const float s = fp8_max / amax;
  return std::isinf(s) ? value_for_inf : s;
}

Fp8GemmScaling::Fp8GemmScaling(const std::string& linear_name, const Fp8Config& cfg, int tp_rank,
                               int tp_size)
    : cfg_(cfg), delayed_(cfg.recipe == Fp8Recipe::kDelayed) {
  if (!delayed_) return;
  MEGATRON_CHECK(cfg.amax_history_len >= 1, "--fp8-amax-history-len must be at least 1, got ",
                 cfg.amax_history_len);
  for (Param* p : {&scale_, &history_}) {
    p->init = Init::kZeros;
    p->no_weight_decay = true;
    p->frozen = true;
    p->tp_rank = tp_rank;
    p->tp_size = tp_size;
  }
  scale_.name = linear_name + ".fp8_scale";
  scale_.shape = {kOperands};
  scale_.main = Tensor::full(scale_.shape, 1.0, DType::kF32);
  history_.name = linear_name + ".fp8_amax_history";
  history_.shape = {cfg.amax_history_len, kOperands};
  history_.main = Tensor::zeros(history_.shape, DType::kF32);
  scale_.value = scale_.main;
  history_.value = history_.main;
}

std::vector<Param*> Fp8GemmScaling::state() {
  if (!delayed_) return {};
  return {&scale_, &history_};
}

Fp8Format Fp8GemmScaling::format_of(Operand op) const {
  return op == kGradOutput ? cfg_.backward_format() : cfg_.forward_format();
}

void Fp8GemmScaling::record(Operand op, double amax) {
  if (!delayed_ || !recording_) return;
  float& slot = history_row0()[op];
  slot = std::fmax(slot, static_cast<float>(amax));
}

std::pair<int64_t, int64_t> Fp8GemmScaling::block_shape(Operand op, Fp8Usage u) const {
  const bool rowwise = u == Fp8Usage::kRowwise;
  if (cfg_.recipe == Fp8Recipe::kMxfp8) return rowwise ? std::pair{1, 32} : std::pair{32, 1};
  if (op == kWeight) return {128, 128};
  return rowwise ? std::pair{1, 128} : std::pair{128, 1};
}

float Fp8GemmScaling::quantize_into(Tensor& out, const Tensor& x, Operand op, Fp8Usage usage) {
  const Fp8Format f = format_of(op);
  if (cfg_.block_scaled()) {
    const auto [rows, cols] = block_shape(op, usage);
    ops::fp8_block_quantize(
        out, x, rows, cols,
        cfg_.recipe == Fp8Recipe::kMxfp8 ? Fp8BlockRule::kMxfp8 : Fp8BlockRule::kBlockwise, f);
    return 1.0f;
  }
  float scale;
  if (delayed_) {
    scale = scales()[op];
    if (recording_) record(op, ops::abs_max(x));
  } else {
    const float for_inf = x.dtype() == DType::kBF16 ? 0x1.fep127f : FLT_MAX;
    scale = current_scaling_scale(ops::abs_max(x), fp8_max(f), for_inf);
  }
  ops::fp8_quantize(out, x, scale, f);
  return 1.0f / scale;
}

Fp8Tensor Fp8GemmScaling::quantize(const Tensor& x, Operand op, Fp8Usage usage) {
  Fp8Tensor out;
  out.q =
      Tensor::empty(x.shape(), x.dtype() == DType::kF64 ? DType::kF64 : DType::kBF16, x.device());
  out.scale_inv = quantize_into(out.q, x, op, usage);
  return out;
}

Fp8Tensor Fp8GemmScaling::weight(const Tensor& w) {
  if (fresh_weight_ || !weight_cache_.q.defined()) {
    weight_cache_ = quantize(w, kWeight);
    ++weight_version_;
  }
  return weight_cache_;
}

Fp8Tensor Fp8GemmScaling::weight_columnwise(const Param& w) {
  // Blockwise FP8 primary weights: decoded afresh, their tiles read the same both ways.
  if (w.fp8 && tiled_primary_weight()) return weight(w);
  MEGATRON_ASSERT(usages_differ() && !w.fp8 && weight_cache_.q.defined(), w.name,
                  ": a columnwise weight is a block-scaled recipe's, after the forward's");
  // blockwise's 128 x 128 weight tiles read the same both ways
  if (cfg_.recipe == Fp8Recipe::kBlockwise) return weight_cache_;
  if (columnwise_version_ != weight_version_ || !weight_cache_columnwise_.q.defined()) {
    weight_cache_columnwise_ = quantize(w.value, kWeight, Fp8Usage::kColumnwise);
    columnwise_version_ = weight_version_;
  }
  return weight_cache_columnwise_;
}

Fp8Tensor Fp8GemmScaling::weight(const Param& w) {
  if (!w.fp8) return weight(w.value);
  MEGATRON_ASSERT(w.fp8 == this, w.name, " is the FP8 primary weight of another GEMM");
  Fp8Tensor out;
  out.q = Tensor::empty(w.shape, DType::kBF16, w.value.device());
  if (tiled_primary_weight()) {
    ops::fp8_tile_decode(out.q, w.value, ops::Fp8Tiles{0, w.shape[1], kWeightTile, kWeightTile},
                         primary_tile_scale_inv_, format_of(kWeight));
    return out;  // the values times their tile's factor: scale_inv 1
  }
  ops::fp8_decode(out.q, w.value, format_of(kWeight));
  out.scale_inv = primary_scale_inv_;
  return out;
}

Tensor Fp8GemmScaling::primary_tile_scales(const std::vector<float>& tile_amax, Device device) {
  Tensor scales = Tensor::empty({static_cast<int64_t>(tile_amax.size())}, DType::kF32);
  Tensor inv = Tensor::empty(scales.shape(), DType::kF32);
  for (size_t i = 0; i < tile_amax.size(); ++i) {
    const Fp8BlockScale b =
        fp8_block_scale(tile_amax[i], Fp8BlockRule::kBlockwise, format_of(kWeight));
    scales.data<float>()[i] = b.scale;
    inv.data<float>()[i] = b.scale_inv;
  }
  primary_tile_scale_inv_ = inv.to(device);
  return scales.to(device);
}

float Fp8GemmScaling::primary_weight_scale(double amax) {
  float scale;
  if (delayed_) {
    scale = scales()[kWeight];
    float& slot = history_row0()[kWeight];
    slot = std::fmax(slot, static_cast<float>(amax));
  } else {
    scale = current_scaling_scale(amax, fp8_max(format_of(kWeight)), 0x1.fep127f);  // bf16's max
  }
  primary_scale_inv_ = 1.0f / scale;
  return scale;
}

void Fp8GemmScaling::begin_forward(bool training, bool first_micro_batch) {
  recording_ = training;
  fresh_weight_ = first_micro_batch || !training;
}

void Fp8GemmScaling::forward_scales(std::vector<float>* out) const {
  if (!delayed_) return;
  const float* s = scale_.main.data<float>();
  out->push_back(s[kInput]);
  out->push_back(s[kWeight]);
}

void Fp8GemmScaling::begin_recompute(const float* saved) {
  recording_ = false;
  fresh_weight_ = false;  // the copy of this step's first micro-batch, as the forward used
  recomputing_ = true;
  if (!delayed_) return;
  saved_scales_[0] = scales()[kInput];
  saved_scales_[1] = scales()[kWeight];
  scales()[kInput] = saved[0];
  scales()[kWeight] = saved[1];
}

void Fp8GemmScaling::end_recompute() {
  if (!recomputing_) return;
  recomputing_ = false;
  if (!delayed_) return;
  scales()[kInput] = saved_scales_[0];
  scales()[kWeight] = saved_scales_[1];
}

void Fp8GemmScaling::recorded_amaxes(bool forward, std::vector<float>* out) const {
  if (!delayed_) return;
  const float* row0 = history_.main.data<float>();
  if (forward) {
    out->push_back(row0[kInput]);
    out->push_back(row0[kWeight]);
  } else {
    out->push_back(row0[kGradOutput]);
  }
}

void Fp8GemmScaling::set_recorded_amaxes(bool forward, const float* in) {
  if (!delayed_) return;
  float* row0 = history_row0();
  if (forward) {
    row0[kInput] = in[0];
    row0[kWeight] = in[1];
  } else {
    row0[kGradOutput] = in[0];
  }
}

void Fp8GemmScaling::update(bool forward) {
  if (!delayed_) return;
  const int64_t len = cfg_.amax_history_len;
  auto one = [&](Operand op) {
    delayed_scaling_update(history_row0() + op, len, kOperands, scales() + op,
                           fp8_max(format_of(op)), cfg_.margin, cfg_.amax_compute_max);
  };
  if (forward) {
    one(kInput);
    one(kWeight);
  } else {
    one(kGradOutput);
  }
}

namespace {

// Delayed scaling's end of a region over `gemms`: their recorded amaxes of the pass reduced with
// one all-reduce (MAX), then each GEMM's history rolled and its scales updated.
void reduce_and_update_gemms(const std::vector<Fp8GemmScaling*>& gemms, bool forward,
                             ProcessGroup* group) {
  if (gemms.empty()) return;
  std::vector<float> amax;
  for (const Fp8GemmScaling* g : gemms) g->recorded_amaxes(forward, &amax);
  if (group && group->size() > 1) {
    Tensor t = Tensor::empty({static_cast<int64_t>(amax.size())}, DType::kF32);
    std::copy(amax.begin(), amax.end(), t.data<float>());
    group->all_reduce(t, ReduceOp::kMax);
    std::copy(t.data<float>(), t.data<float>() + t.numel(), amax.begin());
  }
  const size_t per = forward ? 2 : 1;
  for (size_t i = 0; i < gemms.size(); ++i) {
    gemms[i]->set_recorded_amaxes(forward, amax.data() + i * per);
    gemms[i]->update(forward);
  }
}

}  // namespace

bool Fp8Region::delayed() const {
  return !gemms_.empty() && gemms_.front()->config().recipe == Fp8Recipe::kDelayed;
}

void Fp8Region::join(Fp8Registry* registry) {
  registry_ = registry;
  registry->enroll(this);
}

void Fp8Region::begin_forward(bool training, bool first_micro_batch) {
  for (Fp8GemmScaling* g : gemms_) g->begin_forward(training, first_micro_batch);
}

void Fp8Region::end_forward(bool training, ProcessGroup* group) {
  if (training) reduce_and_update(/*forward=*/true, group);
  for (Fp8GemmScaling* g : gemms_) g->begin_forward(false, false);  // nothing recorded between
}

void Fp8Region::begin_backward() {
  for (Fp8GemmScaling* g : gemms_) g->begin_backward();
}

void Fp8Region::end_backward(ProcessGroup* group) {
  reduce_and_update(/*forward=*/false, group);
  for (Fp8GemmScaling* g : gemms_) g->begin_forward(false, false);
}

void Fp8Region::reduce_and_update(bool forward, ProcessGroup* group) {
  if (!delayed()) return;
  if (registry_) {
    registry_->reduce_and_update(forward, group);
  } else {
    reduce_and_update_gemms(gemms_, forward, group);
  }
}

void Fp8Registry::enroll(Fp8Region* r) {
  if (!r->delayed() || std::find(regions_.begin(), regions_.end(), r) != regions_.end()) return;
  regions_.push_back(r);
  for (Fp8GemmScaling* g : r->gemms()) gemms_.push_back(g);
}

void Fp8Registry::reduce_and_update(bool forward, ProcessGroup* group) const {
  reduce_and_update_gemms(gemms_, forward, group);
}

std::vector<float> Fp8Region::forward_scales() const {
  std::vector<float> out;
  for (const Fp8GemmScaling* g : gemms_) g->forward_scales(&out);
  return out;
}

void Fp8Region::begin_recompute(const std::vector<float>& saved) {
  size_t at = 0;
  for (Fp8GemmScaling* g : gemms_) {
    g->begin_recompute(saved.empty() ? nullptr : saved.data() + at);
    if (!saved.empty()) at += 2;
  }
}

void Fp8Region::end_recompute() {
  for (Fp8GemmScaling* g : gemms_) {
    g->end_recompute();
    g->begin_backward();  // recomputation happens inside a backward, which records again
  }
}

std::vector<Param*> Fp8Region::state() const {
  std::vector<Param*> out;
  for (Fp8GemmScaling* g : gemms_)
    for (Param* p : g->state()) out.push_back(p);
  return out;
}

}  // namespace megatron
