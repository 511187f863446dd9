// The MoE router math (transformer/moe/routing.h) against an fp64 restatement of Megatron's
// router in PyTorch (tests/reference/moe_routing_oracle.py, run by CTest first): softmax before
// and after the top-k, sigmoid with and without expert bias, the scaling factor, group-limited
// routing, sinkhorn in training and evaluation, capacity with both drop policies with and without
// padding; for each, the probabilities, the map, the gradient of sum(probs * G) with respect to
// the logits, the aux / seq-aux / z-losses and their gradients, and the expert-bias update. Plus
// the cases the oracle cannot state: top-k ties (lowest index wins) and the capacity formula.
//
// Tolerance: both sides compute in f64 from the same inputs; sums are ordered differently
// (softmax denominators, the losses' reductions over T x E), so results agree to ~1e-15
// relative; 1e-12 absolute + 1e-10 relative is far below any wrong term (O(1e-3) or more here).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/process_group.h"
#include "parallel/param.h"
#include "transformer/moe/router.h"
#include "transformer/moe/routing.h"

namespace megatron {
namespace {

using nlohmann::json;

constexpr double kAbs = 1e-12, kRel = 1e-10;

const json& cases() {
  static const json j = [] {
    std::ifstream in("oracle/moe_routing.json");
    EXPECT_TRUE(in.good()) << "oracle/moe_routing.json missing (CTest's generator runs first)";
    return in.good() ? json::parse(in) : json::object();
  }();
  return j;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], kAbs + kRel * std::abs(want[i])) << what << "[" << i << "]";
}

MoeConfig config_of(const json& c, int64_t E) {
  MoeConfig m;
  m.num_experts = E;
  m.ffn_hidden_size = 1;
  m.router_topk = c.at("topk").get<int64_t>();
  m.score_function =
      c.at("score") == "sigmoid" ? MoeScoreFunction::kSigmoid : MoeScoreFunction::kSoftmax;
  m.pre_softmax = c.value("pre_softmax", false);
  m.topk_scaling_factor = c.value("scaling", 0.0);
  m.num_groups = c.value("num_groups", 0);
  m.group_topk = c.value("group_topk", 0);
  m.enable_expert_bias = c.value("bias", false);
  if (c.value("sinkhorn", false)) m.load_balancing = {MoeLoadBalancing::kSinkhorn};
  m.capacity_factor = c.value("capacity", 0.0);
  m.drop_policy = c.value("policy", std::string("probs")) == "position" ? MoeDropPolicy::kPosition
                                                                        : MoeDropPolicy::kProbs;
  m.pad_expert_input_to_capacity = c.value("pad", false);
  return m;
}

TEST(MoeRouting, EveryRouterConfigurationAgainstTheFp64Oracle) {
  const json& all = cases();
  ASSERT_TRUE(all.contains("cases"));
  const int64_t T = all["T"], B = all["B"], E = all["E"];
  const double coeff = all["coeff"];
  ASSERT_GE(all["cases"].size(), 16u);
  for (const json& c : all["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const MoeConfig m = config_of(c["cfg"], E);
    const auto logits = c["logits"].get<std::vector<double>>();
    const auto bias = c["bias"].get<std::vector<double>>();
    const moe::Routing r = moe::route(logits, T, m, bias, c["training"].get<bool>());
    expect_near_all(r.probs, c["probs"].get<std::vector<double>>(), "probs");
    const auto want_map = c["map"].get<std::vector<int>>();
    for (size_t i = 0; i < want_map.size(); ++i) ASSERT_EQ(r.map[i], want_map[i]) << "map " << i;
    if (c.contains("capacity")) {
      EXPECT_EQ(moe::expert_capacity(T, E, m.router_topk, m.capacity_factor),
                c["capacity"].get<int64_t>());
    }

    std::vector<double> dlogits(static_cast<size_t>(T * E), 0.0);
    moe::route_backward(r, m, c["G"].get<std::vector<double>>(), dlogits);
    expect_near_all(dlogits, c["dlogits"].get<std::vector<double>>(), "d logits");

    // Losses at TP = CP = 1: counts are this rank's, T tokens, S = T / B per sequence.
    const moe::AuxScores a = moe::aux_scores(logits, T, m);
    std::vector<double> ds(static_cast<size_t>(T * E), 0.0), dl(ds.size(), 0.0);
    const double aux = moe::aux_loss(a, T, E, m.router_topk, moe::aux_counts(a, T, E),
                                     static_cast<double>(T), coeff, 1.0, &ds);
    EXPECT_NEAR(aux, c["aux_loss"].get<double>(), kAbs + kRel * aux);
    moe::aux_scores_backward(logits, T, m, ds, dl);
    expect_near_all(dl, c["daux"].get<std::vector<double>>(), "d aux loss");

    std::fill(ds.begin(), ds.end(), 0.0);
    std::fill(dl.begin(), dl.end(), 0.0);
    const double seq = moe::seq_aux_loss(a, T, E, m.router_topk, B, moe::aux_counts(a, T, E, B),
                                         static_cast<double>(T / B), coeff, 1.0, &ds);
    EXPECT_NEAR(seq, c["seq_aux_loss"].get<double>(), kAbs + kRel * seq);
    moe::aux_scores_backward(logits, T, m, ds, dl);
    expect_near_all(dl, c["dseq_aux"].get<std::vector<double>>(), "d seq aux loss");

    std::fill(dl.begin(), dl.end(), 0.0);
    const double z = coeff * moe::z_loss(logits, T, E, coeff, 1.0, &dl);
    EXPECT_NEAR(z, c["z_loss"].get<double>(), kAbs + kRel * z);
    expect_near_all(dl, c["dz"].get<std::vector<double>>(), "d z-loss");
  }
}

// The aux-loss-free update (get_updated_expert_bias): bias += 1e-3 sign(mean count - count), from
// the counts of the batch's map, through the router that owns the bias.
TEST(MoeRouting, ExpertBiasUpdateAgainstTheOracle) {
  const json& all = cases();
  ASSERT_TRUE(all.contains("cases"));
  const int64_t T = all["T"], E = all["E"];
  int checked = 0;
  for (const json& c : all["cases"]) {
    if (!c.contains("bias_after")) continue;
    SCOPED_TRACE(c["name"].get<std::string>());
    TransformerConfig cfg;
    cfg.hidden_size = 4;
    cfg.moe = config_of(c["cfg"], E);
    auto self = make_self_process_group();
    TopKRouter router("router", cfg, 0, TensorParallelContext{self.get(), false, {}});
    std::vector<Param*> ps;
    router.collect(ps);
    ParamSet set(ps, DType::kF32);
    const auto bias = c["bias"].get<std::vector<double>>();
    Tensor b = Tensor::empty({E}, DType::kF64);
    std::copy(bias.begin(), bias.end(), b.data<double>());
    router.expert_bias.main.copy_from(b);
    const moe::Routing r =
        moe::route(c["logits"].get<std::vector<double>>(), T, cfg.moe, bias, true);
    std::vector<double> counts(static_cast<size_t>(E), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) counts[e] += r.map[t * E + e];
    router.update_expert_bias(counts);
    const auto want = c["bias_after"].get<std::vector<double>>();
    // The bias is kept in f32 (Megatron's too): one f32 rounding of each updated value.
    for (int64_t e = 0; e < E; ++e)
      EXPECT_NEAR(router.expert_bias.main.item(e), want[e], 1e-7) << "expert " << e;
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// At B = 1 the sequence-level loss is the micro-batch one (Megatron's test_seq_aux_loss).
TEST(MoeRouting, SeqAuxLossEqualsAuxLossForOneSequence) {
  const json& all = cases();
  ASSERT_TRUE(all.contains("cases"));
  const int64_t T = all["T"], E = all["E"];
  const MoeConfig m = config_of(all["cases"][0]["cfg"], E);
  const auto logits = all["cases"][0]["logits"].get<std::vector<double>>();
  const moe::AuxScores a = moe::aux_scores(logits, T, m);
  const double aux =
      moe::aux_loss(a, T, E, m.router_topk, moe::aux_counts(a, T, E), T, 1.0, 0, nullptr);
  const double seq =
      moe::seq_aux_loss(a, T, E, m.router_topk, 1, moe::aux_counts(a, T, E, 1), T, 1.0, 0, nullptr);
  EXPECT_NEAR(seq, aux, 1e-14 * aux);
  EXPECT_GT(aux, 0.5);  // a balanced router gives ~1: a real value, not a zero
}

// A repeated MTP block's application (ForwardMode::moe_aux_share = 1 / depths, Megatron 0.19's
// division by mtp_num_layers): the load-balancing loss counts that share in its gradient and its
// logged value, the z-loss in its logged value only (Megatron attaches the z-loss's gradient
// before dividing it).
TEST(MoeRouting, RepeatedApplicationsShareTheLosses) {
  auto self = make_self_process_group();
  for (const bool z : {false, true}) {
    SCOPED_TRACE(z ? "z-loss" : "load-balancing loss");
    TransformerConfig cfg;
    cfg.hidden_size = 4;
    cfg.moe.num_experts = 4;
    cfg.moe.ffn_hidden_size = 1;
    cfg.moe.router_topk = 2;
    cfg.moe.aux_loss_coeff = {z ? 0.0 : 0.01};
    cfg.moe.z_loss_coeff = z ? 0.001 : 0.0;
    TopKRouter router("router", cfg, 0, TensorParallelContext{self.get(), false, {}});
    std::vector<Param*> ps;
    router.collect(ps);
    ParamSet set(ps, DType::kF32);
    Tensor w = Tensor::empty({4, 4}, DType::kF64);
    for (int64_t i = 0; i < 16; ++i) w.data<double>()[i] = std::sin(1.7 * static_cast<double>(i));
    set.set_main(router.weight, w);
    set.sync_compute_from_main();
    Tensor x = Tensor::empty({6, 4});
    for (int64_t i = 0; i < 24; ++i) x.data<float>()[i] = static_cast<float>(std::cos(0.9 * i));
    auto run = [&](double share) {
      ForwardMode mode{true, 1, 0};
      mode.aux_loss_scale = 1.0;
      mode.moe_aux_share = share;
      TopKRouter::Ctx ctx;
      router.forward(x, 1, ctx, mode);
      return ctx;
    };
    const TopKRouter::Ctx whole = run(1.0), half = run(0.5);
    ASSERT_EQ(whole.logged.size(), 1u);
    ASSERT_EQ(half.logged.size(), 1u);
    EXPECT_GT(whole.logged[0].second, 0.0);
    EXPECT_NEAR(half.logged[0].second, 0.5 * whole.logged[0].second,
                1e-15 * whole.logged[0].second);
    ASSERT_EQ(half.dlogits_aux.size(), whole.dlogits_aux.size());
    double norm = 0;
    const double factor = z ? 1.0 : 0.5;
    for (size_t i = 0; i < whole.dlogits_aux.size(); ++i) {
      norm += std::abs(whole.dlogits_aux[i]);
      EXPECT_NEAR(half.dlogits_aux[i], factor * whole.dlogits_aux[i], 1e-15);
    }
    EXPECT_GT(norm, 1e-6);  // a gradient to compare
  }
}

// Ties, which the oracle avoids: the lower expert index wins (routing.h's documented rule).
TEST(MoeRouting, TopKTiesGoToTheLowerIndex) {
  MoeConfig m;
  m.num_experts = 4;
  m.ffn_hidden_size = 1;
  m.router_topk = 2;
  const std::vector<double> logits = {1, 3, 3, 3,   // three equal maxima: experts 1 and 2
                                      2, 2, 2, 2};  // all equal: experts 0 and 1
  const moe::Routing r = moe::route(logits, 2, m, {}, true);
  EXPECT_EQ(r.topk, (std::vector<int32_t>{1, 2, 0, 1}));
  EXPECT_EQ(r.map, (std::vector<uint8_t>{0, 1, 1, 0, 1, 1, 0, 0}));
  // Capacity ties: 4 equal tokens for capacity ceil(4 * 2 / 4 * 0.5) = 1: the first token stays.
  m.capacity_factor = 0.5;
  const std::vector<double> same(16, 0.0);
  const moe::Routing d = moe::route(same, 4, m, {}, true);
  for (int64_t e = 0; e < 2; ++e) {
    EXPECT_EQ(d.map[0 * 4 + e], 1) << "expert " << e;
    for (int64_t t = 1; t < 4; ++t) EXPECT_EQ(d.map[t * 4 + e], 0) << "token " << t;
  }
}

// --moe-router-padding-for-fp8: Megatron's pad_routing_map turns, per expert, the first zeros in
// token order into ones (zero_ranks = cumsum(map == 0) <= (-count) % multiple).
TEST(MoeRouting, PaddingForFp8TakesEachExpertsFirstFreeTokens) {
  // 6 tokens, 3 experts, multiple 4. Expert 0 has tokens 1 and 3: tokens 0 and 2 join it.
  // Expert 1 has 4 tokens already. Expert 2 has none: nothing to pad.
  const std::vector<uint8_t> map = {0, 1, 0,  //
                                    1, 1, 0,  //
                                    0, 0, 0,  //
                                    1, 1, 0,  //
                                    0, 1, 0,  //
                                    0, 0, 0};
  const std::vector<uint8_t> want = {1, 1, 0,  //
                                     1, 1, 0,  //
                                     1, 0, 0,  //
                                     1, 1, 0,  //
                                     0, 1, 0,  //
                                     0, 0, 0};
  EXPECT_EQ(moe::pad_routing_map(map, 6, 3, 4), want);
  // Too few free tokens: every one of them joins (5 of 6 routed, multiple 4 -> all 6).
  const std::vector<uint8_t> full = {1, 1, 1, 1, 1, 0};
  EXPECT_EQ(moe::pad_routing_map(full, 6, 1, 4), std::vector<uint8_t>(6, 1));
  // Against the cumsum rule on a random map: counts become multiples of 16 where they can.
  const int64_t T = 100, E = 5, m = 16;
  std::vector<uint8_t> rnd(static_cast<size_t>(T * E));
  uint64_t state = 7;
  for (uint8_t& v : rnd) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = (state >> 60) < 3 ? 1 : 0;
  }
  const std::vector<uint8_t> padded = moe::pad_routing_map(rnd, T, E, m);
  for (int64_t e = 0; e < E; ++e) {
    int64_t ones = 0, zero_rank = 0, count = 0;
    for (int64_t t = 0; t < T; ++t) ones += rnd[t * E + e];
    const int64_t need = ((-ones) % m + m) % m;
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(t * E + e);
      if (rnd[i] == 0) ++zero_rank;
      const uint8_t rule = rnd[i] != 0 || zero_rank <= need ? 1 : 0;
      EXPECT_EQ(padded[i], rule) << "expert " << e << " token " << t;
      count += padded[i];
    }
    EXPECT_EQ(count % m, 0) << "expert " << e;
  }
}

// Megatron's get_capacity, ceil(T k / E x factor), clamped here to T (torch.topk over the tokens
// would fail beyond it).
TEST(MoeRouting, CapacityIsMegatronsCeilingClampedToTheTokens) {
  EXPECT_EQ(moe::expert_capacity(12, 8, 2, 1.0), 3);
  EXPECT_EQ(moe::expert_capacity(12, 8, 2, 1.1), 4);   // 3.3 -> 4
  EXPECT_EQ(moe::expert_capacity(12, 8, 2, 0.5), 2);   // 1.5 -> 2
  EXPECT_EQ(moe::expert_capacity(12, 2, 2, 4.0), 12);  // 48 -> every token
}

}  // namespace
}  // namespace megatron
