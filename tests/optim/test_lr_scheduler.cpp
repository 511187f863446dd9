// Learning-rate schedules against Megatron's formulas, evaluated by hand at chosen points.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/lr_scheduler.h"

namespace megatron {
namespace {

LrSchedule make(LrDecayStyle style) {
  LrSchedule s;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_samples = 100;
  s.decay_samples = 1100;
  s.style = style;
  return s;
}

TEST(LrSchedule, WarmupIsLinearFromInit) {
  LrSchedule s = make(LrDecayStyle::kCosine);
  s.warmup_init = 0.2;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.2);
  EXPECT_DOUBLE_EQ(s.lr_at(50), 0.2 + 0.8 * 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(100), 1.0);
}

TEST(LrSchedule, LinearCosineConstantAfterWarmup) {
  // Halfway through decay: linear coeff 0.5, cosine coeff 0.5 too; a quarter: 0.75 vs 0.853553.
  EXPECT_DOUBLE_EQ(make(LrDecayStyle::kLinear).lr_at(600), 0.1 + 0.5 * 0.9);
  EXPECT_NEAR(make(LrDecayStyle::kCosine).lr_at(600), 0.1 + 0.5 * 0.9, 1e-15);
  EXPECT_DOUBLE_EQ(make(LrDecayStyle::kLinear).lr_at(350), 0.1 + 0.75 * 0.9);
  EXPECT_NEAR(make(LrDecayStyle::kCosine).lr_at(350), 0.1 + 0.5 * (std::cos(M_PI * 0.25) + 1) * 0.9,
              1e-15);
  EXPECT_DOUBLE_EQ(make(LrDecayStyle::kConstant).lr_at(5000), 1.0);
  // After the decay length: min_lr.
  EXPECT_DOUBLE_EQ(make(LrDecayStyle::kLinear).lr_at(1100), 0.1);
  EXPECT_DOUBLE_EQ(make(LrDecayStyle::kCosine).lr_at(2000), 0.1);
}

TEST(LrSchedule, FractionalWarmupAsMegatron) {
  // --lr-warmup-fraction 0.13 of 20 samples: warm-up ends at 2.6 samples, not at 2.
  LrSchedule s = make(LrDecayStyle::kLinear);
  s.decay_samples = 20;
  s.warmup_samples = 0.13 * 20;
  EXPECT_DOUBLE_EQ(s.lr_at(2), 1.0 * 2 / 2.6);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.1 + (1 - (4 - 2.6) / (20 - 2.6)) * 0.9);
}

TEST(LrSchedule, InverseSquareRoot) {
  LrSchedule s = make(LrDecayStyle::kInverseSquareRoot);
  EXPECT_DOUBLE_EQ(s.lr_at(400), 1.0 * std::sqrt(100.0) / std::sqrt(400.0));
  s.decay_samples = 100000;
  EXPECT_DOUBLE_EQ(s.lr_at(40000), 0.1);  // clamped at min_lr (0.05 < 0.1)
}

TEST(LrSchedule, WarmupStableDecay) {
  LrSchedule s = make(LrDecayStyle::kWSD);
  s.wsd_decay_samples = 200;  // anneal over [900, 1100]
  EXPECT_DOUBLE_EQ(s.lr_at(500), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(900), 1.0);
  // exponential: coeff = 2 * 0.5^r - 1; r = 0.5 at 1000.
  EXPECT_NEAR(s.lr_at(1000), 0.1 + (2 * std::pow(0.5, 0.5) - 1) * 0.9, 1e-15);
  s.wsd_style = WsdDecayStyle::kLinear;
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 0.1 + 0.5 * 0.9);
  s.wsd_style = WsdDecayStyle::kMinusSqrt;
  EXPECT_NEAR(s.lr_at(1000), 0.1 + (1 - std::sqrt(0.5)) * 0.9, 1e-15);
  EXPECT_NEAR(s.lr_at(1100), 0.1, 1e-15);
}

TEST(LrSchedule, ParsesMegatronNamesAndRejectsOthers) {
  EXPECT_EQ(parse_lr_decay_style("inverse-square-root"), LrDecayStyle::kInverseSquareRoot);
  EXPECT_EQ(parse_lr_decay_style("WSD"), LrDecayStyle::kWSD);
  EXPECT_THROW(parse_lr_decay_style("wsd"), InvalidArgument);
  EXPECT_THROW(parse_wsd_decay_style("sqrt"), InvalidArgument);
}

TEST(AdamWGroups, NoWeightDecayOnBiasesAndNorms) {
  // With zero gradients Adam's update is 0, so only weight decay moves the weights.
  Param w, b;
  w.name = "w";
  w.shape = {4};
  b.name = "b";
  b.shape = {4};
  b.no_weight_decay = true;
  ParamSet set({&w, &b}, DType::kF32);
  w.main.fill(1.0);
  b.main.fill(1.0);
  AdamW opt(set, AdamWConfig{0.9, 0.999, 1e-8, 0.5});
  opt.step(0.1);
  EXPECT_FLOAT_EQ(static_cast<float>(w.main.item(0)), 1.0f - 0.1f * 0.5f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.main.item(0)), 1.0f);
}

TEST(AdamWGroups, DecoupledRateForEmbeddingsAndOutputAndScheduledDecay) {
  // Zero gradients again: each weight moves by -lr x decay x w, with its group's lr and decay.
  Param emb, w, b;
  emb.name = "embedding.word_embeddings.weight";
  emb.shape = {4};
  emb.is_embedding_or_output = true;
  w.name = "w";
  w.shape = {4};
  b.name = "b";
  b.shape = {4};
  b.no_weight_decay = true;
  ParamSet set({&emb, &w, &b}, DType::kF32);
  for (Param* p : {&emb, &w, &b}) p->main.fill(1.0);
  AdamW opt(set, AdamWConfig{0.9, 0.999, 1e-8, 0.5});
  opt.step(StepRates{0.1, 0.3, 0.25});
  EXPECT_FLOAT_EQ(static_cast<float>(emb.main.item(0)), 1.0f - 0.3f * 0.25f);
  EXPECT_FLOAT_EQ(static_cast<float>(w.main.item(0)), 1.0f - 0.1f * 0.25f);
  EXPECT_FLOAT_EQ(static_cast<float>(b.main.item(0)), 1.0f);
  // --lr 0 (and a decoupled 0): nothing moves, bit for bit.
  opt.step(StepRates{0.0, 0.0, 0.25});
  EXPECT_EQ(static_cast<float>(w.main.item(0)), 1.0f - 0.1f * 0.25f);
}

TEST(WeightDecaySchedule, MegatronIncrementStyles) {
  // OptimizerParamScheduler.get_wd: start + coeff x (end - start), coeff = ratio (linear) or
  // 0.5 (cos(pi (1 - ratio)) + 1) (cosine), ratio = samples / incr; end after incr samples.
  WeightDecaySchedule s{0.1, 0.5, 1000, WeightDecayIncrStyle::kLinear};
  EXPECT_DOUBLE_EQ(s.wd_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.wd_at(250), 0.1 + 0.25 * 0.4);
  EXPECT_DOUBLE_EQ(s.wd_at(1000), 0.5);
  EXPECT_DOUBLE_EQ(s.wd_at(5000), 0.5);
  s.style = WeightDecayIncrStyle::kCosine;
  EXPECT_DOUBLE_EQ(s.wd_at(0), 0.1);
  EXPECT_NEAR(s.wd_at(250), 0.1 + 0.5 * (std::cos(M_PI * 0.75) + 1.0) * 0.4, 1e-15);
  EXPECT_NEAR(s.wd_at(500), 0.3, 1e-15);
  EXPECT_DOUBLE_EQ(s.wd_at(1001), 0.5);
  const WeightDecaySchedule constant{0.2, 0.2, 1000, WeightDecayIncrStyle::kConstant};
  EXPECT_DOUBLE_EQ(constant.wd_at(0), 0.2);
  EXPECT_DOUBLE_EQ(constant.wd_at(700), 0.2);
  EXPECT_THROW(parse_weight_decay_incr_style("exp"), InvalidArgument);
}

TEST(GradClip, ScalesOnlyAboveTheThreshold) {
  Param w;
  w.name = "w";
  w.shape = {2};
  ParamSet set({&w}, DType::kF32);
  w.main_grad.data<float>()[0] = 3;
  w.main_grad.data<float>()[1] = 4;
  EXPECT_DOUBLE_EQ(grad_norm(set), 5.0);
  clip_grads(set, 10.0, 5.0);
  EXPECT_FLOAT_EQ(w.main_grad.data<float>()[0], 3.0f);
  clip_grads(set, 1.0, 5.0);
  EXPECT_NEAR(grad_norm(set), 1.0, 1e-6);
  EXPECT_EQ(clip_coefficient(10.0, 5.0), 1.0);
  EXPECT_EQ(clip_coefficient(0.0, 5.0), 1.0);  // --clip-grad 0: off
  EXPECT_DOUBLE_EQ(clip_coefficient(1.0, 5.0), 1.0 / (5.0 + 1e-6));
}

}  // namespace
}  // namespace megatron
