// The hybrid Mamba model against PyTorch: tests/reference/hf_oracle.py --arch nemotron-h writes a
// tiny NemotronH ("M*M-": Mamba-2, attention-only and squared-ReLU MLP-only layers) with random
// weights and PyTorch's logits, loss, every gradient and 10 AdamW steps; we load the directory
// through the NemotronH importer (models/mamba/mamba_hf.h) and reproduce them. Then: the export
// writes the files' tensors back bit for bit, and generation's carried Mamba state (prefill, then
// one position at a time) gives the logits of full forwards. --arch nemotron-h-moe does the same
// for a NemotronH with MoE layers ("ME*-E", Nemotron 3's NemotronHMoE: sigmoid routing with a
// correction bias, renormalised and scaled, squared-ReLU experts and a shared MLP), and
// --arch nemotron-h-latent for its LatentMoE form (the experts between two latent projections).
//
// Usage: test_mamba_hf_oracle ORACLE_DIR (CTest runs the Python script first, as a fixture).
//
// Tolerances, as test_gpt_hf_oracle's (both sides f32 with different summation orders: PyTorch's
// scan sums a position's state updates in another order than ours, O(1e-7) relative per step):
// logits 1e-5 + 1e-4 |x|; loss 1e-5 relative; gradients 1e-6 + 1e-3 |g|; AdamW losses 1e-4
// relative.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_dir.h"
#include "models/common/hf_tensors.h"
#include "models/mamba/mamba_hf.h"
#include "optim/adamw.h"
#include "oracle_mtp.h"
#include "testing/testing.h"
#include "transformer/kv_cache.h"

namespace megatron {
namespace {

std::string g_oracle_dir;

struct Loaded {
  NemotronHInfo info;
  std::unique_ptr<GPTModel> model;
  std::unique_ptr<ParamSet> params;
};

// variant: what a run's flags change (--mtp-num-layers, --mtp-detach-heads).
Loaded load(const std::string& dir, const std::function<void(TransformerConfig&)>& variant = {}) {
  Loaded l;
  l.info = read_nemotron_h_config(dir);
  TransformerConfig c = l.info.config;
  if (variant) variant(c);
  c.padded_vocab_size = pad_vocab_size(c.vocab_size, 128);
  c.seq_length = 16;
  c.hidden_dropout = c.attention_dropout = 0;
  c.finalize();
  l.model = std::make_unique<GPTModel>(c);
  l.params = std::make_unique<ParamSet>(l.model->parameters(), DType::kF32);
  load_nemotron_h_weights(dir, *l.model, *l.params);
  return l;
}

double mean(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += t.item(i);
  return s / static_cast<double>(t.numel());
}

struct Batch {
  Tensor inputs, labels;  // [B, S]
};

Batch oracle_batch(safetensors::File& expected) {
  Tensor tokens = expected.read("tokens");
  const int64_t B = tokens.dim(0), S = tokens.dim(1) - 1;
  Batch out{Tensor::empty({B, S}, DType::kI64), Tensor::empty({B, S}, DType::kI64)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      out.inputs.data<int64_t>()[b * S + t] = tokens.data<int64_t>()[b * (S + 1) + t];
      out.labels.data<int64_t>()[b * S + t] = tokens.data<int64_t>()[b * (S + 1) + t + 1];
    }
  return out;
}

// Logits [S * B, Vp] (row t * B + b) as PyTorch's [B, S, V].
Tensor as_pytorch(const Tensor& logits, const TransformerConfig& c, int64_t B, int64_t S) {
  Tensor got = Tensor::empty({B, S, c.vocab_size});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t)
      for (int64_t v = 0; v < c.vocab_size; ++v)
        got.data<float>()[(b * S + t) * c.vocab_size + v] =
            logits.data<float>()[(t * B + b) * c.padded_vocab_size + v];
  return got;
}

std::string root(const std::string& arch) {
  return g_oracle_dir + "/" + arch;
}

// The logged gradient norm: every gradient's, or with --mtp-detach-heads all but the MTP
// parameters' (Megatron's separate grad_norm_group 'mtp').
double main_grad_norm(ParamSet& params, const TransformerConfig& c) {
  return std::sqrt(grad_sum_squares_unique(
      params, ParamDomain::kAll, c.mtp_detach_heads ? NormGroup::kMain : NormGroup::kAll));
}

// An AdamW step (lr 1e-3, decay 0.1) with clipping to 1.0 as the trainer's: the main norm's
// factor, and with --mtp-detach-heads the MTP parameters' own.
void step_as_the_trainer(AdamW& opt, ParamSet& params, const TransformerConfig& c) {
  StepRates rates{1e-3, 1e-3, 0.1};
  if (c.mtp_detach_heads) {
    rates.separate_grad_scale = clip_coefficient(
        1.0, std::sqrt(grad_sum_squares_unique(params, ParamDomain::kAll, NormGroup::kSeparate)));
  }
  opt.step(rates, clip_coefficient(1.0, main_grad_norm(params, c)));
}

// Logits, loss, every gradient (`tensors` of them) and 10 AdamW steps of `arch` against PyTorch.
void check_training_math(const std::string& arch, const std::string& pattern, size_t tensors,
                         const std::function<void(TransformerConfig&)>& variant = {}) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass the oracle directory as the first argument";
  auto expected = safetensors::File::open(root(arch) + "/expected.safetensors");
  Loaded l = load(root(arch) + "/model", variant);
  const TransformerConfig& c = l.model->config();
  EXPECT_EQ(c.mamba.layers, pattern);
  const Batch batch = oracle_batch(expected);
  const int64_t B = batch.inputs.dim(0), S = batch.inputs.dim(1);
  GPTModel::Ctx ctx;
  const ForwardMode mode = testing::oracle_mode(c);
  const Tensor loss = l.model->forward(batch.inputs, batch.labels, Tensor(), ctx, mode);
  EXPECT_EQ(static_cast<int64_t>(ctx.mtp_losses.size()), c.mtp_num_layers);
  EXPECT_TRUE(
      testing::allclose(as_pytorch(ctx.head.logits, c, B, S), expected.read("logits"), 1e-5, 1e-4))
      << "logits";
  const double want_loss = expected.read("loss").item(0);
  EXPECT_NEAR(mean(loss), want_loss, 1e-5 * want_loss) << "loss";

  l.params->zero_grads();
  testing::set_mtp_gradients(c, B, S, ctx);
  l.model->backward(Tensor::full({B, S}, 1.0 / static_cast<double>(B * S)), ctx);
  const auto grads = nemotron_h_tensors(*l.model, true);
  EXPECT_EQ(grads.size(), tensors);
  for (const auto& [name, g] : grads)
    EXPECT_TRUE(testing::allclose(g, expected.read("grad." + name), 1e-6, 1e-3))
        << "gradient of " << name;
  const double norm = main_grad_norm(*l.params, c);
  EXPECT_NEAR(norm, expected.read("grad_norm").item(0), 1e-4 * norm) << "grad norm";

  // 10 AdamW steps on the same batch: lr 1e-3, betas (0.9, 0.95), wd 0.1 on tensors of >= 2
  // dims (conv1d.weight included, as Megatron decays its 3-D weight), clip 1.0.
  Loaded fresh = load(root(arch) + "/model", variant);
  AdamW opt(*fresh.params, AdamWConfig{0.9, 0.95, 1e-8, 0.1});
  const Tensor want_losses = expected.read("adam_losses");
  for (int64_t step = 0; step < want_losses.numel(); ++step) {
    GPTModel::Ctx sctx;
    const Tensor l2 = fresh.model->forward(batch.inputs, batch.labels, Tensor(), sctx, mode);
    EXPECT_NEAR(mean(l2), want_losses.item(step), 1e-4 * want_losses.item(step)) << "step " << step;
    fresh.params->zero_grads();
    testing::set_mtp_gradients(c, B, S, sctx);
    fresh.model->backward(Tensor::full({B, S}, 1.0 / static_cast<double>(B * S)), sctx);
    step_as_the_trainer(opt, *fresh.params, c);
  }
}

// Every tensor: the embedding, 2 Mamba layers of 9, the attention layer's 5, the MLP layer's 3,
// the final norm and the head.
TEST(NemotronHOracle, LogitsLossGradientsAndAdamW) {
  check_training_math("nemotron-h", "M*M-", 1U + 2 * 9 + 5 + 3 + 2);
}

// An MoE layer's 12 trained tensors: its norm, the router (its correction bias is a buffer), 4
// experts' up and down projections, the shared MLP's two.
TEST(NemotronHMoeOracle, LogitsLossGradientsAndAdamW) {
  check_training_math("nemotron-h-moe", "ME*-E", 1U + 9 + 12 + 5 + 3 + 12 + 2);
}

// Nemotron 3 Super's multi-token prediction (hybrid MTP): two depths of "*E", each trained
// through lm loss + 0.1 x the depths' mean loss; per depth enorm, hnorm, eh_proj,
// final_layernorm and the attention's 5 and the MoE layer's 12 tensors.
TEST(NemotronHMtpOracle, LogitsLossGradientsAndAdamW) {
  check_training_math("nemotron-h-mtp", "ME*-E", 1U + 9 + 12 + 5 + 3 + 12 + 2 + 2 * (4 + 5 + 12));
  const TransformerConfig c = read_nemotron_h_config(root("nemotron-h-mtp") + "/model").config;
  EXPECT_EQ(c.mtp_num_layers, 2);
  EXPECT_EQ(c.mamba.mtp_layers, "*E");
}

// Import -> export reproduces the files' tensors and config bit for bit.
void check_export_round_trip(const std::string& arch) {
  Loaded l = load(root(arch) + "/model");
  const std::string out = testing::scratch_dir(arch + "_export");
  save_nemotron_h(out, *l.model, root(arch) + "/model", std::nullopt);
  auto a = safetensors::SafetensorsDir::open(root(arch) + "/model");
  auto b = safetensors::SafetensorsDir::open(out);
  EXPECT_EQ(a.names(), b.names());
  for (const std::string& n : a.names()) {
    const Tensor x = a.read(n), y = b.read(n);
    ASSERT_EQ(x.shape(), y.shape()) << n;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << n;
  }
  // A config made from ours (no source directory) reads back as the same model.
  const std::string fresh = testing::scratch_dir(arch + "_fresh");
  save_nemotron_h(fresh, *l.model, "", std::nullopt);
  const TransformerConfig back = read_nemotron_h_config(fresh).config;
  const TransformerConfig& in = l.info.config;
  EXPECT_EQ(back.mamba.layers, in.mamba.layers);
  EXPECT_EQ(back.mamba.heads(back.hidden_size), in.mamba.heads(in.hidden_size));
  EXPECT_EQ(back.mamba.num_groups, in.mamba.num_groups);
  EXPECT_EQ(back.mamba.state_dim, in.mamba.state_dim);
  EXPECT_EQ(back.num_query_groups, in.num_query_groups);
  EXPECT_EQ(back.kv_channels, in.kv_channels);
  EXPECT_EQ(back.untie_embeddings_and_output_weights, in.untie_embeddings_and_output_weights);
  EXPECT_EQ(back.moe.num_experts, in.moe.num_experts);
  EXPECT_EQ(back.moe.router_topk, in.moe.router_topk);
  EXPECT_EQ(back.moe.ffn_hidden_size, in.moe.ffn_hidden_size);
  EXPECT_EQ(back.moe.shared_expert_intermediate_size, in.moe.shared_expert_intermediate_size);
  EXPECT_EQ(back.moe.num_groups, in.moe.num_groups);
  EXPECT_EQ(back.moe.group_topk, in.moe.group_topk);
  EXPECT_EQ(back.moe.topk_scaling_factor, in.moe.topk_scaling_factor);
  EXPECT_EQ(back.moe.layer_pattern, in.moe.layer_pattern);
  EXPECT_EQ(back.mtp_num_layers, in.mtp_num_layers);
  EXPECT_EQ(back.mamba.mtp_layers, in.mamba.mtp_layers);
}

// config.json forms and refusals, on the oracle's MoE config edited: the layer_types alias of
// layers_block_type and num_local_experts of n_routed_experts; an unknown layer type; top-1
// sigmoid routing, which Megatron leaves unnormalised (norm_topk_prob must be false), and its
// export writing norm_topk_prob false.
TEST(NemotronHMoeOracle, ConfigFormsAndRefusals) {
  const nlohmann::json base = read_hf_config_json(root("nemotron-h-moe") + "/model");
  auto read = [](const nlohmann::json& j, const std::string& name) {
    const std::string dir = testing::scratch_dir(name);
    std::ofstream(dir + "/config.json") << j.dump();
    return read_nemotron_h_config(dir).config;
  };
  auto refusal = [&](const nlohmann::json& j, const std::string& name) -> std::string {
    try {
      read(j, name);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  nlohmann::json alias = base;
  alias["layer_types"] = alias["layers_block_type"];
  alias.erase("layers_block_type");
  alias["num_local_experts"] = alias["n_routed_experts"];
  alias.erase("n_routed_experts");
  const TransformerConfig c = read(alias, "nemotron_h_alias");
  EXPECT_EQ(c.mamba.layers, "ME*-E");
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.moe.num_experts, 4);
  nlohmann::json unknown = base;
  unknown["layers_block_type"][2] = "sliding_attention";
  EXPECT_NE(refusal(unknown, "nemotron_h_unknown").find("layer type 'sliding_attention'"),
            std::string::npos);
  nlohmann::json top1 = base;
  top1["num_experts_per_tok"] = 1;
  EXPECT_NE(refusal(top1, "nemotron_h_top1").find("norm_topk_prob true with num_experts_per_tok 1"),
            std::string::npos);
  top1["norm_topk_prob"] = false;
  EXPECT_EQ(read(top1, "nemotron_h_top1_raw").moe.router_topk, 1);
  Loaded l = load(root("nemotron-h-moe") + "/model");
  TransformerConfig one = l.model->config();
  one.moe.router_topk = 1;
  GPTModel m1(one);
  ParamSet p1(m1.parameters(), DType::kF32);  // the weights' storage (values do not matter here)
  const std::string out = testing::scratch_dir("nemotron_h_top1_export");
  save_nemotron_h(out, m1, "", std::nullopt);
  EXPECT_FALSE(read_hf_config_json(out)["norm_topk_prob"].get<bool>());
  one.moe.apply_probs_on_input = true;
  EXPECT_THROW(check_nemotron_h_exportable(one), InvalidArgument);
}

TEST(NemotronHOracle, ExportRoundTrip) {
  check_export_round_trip("nemotron-h");
}
// Nemotron 3 Super's training form: the files' one MTP block applied at two depths
// (mtp_use_repeated_layer: --mtp-num-layers 2 over one block), --mtp-detach-heads (the decoder's
// output, the embeddings and the output weight detached; the MTP parameters clipped by their own
// norm, the logged norm without them); the one block's 21 tensors trained by both depths.
TEST(NemotronHMtpOracle, RepeatedLayerAndDetachedHeads) {
  const TransformerConfig file =
      read_nemotron_h_config(root("nemotron-h-mtp-repeated") + "/model").config;
  EXPECT_EQ(file.mtp_num_layers, 1);
  EXPECT_TRUE(file.mtp_use_repeated_layer);
  check_training_math("nemotron-h-mtp-repeated", "ME*-E", 1U + 9 + 12 + 5 + 3 + 12 + 2 + 21,
                      [](TransformerConfig& c) {
                        c.mtp_num_layers = 2;
                        c.mtp_detach_heads = true;
                      });
}

// Packed rows (--dataloader-inter-document-masking): documents cut from the oracle's two
// sequences, placed one after the other in a row of S tokens; doc_start marks them.
struct Packed {
  struct Doc {
    int64_t seq, from, len, at;  // the oracle sequence's [from, from + len) at row position at
  };
  std::vector<std::vector<Doc>> rows;
  Tensor tokens, labels, starts;  // [rows, S]
};

Packed pack(const Batch& batch, const std::vector<std::vector<std::array<int64_t, 3>>>& rows) {
  const int64_t R = static_cast<int64_t>(rows.size()), S = batch.inputs.dim(1);
  Packed p{{},
           Tensor::empty({R, S}, DType::kI64),
           Tensor::empty({R, S}, DType::kI64),
           Tensor::empty({R, S}, DType::kI32)};
  for (int64_t r = 0; r < R; ++r) {
    std::vector<Packed::Doc> docs;
    int64_t at = 0;
    for (const auto& [seq, from, len] : rows[static_cast<size_t>(r)]) {
      for (int64_t t = 0; t < len; ++t) {
        p.tokens.data<int64_t>()[r * S + at + t] = batch.inputs.data<int64_t>()[seq * S + from + t];
        p.labels.data<int64_t>()[r * S + at + t] = batch.labels.data<int64_t>()[seq * S + from + t];
        p.starts.data<int32_t>()[r * S + at + t] = static_cast<int32_t>(at);
      }
      docs.push_back({seq, from, len, at});
      at += len;
    }
    EXPECT_EQ(at, S);
    p.rows.push_back(docs);
  }
  return p;
}

// Positions [at, at + len) of row r of a [R, S, ...] float tensor (logits as PyTorch's) or a
// [R, S] one (per-token losses), as [len, ...].
Tensor positions_of(const Tensor& t, int64_t r, int64_t at, int64_t len) {
  const int64_t S = t.dim(1), inner = t.numel() / (t.dim(0) * S);
  Tensor out = Tensor::empty({len, inner}, t.dtype());
  const auto w = static_cast<int64_t>(dtype_size(t.dtype()));
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + (r * S + at) * inner * w,
              static_cast<size_t>(len * inner * w));
  return out;
}

// Each document of a packed row gives PyTorch's logits of its oracle sequence alone (a document
// starting at the sequence's start, so its prefix is what the oracle ran): the Mamba layers
// restart their convolution and state at the document (Megatron's seq_idx), attention stays
// inside it (no position embedding here). doc_start as an attention mask only
// (--reset-attention-mask) keeps the Mamba state across, so the second documents' logits are
// not those. Rows: 6 tokens of sequence 0 then 10 of sequence 1, and 3 of sequence 1 then 13 of
// sequence 0 (every position of a row and both sequences in each). Tolerance: test_gpt_hf_
// oracle's logits tolerance (f32 on both sides, other summation orders).
TEST(NemotronHOracle, PackedDocumentsAreSeparateSequences) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass the oracle directory as the first argument";
  auto expected = safetensors::File::open(root("nemotron-h") + "/expected.safetensors");
  Loaded l = load(root("nemotron-h") + "/model");
  const TransformerConfig& c = l.model->config();
  const Batch batch = oracle_batch(expected);
  const Packed p = pack(batch, {{{0, 0, 6}, {1, 0, 10}}, {{1, 0, 3}, {0, 0, 13}}});
  const int64_t R = p.tokens.dim(0), S = p.tokens.dim(1);
  const Tensor want = expected.read("logits");  // [2, S, V]
  auto logits = [&](bool packed) {
    GPTModel::Ctx ctx;
    l.model->forward(p.tokens, p.labels, Tensor(), ctx, ForwardMode{}, p.starts, packed);
    return as_pytorch(ctx.head.logits, c, R, S);
  };
  const Tensor got = logits(true), attention_only = logits(false);
  for (int64_t r = 0; r < R; ++r)
    for (const Packed::Doc& d : p.rows[static_cast<size_t>(r)]) {
      const Tensor oracle = positions_of(want, d.seq, 0, d.len);
      EXPECT_TRUE(testing::allclose(positions_of(got, r, d.at, d.len), oracle, 1e-5, 1e-4))
          << "row " << r << ", the document at " << d.at;
      if (d.at == 0) continue;
      EXPECT_FALSE(
          testing::allclose(positions_of(attention_only, r, d.at, d.len), oracle, 1e-3, 1e-2))
          << "row " << r << ": the Mamba state crossed into the document at " << d.at;
    }
}

// Multi-token prediction on packed rows: a document's every per-token loss (the main one and
// both depths') is the same wherever the row puts it and whatever precedes or follows it:
// sequence 1's first 10 tokens after 6 of sequence 0 (their end is the row's) and before 6 of
// sequence 0 (their end a document boundary, where the roll gives 0 as at the row's end).
// Without packing the depths' roll reads the next document's tokens and the Mamba state carries
// over, so the two placements differ. Tolerance: f32 on both sides; the same arithmetic at other
// row positions except the expert GEMMs' row grouping (a few ulp of O(1) losses).
TEST(NemotronHMtpOracle, PackedDocumentsRollInsideEachDocument) {
  ASSERT_FALSE(g_oracle_dir.empty()) << "pass the oracle directory as the first argument";
  auto expected = safetensors::File::open(root("nemotron-h-mtp") + "/expected.safetensors");
  Loaded l = load(root("nemotron-h-mtp") + "/model");
  const TransformerConfig& c = l.model->config();
  ASSERT_EQ(c.mtp_num_layers, 2);
  const Batch batch = oracle_batch(expected);
  const Packed p = pack(batch, {{{0, 0, 6}, {1, 0, 10}}, {{1, 0, 10}, {0, 6, 6}}});
  // Per row, the main loss then the depths' [R, S].
  auto losses = [&](bool packed) {
    GPTModel::Ctx ctx;
    std::vector<Tensor> out{l.model->forward(p.tokens, p.labels, Tensor(), ctx,
                                             testing::oracle_mode(c), p.starts, packed)};
    out.insert(out.end(), ctx.mtp_losses.begin(), ctx.mtp_losses.end());
    return out;
  };
  const std::vector<Tensor> got = losses(true), unpacked = losses(false);
  ASSERT_EQ(got.size(), 3U);
  double moved = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    const Tensor after = positions_of(got[k], 0, 6, 10), before = positions_of(got[k], 1, 0, 10);
    EXPECT_TRUE(testing::allclose(after, before, 1e-5, 1e-5)) << "loss " << k;
    const Tensor a = positions_of(unpacked[k], 0, 6, 10), b = positions_of(unpacked[k], 1, 0, 10);
    for (int64_t t = 0; t < 10; ++t) moved = std::max(moved, std::abs(a.item(t) - b.item(t)));
  }
  EXPECT_GT(moved, 1e-2);
}

TEST(NemotronHMtpOracle, ExportRoundTrip) {
  check_export_round_trip("nemotron-h-mtp");
}
TEST(NemotronHMoeOracle, ExportRoundTrip) {
  check_export_round_trip("nemotron-h-moe");
}

// Nemotron 3's LatentMoE (moe_latent_size 24 of 64): each MoE layer's 12 tensors, now with the
// experts at the latent width, plus fc1_latent_proj and fc2_latent_proj; the export writes them
// and moe_latent_size back.
TEST(NemotronHLatentOracle, LogitsLossGradientsAndAdamW) {
  check_training_math("nemotron-h-latent", "ME*-E", 1U + 9 + 14 + 5 + 3 + 14 + 2);
  EXPECT_EQ(read_nemotron_h_config(root("nemotron-h-latent") + "/model").config.moe.latent_size,
            24);
}

TEST(NemotronHLatentOracle, ExportRoundTrip) {
  check_export_round_trip("nemotron-h-latent");
}

// Generation: a prefill of 5 positions, then one position per call with the Mamba layers' carried
// convolution inputs and scan state and the attention layer's KV cache, gives each position's
// logits as one full forward over the whole sequence (f32, different summation orders in the
// attention over the cache: 1e-5 + 1e-4 |x|, the logits tolerance above).
void check_generation(const std::string& arch) {
  auto expected = safetensors::File::open(root(arch) + "/expected.safetensors");
  Loaded l = load(root(arch) + "/model");
  const Batch batch = oracle_batch(expected);
  const int64_t B = batch.inputs.dim(0), S = batch.inputs.dim(1);
  const int64_t Vp = l.model->config().padded_vocab_size;
  const Tensor full = l.model->infer_stage(Tensor(), batch.inputs, Tensor(), ForwardMode{}, false);
  KvCache cache(S);
  ForwardMode mode;
  mode.kv_cache = &cache;
  auto columns = [&](int64_t t0, int64_t t1) {
    Tensor out = Tensor::empty({B, t1 - t0}, DType::kI64);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = t0; t < t1; ++t)
        out.data<int64_t>()[b * (t1 - t0) + t - t0] = batch.inputs.data<int64_t>()[b * S + t];
    return out;
  };
  const int64_t prefill = 5;
  std::vector<float> got(static_cast<size_t>(S * B * Vp));
  for (int64_t t0 = 0; t0 < S;) {
    const int64_t t1 = t0 == 0 ? prefill : t0 + 1;
    const Tensor logits = l.model->infer_stage(Tensor(), columns(t0, t1), Tensor(), mode, false);
    cache.advance(t1 - t0);
    std::copy(logits.data<float>(), logits.data<float>() + logits.numel(),
              got.begin() + t0 * B * Vp);
    t0 = t1;
  }
  Tensor g = Tensor::empty({S * B, Vp});
  std::copy(got.begin(), got.end(), g.data<float>());
  EXPECT_TRUE(testing::allclose(g, full, 1e-5, 1e-4));
  // A second generation after reset() starts from zero state again.
  cache.reset();
  const Tensor again = l.model->infer_stage(Tensor(), columns(0, S), Tensor(), mode, false);
  EXPECT_TRUE(testing::allclose(again, full, 1e-5, 1e-4));
}

TEST(NemotronHOracle, CarriedStateGenerationEqualsFullForward) {
  check_generation("nemotron-h");
}
TEST(NemotronHMoeOracle, CarriedStateGenerationEqualsFullForward) {
  check_generation("nemotron-h-moe");
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) megatron::g_oracle_dir = argv[1];
  return RUN_ALL_TESTS();
}
