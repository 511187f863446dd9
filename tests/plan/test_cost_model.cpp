// The planner's model (plan/cost_model.h, plan/planner.h) on cases whose answer is known
// independently: parameter counts against the built model, Korthikanti et al.'s activation
// formulas, collective volumes on a cluster whose compute is free, the pipeline's in-flight
// counts against the schedules, and the enumeration against Megatron's rules.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "models/model_spec.h"
#include "pipeline/schedule.h"
#include "plan/cost_model.h"
#include "plan/planner.h"

namespace megatron::plan {
namespace {

TransformerConfig gpt2_style() {
  TransformerConfig c;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.seq_length = 32;
  c.max_position_embeddings = 48;
  c.vocab_size = 500;
  c.padded_vocab_size = 512;
  c.compute_dtype = DType::kBF16;
  c.finalize();
  return c;
}

TransformerConfig llama_style() {
  TransformerConfig c = gpt2_style();
  c.num_attention_heads = 8;
  c.num_query_groups = 2;
  c.kv_channels = 0;
  c.ffn_hidden_size = 96;
  c.normalization = Normalization::kRMSNorm;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.position_embedding = PositionEmbedding::kRope;
  c.untie_embeddings_and_output_weights = true;
  c.qk_layernorm = true;
  c.finalize();
  return c;
}

TransformerConfig moe_style() {
  TransformerConfig c = llama_style();
  c.moe.num_experts = 4;
  c.moe.router_topk = 2;
  c.moe.ffn_hidden_size = 48;
  c.moe.shared_expert_intermediate_size = 32;
  c.moe.layer_pattern = {0, 1, 1, 0};  // dense, MoE, MoE, dense
  c.finalize();
  return c;
}

// DeepSeek-V3's shape: multi-latent attention (with and without the query bottleneck) over the MoE
// layers with a shared expert and the router's expert bias; with the bottleneck, two multi-token
// prediction depths (of the last layer's kind: dense here).
TransformerConfig mla_style(int64_t q_lora_rank) {
  TransformerConfig c = moe_style();
  c.num_query_groups = c.num_attention_heads;
  c.kv_channels = 0;
  c.mla.enabled = true;
  c.mla.q_lora_rank = q_lora_rank;
  c.mla.kv_lora_rank = 24;
  c.mla.qk_head_dim = 16;
  c.mla.qk_pos_emb_head_dim = 8;
  c.mla.v_head_dim = 12;
  c.moe.score_function = MoeScoreFunction::kSigmoid;
  c.moe.enable_expert_bias = true;
  c.mtp_num_layers = q_lora_rank > 0 ? 2 : 0;  // multi-token prediction on the last stage
  c.finalize();
  return c;
}

// gpt-oss's shape: sinks per head, biases on the attention, the router and the experts, a gated
// MLP (quick GeGLU), every layer MoE.
TransformerConfig gpt_oss_style() {
  TransformerConfig c = llama_style();
  c.qk_layernorm = false;
  c.swiglu = false;
  c.quick_geglu = true;
  c.glu_linear_offset = 1;
  c.activation_clamp = 7;
  c.add_bias_linear = true;
  c.softmax_type = SoftmaxType::kLearnable;
  c.moe.num_experts = 4;
  c.moe.router_topk = 2;
  c.moe.ffn_hidden_size = 48;
  c.finalize();
  return c;
}

// Parameters the trainer counts on a rank: every parameter but buffers (the routers' expert
// bias), as the start-up line does.
int64_t built_params(const TransformerConfig& c, int pp, int rank) {
  ChunkPlacement placement;
  placement.pp_size = pp;
  placement.pp_rank = rank;
  int64_t n = 0;
  for (auto& chunk : model_spec("gpt").build_chunks(ModelOptions{c, false}, placement))
    for (Param* p : chunk->parameters())
      if (!p->frozen || !p->requires_grad) n += p->shape.numel();
  return n;
}

TEST(PlanParams, RankParamsMatchTheBuiltModelOnEveryStage) {
  // Exact: both count the same tensors' elements.
  for (const TransformerConfig& c :
       {gpt2_style(), llama_style(), moe_style(), mla_style(32), mla_style(0), gpt_oss_style()}) {
    for (int pp : {1, 2, 4}) {
      Layout l;
      l.pp = pp;
      for (int r = 0; r < pp; ++r) {
        SCOPED_TRACE("pp " + std::to_string(pp) + " stage " + std::to_string(r));
        EXPECT_EQ(static_cast<int64_t>(rank_params(c, l, r).total()), built_params(c, pp, r));
      }
    }
  }
}

TEST(PlanParams, TensorAndExpertParallelismDivideTheirShares) {
  const TransformerConfig c = moe_style();
  Layout one, split;
  split.tp = 2;
  split.etp = 1;
  split.ep = 4;
  const RankParams a = rank_params(c, one, 0), b = rank_params(c, split, 0);
  EXPECT_DOUBLE_EQ(b.dense, a.dense / 2);
  EXPECT_DOUBLE_EQ(b.embedding, a.embedding / 2);
  EXPECT_DOUBLE_EQ(b.expert, a.expert / 4);
  EXPECT_DOUBLE_EQ(b.replicated, a.replicated);
}

// A cluster whose compute is free: only communication and the optimizer's bytes cost time.
Cluster free_compute(double bandwidth) {
  Cluster c;
  c.device.name = "test";
  c.device.peak_16bit = c.device.peak_fp32 = 1e12;
  c.device.memory_bytes = 1e12;
  c.device.memory_bw = 1e30;  // elementwise and optimizer passes free too
  c.device.gemm_time = [](int64_t, int64_t, int64_t, bool, bool, DType) { return 0.0; };
  c.device.attention_time = [](int64_t, int64_t, int64_t, int64_t, int64_t, bool, double, DType,
                               bool) { return 0.0; };
  c.device.elementwise_time = [](const ElementwiseWork&) { return 0.0; };
  c.devices_per_node = 8;
  c.intra = Link{bandwidth, 0.0, 1.0};
  c.inter = c.intra;
  return c;
}

Workload workload(const TransformerConfig& c, int64_t global_batch) {
  Workload w;
  w.config = c;
  w.global_batch = global_batch;
  w.model_flops = 1e12;
  return w;
}

TEST(PlanTime, TensorParallelCollectivesMoveMegatronsVolumes) {
  // Without SP: 2 all-reduces forward and 2 backward per layer of [s b, h] 16-bit activations,
  // each 2 (t - 1) / t of them over the link; with SP: 4 all-gathers / reduce-scatters forward
  // and 6 backward, each (t - 1) / t. Plus the embedding's reduction and the cross entropy's
  // three fp32 [s b] all-reduces. Exact up to rounding: the model adds these terms.
  const TransformerConfig c = gpt2_style();
  const double bw = 1e9, S = 32.0 * 2 * 64 * 2;  // s b h x 2 bytes, mbs 2
  for (const bool sp : {false, true}) {
    Layout l;
    l.tp = 4;
    l.sp = sp;
    l.mbs = 2;
    const Prediction p = predict(workload(c, 2), l, free_compute(bw));
    const double layer = sp ? 10 * 0.75 * S / bw : 4 * 1.5 * S / bw;
    const double embedding = sp ? 0.75 * S / bw : 1.5 * S / bw;
    const double ce = 3 * 1.5 * (32.0 * 2 * 4) / bw;
    EXPECT_NEAR(p.tp_comm, 4 * layer, 1e-12) << (sp ? "sp" : "no sp");
    EXPECT_NEAR(p.compute, embedding + ce, 1e-12) << (sp ? "sp" : "no sp");
  }
}

TEST(PlanTime, DataParallelReductionIsARingAllReduceOfFp32Gradients) {
  // DDP: 2 (d - 1) / d of the rank's gradients (4 bytes each); the distributed optimizer
  // reduce-scatters the gradients and all-gathers the 16-bit weights: (d - 1) / d (4 + 2).
  const TransformerConfig c = gpt2_style();
  const double bw = 1e9;
  Layout l;
  l.dp = 4;
  const double params = rank_params(c, l, 0).total();
  EXPECT_NEAR(predict(workload(c, 4), l, free_compute(bw)).dp_comm, 1.5 * 4 * params / bw, 1e-12);
  l.sharding = Sharding::kDistributedOptimizer;
  EXPECT_NEAR(predict(workload(c, 4), l, free_compute(bw)).dp_comm, 0.75 * 6 * params / bw, 1e-12);
}

// Two distributed-optimizer instances at dp 4: the reduce-scatter and gather run over an
// instance of 2 ranks, (2 - 1) / 2 (4 + 2), and each shard (half the gradients) is all-reduced
// over the 2 instances, 2 (2 - 1) / 2 x 4 / 2; the state shards over 2 ranks, not 4.
TEST(PlanTime, OptimizerInstancesReduceWithinThenAcross) {
  const TransformerConfig c = gpt2_style();
  const double bw = 1e9;
  Layout l;
  l.dp = 4;
  l.sharding = Sharding::kDistributedOptimizer;
  l.instances = 2;
  const double params = rank_params(c, l, 0).total();
  const Prediction p = predict(workload(c, 4), l, free_compute(bw));
  EXPECT_NEAR(p.dp_comm, (0.5 * 6 + 1.0 * 4 / 2) * params / bw, 1e-12);
  Layout one = l;
  one.instances = 1;
  Layout half = one;
  half.dp = 2;
  EXPECT_NEAR(p.weight_and_optimizer_bytes,
              predict(workload(c, 4), half, free_compute(bw)).weight_and_optimizer_bytes, 1e-6);
  EXPECT_GT(p.weight_and_optimizer_bytes,
            predict(workload(c, 4), one, free_compute(bw)).weight_and_optimizer_bytes);
}

TEST(PlanTime, ThePipelineBubbleIsPpMinusOneOverVppStageTimes) {
  // With every stage equally slow (compute is a fixed GEMM time per layer here and the ends are
  // free), step = (m + (pp - 1) / vpp) stage times: Narayanan et al.'s bubble.
  TransformerConfig c = gpt2_style();
  c.num_layers = 8;
  c.finalize();
  Cluster cl = free_compute(1e30);
  cl.device.gemm_time = [](int64_t, int64_t, int64_t, bool, bool, DType) { return 1e-3; };
  for (int64_t vpp : {1, 2}) {
    Layout l;
    l.pp = 4;
    l.vpp = vpp;
    const Prediction p = predict(workload(c, 8), l, cl);
    // A layer's 4 GEMMs x 3 (forward, input and weight gradients); 2 layers per stage; the
    // head's 3 GEMMs on the last stage make it slower: the bubble uses the mean stage.
    const double layer = 12e-3, head = 3e-3;
    const double mean = (4 * 2 * layer + head) / 4, slowest = 2 * layer + head;
    EXPECT_NEAR(p.bubble, 3.0 / static_cast<double>(vpp) * mean, 1e-12);
    EXPECT_NEAR(p.step - p.optimizer, 8 * slowest + p.bubble, 1e-9);
  }
}

TEST(PlanTime, GemmEfficiencyGrowsWithSizeTowardsItsMaximum) {
  Device d;
  d.peak_16bit = 1e15;
  d.gemm_e_max = 0.8;
  d.gemm_f_half = 1e9;
  // F = 2 m n k; at F = F_half the rate is half of e_max x peak.
  const double half = gemm_seconds(d, 500, 1000, 1000, false, true, DType::kBF16, false);
  EXPECT_NEAR(1e9 / half, 0.4e15, 1e6);
  const double big = gemm_seconds(d, 16384, 16384, 16384, false, true, DType::kBF16, false);
  EXPECT_NEAR(2.0 * std::pow(16384.0, 3) / big / 1e15, 0.8, 1e-3);
}

TEST(PlanMemory, MegatronActivationsAreKorthikantisTable2) {
  // Bytes per layer (16-bit, 1-byte masks, dropout on): TP without SP sbh (10 + 24/t + 5as/(ht)),
  // TP + SP 34 sbh/t + 5as^2b/t, TP + SP + selective 34 sbh/t. The difference between 4 and 2
  // layers is two layers' bytes (the once-per-stage terms cancel). Exact arithmetic.
  TransformerConfig c = gpt2_style();
  const double s = 32, b = 2, h = 64, a = 4;
  for (int64_t t : {1, 2, 4}) {
    for (const bool sp : {false, true}) {
      for (const Recompute r : {Recompute::kNone, Recompute::kSelective}) {
        if (sp && t == 1) continue;
        Layout l;
        l.tp = t;
        l.sp = sp;
        l.mbs = 2;
        l.recompute = r;
        Device flash_off;
        flash_off.flash_attention = false;
        auto bytes = [&](int64_t layers) {
          TransformerConfig cc = c;
          cc.num_layers = layers;
          cc.finalize();
          Prediction p;
          predict_memory(workload(cc, 2), l, flash_off, &p);
          return p.activation_bytes;
        };
        const double td = static_cast<double>(t);
        const double scores = r == Recompute::kNone ? 5 * a * s * s * b / td : 0.0;
        const double per_layer =
            sp ? 34 * s * b * h / td + scores : s * b * h * (10 + 24 / td) + scores;
        EXPECT_DOUBLE_EQ(bytes(4) - bytes(2), 2 * per_layer)
            << "t " << t << (sp ? " sp" : "") << " " << recompute_name(r);
      }
    }
  }
}

TEST(PlanMemory, InFlightMicroBatchesFollowTheSchedules) {
  // 1F1B: stage r holds pp - r (at most m); interleaved: its warm-up + 1 chunks.
  EXPECT_EQ(in_flight_microbatches(1, 1, 0, 8), 1);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(in_flight_microbatches(4, 1, r, 8), 4 - r);
  EXPECT_EQ(in_flight_microbatches(4, 1, 0, 2), 2);
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(in_flight_microbatches(4, 2, r, 8), interleaved_warmup(4, r, 8, 2) + 1);
}

TEST(PlanMemory, FullRecomputationKeepsLayerInputsAndOneLayersWorkingSet) {
  // Full recomputation holds each layer's input per in-flight micro-batch and one layer's full
  // activations once per stage, whatever the number of chunks in flight. Layers wide against a
  // small vocabulary make stage 0 (the most in flight) the most loaded; exact arithmetic.
  TransformerConfig c = gpt2_style();
  c.num_layers = 8;
  c.hidden_size = 128;
  c.kv_channels = 0;
  c.ffn_hidden_size = 0;
  c.vocab_size = 60;
  c.padded_vocab_size = 64;
  c.finalize();
  Layout l;
  l.pp = 2;
  l.mbs = 1;
  l.recompute = Recompute::kFull;
  Device dev;
  Prediction one, two;
  predict_memory(workload(c, 8), l, dev, &one);
  l.vpp = 2;
  predict_memory(workload(c, 8), l, dev, &two);
  ASSERT_EQ(one.most_loaded_stage, 0);
  ASSERT_EQ(two.most_loaded_stage, 0);
  const double input = 32.0 * 128 * 2;  // s b h, 16-bit
  const int a = in_flight_microbatches(2, 1, 0, 8), b = in_flight_microbatches(2, 2, 0, 8);
  // Stage 0 holds 4 layers in 1 chunk or 2 x 2 layers in 2 chunks.
  EXPECT_DOUBLE_EQ(two.activation_bytes - one.activation_bytes, (b * 2 - a * 4) * input);
}

TEST(PlanMemory, OptimizerStateIsTheWorkloadsWhereverItLives) {
  // bf16 weights: fp32 main 4 + compute copy 2 + gradient 4 + the state per parameter. SGD keeps
  // one fp32 buffer (4) or none, in the plain optimizer as in the distributed one (which splits
  // the main weights and the state over dp 2). Exact arithmetic.
  TransformerConfig c = gpt2_style();
  c.finalize();
  Device dev;
  auto bytes = [&](double plain, double sharded, Sharding s) {
    Workload w = workload(c, 8);
    w.plain_moment_bytes = plain;
    w.moment_bytes = sharded;
    Layout l;
    l.dp = 2;
    l.mbs = 1;
    l.sharding = s;
    Prediction p;
    predict_memory(w, l, dev, &p);
    return p.weight_and_optimizer_bytes / p.params.total();
  };
  EXPECT_DOUBLE_EQ(bytes(8, 8, Sharding::kNone), 18.0);  // Adam
  EXPECT_DOUBLE_EQ(bytes(4, 4, Sharding::kNone), 14.0);  // SGD with momentum
  EXPECT_DOUBLE_EQ(bytes(0, 0, Sharding::kNone), 10.0);  // SGD without
  EXPECT_DOUBLE_EQ(bytes(8, 8, Sharding::kDistributedOptimizer), 2.0 + 2.0 + 4.0 + 4.0);
  EXPECT_DOUBLE_EQ(bytes(8, 4, Sharding::kDistributedOptimizer), 2.0 + 2.0 + 4.0 + 2.0);
  // The step's memory traffic follows the state too (Adam's 42 bytes per element, 8 fewer per
  // fp32 state SGD lacks): the optimizer time scales with it.
  Workload adam = workload(c, 8), sgd = workload(c, 8);
  sgd.optimizer_traffic_bytes = 34.0;
  Layout l;
  l.mbs = 1;
  const double ta = predict(adam, l, free_compute(1e12)).optimizer,
               ts = predict(sgd, l, free_compute(1e12)).optimizer;
  EXPECT_GT(ta, 0.0);
  EXPECT_NEAR(ts / ta, 34.0 / 42.0, 1e-12);
}

TEST(Planner, EveryCandidateKeepsMegatronsRulesAndTheRankingIsByTime) {
  const TransformerConfig c = llama_style();
  PlanRequest r;
  r.workload = workload(c, 16);
  r.cluster = free_compute(1e10);
  r.cluster.device.gemm_time = [](int64_t m, int64_t n, int64_t k, bool, bool, DType) {
    return 2e-12 * static_cast<double>(m * n * k);
  };
  r.cluster.devices_per_node = 8;
  const std::vector<Candidate> all = plan_layouts(r);
  ASSERT_FALSE(all.empty());
  std::set<std::string> names;
  for (size_t i = 0; i < all.size(); ++i) {
    const Layout& l = all[i].layout;
    EXPECT_EQ(layout_rule_violation(r.workload, l, 8), "") << layout_name(l);
    EXPECT_EQ(l.world(), 8);
    EXPECT_EQ(c.num_query_groups % l.tp, 0);
    EXPECT_EQ(c.num_layers % (l.pp * l.vpp), 0);
    EXPECT_EQ(16 % (l.mbs * l.dp), 0);
    if (i > 0 && all[i].fits == all[i - 1].fits && all[i].fits) {
      EXPECT_GE(all[i].prediction.step, all[i - 1].prediction.step);
    }
    names.insert(layout_name(l));
  }
  // tp 4 and 8 break the 2 query groups; tp 1 and 2 both appear.
  EXPECT_TRUE(names.count("tp2+sp pp1 dp4 mbs1"));
  for (const Candidate& cand : all) EXPECT_LE(cand.layout.tp, 2);
  // A fixed degree restricts the search to it.
  r.constraints.pp = 2;
  for (const Candidate& cand : plan_layouts(r)) EXPECT_EQ(cand.layout.pp, 2);
}

TEST(Planner, RulesNameTheFlagThatBreaks) {
  const Workload w = workload(gpt2_style(), 8);
  Layout l;
  l.tp = 3;
  l.dp = 1;
  EXPECT_NE(layout_rule_violation(w, l, 3).find("--tensor-model-parallel-size"), std::string::npos);
  l = Layout{};
  l.pp = 3;
  EXPECT_NE(layout_rule_violation(w, l, 3).find("--num-layers"), std::string::npos);
  l = Layout{};
  l.dp = 3;
  EXPECT_NE(layout_rule_violation(w, l, 3).find("--global-batch-size"), std::string::npos);
  l = Layout{};
  l.ep = 2;
  l.dp = 2;
  EXPECT_NE(layout_rule_violation(w, l, 2).find("--num-experts"), std::string::npos);
}

}  // namespace
}  // namespace megatron::plan
